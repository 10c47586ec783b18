"""The elastic controller follows a plan between stages, bills it, re-plans and stops.

The engine runs successive halving on a real WorkerPool over the in-memory fake transport
(no torch, no Spark) with a fake cluster whose executors are the pool's workers: growing
starts workers (as new executors bring them), shrinking releases the victims' executors.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.backends import WorkerInfo, WorkerPool
from cerebro_spark.cluster import Capabilities, ClusterManager, CostMeter, Executor
from cerebro_spark.driver import cost_table
from cerebro_spark.elastic import parse_catalog
from cerebro_spark.engine import (
    ExperimentConfig,
    experiment_spec,
    load_state,
    parse_config,
    read_events,
    run_experiment,
)
from cerebro_spark.engine._elastic import ElasticController, StagePlan, victims_to_retire
from cerebro_spark.store import open_store
from tests.backends import fake_transport
from tests.backends.fake_transport import ThreadTransport

PRICE = 36.0  # dollars per instance-hour: a cent per second, so that cents show


@pytest.fixture(autouse=True)
def script() -> Iterator[fake_transport.Script]:
    yield fake_transport.reset()
    fake_transport.reset()


class PoolCluster(ClusterManager):
    """Executors are the pool's workers; growing starts workers, shrinking releases."""

    capabilities = Capabilities(resizable=True, choose_victims=True, min_executors=1)

    def __init__(self, grow: bool = True) -> None:
        self.pool: WorkerPool | None = None
        self.grow = grow
        self.requests: list[tuple[int, tuple[str, ...]]] = []
        self.since: dict[str, float] = {}

    def executors(self) -> list[Executor]:
        """One per live worker, ready or still starting (its executor is already there)."""
        assert self.pool is not None
        now = time.time()
        with self.pool._lock:
            live = list(self.pool._handles)
        return [
            Executor(w, "127.0.0.1", 1, since=self.since.setdefault(w, now), instance=w)
            for w in live
        ]

    def resize(self, target: int, victims: Sequence[str] = ()) -> None:
        assert self.pool is not None
        self.check_resize(target, victims)
        self.requests.append((target, tuple(victims)))
        if self.grow:
            for _ in range(target - len(self.executors())):
                threading.Thread(target=self.pool.add_worker, daemon=True).start()


def sha_config(store: Path, trials: int = 8) -> ExperimentConfig:
    return parse_config(
        {
            "name": "elastic",
            "seed": 5,
            "store": str(store),
            "data": {"source": "sklearn:digits", "partitions": 4},
            "procedure": {"name": "sha", "eta": 2, "num_trials": trials},
            "epochs": 4,
            "workers": 4,
            "model": "tests.engine.free_spec:FreeSpec",  # built once by the pre-flight
            "space": {"hidden": {"choice": [1, 2, 3, 4, 5, 6, 7, 8]}},
        }
    )


CATALOG = parse_catalog(
    {
        "billing": {"model": "per_instance", "granularity_seconds": 0.001, "minimum_seconds": 0},
        "instances": {"box": {"usd_per_hour": PRICE}},
    }
)


def controller(
    cluster: ClusterManager,
    cfg: ExperimentConfig,
    workers: list[int],
    *,
    budget: float | None = None,
    resize_timeout: float = 30.0,
    replan: Any = None,
    replan_drift: float = 1e9,
) -> ElasticController:
    spec = experiment_spec(cfg)
    stages, end = [], 0.0
    for i, (stage, w) in enumerate(zip(spec.stages, workers, strict=True)):
        stages.append(StagePlan(i, stage.trials, stage.epochs, w, end, end + 2.0, 0.01 * w))
        end += 2.0
    return ElasticController(
        cluster,
        CostMeter(cluster, CATALOG, "box", interval_s=0.2),
        stages,
        deadline=600.0,
        budget=budget,
        started_at=time.time(),
        lead_seconds=0.0,
        resize_timeout=resize_timeout,
        replan_drift=replan_drift,
        replan=replan,
    )


def run(
    tmp_path: Path, cluster: PoolCluster, hook: ElasticController, first: int
) -> list[dict[str, Any]]:
    cfg = sha_config(tmp_path)

    def factory(c: ExperimentConfig) -> WorkerPool:
        cluster.pool = WorkerPool(ThreadTransport(), first, heartbeat_s=0.5, heartbeat_timeout_s=10)
        return cluster.pool

    run_experiment(cfg, experiment_id="e", backend_factory=factory, on_stage=hook)
    return read_events(open_store(str(tmp_path)).child("experiments/e"))


def round_workers(events: list[dict[str, Any]]) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for e in events:
        if e["event"] == "unit_end":
            out.setdefault(e["round"], set()).add(e["worker"])
    return out


def test_the_cluster_follows_the_plan_and_every_stage_is_billed(tmp_path: Path) -> None:
    cluster = PoolCluster()
    cfg = sha_config(tmp_path)
    hook = controller(cluster, cfg, [4, 2, 3])  # shrink, then grow
    events = run(tmp_path, cluster, hook, first=4)
    by_round = round_workers(events)
    # 8 trials on 4 workers, 4 on 2; the last stage's 2 trials hop over its 3 workers.
    assert [len(by_round[0]), len(by_round[1])] == [4, 2]
    assert by_round[1] < by_round[0] and len(by_round[2] | by_round[3]) <= 3
    resized = [e for e in events if e["event"] == "resized"]
    assert [(e["stage"], e["from"], e["target"]) for e in resized] == [(1, 4, 2), (2, 2, 3)]
    # Shrinking retired the two workers holding the fewest sole copies: no unit failed.
    assert not any(e["event"] in ("unit_failed", "worker_lost") for e in events)
    retired = [e["worker"] for e in events if e["event"] == "worker_retired"][:2]
    assert sorted(retired) == sorted(resized[0]["victims"])
    keys = Counter((e["trial"], e["epoch"], e["kind"], e["partition"]) for e in events
                   if e["event"] == "unit_end")  # fmt: skip
    assert set(keys.values()) == {1} and len(keys) == (8 + 4 + 2 * 2) * 2 * 4
    plans = [e for e in events if e["event"] == "stage_plan"]
    actuals = [e for e in events if e["event"] == "stage_actual"]
    assert [p["workers"] for p in plans] == [4, 2, 3]
    assert [a["stage"] for a in actuals] == [0, 1, 2]
    assert [a["workers"] for a in actuals] == [4, 2, 3]
    summary = next(e for e in events if e["event"] == "elastic_summary")
    # The bill is the instance-seconds held at a cent a second, stage by stage.
    assert summary["usd"] == pytest.approx(summary["instance_seconds"] * PRICE / 3600, rel=1e-2)
    assert sum(a["usd"] for a in actuals) == pytest.approx(summary["usd"], rel=1e-2)
    assert all(a["usd"] > 0 for a in actuals)
    _, state = load_state(str(tmp_path), "e")
    table = cost_table(state)
    # Three stages, the totals against the first and the last plan, and their legend.
    assert table is not None and "total" in table and table.count("\n") == 2 + 3 + 2
    assert summary["deadline_met"] and summary["budget_met"] and not summary["misses"]
    assert summary["first_plan"] == summary["last_plan"] == {"seconds": 6.0, "usd": 0.09}


def test_a_budget_stops_the_search_before_a_stage_would_overrun_it(tmp_path: Path) -> None:
    cluster = PoolCluster()
    cfg = sha_config(tmp_path)
    # Stage 1 is planned at $0.02 more: a budget of $0.015 cannot pay for it.
    hook = controller(cluster, cfg, [2, 2, 2], budget=0.015)
    hook.stages[0] = StagePlan(0, 8, 1, 2, 0.0, 2.0, 0.0)
    events = run(tmp_path, cluster, hook, first=2)
    stopped = [e for e in events if e["event"] == "search_stopped"]
    assert len(stopped) == 1 and "budget of $0.0150 would be overrun" in stopped[0]["reason"]
    assert {e["round"] for e in events if e["event"] == "unit_end"} == {0}
    _, state = load_state(str(tmp_path), "e")
    assert state.finished and all(t.status == "stopped" for t in state.trials.values())
    assert state.elastic_summary is not None and state.elastic_summary["stopped"]


def test_a_resize_that_times_out_goes_on_with_what_it_has_and_replans(tmp_path: Path) -> None:
    cluster = PoolCluster(grow=False)  # asks for executors that never come
    cfg = sha_config(tmp_path)
    asked: list[tuple[int, float, float | None, int]] = []

    def replan(
        index: int, seconds: float, usd: float | None, running: int, profile: Any
    ) -> list[StagePlan]:
        asked.append((index, seconds, usd, running))
        return [StagePlan(i, 2, 2, running, 0.0, 1.0, 0.0) for i in range(index, 3)]

    hook = controller(cluster, cfg, [2, 3, 3], resize_timeout=1.0, replan=replan)
    events = run(tmp_path, cluster, hook, first=2)
    failed = [e for e in events if e["event"] == "resize_failed"]
    assert [(e["stage"], e["target"], e["workers"]) for e in failed] == [(1, 3, 2)]
    assert "did not reach 3" in failed[0]["error"] or "ResizeTimeout" in failed[0]["error"]
    assert [a[0] for a in asked] == [2] and asked[0][3] == 2
    assert any(e["event"] == "replanned" for e in events)
    by_round = round_workers(events)
    assert all(len(w) == 2 for w in by_round.values())
    keys = Counter((e["trial"], e["epoch"], e["kind"], e["partition"]) for e in events
                   if e["event"] == "unit_end")  # fmt: skip
    assert set(keys.values()) == {1}
    assert next(e for e in events if e["event"] == "experiment_end")


def test_victims_hold_the_fewest_sole_copies() -> None:
    def info(w: str, parts: set[int]) -> WorkerInfo:
        return WorkerInfo(worker_id=w, partitions=frozenset(parts), host="h", device="cpu",
                          bytes_read=0, executor_id=None)  # fmt: skip

    workers = {
        "w0": info("w0", {0, 1}),
        "w1": info("w1", {2, 3}),
        "w2": info("w2", {0, 2}),  # replicas only
        "w3": info("w3", {1}),  # a replica of w0's partition 1
    }
    # No sole copies on w2 or w3; w3 holds fewer partitions: the fewest replicas go.
    assert victims_to_retire(workers, 1) == ["w3"]
    # Then partition 1 is a sole copy on w0, partition 3 on w1; w2 still holds none.
    assert victims_to_retire(workers, 2) == ["w3", "w2"]
    # w0 and w1 tie (two sole copies, two partitions): the newest goes; never the last.
    assert victims_to_retire(workers, 9) == ["w3", "w2", "w1"]


def test_stage_times_count_from_run_on_the_drivers_clock(tmp_path: Path) -> None:
    """One clock: the first stage begins at ``run`` (its start-up is its own), every stage's
    end and the summary are experiment seconds since ``run``, the clock the procedure's
    deadline and the log's experiment time read; a re-plan is asked with the deadline
    minus that time."""
    cluster = PoolCluster()
    cfg = sha_config(tmp_path)
    asked: list[float] = []

    def replan(
        index: int, seconds: float, usd: float | None, running: int, profile: Any
    ) -> list[StagePlan]:
        asked.append(seconds)
        return [StagePlan(i, 2, 2, running, 0.0, 1.0, 0.0) for i in range(index, 3)]

    hook = controller(cluster, cfg, [2, 2, 2], replan=replan, replan_drift=0.0)
    events = run(tmp_path, cluster, hook, first=2)
    start = next(e for e in events if e["event"] == "experiment_start")
    assert start["startup"] > 0  # the pre-flight ran before it: experiment time already
    actuals = [e for e in events if e["event"] == "stage_actual"]
    assert actuals[0]["seconds"] == pytest.approx(actuals[0]["end"], abs=0.01)
    assert actuals[0]["end"] > start["startup"]
    for before, after in itertools.pairwise(actuals):
        assert after["end"] == pytest.approx(before["end"] + after["seconds"], abs=0.01)
    summary = next(e for e in events if e["event"] == "elastic_summary")
    assert summary["seconds"] == pytest.approx(actuals[-1]["end"], abs=0.01)
    _, state = load_state(str(tmp_path), "e")
    assert summary["seconds"] <= state.experiment_seconds + 0.01
    assert state.experiment_seconds - summary["seconds"] < 5.0  # the end's bookkeeping
    replans = [e for e in events if e["event"] == "replanned"]
    assert replans and asked[0] == pytest.approx(600.0 - replans[0]["elapsed"], abs=0.01)
    assert replans[0]["elapsed"] == pytest.approx(actuals[0]["end"], abs=0.05)
    # Stages are logged from 0 and shown from 1, as `plan` shows them.
    assert [a["stage"] for a in actuals] == [0, 1, 2]
    assert replans[0]["reason"].startswith("stage 1 took ")
    table = cost_table(state)
    assert table is not None
    assert [line.split()[0] for line in table.splitlines()[2:5]] == ["1", "2", "3"]
    # The report's timeline is on the same clock, zero at run: each stage's end marker is
    # written when its boundary (at the actual's end) is done.
    from cerebro_spark.report import load_report_data

    data = load_report_data(str(tmp_path), "e")
    assert data.origin == pytest.approx(start["time"] - start["startup"])
    ended = {m.label: m.time for m in data.markers if m.label.endswith(" ended")}
    for actual in actuals:
        shown = ended[f"stage {actual['stage'] + 1} ended"]
        assert actual["end"] - 0.01 <= shown <= actual["end"] + 10.0
    assert data.last == pytest.approx(state.experiment_seconds)


class NodesCluster(ClusterManager):
    """A platform's nodes, which the pool does not see arrive (Spark Connect's databricks
    manager): a resize changes the nodes at once and starts no worker."""

    def __init__(self, nodes: int, *, workers_follow: bool = False) -> None:
        self.capabilities = Capabilities(
            resizable=True, choose_victims=False, min_executors=1, workers_follow=workers_follow
        )
        self.nodes = nodes
        self.requests: list[int] = []
        self.began = time.time()

    def executors(self) -> list[Executor]:
        return [
            Executor(f"node-{i}", "127.0.0.1", 1, since=self.began, instance=f"node-{i}")
            for i in range(self.nodes)
        ]

    def resize(self, target: int, victims: Sequence[str] = ()) -> None:
        self.check_resize(target, victims)
        self.requests.append(target)
        self.nodes = target


def run_on_nodes(tmp_path: Path, cluster: NodesCluster, hook: ElasticController) -> list[Any]:
    def factory(c: ExperimentConfig) -> WorkerPool:
        return WorkerPool(ThreadTransport(), 2, heartbeat_s=0.5, heartbeat_timeout_s=10)

    cfg = sha_config(tmp_path)
    run_experiment(cfg, experiment_id="e", backend_factory=factory, on_stage=hook)
    return read_events(open_store(str(tmp_path)).child("experiments/e"))


def test_where_the_pool_does_not_see_new_executors_the_controller_starts_their_workers(
    tmp_path: Path,
) -> None:
    """Spark Connect: the nodes a grow adds get no worker from the pool; the controller
    waits for them and starts one on each (``Capabilities.workers_follow`` false)."""
    cluster = NodesCluster(2)
    events = run_on_nodes(tmp_path, cluster, controller(cluster, sha_config(tmp_path), [2, 1, 3]))
    assert cluster.requests == [1, 3]
    resized = [e for e in events if e["event"] == "resized"]
    assert [(e["stage"], e["from"], e["target"], e["workers"]) for e in resized] == [
        (1, 2, 1, 1),
        (2, 1, 3, 3),
    ]
    assert [a["workers"] for a in events if a["event"] == "stage_actual"] == [2, 1, 3]
    assert not any(e["event"] in ("resize_failed", "unit_failed") for e in events)
    started = [e["worker"] for e in events if e["event"] == "worker_ready"]
    assert len(started) == 4  # two at the start, two the controller started for stage 3


def test_a_grow_the_pool_does_not_see_would_wait_in_vain_without_it(tmp_path: Path) -> None:
    """The same nodes said to be followed by the pool: nobody starts their workers."""
    cluster = NodesCluster(2, workers_follow=True)
    hook = controller(cluster, sha_config(tmp_path), [2, 2, 3], resize_timeout=1.0)
    events = run_on_nodes(tmp_path, cluster, hook)
    failed = [e for e in events if e["event"] == "resize_failed"]
    assert [(e["stage"], e["target"], e["workers"]) for e in failed] == [(2, 3, 2)]
