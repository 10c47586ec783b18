"""Models whose loss goes NaN (issue 12, part 1: events are standard JSON).

A training loss that goes NaN fails its trial with a clear error (the others' results
stand). A model whose *validation* goes NaN is recorded as it is (its loss NaN): the log
stays standard JSON (``"NaN"`` strings listed in ``nonfinite``) and reads back as NaN,
and the experiment's best is a healthy trial.
"""

from __future__ import annotations

import math

import pytest

from cerebro_spark.driver._state import COMPLETED, FAILED
from cerebro_spark.engine import load_state, parse_config, replay_experiment, run_experiment
from tests.reliability.conftest import strict_events, tiny_config, unit_ends

pytestmark = [pytest.mark.torch, pytest.mark.slow]

HEALTHY = {"model": "cerebro_spark.training:MLPSpec", "hidden_units": [8], "lr": 0.05}
DIVERGES = "tests.reliability.specs:NanAfterFirstEpochSpec"
NAN_VALIDATION = "tests.reliability.specs:NanInValidationSpec"


def run(tmp_path, sick_spec):
    space = {"choice": [HEALTHY, {**HEALTHY, "model": sick_spec}]}
    result = run_experiment(
        parse_config(tiny_config(tmp_path, space=space, epochs=3)), experiment_id="nan"
    )
    events, state = strict_events(str(tmp_path), "nan")  # standard JSON, folds
    assert state.finished
    sick = next(t for t in state.trials.values() if t.spec == sick_spec)
    healthy = next(t for t in state.trials.values() if t.spec != sick_spec)
    assert healthy.status == COMPLETED and healthy.epochs == 3
    assert all(math.isfinite(m["loss"]) for m in healthy.history)
    assert result.best.trial_id == healthy.trial_id
    return events, sick


def test_a_training_loss_gone_nan_fails_its_trial_clearly(tmp_path):
    _, sick = run(tmp_path, DIVERGES)
    assert sick.status == FAILED and sick.epochs == 1
    assert f"trial '{sick.trial_id}' (epoch 1, partition" in sick.error
    assert "training loss is nan (not finite)" in sick.error


def test_a_validation_gone_nan_is_recorded_as_standard_json_and_read_back(tmp_path):
    events, sick = run(tmp_path, NAN_VALIDATION)
    assert len(unit_ends(events)) == 2 * 3 * 2 * 2
    assert sick.status == COMPLETED and sick.epochs == 3
    assert all(math.isnan(m["loss"]) for m in sick.history)
    raw_lines = (tmp_path / "experiments/nan/events.jsonl").read_text().splitlines()
    marked = [line for line in raw_lines if '"nonfinite"' in line]
    assert marked and all('"NaN"' in line for line in marked)
    _, loaded = load_state(str(tmp_path), "nan")  # what leaderboard, report, resume read
    assert math.isnan(loaded.trials[sick.trial_id].metrics["loss"])
    assert replay_experiment(str(tmp_path), "nan", workers=1).identical
