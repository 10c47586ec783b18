"""Backends: where workers run (local processes, Spark executors).

:class:`Backend` is the seam the engine sees (rules in :mod:`._base`); every backend is a
:class:`WorkerPool` over a small :class:`Transport` (:class:`LocalBackend`: OS processes;
:class:`SparkBackend`: long-lived Spark tasks; pyspark is imported when one starts).
"""

from __future__ import annotations

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
from cerebro_spark.backends._spark import SparkBackend, SparkTransport
from cerebro_spark.backends._transport import Location, Transport
from cerebro_spark.backends._worker import Worker

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
