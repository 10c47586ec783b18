"""What both Spark transports read: a worker task's own facts, and the settings it needs.

:mod:`._spark` (classic sessions) and :mod:`._connect` (Spark Connect) share these. This
module imports pyspark only inside :func:`spark_task_info` (it runs in a task).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future

from cerebro_spark.backends._serve import TaskInfo
from cerebro_spark.errors import ConfigError


def run_in_thread(name: str, ended: Future[str], job: Callable[[], str]) -> None:
    """Run a worker's blocking Spark call in a daemon thread named ``name``.

    ``ended`` gets ``job``'s result (the worker's outcome), or the exception it raised.
    """

    def run() -> None:
        try:
            outcome = job()
        except BaseException as exc:
            ended.set_exception(exc)
        else:
            ended.set_result(outcome)

    threading.Thread(target=run, name=name, daemon=True).start()


def check_spark_conf(get: Callable[[str], str | None]) -> None:
    """Refuse Spark settings under which long-lived worker tasks cannot work.

    A speculative copy of a worker's task (``spark.speculation``) is refused by the
    driver, ends first, and makes Spark kill the real worker as the "slower" attempt.

    Args:
        get: Reads a Spark setting (``SparkConf.get``); ``None`` when unset.

    Raises:
        ConfigError: ``spark.speculation`` is true.
    """
    if (get("spark.speculation") or "false").strip().lower() == "true":
        raise ConfigError(
            "spark.speculation=true is not supported by SparkBackend: a speculative copy of "
            "a long-lived worker task would make Spark kill the worker; set "
            "spark.speculation=false"
        )


def spark_task_info() -> TaskInfo:
    """Read the :class:`~._serve.TaskInfo` of the running Spark task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return TaskInfo()
    return TaskInfo(
        attempt=context.attemptNumber(),
        task_attempt_id=context.taskAttemptId(),
        resources={name: tuple(info.addresses) for name, info in context.resources().items()},
    )
