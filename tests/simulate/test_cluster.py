"""Epoch times under the scaling functions, overheads, and list-scheduled rounds."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cerebro_spark.errors import ConfigError
from cerebro_spark.simulate import EpochJob, epoch_seconds, schedule_round


def test_epoch_seconds_under_each_scaling() -> None:
    assert epoch_seconds(1.0, 4, "linear") == 0.25
    assert epoch_seconds(1.0, 4, "sqrt") == 0.5
    assert epoch_seconds(1.0, 4, "none") == 1.0
    assert epoch_seconds(2.0, 2, "sqrt") == pytest.approx(math.sqrt(2))


def test_overhead_is_paid_only_on_a_change() -> None:
    assert epoch_seconds(1.0, 2, "linear", overhead=0.3, changed=True) == pytest.approx(0.8)
    assert epoch_seconds(1.0, 2, "linear", overhead=0.3, changed=False) == 0.5


def test_round_of_single_worker_jobs() -> None:
    jobs = [EpochJob(f"t{i}", 1, 1.0) for i in range(5)]
    schedule = schedule_round(jobs, 2)
    assert schedule.makespan == 3.0
    assert sorted(schedule.finish.values()) == [1.0, 1.0, 2.0, 2.0, 3.0]


def test_wide_jobs_occupy_several_workers() -> None:
    jobs = [EpochJob("a", 2, 0.5), EpochJob("b", 1, 1.0), EpochJob("c", 1, 1.0)]
    schedule = schedule_round(jobs, 2)
    # longest first: b and c fill both workers until 1.0, then a needs both
    assert schedule.finish == {"b": 1.0, "c": 1.0, "a": 1.5}
    assert schedule_round([EpochJob("x", 8, 1.0)], 4).makespan == 1.0  # capped at 4


def test_empty_round_and_bad_input() -> None:
    assert schedule_round([], 3).makespan == 0.0
    with pytest.raises(ConfigError, match="num_workers must be >= 1"):
        schedule_round([], 0)
    with pytest.raises(ConfigError, match="trial a needs >= 1 worker, got 0"):
        schedule_round([EpochJob("a", 0, 1.0)], 2)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 6), st.floats(0.01, 5.0)), min_size=1, max_size=20),
    st.integers(1, 8),
)
def test_makespan_between_lower_bound_and_serial_time(
    spec: list[tuple[int, float]], workers: int
) -> None:
    jobs = [EpochJob(f"t{i}", k, s) for i, (k, s) in enumerate(spec)]
    schedule = schedule_round(jobs, workers)
    work = sum(min(j.workers, workers) * j.seconds for j in jobs)
    lower = max(work / workers, max(j.seconds for j in jobs))
    assert schedule.makespan >= lower - 1e-9
    assert schedule.makespan <= sum(j.seconds for j in jobs) + 1e-9
    assert set(schedule.finish) == {j.trial_id for j in jobs}
