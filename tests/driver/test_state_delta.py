"""The procedure's state in the log: deltas between snapshots keep it linear in the work
(issue 29 part 2), and every state folds back exactly (fast, no Spark, no torch)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from cerebro_spark.driver._state import ExperimentState
from cerebro_spark.driver._state_delta import StateLog, apply_delta, as_json, state_diff
from cerebro_spark.errors import EventLogError


def random_json(rng: np.random.Generator, depth: int = 0) -> Any:
    kind = rng.integers(0, 7 if depth < 3 else 4)
    if kind == 0:
        return int(rng.integers(-5, 5))
    if kind == 1:
        return float(rng.normal())
    if kind == 2:
        return str(rng.integers(0, 3))
    if kind == 3:
        return [None, True, False][int(rng.integers(0, 3))]
    if kind in (4, 5):
        return {f"k{int(rng.integers(0, 5))}": random_json(rng, depth + 1) for _ in range(3)}
    return [random_json(rng, depth + 1) for _ in range(int(rng.integers(0, 4)))]


def mutate(rng: np.random.Generator, value: Any) -> Any:
    if isinstance(value, dict) and value and rng.random() < 0.8:
        out = dict(value)
        key = list(out)[int(rng.integers(0, len(out)))]
        if rng.random() < 0.2:
            del out[key]
        else:
            out[key] = mutate(rng, out[key])
        if rng.random() < 0.3:
            out[f"n{int(rng.integers(0, 9))}"] = random_json(rng, 2)
        return out
    if isinstance(value, list) and rng.random() < 0.8:
        out_list = list(value)
        if out_list and rng.random() < 0.5:
            index = int(rng.integers(0, len(out_list)))
            out_list[index] = mutate(rng, out_list[index])
        if rng.random() < 0.6:
            out_list.append(random_json(rng, 2))
        if out_list and rng.random() < 0.1:
            out_list.pop()
        return out_list
    return random_json(rng, 1)


def test_a_delta_takes_the_old_state_to_the_new_one_exactly() -> None:
    rng = np.random.default_rng(7)
    for _ in range(500):
        old = random_json(rng)
        new = mutate(rng, old)
        delta = state_diff(old, new)
        if delta is None:
            assert json.dumps(old) == json.dumps(new)
            continue
        logged = json.loads(json.dumps(delta))  # what the log reads back
        assert json.dumps(apply_delta(old, logged)) == json.dumps(new)  # key order too


def test_types_are_kept_and_tuples_read_as_lists() -> None:
    assert state_diff({"a": 1}, {"a": True}) == {"{": {"a": {"=": True}}}
    assert state_diff({"a": 1}, {"a": 1.0}) == {"{": {"a": {"=": 1.0}}}
    assert as_json({"rungs": ((1, 2), [3])}) == {"rungs": [[1, 2], [3]]}
    assert state_diff([1, 2], [1, 2, 3]) == {"+": [3]}
    with pytest.raises(EventLogError, match="patches a mapping"):
        apply_delta([1], {"{": {"a": {"=": 1}}})
    with pytest.raises(EventLogError, match="patches item 3"):
        apply_delta([1], {"[": {"3": {"=": 1}}, "+": []})


def asha_like(trials: int) -> dict[str, Any]:
    """A state that grows with the trials, as ASHA's rungs do."""
    return {
        "next": trials,
        "rungs": [
            [[f"t{i:05d}", 0.5 + i / 1e4] for i in range(trials // (3**r))] for r in range(4)
        ],
        "rng": {"state": trials * 7919 % 1000003},
    }


def test_the_states_share_of_the_log_is_linear_in_the_trials() -> None:
    """Logged every round for n rounds of one new trial each: snapshots alone are
    quadratic (the sum of the sizes), snapshots and deltas stay within a constant of the
    final state (bytes per trial flat within 1.5x from 100 to 800 trials)."""
    per_trial = {}
    for n in (100, 800):
        log, logged, snapshots = StateLog(), 0, 0
        state = None
        for trials in range(1, n + 1):
            current = asha_like(trials)
            fields = log.fields(current)
            logged += len(json.dumps(fields, separators=(",", ":")))
            snapshots += len(json.dumps(current, separators=(",", ":")))
            if "procedure_state" in fields:
                state = fields["procedure_state"]
            else:
                state = apply_delta(state, fields["procedure_state_delta"])
            if trials % 97 == 0 or trials == n:
                assert state == as_json(current)
        per_trial[n] = logged / n
        if n == 800:
            assert logged * 10 < snapshots  # snapshots every round: over 10x more
    assert per_trial[800] < 1.5 * per_trial[100]


def test_a_log_of_snapshots_and_deltas_folds_to_each_state() -> None:
    log = StateLog()
    events: list[dict[str, Any]] = [
        {"event": "experiment_start", "experiment_id": "e", "config": {}, "resumed": False}
    ]
    for round_ in range(30):
        fields = log.fields(asha_like(round_ + 1))
        events.append(
            {
                "event": "round_start",
                "round": round_,
                "trials": [],
                "epochs": {},
                "visit_orders": None,
                **fields,
            }
        )
        events.append({"event": "round_end", "round": round_, **log.fields(asha_like(round_ + 2))})
    kinds = {k for e in events for k in e if k.startswith("procedure_state")}
    assert kinds == {"procedure_state", "procedure_state_delta"}
    events = json.loads(json.dumps(events))
    state = ExperimentState.from_events(events)
    assert state.procedure_state == as_json(asha_like(31))
    # a resumed session starts again from the folded state, with a snapshot first
    resumed = StateLog(state.procedure_state)
    assert "procedure_state" in resumed.fields(asha_like(32))
    assert "procedure_state_delta" in resumed.fields(asha_like(33))
