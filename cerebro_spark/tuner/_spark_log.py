"""Spark's console level around :meth:`Tuner.fit`: set for the call, restored on every exit.

Spark's console level is two settings, not one (PySpark 4, measured): log4j2's root
logger level, and -- in a session PySpark started (an "interpreter") -- a threshold
Spark keeps beside it (``org.apache.spark.internal.Logging.sparkShellThresholdLevel``)
that filters the console: the root stays at INFO while the console shows WARN ("Setting
default log level to WARN"). ``SparkContext.setLogLevel`` sets the root and clears that
threshold. Restoring only the root level read before (INFO) therefore left the console
at INFO after the first ``fit``, even one that raised (issue 30, part 5): both are read
before and put back after.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from cerebro_spark.spark_session import is_connect_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class SparkLogLevels:
    """Spark's console level as two settings (module docstring).

    Attributes:
        root: log4j2's root logger level (``"INFO"``, ``"WARN"`` ...).
        threshold: Spark's console threshold of a PySpark-started session, or ``None``
            where none filters the console.
    """

    root: str
    threshold: str | None


def _logging_module(spark: SparkSession) -> Any:
    """The JVM's ``org.apache.spark.internal.Logging`` object (its ``MODULE$``)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None  # ok: a live session has its gateway
    return getattr(getattr(jvm.org.apache.spark.internal, "Logging$"), "MODULE$")


def spark_log_levels(spark: SparkSession) -> SparkLogLevels:
    """Read Spark's root level and console threshold through the JVM."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None  # ok: a live session has its gateway
    root = str(jvm.org.apache.logging.log4j.LogManager.getRootLogger().getLevel())
    threshold = _logging_module(spark).sparkShellThresholdLevel()
    return SparkLogLevels(root, None if threshold is None else str(threshold))


def restore_spark_log_levels(spark: SparkSession, levels: SparkLogLevels) -> None:
    """Put back what :func:`spark_log_levels` read (the root level, then the threshold)."""
    spark.sparkContext.setLogLevel(levels.root)  # clears the threshold ...
    jvm = spark.sparkContext._jvm
    assert jvm is not None  # ok: a live session has its gateway
    threshold = None
    if levels.threshold is not None:
        threshold = jvm.org.apache.logging.log4j.Level.toLevel(levels.threshold)
    getattr(_logging_module(spark), "sparkShellThresholdLevel_$eq")(threshold)  # ... back


@contextlib.contextmanager
def spark_log_level(spark: SparkSession | None, level: str | None) -> Iterator[None]:
    """Spark's console at ``level`` for the block; both settings restored however it ends.

    ``spark`` ``None`` (no session), a Spark Connect session (its log is the server's) or
    ``level`` ``None`` (leave it): nothing changes.
    Where the levels cannot be read (a JVM without Spark's logging object), the level is
    set and left as it is, with a warning that says so.
    """
    if spark is None or level is None or is_connect_session(spark):
        yield  # a Spark Connect session's log is the server's, out of this process's reach
        return
    try:
        before = spark_log_levels(spark)
    except Exception as error:  # ok: the py4j names of another Spark; set and warn
        logger.warning("cannot read Spark's log level (%s): it stays at %s after fit", error, level)
        spark.sparkContext.setLogLevel(level)
        yield
        return
    spark.sparkContext.setLogLevel(level)
    try:
        yield
    finally:
        restore_spark_log_levels(spark, before)
