"""A local standalone cluster's daemons stop when the driver that started them is killed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cerebro_spark.cluster import SparkDaemons
from cerebro_spark.cluster._daemons import MASTER_CLASS, alive, wait_until

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DRIVER = """
import os, signal
from cerebro_spark.cluster import LocalStandaloneCluster
LocalStandaloneCluster(1, root={root!r}, cores=1, memory="512m", instance_type="local-core")
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_daemons_of_a_sigkilled_driver_are_stopped(tmp_path: Path) -> None:
    root = tmp_path / "cluster"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", DRIVER.format(root=str(root))], env=env, timeout=180
    )
    assert done.returncode == -9
    daemons = SparkDaemons(root)
    pids = [daemons.pid_of(MASTER_CLASS, 1)] + [
        daemons.pid_of("org.apache.spark.deploy.worker.Worker", i)
        for i in daemons.worker_instances(running=False)
    ]
    assert len(pids) == 2 and all(pids)
    try:
        wait_until(lambda: not any(alive(p) for p in pids if p), "the daemons to stop", 60)
    finally:
        daemons.stop_all()


def test_a_closed_cluster_stops_its_watcher(monkeypatch: pytest.MonkeyPatch) -> None:
    from cerebro_spark.cluster import LocalStandaloneCluster

    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    cluster = LocalStandaloneCluster(1, cores=1, memory="512m", instance_type="local-core")
    root = cluster.daemons.root
    watcher = cluster._reaper
    assert watcher.poll() is None  # watching while the cluster runs
    cluster.close()
    assert watcher.poll() is not None
    assert not root.exists()
