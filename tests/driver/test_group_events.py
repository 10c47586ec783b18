"""Group units in the event log (Cerebro §5.7): folding, resume and replay plans.

Pure: synthetic events, no backend, no torch.
"""

from __future__ import annotations

from typing import Any

import pytest

from cerebro_spark.driver._group_plans import group_plans_from_events
from cerebro_spark.driver._running import group_failure
from cerebro_spark.engine import ExperimentState
from cerebro_spark.errors import StoreError, TrialError, WorkerLostError
from cerebro_spark.units import GroupBrokenError, UnitKind


def start(round_: int = 0, **fields: Any) -> dict[str, Any]:
    return {
        "event": "round_start",
        "round": round_,
        "trials": ["t"],
        "epochs": {"t": round_},
        "visit_orders": {"t": [0, 1, 2, 3]},
        "procedure_state": {},
        **fields,
    }


def end(
    step: int, partition: int, group: str | None = None, size: int = 2, **fields: Any
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "event": "unit_end",
        "round": fields.pop("round", 0),
        "trial": "t",
        "epoch": 0,
        "kind": "train",
        "partition": partition,
        "step": step,
        "worker": f"w{partition}",
        "seconds": 1.0,
        "rows": 10,
        "metric_sums": {"loss": 1.0},
        "checkpoint": f"ck/{group or step}",
        "checkpoint_bytes": 5,
        "checkpoint_sha256": f"sha-{group or step}",
        **fields,
    }
    if group is not None:
        event["group"] = group
        event["group_partitions"] = fields.get("group_partitions", list(range(size)))
    return event


TRIAL: dict[str, Any] = {
    "event": "trial_added",
    "trial": "t",
    "params": {},
    "seed": 1,
    "spec": "m:S",
}


def test_round_start_records_resources_and_imposed_plans() -> None:
    state = ExperimentState.from_events([TRIAL, start(resources={"t": 2}, group_plans=None)])
    assert state.round_resources == {"t": 2} and state.round_group_plans is None
    state.apply(start(1, resources={"t": 3}, group_plans={"t": [1, 3]}))
    assert state.round_resources == {"t": 3} and state.round_group_plans == {"t": [1, 3]}
    old = ExperimentState.from_events([TRIAL, start()])  # logs from before groups
    assert old.round_resources == {} and old.round_group_plans is None


def test_a_group_counts_only_once_all_its_unit_ends_are_in() -> None:
    state = ExperimentState.from_events([TRIAL, start(), end(0, 0), end(1, 1)])
    state.apply(end(2, 2, "g1", group_partitions=[2, 3]))
    assert [u.step for u in state.done_units] == [0, 1]  # half a group is not done
    assert state.trials["t"].checkpoint == "ck/1"  # resume starts from the unit before
    assert state.unit_seconds["t"] == 2.0
    state.apply(end(3, 3, "g1", group_partitions=[2, 3]))
    assert [(u.step, u.partition, u.kind) for u in state.done_units] == [
        (0, 0, UnitKind.TRAIN),
        (1, 1, UnitKind.TRAIN),
        (2, 2, UnitKind.TRAIN),
        (3, 3, UnitKind.TRAIN),
    ]
    assert state.trials["t"].checkpoint == "ck/g1"
    assert state.trials["t"].checkpoint_sha256 == "sha-g1"
    assert state.unit_seconds["t"] == 4.0


def test_a_half_logged_group_is_forgotten_and_its_rerun_counts() -> None:
    events: list[dict[str, Any]] = [
        TRIAL,
        {"event": "experiment_start"},
        start(),
        end(0, 0, "a1"),
        {"event": "experiment_start"},
    ]
    state = ExperimentState.from_events(events)
    assert state.done_units == [] and state.trials["t"].checkpoint is None
    assert state.sessions == 2
    for event in [end(0, 0, "a2"), end(1, 1, "a2")]:
        state.apply(event)
    assert [u.step for u in state.done_units] == [0, 1]
    assert state.trials["t"].checkpoint == "ck/a2"


def test_a_new_round_drops_half_logged_groups() -> None:
    state = ExperimentState.from_events([TRIAL, start(), end(0, 0, "g")])
    state.apply(start(1))
    state.apply(end(1, 1, "g"))  # the same id in another round does not complete it
    assert state.done_units == []


def test_group_plans_from_events_rebuild_the_groups_each_trial_trained_in() -> None:
    events = [
        start(),
        end(0, 0, "half", group_partitions=[0, 1]),  # a driver died here: ignored
        end(0, 0, "g1", group_partitions=[0, 1]),
        end(1, 1, "g1", group_partitions=[0, 1]),
        end(2, 2),
        end(3, 3),
        {**end(0, 0), "kind": "validate"},
        start(1),
        end(0, 3, round=1),
        end(1, 2, round=1),
        end(2, 1, round=1),
        end(3, 0, round=1),  # round 1: no group at all
        start(2),
        end(0, 1, "g2", size=3, round=2, group_partitions=[1, 2, 3]),
        end(1, 2, "g2", size=3, round=2, group_partitions=[1, 2, 3]),
        end(2, 3, "g2", size=3, round=2, group_partitions=[1, 2, 3]),
    ]
    assert group_plans_from_events(events) == {0: {"t": [2, 1, 1]}, 2: {"t": [3]}}


def test_group_failure_reasons() -> None:
    lost = WorkerLostError("w1 died")
    broken = GroupBrokenError("on worker w0: lost its peers")
    assert group_failure([broken, TrialError("boom")]) == "trial_error"
    assert group_failure([broken, lost]) == "worker_lost"
    assert group_failure([broken, broken]) == "group_broken"
    assert group_failure([StoreError("s3 down"), StoreError("s3 down")]) == "io_error"
    with pytest.raises(KeyError, match="bug"):
        group_failure([KeyError("bug")])
