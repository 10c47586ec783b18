"""Backends: where workers run (local processes, Spark executors).

:class:`Backend` is the seam the engine sees (rules in :mod:`._base`); every backend is a
:class:`WorkerPool` over a small :class:`Transport` (:class:`LocalBackend`: OS processes;
:class:`SparkBackend`, imported lazily without pyspark: long-lived Spark tasks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cerebro_spark.backends._base import (
    Backend,
    Membership,
    UnitFuture,
    WorkerChange,
    WorkerInfo,
    WorkerJob,
)
from cerebro_spark.backends._local import LocalBackend, LocalTransport
from cerebro_spark.backends._pool import PoolStats, WorkerPool, next_worker_index
from cerebro_spark.backends._serve import TaskInfo, WorkerSpec, serve
from cerebro_spark.backends._transport import Location, Transport
from cerebro_spark.backends._worker import Worker

if TYPE_CHECKING:
    from cerebro_spark.backends._spark import SparkBackend, SparkTransport

__all__ = [
    "Backend",
    "LocalBackend",
    "LocalTransport",
    "Location",
    "Membership",
    "PoolStats",
    "SparkBackend",
    "SparkTransport",
    "TaskInfo",
    "Transport",
    "UnitFuture",
    "Worker",
    "WorkerChange",
    "WorkerInfo",
    "WorkerJob",
    "WorkerPool",
    "WorkerSpec",
    "next_worker_index",
    "serve",
]


def __getattr__(name: str) -> Any:
    if name in ("SparkBackend", "SparkTransport"):
        from cerebro_spark.backends import _spark

        return getattr(_spark, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
