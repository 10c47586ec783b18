"""The Python daemon of sessions whose workers train: torch imported once, before forks."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.spark_daemon import preloaded
from cerebro_spark.spark_session import DAEMON_MODULE, session_settings


@pytest.mark.spark
@pytest.mark.torch
def test_a_training_sessions_workers_fork_from_a_daemon_that_imported_torch(spark: Any) -> None:
    """The shared test session is one (``preload_torch=True``, ``local[4]``): its workers'
    parent is the daemon module, and torch is in a worker before its task imports it."""
    assert spark.sparkContext.getConf().get("spark.python.daemon.module") == DAEMON_MODULE

    def where_am_i(_: Any) -> list[tuple[str, bool]]:  # pickled by value: a closure
        parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().replace(b"\0", b" ")
        return [(parent.decode(), "torch" in sys.modules)]

    seen = spark.sparkContext.parallelize(range(4), 4).mapPartitions(where_am_i).collect()
    assert seen and all(f"-m {DAEMON_MODULE}" in parent for parent, _ in seen), seen
    assert all(torch for _, torch in seen), seen


@pytest.mark.parametrize("master", ["local[2]", "local-cluster[2,1,1024]", "local"])
def test_local_masters_of_training_sessions_get_the_daemon(master: str) -> None:
    settings = session_settings(master, {"spark.ui.enabled": "false"}, preload_torch=True)
    assert settings == {"spark.ui.enabled": "false", "spark.python.daemon.module": DAEMON_MODULE}


@pytest.mark.parametrize(
    ("master", "preload"),
    [("spark://10.0.0.5:7077", True), ("yarn", True), (None, True), ("local[2]", False)],
)
def test_other_sessions_keep_pysparks_daemon(master: str | None, preload: bool) -> None:
    """Executors elsewhere may lack the module when they start (a ``--py-files`` archive)."""
    assert session_settings(master, None, preload_torch=preload) == {}


@pytest.mark.parametrize(
    ("environ", "imported"),
    [
        ({}, ("torch",)),
        ({"PYSPARK_EXECUTOR_MEMORY_MB": ""}, ("torch",)),
        ({"PYSPARK_EXECUTOR_MEMORY_MB": "1536"}, ()),
    ],
)
def test_under_a_pyspark_memory_cap_the_daemon_imports_nothing(
    environ: dict[str, str], imported: tuple[str, ...]
) -> None:
    """The cap applies after the fork; a worker checks PyTorch fits before importing it.

    End to end: tests/backends/test_spill_spark.py (its probe imports torch in a worker).
    """
    assert preloaded(environ) == imported


def test_the_users_daemon_module_wins() -> None:
    conf = {"spark.python.daemon.module": "pyspark.daemon"}
    assert session_settings("local[2]", conf, preload_torch=True) == conf
