"""Spark's daemons start under a root whose pid files a crash left behind."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cerebro_spark.cluster import SparkDaemons
from cerebro_spark.cluster._daemons import MASTER_CLASS, WORKER_CLASS, alive, wait_until

pytestmark = pytest.mark.spark


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_master_starts_where_the_pid_file_names_an_unreaped_java(tmp_path: Path) -> None:
    """A daemon a watcher killed stays a zombie (``ps`` still says ``java``) where nothing
    reaps it; ``spark-daemon.sh`` alone would refuse to start a new one there."""
    zombie = subprocess.Popen(
        ["java", "-version"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    daemons = SparkDaemons(tmp_path / "cluster")
    try:
        wait_until(lambda: _state(zombie.pid) == "Z", "java to end unreaped", 60)
        assert not alive(zombie.pid)
        pids = daemons.root / "pids"
        pids.mkdir(parents=True)
        (pids / f"spark-cerebro-{MASTER_CLASS}-1.pid").write_text(f"{zombie.pid}\n")
        daemons.start_master()
        master = daemons.pid_of(MASTER_CLASS, 1)
        assert master is not None and master != zombie.pid and alive(master)
        assert daemons.alive_workers() == 0
    finally:
        daemons.stop_all()
        zombie.wait()
    assert not alive(master)


def test_a_worker_starts_where_its_pid_file_names_a_process_long_gone(tmp_path: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    daemons = SparkDaemons(tmp_path / "cluster")
    try:
        daemons.start_master()
        (daemons.root / "pids" / f"spark-cerebro-{WORKER_CLASS}-1.pid").write_text(f"{gone.pid}\n")
        daemons.start_worker(1, cores=1, memory="512m")
        wait_until(lambda: daemons.alive_workers() == 1, "the worker to register", 60)
        assert daemons.worker_instances() == [1]
    finally:
        daemons.stop_all()
