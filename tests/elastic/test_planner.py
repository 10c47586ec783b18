"""The planner (RubberBand §4.3, Alg. 2; Cynthia Alg. 1 for the instance type)."""

from __future__ import annotations

import itertools
import time

import pytest

from cerebro_spark.elastic import (
    PlanInfeasible,
    Simulator,
    next_lower,
    parse_profile,
    plan,
    static_sizes,
)
from cerebro_spark.elastic._prices import load_catalog
from cerebro_spark.errors import ConfigError
from cerebro_spark.search import Cohort, ExperimentSpec, StageSpec
from tests.elastic.helpers import TYPE, catalog, profile, sha_spec, two_stages

PRICES = "conf/prices/aws-us-east-1.yaml"


def rubberband_like(scaling: object = None) -> object:
    """ResNet-like units on p3.2xlarge (8 partitions, 4 s units), scaling flat beyond 8."""
    return parse_profile(
        {
            "partitions": 8,
            "unit_seconds": {"p3.2xlarge": 4.0},
            "validation_seconds": {"p3.2xlarge": 2.0},
            "hop_seconds": 0.5,
            "worker_start_seconds": 15,
            "scale_seconds": 15,
            "scaling": scaling or {1: 1.0, 2: 1.9, 4: 3.5, 8: 6.0},
            "partition_load_seconds": 2,
        }
    )


def test_the_step_rule_keeps_workers_a_factor_or_a_multiple_of_the_trials() -> None:
    assert next_lower(12, 8) == 8
    assert next_lower(8, 8) == 4
    assert next_lower(4, 6) == 3
    assert next_lower(20, 6) == 18
    assert next_lower(1, 5) is None
    assert static_sizes(3, 9) == list(range(3, 10))
    wide = static_sizes(1, 2000, exhaustive=10)
    assert wide[:10] == list(range(1, 11)) and wide[-1] == 2000
    assert all(b > a for a, b in itertools.pairwise(wide))


def test_the_plan_meets_the_deadline_and_is_no_dearer_than_the_cheapest_static() -> None:
    spec = sha_spec(32, 50, 1, eta=3)
    prof = rubberband_like()
    cat = load_catalog(PRICES)
    for deadline in (700, 900, 1200, 1800, 2400):
        result = plan(spec, prof, cat, deadline=deadline)
        assert result.seconds <= deadline
        assert result.usd <= result.static.usd + 1e-9
        assert result.static.seconds <= deadline
        assert all(w == result.static.workers[0] for w in result.static.workers)
        # The simulator agrees with the plan's own numbers.
        sim = Simulator(spec, prof.for_type("p3.2xlarge"), cat, cat.price("p3.2xlarge"))
        again = sim.run(result.outcome.workers)
        assert (again.seconds, again.usd) == pytest.approx((result.seconds, result.usd))


def test_sha_with_many_trials_early_and_one_late_saves_a_large_share() -> None:
    """RubberBand §6.3.1's shape: SHA(n=32, r=1, R=50, eta=3) under a tight deadline."""
    result = plan(sha_spec(32, 50, 1, eta=3), rubberband_like(), load_catalog(PRICES),
                  deadline=700)  # fmt: skip
    assert result.saving > 0.3, result.to_dict()
    workers = result.outcome.workers
    assert workers[0] > workers[-1]  # many workers early, few at the end
    assert max(result.outcome.stages[-1].groups) > 1  # the last trial trains in a group


def test_the_planner_never_does_worse_than_its_warm_start_and_greedy_lowers_stages() -> None:
    spec = two_stages()
    result = plan(spec, profile(), catalog(), deadline=200, instance_type=TYPE)
    assert result.usd <= result.static.usd
    sim = Simulator(spec, profile().for_type(TYPE), catalog(), catalog().price(TYPE))
    # No single-stage decrement of the result is feasible and cheaper (a greedy fixpoint).
    for i, stage in enumerate(spec.stages):
        lower = next_lower(result.outcome.workers[i], stage.trials)
        if lower is None:
            continue
        w = list(result.outcome.workers)
        w[i] = lower
        other = sim.run(w)
        assert other.seconds > 200 or other.usd >= result.usd - 1e-9


def test_an_infeasible_budget_or_deadline_names_its_numbers() -> None:
    spec = sha_spec(32, 50, 1, eta=3)
    with pytest.raises(PlanInfeasible) as info:
        plan(spec, rubberband_like(), load_catalog(PRICES), deadline=1200, budget=1.0)
    message = str(info.value)
    assert "deadline 1200 s and budget $1.00" in message
    assert "the fastest found takes" in message and "the cheapest found takes" in message
    fastest, cheapest = info.value.fastest, info.value.cheapest
    assert fastest[1].seconds <= cheapest[1].seconds and cheapest[1].usd > 1.0
    assert f"{cheapest[1].seconds:.1f} s for ${cheapest[1].usd:.2f}" in message
    with pytest.raises(PlanInfeasible, match="no allocation meets the deadline 10 s"):
        plan(spec, rubberband_like(), load_catalog(PRICES), deadline=10)


def test_the_cheapest_instance_type_wins() -> None:
    both = profile(unit_seconds={TYPE: 1.0, "t2": 0.25}, validation_seconds={TYPE: 1.0, "t2": 0.25})
    result = plan(two_stages(), both, catalog(), deadline=400)
    assert set(result.candidates) == {TYPE, "t2"}
    cheapest = min((v[1], t) for t, v in result.candidates.items() if v is not None)[1]
    assert result.instance_type == cheapest
    only = plan(two_stages(), both, catalog(), deadline=400, instance_type="t2")
    assert only.instance_type == "t2"
    with pytest.raises(ConfigError, match=r"has no instance type 'p9'"):
        plan(two_stages(), both, catalog(), deadline=400, instance_type="p9")


def test_an_asynchronous_procedure_gets_one_allocation_within_its_trials_in_flight() -> None:
    spec = ExperimentSpec("grid", (StageSpec((Cohort(16, 8),)),), elastic=False, max_workers=3)
    result = plan(spec, profile(), catalog(), deadline=10_000, instance_type=TYPE)
    assert len(set(result.outcome.workers)) == 1 and result.outcome.workers[0] <= 3
    fixed = ExperimentSpec("hypersched", (StageSpec((Cohort(4, 8),)),), elastic=False,
                           max_workers=2, fixed_seconds=300.0)  # fmt: skip
    assert plan(fixed, profile(), catalog(), deadline=400, instance_type=TYPE).outcome.workers == (
        2,
    )
    with pytest.raises(PlanInfeasible):
        plan(fixed, profile(), catalog(), deadline=200, instance_type=TYPE)


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="deadline must be a number of seconds > 0"):
        plan(two_stages(), profile(), catalog(), deadline=0)
    with pytest.raises(ConfigError, match="budget must be a number of dollars > 0"):
        plan(two_stages(), profile(), catalog(), deadline=10, budget=-1)
    lonely = profile(unit_seconds={"x9": 1.0}, validation_seconds={"x9": 1.0})
    with pytest.raises(ConfigError, match=r"none of which price catalog catalog lists"):
        plan(two_stages(), lonely, catalog(), deadline=10)


def test_planning_a_large_sha_is_quick_enough_to_run_in_a_test() -> None:
    """The 5 s target is measured by benchmarks/elastic_planner.py; this only guards against
    an accidental blow-up (minutes) of the search."""
    spec = sha_spec(512, 4096, 1, eta=2)
    begun = time.perf_counter()
    result = plan(spec, rubberband_like(), load_catalog(PRICES), deadline=3600 * 20)
    assert time.perf_counter() - begun < 60
    assert result.seconds <= 3600 * 20
