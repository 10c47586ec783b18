"""Packed metric states (``cerebro_spark.units``): each distinct state written once."""

import json
import math

import pytest

from cerebro_spark.units import UnitKind, UnitResult, UnitTask, pack_states, unpack_states

COUNTS = {"tp": [1, 2, 0], "predicted": [2, 2, 1], "true": [1, 3, 1]}


def per_class_states():
    """Shaped as a 3-class validation unit's: 9 metrics read one per-class-counts state."""
    states = {"loss": {"sum": 2.5, "count": 5}, "accuracy": {"correct": 3, "count": 5}}
    shared = dict(COUNTS)
    for metric in ("precision", "recall", "f1"):
        states[f"{metric}_macro"] = shared  # the same object
        for label in range(3):
            states[f"{metric}_class_{label}"] = json.loads(json.dumps(COUNTS))  # equal, a copy
    return states


def test_each_distinct_state_is_written_once_under_its_first_metric():
    states = per_class_states()
    packed = pack_states(states)
    assert list(packed) == list(states)  # the order is kept
    assert packed["loss"] == states["loss"] and packed["accuracy"] == states["accuracy"]
    assert packed["precision_macro"] == COUNTS
    references = {name: v for name, v in packed.items() if isinstance(v, str)}
    assert set(references) == set(states) - {"loss", "accuracy", "precision_macro"}
    assert set(references.values()) == {"precision_macro"}


def test_unpacking_gives_equal_states_and_shares_one_object_per_distinct_state():
    states = per_class_states()
    back = unpack_states(json.loads(json.dumps(pack_states(states))))
    assert back == states and list(back) == list(states)
    assert back["f1_class_2"] is back["precision_macro"]
    assert back["loss"] is not back["accuracy"]


def test_states_that_differ_anywhere_stay_apart():
    states = {
        "a": {"count": 1, "sum": 1.0},
        "b": {"count": 1, "sum": 1.5},
        "c": {"count": 1},
        "d": {"count": 1, "sum": 1.0, "extra": []},
        "e": {"count": 1, "sum": 1.0},
    }
    assert pack_states(states) == {**states, "e": "a"}


def test_a_map_written_before_packing_is_read_as_it_is():
    full = per_class_states()
    back = unpack_states(full)
    assert back == full
    assert back["recall_macro"] is not full["recall_macro"]  # each state copied once


def test_convert_runs_once_per_distinct_state():
    seen = []

    def convert(state):
        seen.append(state)
        return {k: float(v) if v == "nan" else v for k, v in state.items()}

    back = unpack_states({"a": {"sum": "nan", "count": 0}, "b": "a"}, convert=convert)
    assert len(seen) == 1 and math.isnan(back["b"]["sum"]) and back["a"] is back["b"]


@pytest.mark.parametrize(
    ("packed", "message"),
    [
        ({"a": "b", "b": {"count": 1}}, "'a' refers to 'b', which is not an earlier metric"),
        ({"a": {"count": 1}, "b": "zzz"}, "'b' refers to 'zzz'"),
        ({"a": {"count": 1}, "b": 3}, "'b' is 3: it must be a state"),
        ({"a": ["count", 1]}, "must be a state"),
    ],
)
def test_a_bad_packed_map_is_refused_naming_the_metric_and_the_rule(packed, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        unpack_states(packed)


def test_a_result_crosses_the_wire_packed_and_comes_back_whole():
    task = UnitTask(
        trial_id="t0",
        spec="m:S",
        params={},
        trial_seed=1,
        epoch=0,
        partition=0,
        step=0,
        kind=UnitKind.VALIDATE,
        checkpoint_in="c.pt",
    )
    states = per_class_states()
    states["odd"] = {"sum": math.nan, "count": 1}
    result = UnitResult(task, "w0", rows=5, seconds=0.1, metric_sums={}, metric_states=states)
    text = json.dumps(result.to_json(), allow_nan=False)  # strict JSON
    assert text.count('"tp"') == 1
    back = UnitResult.from_json(json.loads(text))
    assert {k: v for k, v in back.metric_states.items() if k != "odd"} == {
        k: v for k, v in states.items() if k != "odd"
    }
    assert math.isnan(back.metric_states["odd"]["sum"])
    assert back.metric_states["f1_class_0"] is back.metric_states["precision_macro"]
