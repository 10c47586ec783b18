"""Backends: where workers run (local processes, Spark executors).

:class:`Backend` is the seam (rules in :mod:`cerebro_spark.backends._base`);
:class:`Worker` is the backend-agnostic loop body that holds partitions and runs units;
:class:`LocalBackend` runs each worker in its own OS process on this machine;
:class:`SparkBackend` runs each worker as a long-lived task on a Spark executor. It is
imported lazily: importing this package does not import pyspark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cerebro_spark.backends._base import Backend, WorkerInfo, WorkerJob
from cerebro_spark.backends._local import LocalBackend
from cerebro_spark.backends._worker import Worker, split_of

if TYPE_CHECKING:
    from cerebro_spark.backends._spark import SparkBackend

__all__ = [
    "Backend",
    "LocalBackend",
    "SparkBackend",
    "Worker",
    "WorkerInfo",
    "WorkerJob",
    "split_of",
]


def __getattr__(name: str) -> Any:
    if name == "SparkBackend":
        from cerebro_spark.backends._spark import SparkBackend

        return SparkBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
