"""SparkBackend on a real standalone cluster on 127.0.0.1: executor loss and arrival, and
the engine surviving an executor lost mid-epoch.

The module starts a master and two worker daemons (one core each) with
``$SPARK_HOME/sbin/spark-daemon.sh``, logs and pid files under a temporary directory, and
stops them all at the end. The Spark driver runs in a child process (this very module, run
with ``python -m``): a process has one SparkContext, and the test process may already hold
a local one. The child runs both scenarios in one Spark application, kills and starts
worker daemons itself at the moments a scenario needs (an executor is "killed" by killing
its worker daemon and every process it started, as a crashed machine would), and writes a
JSON report per scenario that the tests check. Group units across executors, a rank's
executor lost mid-group and a retire are ``test_local_cluster.py``'s
(``cluster_scenarios.py``): they ran here too, a third of this module's time, and differed
only in how an executor dies.

Run alone: ``pytest tests/backends/test_standalone_cluster.py``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.cluster import SparkDaemons
from cerebro_spark.cluster._daemons import WORKER_CLASS, alive, descendants, wait_until

ROOT = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT_S = 900

pytestmark = [pytest.mark.spark, pytest.mark.torch, pytest.mark.slow]


def _wait(condition: Callable[[], bool], what: str, timeout_s: float) -> float:
    """Wait for ``condition``; return the seconds it took."""
    try:
        return wait_until(condition, what, timeout_s)
    except TimeoutError as error:
        raise AssertionError(str(error)) from None


class Cluster(SparkDaemons):
    """The package's standalone daemons, and what the scenarios need besides."""

    def start_worker(self, instance: int, cores: int = 1, memory: str = "2g") -> None:
        """A worker daemon of one core (its executor gets 1g: spark.executor.memory)."""
        super().start_worker(instance, cores=cores, memory=memory)

    def crash_worker(self, instance: int) -> None:
        """Crash a worker daemon's machine; wait until the master counts it gone."""
        alive_before = self.alive_workers()
        running = self.pid_of(WORKER_CLASS, instance)
        super().crash_worker(instance)
        if running is not None and alive_before > 0:
            _wait(lambda: self.alive_workers() < alive_before, "the master to see it gone", 60)

    def instance_running(self, executor_id: str) -> int:
        """The worker daemon whose work directory holds executor ``executor_id``."""
        instance = self.instance_of(executor_id)
        if instance is None:
            raise AssertionError(f"no live worker daemon runs executor {executor_id}")
        return instance

    def ensure_workers(self, count: int) -> None:
        """Start worker daemons (new instance numbers) until ``count`` are alive."""
        while self.alive_workers() < count:
            before = self.alive_workers()
            self.start_worker(self.next_instance())
            _wait(
                lambda before=before: self.alive_workers() > before,  # type: ignore[misc]
                "a worker daemon to register",
                120,
            )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("standalone")
    cluster = Cluster(root)
    try:
        cluster.start_master(timeout_s=180)  # a loaded 2-core machine: JVMs start slowly
        # Both daemons at once (spark-daemon.sh waits seconds for each); they register
        # while the child driver starts, which waits for their two executors.
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            for started in [pool.submit(cluster.start_worker, i) for i in (1, 2)]:
                started.result()
        yield cluster
    finally:
        for instance in cluster.worker_instances():
            cluster.crash_worker(instance)
        cluster.stop_all()
        leftovers = [p for p in (root / "pids").glob("*.pid") if alive(int(p.read_text()))]
        assert not leftovers, f"daemons still running: {leftovers}"


@pytest.fixture(scope="module")
def reports(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run both scenarios in a child driver process; return its reports by scenario."""
    tmp = tmp_path_factory.mktemp("driver")
    report = tmp / "report.json"
    args = {"cluster": cluster.to_json(), "tmp": str(tmp), "report": str(report)}
    log = tmp / "driver.log"
    with log.open("w") as sink:
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.backends.test_standalone_cluster", json.dumps(args)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
        try:
            child.wait(timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for pid in [child.pid, *descendants(child.pid)]:  # its JVM and Python workers
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            child.wait()
    lines = log.read_text(errors="replace").splitlines()
    tail = "\n".join(line for line in lines if " WARN " not in line)[-8000:]
    assert child.returncode == 0 and report.exists(), f"driver failed ({child.returncode}):\n{tail}"
    result: dict[str, Any] = json.loads(report.read_text())
    logging.getLogger(__name__).info("reports: %s", result)
    return result


def scenario(reports: dict[str, Any], name: str) -> dict[str, Any]:
    report: dict[str, Any] = reports[name]
    if "error" in report:
        pytest.fail(f"scenario {name} failed in the driver:\n{report['error']}")
    return report


# -- the tests -----------------------------------------------------------------------------------


def test_executor_loss_and_arrival(reports: dict[str, Any]) -> None:
    report = scenario(reports, "backend")
    assert report["workers_at_start"] == {"w0": [0, 2], "w1": [1, 3]}
    assert len(set(report["executors_at_start"].values())) == 2
    assert "driver" not in report["executors_at_start"].values()
    assert report["lost_error"].startswith("WorkerLostError: worker w1 was lost")
    assert "while it ran the train unit" in report["lost_error"]
    assert report["after_loss"] == {"w0": [0, 1, 2, 3]}
    assert report["joined"]["worker"] == "w2" and report["joined"]["partitions"]
    assert report["joined"]["executor"] not in report["executors_at_start"].values()
    assert report["after_executor_kill"] == ["w0"]
    assert report["stats"]["registered"] >= 3  # the cluster may replace the killed executor
    assert sum(report["stats"]["lost"].values()) == 2


def test_engine_survives_a_lost_executor_mid_epoch(reports: dict[str, Any]) -> None:
    report = scenario(reports, "engine")
    ends = Counter(tuple(key) for key in report["unit_ends"])
    assert len(ends) == 2 * 2 * 2 * 4  # trials x epochs x kinds x partitions
    assert set(ends.values()) == {1}, [key for key, n in ends.items() if n > 1]
    assert report["lost_workers"], "no worker was lost"
    assert report["finished"] and report["trials_completed"] == 2


# -- the child driver --------------------------------------------------------------------------


def _child_session(cluster: Cluster, name: str) -> Any:
    from cerebro_spark.spark_session import spark_session

    return spark_session(
        cluster.url,
        name,
        {
            "spark.ui.enabled": "false",
            "spark.executor.memory": "1g",
            "spark.executor.cores": "1",
            "spark.task.cpus": "1",
            "spark.dynamicAllocation.enabled": "false",
            "spark.executorEnv.PYTHONPATH": str(ROOT),
        },
    )


def _executors(session: Any) -> list[str]:
    ids = session.sparkContext._jsc.sc().getExecutorIds().mkString("\n")
    return [i for i in str(ids).split("\n") if i]


def _scenario_backend(cluster: Cluster, session: Any, tmp: Path) -> dict[str, Any]:
    """Loss of an executor mid-unit, re-homing, then a new executor's worker joining."""
    from cerebro_spark.backends import SparkBackend, WorkerJob
    from cerebro_spark.errors import WorkerLostError
    from cerebro_spark.store import open_store
    from tests.backends.contract import GATED, gated, make_dataset, result, train_task

    report: dict[str, Any] = {}
    dataset = make_dataset(tmp / "dataset")
    job = WorkerJob(dataset.uri, open_store(str(tmp / "store")), torch_threads=1)
    # The worker daemons were started with this driver: both register, then their executors.
    _wait(lambda: cluster.alive_workers() == 2, "two worker daemons to register", 180)
    _wait(lambda: len(_executors(session)) == 2, "two executors", 180)
    backend = SparkBackend(spark=session, heartbeat_s=1.0, heartbeat_timeout_s=10.0, poll_s=1.0)
    try:
        begun = time.monotonic()
        backend.start(job)  # num_workers=None: one per executor slot
        backend.wait_started(120.0)
        report["start_seconds"] = time.monotonic() - begun
        held = {w: sorted(i.partitions) for w, i in backend.workers().items()}
        report["workers_at_start"] = held
        report["executors_at_start"] = backend.executors()
        for worker_id, partitions in held.items():
            assert result(backend.submit(worker_id, train_task("t", partitions[0]))).rows > 0
        # Crash the machine of w1's executor while w1 runs a unit.
        victim = cluster.instance_running(str(backend.executors()["w1"]))
        marker = tmp / "started"
        running = backend.submit(
            "w1", train_task("k", 1, spec=GATED, params=gated(marker, [tmp / "never"]))
        )
        _wait(marker.exists, "the unit to start", 60)
        killed_at = time.monotonic()
        cluster.crash_worker(victim)
        try:
            running.result(timeout=120)
            raise AssertionError("the unit on the killed executor succeeded")
        except WorkerLostError as exc:
            report["lost_error"] = f"{type(exc).__name__}: {exc}"
        report["loss_seconds"] = time.monotonic() - killed_at
        report["after_loss"] = {w: sorted(i.partitions) for w, i in backend.workers().items()}
        for partition in (1, 3):  # re-homed from w1: they still run
            out = result(backend.submit("w0", train_task("m", partition)))
            assert out.rows == dataset.manifest.partition("train", partition).rows
        info = backend.workers()["w0"]
        assert info.bytes_read == dataset.bytes_of(info.partitions), info
        # A new worker daemon: its executor gets a new worker, which joins with replicas.
        begun = time.monotonic()
        cluster.start_worker(victim + 10)
        _wait(lambda: "w2" in backend.workers(), "a worker on the new executor", 180)
        report["join_seconds"] = time.monotonic() - begun
        joined = backend.workers()["w2"]
        report["joined"] = {
            "worker": "w2",
            "partitions": sorted(joined.partitions),
            "executor": backend.executors()["w2"],
        }
        assert result(backend.submit("w2", train_task("j", min(joined.partitions)))).rows > 0
        # Killing a worker's executor through Spark is a loss like any other.
        begun = time.monotonic()
        backend.kill_worker("w2", executor=True)
        report["executor_kill_seconds"] = time.monotonic() - begun
        report["after_executor_kill"] = sorted(backend.workers())
        report["stats"] = dataclasses.asdict(backend.stats())
    finally:
        backend.close()
    return report


def _scenario_engine(cluster: Cluster, session: Any, tmp: Path) -> dict[str, Any]:
    """The engine end to end on digits, an executor lost in the first epoch: the first
    units of both trials wait in ``build_model`` (GatedSpec) until a daemon is stopped."""
    from cerebro_spark.backends import SparkBackend
    from cerebro_spark.engine import parse_config, read_events, run_experiment
    from cerebro_spark.store import open_store

    store = tmp / "store"
    begun, release = tmp / "begun", tmp / "release"
    config = parse_config(
        {
            "name": "standalone",
            "seed": 3,
            "store": str(store),
            "data": {"source": "sklearn:digits", "partitions": 4},
            "procedure": "grid",
            "epochs": 2,
            "workers": 2,
            "space": {
                "model": "tests.backends.failing_spec:GatedSpec",
                "hidden_units": {"grid": [[16], [32]]},
                "lr": 0.01,
                "batch_size": 64,
                "marker": str(begun),
                "wait_for": [str(release)],
            },
        }
    )
    cluster.ensure_workers(2)
    _wait(lambda: len(_executors(session)) == 2, "two executors", 120)
    backends: list[SparkBackend] = []
    outcome: dict[str, Any] = {}

    def factory(config: Any) -> SparkBackend:
        backend = SparkBackend(
            config.workers,
            spark=session,
            heartbeat_s=1.0,
            heartbeat_timeout_s=10.0,
            start_timeout_s=150.0,
        )
        backends.append(backend)
        return backend

    def run() -> None:
        try:
            result = run_experiment(config, experiment_id="e2e", backend_factory=factory)
            outcome["trials"] = [t.status for t in result.trials]
        except BaseException as exc:
            outcome["error"] = repr(exc)
            raise

    thread = threading.Thread(target=run, name="experiment")
    thread.start()
    _wait(lambda: begun.exists() or not thread.is_alive(), "the first units of epoch 0", 200)
    assert thread.is_alive(), outcome
    # start() returns with the first ready worker: w1 may still be loading, or not located
    _wait(
        lambda: backends[0].executors().get("w1") is not None or not thread.is_alive(),
        "worker w1 to be ready on an executor",
        120,
    )
    assert thread.is_alive(), outcome
    executor = str(backends[0].executors()["w1"])
    cluster.crash_worker(cluster.instance_running(executor))
    release.touch()
    thread.join(timeout=300)
    assert not thread.is_alive(), "the experiment did not finish"
    assert "error" not in outcome, outcome
    events = read_events(open_store(str(store)).child("experiments/e2e"))
    return {
        "unit_ends": [
            [e["trial"], e["epoch"], e["kind"], e["partition"]]
            for e in events
            if e["event"] == "unit_end"
        ],
        "lost_workers": [e["worker"] for e in events if e["event"] == "worker_lost"],
        "lost_units": [
            [e["trial"], e["epoch"], e["kind"], e["partition"]]
            for e in events
            if e["event"] == "unit_failed" and e["reason"] == "worker_lost"
        ],
        "finished": any(e["event"] == "experiment_end" for e in events),
        "trials_completed": sum(1 for status in outcome.get("trials", []) if status == "completed"),
    }


def _child_main(raw: str) -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(threadName)s %(name)s: %(message)s"
    )
    args = json.loads(raw)
    cluster = Cluster.from_json(args["cluster"])
    tmp = Path(args["tmp"])
    reports: dict[str, Any] = {}
    session = _child_session(cluster, "cerebro-standalone")
    try:
        for name, run in (("backend", _scenario_backend), ("engine", _scenario_engine)):
            (tmp / name).mkdir()
            begun = time.monotonic()
            try:
                reports[name] = run(cluster, session, tmp / name)
            except Exception:
                logging.getLogger("standalone").exception("scenario %s failed", name)
                reports[name] = {"error": traceback.format_exc()}
            reports[name]["seconds"] = time.monotonic() - begun
    finally:
        session.stop()
    Path(args["report"]).write_text(json.dumps(reports, indent=2, default=str))


if __name__ == "__main__":
    _child_main(sys.argv[1])
