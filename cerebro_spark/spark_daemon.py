"""PySpark's worker daemon, with torch imported once before it forks the workers.

Spark starts one Python daemon per executor (``spark.python.daemon.module``; PySpark's own
is ``pyspark.daemon``) and forks a Python worker from it whenever a task needs one. Every
worker that trains or scores imports torch, a few CPU-seconds each. Run as this module,
the daemon imports torch first, then is PySpark's own daemon (:func:`pyspark.daemon.manager`):
every worker it forks inherits torch (its pages shared copy-on-write) instead of importing
it again. The first Python task of an executor waits for the import instead.

PySpark forks only from a daemon that started no thread (pandas and pyarrow start threads
when imported, so its workers import them after the fork): importing torch starts none,
its thread pools start at the first parallel operation, in the workers. numpy's OpenBLAS
(imported by torch) starts its threads at import and resets them on fork, as it does for
:mod:`multiprocessing`.

Not under ``spark.executor.pyspark.memory``: PySpark caps each worker's address space
(``RLIMIT_AS``) after the fork, and a worker checks that PyTorch fits under its cap before
it imports it, naming the setting (:mod:`cerebro_spark.data._residence`); one forked with
torch already mapped would be over its cap from the start. Spark gives the daemon the
cap's environment variable (``PYSPARK_EXECUTOR_MEMORY_MB``) whatever set it.

The module must be importable by the executors' Python when they start (installed, or on
``spark.executorEnv.PYTHONPATH``; a ``--py-files`` archive is not): :func:`spark_session`
uses it on its own only where the executors run the driver's Python (``local`` masters).
Elsewhere set ``spark.python.daemon.module=cerebro_spark.spark_daemon`` yourself.
Without torch installed the daemon goes on as PySpark's.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Mapping

PRELOAD = ("torch",)
"""What the daemon imports before it forks."""


def preloaded(environ: Mapping[str, str]) -> tuple[str, ...]:
    """What a daemon started with ``environ`` imports before it forks.

    :data:`PRELOAD`, or nothing under a memory cap (``PYSPARK_EXECUTOR_MEMORY_MB``; see
    the module docstring).
    """
    return () if environ.get("PYSPARK_EXECUTOR_MEMORY_MB", "").strip() else PRELOAD


def main() -> None:
    """Import what :func:`preloaded` says, then run PySpark's daemon (it never returns)."""
    for name in preloaded(os.environ):
        with contextlib.suppress(ImportError):  # the workers say what is missing
            importlib.import_module(name)
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
