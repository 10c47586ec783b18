"""Backends: where workers run (in-process pools, local processes, Spark executors)."""

from cerebro_spark.backends._base import Backend, WorkerInfo, WorkerJob

__all__ = ["Backend", "WorkerInfo", "WorkerJob"]
