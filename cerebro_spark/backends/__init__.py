"""Backends: where workers run (local processes, Spark executors).

:class:`Backend` is the seam the engine sees (rules in :mod:`cerebro_spark.backends._base`).
Every backend is a :class:`WorkerPool` (handles, futures, heartbeats, losses, re-homing,
joins, group rendezvous, retire) over a small :class:`Transport` that starts workers and
says when they end: :class:`LocalBackend` runs each worker in its own OS process on this
machine, :class:`SparkBackend` as a long-lived task on a Spark executor. Both speak the same
authenticated JSON frames. :class:`Worker` is the loop body that holds partitions and runs
units. ``SparkBackend`` is imported lazily: importing this package does not import pyspark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cerebro_spark.backends._base import (
    Backend,
    Membership,
    WorkerChange,
    WorkerInfo,
    WorkerJob,
)
from cerebro_spark.backends._local import LocalBackend, LocalTransport
from cerebro_spark.backends._pool import PoolStats, WorkerPool, next_worker_index, worker_name
from cerebro_spark.backends._serve import TaskInfo, WorkerSpec, serve
from cerebro_spark.backends._transport import Location, Transport
from cerebro_spark.backends._worker import Worker, split_of

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
    "Worker",
    "WorkerChange",
    "WorkerInfo",
    "WorkerJob",
    "WorkerPool",
    "WorkerSpec",
    "next_worker_index",
    "serve",
    "split_of",
    "worker_name",
]


def __getattr__(name: str) -> Any:
    if name in ("SparkBackend", "SparkTransport"):
        from cerebro_spark.backends import _spark

        return getattr(_spark, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
