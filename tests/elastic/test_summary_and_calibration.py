"""Honest totals and early calibration, on the planner's own objects (no Spark, no torch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.elastic import (
    LOAD_CHANGE,
    calibrated,
    load_change,
    load_profile,
    machine_load,
    miss_lines,
    parse_catalog,
    plan,
    planned_parts,
    startup_calibration,
    summarize,
    trial_epoch,
    units_calibration,
)
from cerebro_spark.search import Cohort, ExperimentSpec, StageSpec

ROOT = Path(__file__).resolve().parents[2]
PROFILE = load_profile(ROOT / "conf/profiles/digits-local.yaml")
TYPE = "local-core"
CATALOG = parse_catalog(
    {
        "billing": {"model": "per_instance", "granularity_seconds": 1, "minimum_seconds": 0},
        "instances": {TYPE: {"usd_per_hour": 0.05}},
    }
)


def stage(index: int, seconds: float, first: float, parts: dict[str, float],
          first_parts: dict[str, float]) -> dict[str, Any]:  # fmt: skip
    return {"stage": index, "seconds": seconds, "planned_seconds": first, "first_seconds": first,
            "parts": parts, "planned_parts": first_parts, "first_parts": first_parts}  # fmt: skip


def test_the_summary_compares_with_the_first_plan_and_the_last_separately() -> None:
    """The issue's run: 34.1 s planned, 46.2 s taken, a late re-plan said 46.4 s."""
    stages = [
        stage(
            0,
            30.0,
            20.0,
            {"start-up": 23.0, "units": 5.0, "waiting": 2.0},
            {"start-up": 16.0, "units": 4.0},
        ),
        stage(1, 16.2, 14.1, {"resizing": 2.0, "units": 14.2}, {"resizing": 2.0, "units": 12.1}),
    ]
    replans = [{"stage": 1, "reason": "stage 1 took 30.0 s, planned 20.0 s", "elapsed": 30.0,
                "seconds": 46.4, "usd": 0.0013}]  # fmt: skip
    fields = summarize(deadline=40.0, seconds=46.2, budget=0.0012, usd=0.0013,
                       first_plan=(34.1, 0.0009), last_plan=(46.4, 0.0013), replans=replans,
                       stages=stages)  # fmt: skip
    assert fields["deadline_met"] is False and fields["budget_met"] is False
    assert fields["first_plan"] == {"seconds": 34.1, "usd": 0.0009}
    assert fields["last_plan"] == {"seconds": 46.4, "usd": 0.0013}
    assert fields["replans"] == replans
    deadline, budget = fields["misses"]
    assert deadline == (
        "deadline missed: 46.2 s against a deadline of 40 s (6.2 s over; the first plan said "
        "34.1 s, +35.5 %); stage 1 ran 10.0 s over the first plan (30.0 s against 20.0 s), "
        "most in start-up 23.0 s against 16.0 s; then waiting 2.0 s against 0.0 s"
    )
    assert budget.startswith(
        "budget missed: $0.0013 against a budget of $0.0012 ($0.0001 over; the first plan said "
        "$0.0009, +44.4 %); stage 1 ran 10.0 s over"
    )


def test_a_run_that_keeps_its_deadline_and_budget_says_nothing_missed() -> None:
    fields = summarize(deadline=40.0, seconds=39.0, budget=None, usd=1.0, first_plan=(38.0, 1.0),
                       last_plan=(38.0, 1.0), replans=[], stages=[])  # fmt: skip
    assert fields["deadline_met"] and fields["budget_met"] and fields["misses"] == []


def test_a_miss_in_an_old_log_names_the_stage_against_its_own_plan() -> None:
    """Stages of a log written before parts and first plans: the stage, no parts."""
    old = [{"stage": 0, "seconds": 9.0, "planned_seconds": 4.0}]
    (line,) = miss_lines(deadline=5.0, seconds=9.0, budget=None, usd=0.0, first_plan=(4.0, 0.0),
                         stages=old)  # fmt: skip
    assert line.endswith("; stage 1 ran 5.0 s over its plan (9.0 s against 4.0 s)")


def test_planned_parts_split_training_as_a_trial_epoch_does() -> None:
    typed = PROFILE.for_type(TYPE)
    parts = planned_parts(typed, 8.0, 10.0, first=True)
    p = typed.partitions
    epoch = trial_epoch(p, typed.unit.mean, typed.hop.mean, typed.validation.mean, 1.0)
    assert parts["start-up"] == 8.0
    assert parts["units"] == pytest.approx(10.0 * p * typed.unit.mean / epoch)
    assert parts["hops"] == pytest.approx(10.0 * p * typed.hop.mean / epoch)
    assert parts["validation"] == pytest.approx(10.0 * typed.validation.mean / epoch)
    assert "resizing" in planned_parts(typed, 1.0, 1.0, first=False)


def spec(trials: int = 8, epochs: int = 2) -> ExperimentSpec:
    stages = (StageSpec((Cohort(trials, epochs),)), StageSpec((Cohort(2, 4),)))
    return ExperimentSpec("sha", stages)


def test_first_units_slower_than_the_profile_recalibrate_and_the_plan_grows() -> None:
    """The early re-plan decision: units twice as slow as the profile are off by more than
    ``replan_drift``; the calibrated profile plans a longer (or larger) search."""
    typed = PROFILE.for_type(TYPE)
    p = typed.partitions
    units = [2 * typed.unit.mean] * p
    hops = [2 * typed.hop.mean] * p
    measured = units_calibration(typed, units, hops, [2 * typed.validation.mean])
    assert measured is not None and measured.what == "units"
    assert measured.measured == pytest.approx(2 * typed.trial_epoch_seconds(1))
    assert measured.off(0.25) and not measured.off(1.5)
    assert measured.ratio == pytest.approx(2.0)
    assert measured.reason.startswith("measured a trial-epoch of its first units")
    fresh = calibrated(PROFILE, TYPE, measured.values)
    assert fresh.unit_seconds[TYPE] == pytest.approx(2 * typed.unit.mean)
    assert fresh.hop_seconds == pytest.approx(2 * typed.hop.mean)
    assert fresh.worker_start_seconds == PROFILE.worker_start_seconds
    before = plan(spec(), PROFILE, CATALOG, deadline=600.0, instance_type=TYPE, seed=1)
    after = plan(spec(), fresh, CATALOG, deadline=600.0, instance_type=TYPE, seed=1)
    assert after.outcome.seconds > before.outcome.seconds


def test_units_within_the_drift_or_too_few_do_not_recalibrate() -> None:
    typed = PROFILE.for_type(TYPE)
    p = typed.partitions
    close = units_calibration(
        typed, [1.1 * typed.unit.mean] * p, [typed.hop.mean] * p, [typed.validation.mean]
    )
    assert close is not None and not close.off(0.25)
    assert units_calibration(typed, [1.0] * (p - 1), [0.0] * (p - 1), [1.0]) is None
    assert units_calibration(typed, [1.0] * p, [0.0] * p, []) is None


def test_a_slow_start_up_sets_the_worker_start_it_implies() -> None:
    typed = PROFILE.for_type(TYPE)
    slow = startup_calibration(typed, measured=72.0, planned=16.0)
    assert slow.off(0.25) and slow.values == {
        "worker_start_seconds": pytest.approx(typed.worker_start.mean + 56.0)
    }
    assert not startup_calibration(typed, measured=17.0, planned=16.0).off(0.25)
    fast = startup_calibration(typed, measured=0.0, planned=1e9)
    assert fast.values["worker_start_seconds"] == 0.0  # never negative


def test_load_change_warns_past_half_a_core_per_core() -> None:
    then = {"loadavg_1m": 0.2, "cpus": 2}
    assert load_change(then, {"loadavg_1m": 0.2 + 2 * LOAD_CHANGE - 0.01, "cpus": 2}) is None
    warned = load_change(then, {"loadavg_1m": 3.2, "cpus": 2})
    assert warned is not None and "load per core is 1.60 now" in warned and "0.10" in warned
    assert load_change(None, machine_load()) is None  # a profile that recorded none
    now = machine_load()
    assert now["cpus"] >= 1 and now["loadavg_1m"] >= 0
