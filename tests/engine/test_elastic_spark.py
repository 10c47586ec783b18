"""Elastic runs on real Spark clusters: the executor count follows the plan between rungs.

* The demo itself: ``cerebro-spark run conf/experiments/digits-elastic.yaml`` starts a
  standalone cluster on 127.0.0.1, shrinks it between rungs as planned, fails no Spark
  task and trains every unit once. That a resized run ends with the weights of its config
  on fixed workers is tests/reliability/test_elastic_crash.py's (the demo's CNNs took as
  long again on ``local[2]``).
* ``spark-submit`` of ``jobs/run.py`` to a standalone cluster the test starts, with
  ``manager: spark`` (the application's own executors) and a plan file written by
  ``cerebro-spark plan --format json``.

Each run is its own process (the CLI or spark-submit): a process holds one SparkContext.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from cerebro_spark.cluster import SparkDaemons
from cerebro_spark.cluster._daemons import wait_until
from cerebro_spark.engine import read_events
from cerebro_spark.store import open_store

pytestmark = [pytest.mark.spark, pytest.mark.torch, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "conf/experiments/digits-elastic.yaml"
ENV = {
    **os.environ,
    "SPARK_LOCAL_IP": "127.0.0.1",
    "PYSPARK_PYTHON": sys.executable,
    "PYSPARK_DRIVER_PYTHON": sys.executable,
    "PYTHONUNBUFFERED": "1",
    "PYTHONPATH": str(ROOT),
}


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).with_name("cerebro-spark")), *args]
    done = subprocess.run(command, env=ENV, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done


def events_of(store: Path, experiment: str) -> list[dict[str, Any]]:
    return read_events(open_store(str(store)).child(f"experiments/{experiment}"))


def check_followed_the_plan(events: list[dict[str, Any]]) -> list[int]:
    """Every stage ran on the executors its plan (the one in force) said; return them."""
    planned: dict[int, int] = {}
    ran = []
    for event in events:
        if event["event"] == "stage_plan":
            planned[event["stage"]] = event["workers"]
        if event["event"] == "stage_actual":
            assert event["workers"] == planned[event["stage"]], event
            ran.append(event["workers"])
    assert not any(e["event"] == "resize_failed" for e in events)
    return ran


def check_every_unit_once(events: list[dict[str, Any]]) -> None:
    ends = Counter(
        (e["trial"], e["epoch"], e["kind"], e["partition"])
        for e in events
        if e["event"] == "unit_end"
    )
    assert set(ends.values()) == {1}
    assert not any(e["event"] in ("unit_failed", "worker_lost") for e in events)


def test_the_elastic_demo_follows_its_plan(tmp_path: Path) -> None:
    store = tmp_path / "store"
    done = cli("run", str(DEMO), "--store", str(store), "--experiment-id", "elastic", cwd=ROOT)
    assert "the search cost $" in done.stdout and "total" in done.stdout
    events = events_of(store, "elastic")
    ran = check_followed_the_plan(events)
    assert ran[0] == 2 and ran[-1] == 1  # 16 trials on two executors, the last one on one
    resized = [e for e in events if e["event"] == "resized"]
    assert resized and all(e["workers"] == e["target"] for e in resized)
    assert any(e["target"] < e["from"] for e in resized)
    check_every_unit_once(events)
    retired = {e["worker"] for e in events if e["event"] == "worker_retired"}
    assert {v for e in resized for v in e.get("victims", [])} <= retired
    summary = next(e for e in events if e["event"] == "elastic_summary")
    assert summary["failed_tasks"] == 0  # no resize made Spark fail or re-run a task
    assert summary["usd"] > 0 and summary["instances"] >= 2


@pytest.fixture
def master(tmp_path: Path) -> Any:
    """A standalone master on 127.0.0.1, stopped with every worker daemon at the end."""
    cluster = SparkDaemons(tmp_path / "cluster")
    try:
        cluster.start_master()
        yield cluster
    finally:
        for instance in cluster.worker_instances():
            cluster.crash_worker(instance)
        cluster.stop_all()
        assert not cluster.worker_instances(), "worker daemons still running"


@pytest.fixture
def daemons(master: SparkDaemons) -> SparkDaemons:
    """The master and two worker daemons of one core each, started at once (each start
    waits seconds for its JVM), and maybe not registered yet: :func:`registered`."""
    with ThreadPoolExecutor(2) as starting:
        for done in [starting.submit(master.start_worker, i, 1, "1g") for i in (1, 2)]:
            done.result()
    return master


def registered(daemons: SparkDaemons, workers: int = 2) -> None:
    """Wait until the master counts ``workers`` alive worker daemons."""
    wait_until(lambda: daemons.alive_workers() == workers, f"{workers} worker daemons", 120)


def small_sha(tmp_path: Path, elastic: dict[str, Any], spark: dict[str, Any]) -> Path:
    """SHA of 8 small MLPs (rungs of 1, 2, 4 epochs) following the plan file ``plan.json``
    (written by ``cerebro-spark plan --format json``, its workers set to 2, 1, 1)."""
    config = yaml.safe_load(DEMO.read_text())
    config.update(name="small", epochs=4, procedure={"name": "sha", "eta": 2, "num_trials": 8})
    config["space"] = {"model": "cerebro_spark.training:MLPSpec", "hidden_units": [32],
                       "lr": {"loguniform": [1e-3, 1e-2]}, "batch_size": 32}  # fmt: skip
    config["spark"] = spark
    plan = tmp_path / "plan.json"
    config["deadline"] = 600
    config["elastic"] = {
        "prices": str(ROOT / "conf/prices/local.yaml"),
        "instance_type": "local-core",
        "profile": str(ROOT / "conf/profiles/digits-local.yaml"),
        **elastic,
    }
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    written = cli("plan", str(path), "--format", "json", cwd=tmp_path).stdout
    raw = json.loads(written[written.index("{") :])
    assert [s["trials"] for s in raw["stages"]] == [8, 4, 2]
    for stage, workers in zip(raw["stages"], [2, 1, 1], strict=True):
        stage["workers"] = workers
    plan.write_text(json.dumps(raw))
    config["elastic"]["plan"] = str(plan)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_spark_submit_follows_a_plan_file_on_a_standalone_cluster(
    tmp_path: Path, daemons: SparkDaemons
) -> None:
    """``manager: spark``: the application's own executors, released with killExecutors."""
    path = small_sha(
        tmp_path,
        {"manager": "spark", "spark": {"max_executors": 2}},
        {"conf": {"spark.ui.enabled": False}},
    )  # (written while the worker daemons register)
    registered(daemons)
    submit = Path(sys.executable).with_name("spark-submit")
    done = subprocess.run(
        [
            str(submit),
            "--master",
            daemons.url,
            "--conf",
            "spark.executor.cores=1",
            "--conf",
            "spark.task.cpus=1",
            "--conf",
            "spark.executor.memory=1g",
            "--conf",
            "spark.dynamicAllocation.enabled=false",
            str(ROOT / "jobs/run.py"),
            str(path),
            "--experiment-id",
            "submitted",
        ],
        env=ENV,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    events = events_of(tmp_path / "runs", "submitted")
    assert check_followed_the_plan(events) == [2, 1, 1]
    check_every_unit_once(events)
    summary = next(e for e in events if e["event"] == "elastic_summary")
    assert summary["failed_tasks"] == 0


def test_a_databricks_cluster_follows_a_plan_file(tmp_path: Path, master: SparkDaemons) -> None:
    """``manager: databricks`` through a fake workspace whose nodes are worker daemons."""
    from tests.cluster.fake_databricks import FakeDatabricks

    daemons = master
    with FakeDatabricks(2, daemons=daemons, resize_s=1.0) as fake:
        spark = {
            "master": daemons.url,
            "conf": {
                "spark.ui.enabled": False,
                "spark.databricks.clusterUsageTags.clusterId": fake.cluster_id,
                "spark.executor.cores": 1,
                "spark.task.cpus": 1,
                "spark.executor.memory": "1g",
                "spark.dynamicAllocation.enabled": False,
            },
        }
        databricks = {"host": fake.host, "token_env": "FAKE_DBX_TOKEN", "resize_retry_s": 60}
        path = small_sha(tmp_path, {"manager": "databricks", "databricks": databricks}, spark)
        registered(daemons)  # the fake's two nodes (they register while the plan is written)
        command = [str(Path(sys.executable).with_name("cerebro-spark")), "run", str(path),
                   "--experiment-id", "databricks"]  # fmt: skip
        done = subprocess.run(
            command, env={**ENV, "FAKE_DBX_TOKEN": fake.token}, cwd=tmp_path,
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-5000:]
        resized = [c.body.get("num_workers") for c in fake.calls
                   if c.path.endswith("/clusters/resize") and c.status == 200]  # fmt: skip
    events = events_of(tmp_path / "runs", "databricks")
    assert check_followed_the_plan(events) == [2, 1, 1]
    assert resized[0] == 1 and resized[-1] == 2  # shrunk by the plan, restored by close
    ends = Counter((e["trial"], e["epoch"], e["kind"], e["partition"]) for e in events
                   if e["event"] == "unit_end")  # fmt: skip
    assert set(ends.values()) == {1}
    assert not any(e["event"] == "unit_failed" for e in events)
