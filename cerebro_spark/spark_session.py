"""Creating a Spark session the way every part of cerebro-spark needs it.

Two traps, measured: executors bind to the wrong interface unless ``SPARK_LOCAL_IP`` is
set, and run the wrong Python unless ``PYSPARK_PYTHON`` is. Both are set (when the user has
not set them) before the JVM starts.

A session whose Python workers train or score (``preload_torch``) on executors that run
this very Python (a ``local`` or ``local-cluster`` master) has PySpark's daemon import
torch once, before it forks them (:mod:`cerebro_spark.spark_daemon`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DAEMON_MODULE = "cerebro_spark.spark_daemon"
"""``spark.python.daemon.module`` of sessions whose workers import torch (module docstring)."""


def prepare_environment() -> None:
    """Set ``SPARK_LOCAL_IP`` and ``PYSPARK_PYTHON`` unless the user set them."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def spark_session(
    master: str | None = None,
    app_name: str = "cerebro-spark",
    conf: Mapping[str, str] | None = None,
    *,
    preload_torch: bool = False,
) -> SparkSession:
    """Return the active Spark session, or create one.

    Spark Connect (a Databricks notebook in Standard access mode, serverless, Databricks
    Connect): a ``master`` of ``sc://host:port`` connects to that server, and without
    ``master`` and with no classic session running, the active Connect session is
    returned. A Connect session's settings are the server's: ``conf`` is not applied.

    Args:
        master: Spark master URL (``local[2]``, ``spark://host:port``, ``yarn``,
            ``sc://host:port`` ...); ``None`` keeps what ``spark-submit`` or the
            environment set.
        app_name: Application name.
        conf: Extra Spark settings.
        preload_torch: The session's Python workers will import torch: with a ``local``
            or ``local-cluster`` master, and unless ``conf`` names a daemon module,
            PySpark's daemon imports it before it forks them (:data:`DAEMON_MODULE`).
    """
    prepare_environment()
    from pyspark.sql import SparkSession

    if master is not None and master.startswith("sc://"):  # a Spark Connect server
        return SparkSession.builder.remote(master).getOrCreate()
    if master is None:
        from pyspark import SparkContext

        remote = active_connect_session()
        if remote is not None and SparkContext._active_spark_context is None:
            return remote  # type: ignore[no-any-return]

    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in session_settings(master, conf, preload_torch=preload_torch).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def active_connect_session() -> Any | None:
    """The active Spark Connect session of this thread, if any (no import of Connect)."""
    connect = sys.modules.get("pyspark.sql.connect.session")
    if connect is None:  # no Connect session can exist: its module was never imported
        return None
    return connect.SparkSession.getActiveSession()


def is_connect_session(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (it has no ``SparkContext``)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def spark_setting(session: Any, key: str) -> str | None:
    """A Spark setting of ``session`` (classic or Connect), ``None`` when unset."""
    if is_connect_session(session):
        value = session.conf.get(key, None)
    else:
        value = session.sparkContext.getConf().get(key, None)
    return None if value is None else str(value)


def session_settings(
    master: str | None, conf: Mapping[str, str] | None, *, preload_torch: bool
) -> dict[str, str]:
    """``conf`` and the daemon module of :func:`spark_session` (its ``preload_torch``)."""
    settings = dict(conf or {})
    if preload_torch and master is not None and master.startswith("local"):
        settings.setdefault("spark.python.daemon.module", DAEMON_MODULE)
    return settings
