"""Scenarios for SparkBackend on a Spark cluster of two executors, run in a child driver.

A process holds one SparkContext and the test process may hold a local one, so
``test_local_cluster.py`` (``local-cluster[2,1,1024]``) runs these scenarios in a child
driver process and checks the JSON reports they return (the ``check_*`` functions). Each
scenario takes the Spark session, a scratch directory and a way to kill an executor as a
crash would (any cluster: ``test_standalone_cluster.py`` crashes worker daemons for its
own scenarios).

* :func:`group_scenario`: a group unit of two ranks on the two executors: rank 0's
  executor host is the rendezvous address, its port chosen by rank 0's worker and passed
  on by the driver; the all-reduced update equals one worker on the concatenated batches.
* :func:`engine_group_scenario`: the engine trains a trial with resources 2 in groups;
  then again, and one rank's executor is killed mid-group: the group fails whole, its unit
  goes back to the queue, and the run ends with every unit exactly once.
* :func:`retire_scenario`: a worker is retired, then its executor released: Spark
  reports no failed and no re-run task.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import traceback
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger("cluster-scenarios")

KillExecutor = Callable[[Any, str], None]
"""Kill executor ``id`` of the SparkBackend given (as a crash would)."""

SGD = {"hidden_units": [16], "optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "batch_size": 32}


def wait_for(
    condition: Callable[[], bool],
    what: str,
    timeout_s: float = 120.0,
    state: Callable[[], Any] = lambda: "",
) -> float:
    """Wait for ``condition``; return the seconds it took (``state`` goes in the error)."""
    begun = time.monotonic()
    while not condition():
        if time.monotonic() - begun > timeout_s:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what} {state()}")
        time.sleep(0.2)
    return time.monotonic() - begun


def executor_ids(session: Any) -> list[str]:
    ids = session.sparkContext._jsc.sc().getExecutorIds().mkString("\n")
    return [i for i in str(ids).split("\n") if i]


KILLED: set[str] = set()
"""Executors the scenarios killed (they linger in Spark's lists for seconds)."""


def settle(session: Any, count: int) -> None:
    """Wait until exactly ``count`` executors run and none of them was killed."""
    wait_for(
        lambda: len(ids := executor_ids(session)) == count and not KILLED & set(ids),
        f"exactly {count} executors, none of them killed",
        180,
        lambda: f"(executors {executor_ids(session)}, killed {sorted(KILLED)})",
    )


def failed_tasks(session: Any, executors: Collection[str] | None = None) -> int:
    """Failed tasks of the application so far, on live and dead executors (or on these)."""
    summaries = session.sparkContext._jsc.sc().statusStore().executorList(False)
    return sum(
        int(summary.failedTasks())
        for summary in (summaries.apply(i) for i in range(summaries.size()))
        if executors is None or str(summary.id()) in executors
    )


def worker_jobs(session: Any, groups: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    """Each worker's Spark jobs: status, and every stage attempt's task attempts."""
    sc = session.sparkContext
    tracker = sc.statusTracker()
    store = sc._jsc.sc().statusStore()
    jobs: dict[str, list[dict[str, Any]]] = {}
    for worker, group in groups.items():
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            stages = []
            for stage_id in job.stageIds:
                stage = tracker.getStageInfo(stage_id)
                for attempt in range(stage.currentAttemptId + 1):
                    tasks = store.taskList(stage_id, attempt, 100)
                    stages.append(
                        {
                            "stage_attempt": attempt,
                            "tasks": [
                                [int(tasks.apply(i).attempt()), str(tasks.apply(i).status())]
                                for i in range(tasks.size())
                            ],
                        }
                    )
            jobs.setdefault(worker, []).append({"status": str(job.status), "stages": stages})
    return jobs


# -- a group unit on two executors ---------------------------------------------------------


def group_scenario(session: Any, tmp: Path, kill: KillExecutor) -> dict[str, Any]:
    del kill
    from cerebro_spark.backends import SparkBackend, WorkerJob
    from cerebro_spark.data import read_partition
    from cerebro_spark.store import open_store
    from cerebro_spark.training import decode_checkpoint
    from cerebro_spark.units import group_tasks
    from tests.backends.contract import make_dataset, result, train_task
    from tests.training.training_fixtures import one_worker_on_concatenated_batches

    dataset = make_dataset(tmp / "dataset")
    store = open_store(str(tmp / "store"))
    settle(session, 2)
    report: dict[str, Any] = {}
    with SparkBackend(spark=session, heartbeat_s=1.0, heartbeat_timeout_s=10.0) as backend:
        backend.start(WorkerJob(dataset.uri, store, torch_threads=1))
        backend.wait_started()
        workers = backend.workers()
        report["workers"] = {w: [info.executor_id, info.host] for w, info in workers.items()}
        # A first ordinary unit, so that the group starts from trained weights.
        start = train_task("g", 0, params=SGD, out="start.pt", epoch_units=1)
        result(backend.submit("w0", start))
        base = train_task(
            "g", 0, params=SGD, epoch=1, epoch_units=4, checkpoint_in="start.pt", out="g.pt"
        )
        ranks = group_tasks(base, [0, 1], "two-executors")  # port 0: rank 0 chooses it
        assert 0 in workers["w0"].partitions and 1 in workers["w1"].partitions
        futures = backend.submit_group({"w0": ranks[0], "w1": ranks[1]})
        done = [result(futures["w0"]), result(futures["w1"])]
        report["ranks"] = [
            {
                "worker": r.worker_id,
                "rows": r.rows,
                "address": r.task.group.address if r.task.group else None,
                "port": r.task.group.port if r.task.group else None,
                "sha256": r.checkpoint_sha256,
            }
            for r in done
        ]
        parts = {p: read_partition(dataset.uri, "train", p) for p in (0, 1)}
        reference = one_worker_on_concatenated_batches(ranks, parts, store, dataset.manifest.info)
        saved = decode_checkpoint(store.get("g.pt"))["model"]
        before = decode_checkpoint(store.get("start.pt"))["model"]
        report["max_difference"] = max(
            float((reference[k] - saved[k]).abs().max()) for k in reference
        )
        report["moved"] = max(float((reference[k] - before[k]).abs().max()) for k in reference)
    return report


# -- the engine, a trial in groups, one rank's executor killed -------------------------------


@contextlib.contextmanager
def _grouped_grid() -> Iterator[None]:
    from cerebro_spark.search import GridSearch
    from cerebro_spark.search._registry import PROCEDURES

    class GroupedGrid(GridSearch):
        """Grid search whose trials ask for two workers each (Cerebro §5.7)."""

        def resources(self, trial_id: str) -> int:
            return 2

    PROCEDURES["grouped-grid"] = GroupedGrid
    try:
        yield
    finally:
        del PROCEDURES["grouped-grid"]


def engine_group_scenario(session: Any, tmp: Path, kill: KillExecutor) -> dict[str, Any]:
    """Two runs of one trial with resources 2: a clean one, then one in which rank 1's
    executor is killed while both ranks of the first group wait in ``build_model``."""
    from cerebro_spark.backends import SparkBackend

    begun, release = tmp / "begun", tmp / "release"
    backends: list[SparkBackend] = []

    def factory(config: Any) -> SparkBackend:
        backend = SparkBackend(
            config.workers,
            spark=session,
            heartbeat_s=1.0,
            heartbeat_timeout_s=10.0,
            start_timeout_s=150.0,
            poll_s=1.0,
        )
        backends.append(backend)
        return backend

    def kill_rank_1() -> None:
        wait_for(begun.exists, "the first group", 300)
        wait_for(  # located by the pool's monitor, not by start()
            lambda: getattr(backends[-1].workers().get("w1"), "executor_id", None) is not None,
            "worker w1's executor",
            60,
        )
        executor = backends[-1].workers()["w1"].executor_id
        assert executor is not None
        KILLED.add(executor)
        kill(backends[-1], executor)
        release.touch()

    settle(session, 2)
    gated = {"model": "tests.backends.failing_spec:GatedSpec", "marker": str(begun),
             "wait_for": [str(release)]}  # fmt: skip
    with _grouped_grid():
        clean = _run_grouped(tmp / "clean", factory, {})
        killer = threading.Thread(target=kill_rank_1, name="killer", daemon=True)
        killer.start()
        killed = _run_grouped(tmp / "killed", factory, gated)
        killer.join(timeout=60)
    return {"clean": clean, "killed": killed}


def _run_grouped(
    store: Path, factory: Callable[[Any], Any], space: dict[str, Any]
) -> dict[str, Any]:
    from cerebro_spark.engine import parse_config, read_events, run_experiment
    from cerebro_spark.store import open_store

    config = parse_config(
        {
            "name": "groups",
            "seed": 3,
            "store": str(store),
            "data": {"source": "sklearn:digits", "partitions": 4},
            "procedure": "grouped-grid",
            "epochs": 2,
            "workers": 2,
            "space": {
                "model": "cerebro_spark.training:MLPSpec",
                "hidden_units": [32],
                "lr": 0.003,
                "batch_size": 32,
                **space,
            },
        }
    )
    result = run_experiment(config, experiment_id="groups", backend_factory=factory)
    events = read_events(open_store(str(store)).child("experiments/groups"))
    return {
        "trials": [t.status for t in result.trials],
        "accuracy": result.trials[0].metrics.get("accuracy"),
        "unit_ends": [
            [e["trial"], e["epoch"], e["kind"], e["partition"], e["worker"], e.get("group")]
            for e in events
            if e["event"] == "unit_end"
        ],
        "failed": [
            [e["worker"], e["reason"], e.get("group"), e["partition"]]
            for e in events
            if e["event"] == "unit_failed"
        ],
        "lost": [e["worker"] for e in events if e["event"] == "worker_lost"],
    }


# -- retire, then release the executor -------------------------------------------------------


def retire_scenario(session: Any, tmp: Path, kill: KillExecutor) -> dict[str, Any]:
    del kill
    from cerebro_spark.backends import SparkBackend, WorkerJob
    from cerebro_spark.store import open_store
    from tests.backends.contract import make_dataset, result, train_task

    dataset = make_dataset(tmp / "dataset")
    sc = session.sparkContext
    settle(session, 2)
    report: dict[str, Any] = {}
    with SparkBackend(2, spark=session, heartbeat_s=1.0, heartbeat_timeout_s=10.0) as backend:
        backend.start(WorkerJob(dataset.uri, open_store(str(tmp / "store")), torch_threads=1))
        backend.wait_started()
        for worker, info in backend.workers().items():
            result(backend.submit(worker, train_task("t", min(info.partitions))))
        backend.changes()
        victim = backend.workers()["w1"]
        report["victim_executor"] = victim.executor_id
        report["workers_before"] = sorted(backend.workers())
        # Counted on the executors of this scenario's workers: an earlier scenario's lost
        # executor may have its tasks counted failed late, while this one runs.
        executors = {str(info.executor_id) for info in backend.workers().values()}
        report["failed_before"] = failed_tasks(session, executors)
        groups = dict(backend._spark_transport._groups)
        backend.retire("w1").result(timeout=120)
        report["after_retire"] = {w: sorted(i.partitions) for w, i in backend.workers().items()}
        report["changes"] = [[c.kind.value, c.worker.worker_id] for c in backend.changes()]
        report["jobs_after_retire"] = worker_jobs(session, groups)
        # Release the executor now that nothing runs on it (dynamic allocation off).
        released = bool(
            sc._jsc.sc().killExecutors(sc._jvm.PythonUtils.toSeq([str(victim.executor_id)]))
        )
        report["released"] = released
        report["release_seconds"] = wait_for(
            lambda: str(victim.executor_id) not in executor_ids(session), "the executor to go"
        )
        time.sleep(2.0)  # room for a (wrongly) re-run task to show up
        for partition in range(4):  # the remaining worker serves everything
            assert result(backend.submit("w0", train_task("after", partition))).rows > 0
        report["workers_after_release"] = sorted(backend.workers())
        report["jobs_after_release"] = worker_jobs(session, groups)
        report["stats"] = {"retired": backend.stats().retired, "lost": backend.stats().lost}
        # Counted before the close: closing the backend ends w0's task, and how (told to
        # stop, or killed after the grace on a slow machine) is not what this checks.
        report["failed_after"] = failed_tasks(session, executors)
    return report


# -- checks of the reports (in the test process) -------------------------------------------


def check_group_across_executors(report: dict[str, Any]) -> None:
    """Check :func:`group_scenario`'s report."""
    (e0, host0), (e1, _) = report["workers"]["w0"], report["workers"]["w1"]
    assert e0 != e1 and "driver" not in (e0, e1)
    rank0, rank1 = report["ranks"]
    assert (rank0["worker"], rank1["worker"]) == ("w0", "w1")
    # Rank 0's executor host is the rendezvous; its port was chosen by rank 0's worker.
    assert rank0["address"] == rank1["address"] == host0
    assert rank0["port"] == rank1["port"] > 0
    assert rank0["sha256"] is not None and rank1["sha256"] is None
    assert report["max_difference"] <= 1e-6 < 1e-2 < report["moved"]


def check_engine_group(report: dict[str, Any]) -> None:
    """Check :func:`engine_group_scenario`'s report."""
    for run in (report["clean"], report["killed"]):
        assert run["trials"] == ["completed"]
        assert run["accuracy"] > 0.8
        keys = [tuple(end[:4]) for end in run["unit_ends"]]
        assert len(keys) == len(set(keys)) == 2 * 2 * 4  # epochs x kinds x partitions
    clean = report["clean"]
    assert not clean["failed"] and not clean["lost"]
    train = [end for end in clean["unit_ends"] if end[2] == "train"]
    assert all(group is not None for *_, group in train)  # every train unit in a group of 2
    for group in {end[5] for end in train}:
        assert sorted(end[4] for end in train if end[5] == group) == ["w0", "w1"]
    killed = report["killed"]
    assert {(worker, reason) for worker, reason, _, _ in killed["failed"]} == {
        ("w0", "worker_lost"),
        ("w1", "worker_lost"),
    }
    assert len({group for _, _, group, _ in killed["failed"]}) == 1  # one group, failed whole
    assert killed["lost"][0] == "w1"


def check_retire(report: dict[str, Any]) -> None:
    """Check :func:`retire_scenario`'s report."""
    assert report["changes"] == [
        ["retiring", "w1"],
        ["partitions", "w0"],
        ["retired", "w1"],
    ]
    assert report["after_retire"] == {"w0": [0, 1, 2, 3]}
    one_success = [{"status": "SUCCEEDED", "stages": [{"stage_attempt": 0,
                                                      "tasks": [[0, "SUCCESS"]]}]}]  # fmt: skip
    assert report["jobs_after_retire"]["w1"] == one_success
    assert report["released"] is True
    # Releasing the executor afterwards kills nothing and makes Spark re-run nothing.
    assert report["jobs_after_release"]["w1"] == one_success
    (w0_job,) = report["jobs_after_release"]["w0"]
    assert w0_job["status"] == "RUNNING" and w0_job["stages"] == [
        {"stage_attempt": 0, "tasks": [[0, "RUNNING"]]}
    ]
    assert report["failed_after"] == report["failed_before"]
    assert report["workers_before"] == ["w0", "w1"]
    assert report["workers_after_release"] == ["w0"]
    assert report["stats"] == {"retired": 1, "lost": {}}


SCENARIOS: dict[str, Callable[[Any, Path, KillExecutor], dict[str, Any]]] = {
    "group": group_scenario,
    "engine_group": engine_group_scenario,
    "retire": retire_scenario,
}


def run_scenarios(
    session: Any, tmp: Path, names: list[str], kill: KillExecutor, report: Path
) -> None:
    """Run scenarios in order and write ``{name: report or {"error": ...}}`` to ``report``."""
    reports: dict[str, Any] = {}
    for name in names:
        (tmp / name).mkdir()
        begun = time.monotonic()
        try:
            reports[name] = SCENARIOS[name](session, tmp / name, kill)
        except Exception:
            logger.exception("scenario %s failed", name)
            reports[name] = {"error": traceback.format_exc()}
        reports[name]["seconds"] = time.monotonic() - begun
    report.write_text(json.dumps(reports, indent=2, default=str))
