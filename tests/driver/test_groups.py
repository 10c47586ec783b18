"""Group units end to end (Cerebro §5.7): a procedure gives each trial 2 workers.

Digits in 4 partitions on 2 LocalBackend workers (w0 holds 0 and 2, w1 holds 1 and 3),
2 trials, 2 epochs: every train unit is a group unit of 2 ranks trained data-parallel
with gloo. Checked: every (trial, epoch, partition) is trained exactly once, the models
learn, a replay reproduces every final checkpoint bit for bit, a driver killed between
the ``unit_end`` events of a group resumes to the very same weights, a worker killed in
the middle of a group unit loses nothing, and a backend without group units falls back
to one unit at a time.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.backends import Backend, LocalBackend
from cerebro_spark.driver import logged_group_plans
from cerebro_spark.engine import (
    EventLog,
    Experiment,
    ExperimentConfig,
    logged_visit_orders,
    parse_config,
    read_events,
    replay_experiment,
    resume_experiment,
    run_experiment,
)
from cerebro_spark.search import GridSearch, SearchSpace
from cerebro_spark.search._registry import PROCEDURES
from cerebro_spark.store import open_store

pytestmark = [pytest.mark.torch, pytest.mark.slow]

SPACE = {
    "model": "cerebro_spark.training:MLPSpec",
    "hidden_units": {"grid": [[32], [64]]},
    "lr": {"grid": [0.003]},
    "batch_size": 32,
}


class GroupedGrid(GridSearch):
    """Grid search whose every trial trains on ``group_size`` workers per epoch."""

    def __init__(self, space: SearchSpace, *, group_size: int = 2, **options: Any) -> None:
        super().__init__(space, **options)
        self.group_size = group_size

    def resources(self, trial_id: str) -> int:
        return self.group_size


@pytest.fixture(scope="module", autouse=True)
def grouped_procedure() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(PROCEDURES, "grouped-grid", GroupedGrid)
        yield


def config(store: Path, **changes: Any) -> ExperimentConfig:
    raw: dict[str, Any] = {
        "name": "groups",
        "seed": 11,
        "store": str(store),
        "data": {"source": "sklearn:digits", "partitions": 4},
        "procedure": {"name": "grouped-grid", "group_size": 2},
        "epochs": 2,
        "workers": 2,
        "space": SPACE,
    }
    raw.update(changes)
    return parse_config(raw)


def events_of(store: Path, experiment_id: str) -> list[dict[str, Any]]:
    return read_events(open_store(str(store)).child(f"experiments/{experiment_id}"))


def digests(trials: Any) -> dict[str, str | None]:
    return {t.trial_id: t.checkpoint_sha256 for t in trials}


def complete_train_ends(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The train unit_ends that count: ordinary ones and those of complete groups."""
    by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
    ends = []
    for e in events:
        if e["event"] != "unit_end" or e["kind"] != "train":
            continue
        if "group" not in e:
            ends.append(e)
            continue
        by_group[e["group"]].append(e)
        if len(by_group[e["group"]]) == len(e["group_partitions"]):
            ends += by_group[e["group"]]
    return ends


def check_every_partition_trained_once(events: list[dict[str, Any]], trials: int) -> None:
    ends = complete_train_ends(events)
    keys = Counter((e["trial"], e["epoch"], e["partition"]) for e in ends)
    assert len(keys) == trials * 2 * 4 and set(keys.values()) == {1}, keys
    steps = Counter((e["trial"], e["epoch"], e["step"]) for e in ends)
    assert len(steps) == trials * 2 * 4 and set(steps.values()) == {1}
    validated = Counter(
        (e["trial"], e["epoch"], e["partition"])
        for e in events
        if e["event"] == "unit_end" and e["kind"] == "validate"
    )
    assert len(validated) == trials * 2 * 4 and set(validated.values()) == {1}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("groups-store")


@pytest.fixture(scope="module")
def reference(store: Path) -> Any:
    return run_experiment(config(store), experiment_id="grouped")


def test_every_train_unit_is_a_group_of_two_and_the_trials_learn(
    reference: Any, store: Path
) -> None:
    assert len(reference.trials) == 2
    assert all(t.status == "completed" and t.epochs == 2 for t in reference.trials)
    assert all(t.metrics["accuracy"] > 0.8 for t in reference.trials)
    events = events_of(store, "grouped")
    starts = [e for e in events if e["event"] == "round_start"]
    assert [e["resources"] for e in starts] == [{"t0000": 2, "t0001": 2}] * 2
    assert all(e["group_plans"] is None for e in starts)
    check_every_partition_trained_once(events, trials=2)
    train = [e for e in events if e["event"] == "unit_end" and e["kind"] == "train"]
    assert len(train) == 2 * 2 * 4  # no group failed, none was logged twice
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in train:
        groups[e["group"]].append(e)
    assert len(groups) == 2 * 2 * 2  # two groups of two per trial and epoch
    for ranks in groups.values():
        first, second = ranks
        assert [first["partition"], second["partition"]] == first["group_partitions"]
        assert second["step"] == first["step"] + 1 and first["step"] in (0, 2)
        assert first["worker"] != second["worker"]
        assert first["checkpoint_sha256"] == second["checkpoint_sha256"] is not None
        assert first["rows"] > 0 and second["rows"] > 0
    # The logged order is the round's visit order: the groups followed it rank by rank.
    orders = logged_visit_orders(open_store(str(store)), "grouped")
    assert orders == {e["round"]: e["visit_orders"] for e in starts}
    # Validation units stay ordinary units.
    assert not any("group" in e for e in events if e.get("kind") == "validate")
    # Only each trial's latest checkpoint is kept.
    kept = open_store(str(store)).list("experiments/grouped/checkpoints")
    assert len(kept) == 2


def test_a_replay_with_the_same_workers_is_bit_identical(reference: Any, store: Path) -> None:
    report = replay_experiment(str(store), "grouped")
    assert report.identical, report.rows
    assert digests(report.replay.trials) == digests(reference.trials)


class _DriverKilled(BaseException):
    """Stands for SIGKILL: nothing in the engine catches it."""


def test_a_driver_killed_between_the_unit_ends_of_a_group_resumes_to_the_same_weights(
    reference: Any, store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver dies right after logging rank 0's unit_end of a group in the second
    epoch: the group is half logged. Resume must count it as not done, train it again
    from the checkpoint before it, and end with the uninterrupted run's weights."""
    original = EventLog.append

    def append(self: EventLog, event: str, **fields: Any) -> dict[str, Any]:
        record = original(self, event, **fields)
        if (
            event == "unit_end"
            and fields.get("group") is not None
            and fields["round"] == 1
            and fields["partition"] == fields["group_partitions"][0]
        ):
            raise _DriverKilled(f"killed after {record['group']} rank 0")
        return record

    monkeypatch.setattr(EventLog, "append", append)
    with pytest.raises(_DriverKilled):
        run_experiment(config(store), experiment_id="crashed")
    monkeypatch.setattr(EventLog, "append", original)
    before = events_of(store, "crashed")
    half = [e for e in before if e["event"] == "unit_end" and e.get("group")][-1]
    logged = [e["event"] for e in before if e.get("group") == half["group"]]
    assert logged == ["unit_start", "unit_start", "unit_end"]  # rank 1's end is missing

    result = resume_experiment(str(store), "crashed")
    after = events_of(store, "crashed")
    assert after[-1]["event"] == "experiment_end"
    check_every_partition_trained_once(after, trials=2)
    redone = [
        e
        for e in complete_train_ends(after)
        if (e["trial"], e["epoch"], e["partition"])
        == (half["trial"], half["epoch"], half["partition"])
    ]
    assert len(redone) == 1 and redone[0]["group"] != half["group"]
    assert digests(result.trials) == digests(reference.trials)


def test_a_worker_killed_in_the_middle_of_a_group_unit_loses_nothing(
    store: Path, tmp_path: Path
) -> None:
    """Both ranks of the first group wait in ``build_model`` (GatedSpec) until w1 is
    killed; rank 0 then finds its peer gone (GroupBrokenError) and its worker lives on.
    The group goes back to the queue; with one worker left, every unit runs alone on w0,
    and the run completes with every partition trained once. Replaying it with the logged
    visit orders and the logged groups (2 workers again) gives the same weights."""
    begun, release = tmp_path / "begun", tmp_path / "release"
    space = {
        "model": "tests.backends.failing_spec:GatedSpec",
        "hidden_units": [32],
        "lr": 0.003,
        "batch_size": 32,
        "marker": str(begun),
        "wait_for": [str(release)],
    }
    backends: list[LocalBackend] = []

    def factory(cfg: ExperimentConfig) -> Backend:
        backends.append(LocalBackend(cfg.workers))
        return backends[-1]

    def killer() -> None:
        deadline = time.monotonic() + 120
        while not begun.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        backends[0].kill_worker("w1")
        release.touch()

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    cfg = config(store, space=space, name="killed")
    result = run_experiment(cfg, experiment_id="killed", backend_factory=factory)
    thread.join()
    (trial,) = result.trials
    assert trial.status == "completed" and trial.epochs == 2
    assert trial.metrics["accuracy"] > 0.8
    events = events_of(store, "killed")
    assert [e["worker"] for e in events if e["event"] == "worker_lost"] == ["w1"]
    failed = [e for e in events if e["event"] == "unit_failed"]
    assert {(e["worker"], e["reason"]) for e in failed} == {("w0", "worker_lost"),
                                                          ("w1", "worker_lost")}  # fmt: skip
    assert all(e["group"] == failed[0]["group"] for e in failed)
    check_every_partition_trained_once(events, trials=1)
    assert not any("group" in e for e in complete_train_ends(events))  # all alone on w0

    root = open_store(str(store))
    replay = Experiment(
        cfg,
        root,
        "killed-replay",
        lambda c: LocalBackend(c.workers),
        visit_orders=logged_visit_orders(root, "killed"),
        group_plans=logged_group_plans(root, "killed"),
    ).run()
    assert digests(replay) == digests(result.trials)
