"""Epoch metrics from the fold: merged states in partition order, and logs written before
mergeable states (``metric_sums`` only) still give their row-weighted metrics."""

import copy
import json
import math

import pytest

from cerebro_spark.driver._state import epoch_metrics
from cerebro_spark.engine import ExperimentState
from cerebro_spark.errors import EventLogError
from cerebro_spark.metrics import F1, Accuracy, Loss, MeanSquaredError, Precision, Recall
from cerebro_spark.units import pack_states

pytestmark = pytest.mark.torch

FAMILY = {"loss": Loss(), "accuracy": Accuracy(), "rmse": MeanSquaredError(root=True)}


def log(with_states=(True, True)):
    units = [
        # partition 1 ends first: the merge must not depend on the order units end in
        (1, 6, {"loss": 6.0, "accuracy": 5.0, "rmse": 6.0}, 5, 36.0),
        (0, 2, {"loss": 2.0, "accuracy": 1.0, "rmse": 2.0}, 1, 4.0),
    ]
    events = [
        {"event": "trial_added", "trial": "t0", "params": {}, "seed": 1, "spec": "m:S"},
        {
            "event": "round_start",
            "round": 0,
            "trials": ["t0"],
            "epochs": {},
            "visit_orders": None,
            "procedure_state": None,
        },
    ]
    for (partition, rows, sums, correct, squares), states in zip(units, with_states, strict=True):
        event = {
            "event": "unit_end",
            "trial": "t0",
            "partition": partition,
            "kind": "validate",
            "step": 0,
            "metric_sums": sums,
            "rows": rows,
        }
        if states:
            event["metric_states"] = {
                "loss": {"sum": float(rows), "count": rows},
                "accuracy": {"correct": correct, "count": rows},
                "rmse": {"sum": squares, "count": rows},
            }
        events.append(event)
    return events


def test_states_merge_exactly():
    state = ExperimentState.from_events(log())
    assert set(state.validation_states["t0"]) == {0, 1}
    metrics = epoch_metrics(state, "t0", FAMILY)
    assert metrics == {"accuracy": 6 / 8, "loss": 1.0, "rmse": math.sqrt(40 / 8)}


def test_an_old_log_folds_to_row_weighted_sums():
    state = ExperimentState.from_events(log(with_states=(False, False)))
    assert not state.validation_states["t0"]
    metrics = epoch_metrics(state, "t0", FAMILY)
    assert metrics == {"accuracy": 6 / 8, "loss": 1.0, "rmse": 1.0}  # the old, inexact RMSE


def test_a_round_half_logged_by_an_old_version_falls_back_to_the_sums():
    state = ExperimentState.from_events(log(with_states=(True, False)))
    assert epoch_metrics(state, "t0", FAMILY)["rmse"] == 1.0


def test_a_new_round_starts_with_no_states_and_unknown_batch_means_still_merge():
    events = log()
    for event in events[2:]:
        event["metric_states"]["hits"] = {"sum": 1.0, "count": event["rows"]}  # a BatchMean
        event["metric_states"]["mystery"] = {"whatever": 1}
    state = ExperimentState.from_events(events)
    metrics = epoch_metrics(state, "t0", FAMILY)
    assert metrics["hits"] == pytest.approx(2 / 8) and "mystery" not in metrics
    state.apply(copy.deepcopy(events[1]) | {"round": 1})
    assert not state.validation_states and not state.validation_units


def test_packed_states_fold_to_the_same_metrics_and_merge_shared_states_once():
    kinds, averages = (Precision, Recall, F1), ("macro", 0, 1, 2)
    family = {"loss": Loss()} | {
        m.name: m for m in (kind(3, average) for kind in kinds for average in averages)
    }
    counts = [
        {"tp": [1, 0, 2], "predicted": [2, 1, 2], "true": [1, 2, 2]},
        {"tp": [0, 3, 1], "predicted": [1, 3, 2], "true": [2, 3, 1]},
    ]
    full, packed = log(), log()
    for events, pack in ((full, False), (packed, True)):
        for event, state in zip(events[2:], counts, strict=True):
            names = [name for name in family if name != "loss"]
            states = {"loss": {"sum": 1.0, "count": event["rows"]}}
            states |= {name: json.loads(json.dumps(state)) for name in names}
            event["metric_states"] = pack_states(states) if pack else states
    assert any(isinstance(v, str) for v in packed[2]["metric_states"].values())
    expected = epoch_metrics(ExperimentState.from_events(full), "t0", family)
    assert epoch_metrics(ExperimentState.from_events(packed), "t0", family) == expected
    assert expected["recall_class_1"] == 3 / 5 and expected["precision_class_0"] == 1 / 3


def test_a_packed_state_that_names_no_earlier_metric_is_a_malformed_event():
    events = log()
    events[2]["metric_states"]["rmse"] = "nothing"
    with pytest.raises(EventLogError, match="'rmse' refers to 'nothing'"):
        ExperimentState.from_events(events)
