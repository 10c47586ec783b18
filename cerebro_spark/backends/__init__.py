"""Backends: where workers run (local processes, Spark executors).

:class:`Backend` is the seam (rules in :mod:`cerebro_spark.backends._base`);
:class:`Worker` is the backend-agnostic loop body that holds partitions and runs units;
:class:`LocalBackend` runs each worker in its own OS process on this machine.
"""

from cerebro_spark.backends._base import Backend, WorkerInfo, WorkerJob
from cerebro_spark.backends._local import LocalBackend
from cerebro_spark.backends._worker import Worker, split_of

__all__ = ["Backend", "LocalBackend", "Worker", "WorkerInfo", "WorkerJob", "split_of"]
