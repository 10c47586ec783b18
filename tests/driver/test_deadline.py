"""One deadline: the config's, read by the procedure, the planner and the elastic layer.

A deadline is seconds from ``run`` to the end, start-up included: given once (at the top
level, or where older configs gave it) it reaches every reader; given twice with one value
it loads with a warning; two values are refused naming both places.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.driver import ExperimentState
from cerebro_spark.driver._procedure import build_procedure, experiment_spec
from cerebro_spark.engine import load_config, parse_config
from cerebro_spark.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
ELASTIC = {"manager": "standalone", "prices": "conf/prices/local.yaml"}


def raw(procedure: dict[str, Any], **changes: Any) -> dict[str, Any]:
    config = {
        "name": "exp",
        "data": {"source": "sklearn:digits"},
        "model": "cerebro_spark.training:MLPSpec",
        "space": {"lr": {"loguniform": [0.001, 0.1]}},
        "epochs": 4,
        "procedure": procedure,
    }
    config.update(changes)
    return config


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_deadline_given_once_reaches_the_procedure_and_the_planner(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        config = parse_config(
            raw({"name": "seer", "worker_seconds": 120}, deadline=60, elastic=ELASTIC)
        )
    assert not warnings(caplog)
    assert config.deadline == 60.0
    assert "deadline" not in config.procedure_options and config.elastic is not None
    assert build_procedure(config, lambda: 0.0).deadline == 60.0  # type: ignore[attr-defined]
    assert experiment_spec(config).deadline == 60.0
    assert config.to_dict()["deadline"] == 60.0 and "deadline" not in config.to_dict()["elastic"]
    # Where older configs gave it, once, it is the same one deadline.
    for old in (
        raw({"name": "seer", "worker_seconds": 120, "deadline": 60}, elastic=ELASTIC),
        raw({"name": "seer", "worker_seconds": 120}, elastic={**ELASTIC, "deadline": 60}),
    ):
        assert parse_config(old) == config
    assert not warnings(caplog)


@pytest.mark.parametrize("name", ["hypersched", "asha"])
def test_every_deadline_reader_gets_the_top_level_deadline(name: str) -> None:
    config = parse_config(raw({"name": name}, deadline=30, elastic=ELASTIC))
    procedure = build_procedure(config, lambda: 0.0)
    assert procedure.deadline == 30.0  # type: ignore[attr-defined]
    assert experiment_spec(config).deadline == 30.0


def test_an_old_config_giving_the_same_deadline_twice_loads_with_a_warning(caplog) -> None:
    doubled = raw(
        {"name": "seer", "deadline": 60, "worker_seconds": 120},
        elastic={**ELASTIC, "deadline": 60},
    )
    with caplog.at_level(logging.WARNING):
        config = parse_config(doubled)
    assert config.deadline == 60.0
    [message] = [m for m in warnings(caplog) if "deadline" in m]
    assert "given 2 times (procedure.deadline, elastic.deadline), each 60 s" in message
    assert "give it once, as the top-level deadline: 60" in message
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # written back once: no warning
        assert parse_config(config.to_dict()) == config
        assert parse_config(doubled, stored=True).deadline == 60.0  # an old run's config.json
    assert not warnings(caplog)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"procedure": {"name": "seer", "deadline": 60}, "elastic": {**ELASTIC, "deadline": 45}},
            "procedure.deadline is 60 but elastic.deadline is 45: an experiment has one deadline",
        ),
        (
            {"procedure": {"name": "hypersched", "deadline": 60}, "deadline": 90},
            "deadline is 90 but procedure.deadline is 60",
        ),
        ({"procedure": {"name": "seer"}}, "search procedure 'seer' needs a deadline"),
        (
            {"procedure": {"name": "sha"}, "elastic": ELASTIC},
            "an elastic: section needs a deadline",
        ),
        (
            {"procedure": {"name": "sha"}, "deadline": -5},
            "deadline must be a number of seconds > 0",
        ),
        (
            {"procedure": {"name": "sha"}, "elastic": {**ELASTIC, "deadline": "soon"}},
            "elastic.deadline must be a number of seconds > 0, got 'soon'",
        ),
    ],
)
def test_bad_deadlines_are_refused_naming_the_places(changes, message) -> None:
    config = raw({"name": "sha"})
    config.update(changes)
    with pytest.raises(ConfigError) as error:
        parse_config(config)
    assert message in str(error.value)


def test_a_stored_asha_run_without_a_deadline_of_its_own_keeps_running_without_one() -> None:
    """Before one deadline, ASHA beside ``elastic.deadline`` had none: resumed, it has none."""
    old = raw({"name": "asha", "num_trials": 4}, elastic={**ELASTIC, "deadline": 40})
    stored = parse_config(old, stored=True)
    assert stored.deadline == 40.0 and stored.procedure_options["deadline"] is None
    assert build_procedure(stored, lambda: 0.0).deadline is None  # type: ignore[attr-defined]
    assert parse_config(stored.to_dict(), stored=True) == stored
    new = parse_config(old)  # a config file read today: ASHA stops at the one deadline
    assert build_procedure(new, lambda: 0.0).deadline == 40.0  # type: ignore[attr-defined]


def test_the_demo_configs_give_one_deadline(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        seer = load_config(ROOT / "conf/experiments/digits-seer.yaml")
        elastic = load_config(ROOT / "conf/experiments/digits-elastic.yaml")
    assert not warnings(caplog)
    assert (seer.deadline, elastic.deadline) == (60.0, 45.0)
    assert experiment_spec(seer).deadline == 60.0


@pytest.mark.parametrize(
    "procedure",
    [
        {"name": "seer", "worker_seconds": 80, "epoch_seconds": 1.0},
        {"name": "hypersched", "epoch_seconds": 1.0},
        {"name": "asha", "num_trials": 4},
    ],
)
def test_the_deadline_counts_from_run_start_up_included(procedure: dict[str, Any]) -> None:
    """The driver's clock reads experiment time, 0 at ``run``: a procedure built after
    12 s of start-up has 8 s of a 20 s deadline left, not 20."""
    config = parse_config(raw(procedure, deadline=20, workers=2))
    now = [12.0]
    built = build_procedure(config, lambda: now[0])
    assert not built.is_finished()
    now[0] = 20.0
    assert built.is_finished()  # 20 s after run, though only 8 s after it was built


def test_experiment_time_starts_at_run_in_the_log() -> None:
    """``experiment_start.startup``: the seconds from ``run`` to the event are experiment
    time too (a log without the field counts from the event, as before)."""
    events = [
        {"event": "experiment_start", "time": 100.0, "startup": 4.0},
        {"event": "dataset", "time": 110.0, "dataset_id": "d"},
    ]
    state = ExperimentState()
    for event in events:
        state.apply(event)
    assert state.experiment_seconds == pytest.approx(14.0)
    old = ExperimentState()
    for event in events:
        old.apply({k: v for k, v in event.items() if k != "startup"})
    assert old.experiment_seconds == pytest.approx(10.0)
    # A resumed session adds its own start-up; the down-time between is not counted.
    state.apply({"event": "experiment_start", "time": 500.0, "startup": 2.0, "resumed": True})
    state.apply({"event": "dataset", "time": 503.0, "dataset_id": "d"})
    assert state.experiment_seconds == pytest.approx(14.0 + 2.0 + 3.0)
