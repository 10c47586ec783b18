"""Creating a Spark session the way every part of cerebro-spark needs it.

Two traps, measured: executors bind to the wrong interface unless ``SPARK_LOCAL_IP`` is
set, and run the wrong Python unless ``PYSPARK_PYTHON`` is. Both are set (when the user has
not set them) before the JVM starts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def prepare_environment() -> None:
    """Set ``SPARK_LOCAL_IP`` and ``PYSPARK_PYTHON`` unless the user set them."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def spark_session(
    master: str | None = None,
    app_name: str = "cerebro-spark",
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Return the active Spark session, or create one.

    Args:
        master: Spark master URL (``local[2]``, ``spark://host:port``, ``yarn`` ...);
            ``None`` keeps what ``spark-submit`` or the environment set.
        app_name: Application name.
        conf: Extra Spark settings.
    """
    prepare_environment()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
