"""The schedule simulator, and makespans of the rules against the lower bound (§5.4)."""

from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cerebro_spark.errors import ConfigError
from cerebro_spark.mop import (
    CNN_MFLOPS,
    GPU_TFLOPS,
    RandomizedRule,
    ScheduleInstance,
    SimulationResult,
    WorkAwareRule,
    heterogeneous_instance,
    homogeneous_instance,
    seeded_visit_orders,
    simulate,
)


def check_schedule(instance: ScheduleInstance, result: SimulationResult) -> None:
    """Every unit once, on its partition's worker, for its unit time, without overlaps."""
    runs = result.schedule
    cells = {(s.assignment.unit.trial, s.assignment.unit.partition) for s in runs}
    assert len(runs) == len(cells) == len(instance.trials) * len(instance.workers)
    by_worker, by_trial = defaultdict(list), defaultdict(list)
    for s in runs:
        unit, worker = s.assignment.unit, s.assignment.worker
        assert worker == f"w{unit.partition}"
        assert s.end - s.start == pytest.approx(instance.estimate(unit, worker))
        by_worker[worker].append((s.start, s.end))
        by_trial[unit.trial].append((s.start, s.end))
    for spans in [*by_worker.values(), *by_trial.values()]:
        spans.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    assert result.makespan == max((s.end for s in runs), default=0.0)
    assert result.makespan >= result.lower_bound - 1e-9


def test_cnn_table_matches_the_paper() -> None:
    costs = np.array(list(CNN_MFLOPS.values()))
    assert len(costs) == 35 and costs.min() == 360 and costs.max() == 21000
    assert costs.mean() == pytest.approx(5939, rel=1e-3)  # §5.4: mean 5939, sd 5671
    assert costs.std() == pytest.approx(5671, rel=1e-3)
    assert sorted(GPU_TFLOPS.values()) == [5.6, 11.3, 12.1, 18.7]


def test_heterogeneous_instance_samples_the_tables() -> None:
    instance = heterogeneous_instance(6, 4, np.random.default_rng(0))
    times = instance.unit_times
    assert times.shape == (6, 4) and not times.flags.writeable
    costs = set(CNN_MFLOPS.values())
    for column in times.T:  # T[i, j] * capacity_j is a CNN's cost, for one GPU capacity
        assert any(all(round(t * c) in costs for t in column) for c in GPU_TFLOPS.values())


def test_lower_bound_and_ratio() -> None:
    instance = ScheduleInstance([[1.0, 2.0], [3.0, 1.0], [1.0, 1.0]])
    assert instance.lower_bound == 5.0  # worker 0 load 5 > trial 1 total 4
    result = simulate(instance, np.random.default_rng(0))
    check_schedule(instance, result)
    assert result.ratio == result.makespan / 5.0
    empty = simulate(ScheduleInstance(np.ones((0, 3))), np.random.default_rng(0))
    assert empty.makespan == 0.0 and empty.ratio == 1.0 and empty.schedule == ()


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 6).flatmap(
        lambda p: st.lists(
            st.lists(st.integers(1, 9), min_size=p, max_size=p), min_size=1, max_size=8
        )
    ),
    st.booleans(),
    st.booleans(),
    st.integers(0, 2**32 - 1),
)
def test_simulated_schedules_are_valid(
    times: list[list[int]], seeded: bool, work_aware: bool, seed: int
) -> None:
    instance = ScheduleInstance(times)
    rng = np.random.default_rng(seed)
    rule = WorkAwareRule(instance.estimate) if work_aware else RandomizedRule()
    orders = seeded_visit_orders(instance.trials, instance.partitions, rng) if seeded else None
    result = simulate(instance, rng, rule=rule, visit_orders=orders)
    check_schedule(instance, result)
    again = simulate(instance, np.random.default_rng(seed), rule=rule, visit_orders=orders)
    assert seeded or again == result  # deterministic (seeded: rng also drew the orders)


@pytest.mark.parametrize("p", [4, 8])
@pytest.mark.parametrize("seeded", [False, True])
def test_randomized_rule_is_near_optimal_when_configs_outnumber_workers(
    p: int, seeded: bool
) -> None:
    """§5.4: on homogeneous instances with |S| >= 4p the randomized rule is within 10% of
    the lower bound (mean over seeds)."""
    instance = homogeneous_instance(4 * p, p)
    ratios = []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        orders = seeded_visit_orders(instance.trials, instance.partitions, rng) if seeded else None
        ratios.append(simulate(instance, rng, visit_orders=orders).ratio)
    assert np.mean(ratios) <= 1.10, ratios


@pytest.mark.parametrize(("p", "n_trials"), [(4, 8), (4, 16), (8, 16), (8, 32)])
def test_work_aware_rule_beats_randomized_on_heterogeneous_instances(p: int, n_trials: int) -> None:
    randomized, work_aware = [], []
    for seed in range(30):
        instance = heterogeneous_instance(n_trials, p, np.random.default_rng(seed))
        randomized.append(simulate(instance, np.random.default_rng(seed)).ratio)
        rule = WorkAwareRule(instance.estimate)
        work_aware.append(simulate(instance, np.random.default_rng(seed), rule=rule).ratio)
    assert np.mean(work_aware) < np.mean(randomized)


def test_bad_unit_times_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"unit_times \[\[1.0, -1.0\]\] must be .*positive"):
        ScheduleInstance([[1.0, -1.0]])
    with pytest.raises(ConfigError, match=r"unit_times \[1.0, 2.0\] must be a trials x workers"):
        ScheduleInstance(np.array([1.0, 2.0]))
