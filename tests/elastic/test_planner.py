"""The planner (RubberBand §4.3, Alg. 2; Cynthia Alg. 1 for the instance type)."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time

import pytest

from cerebro_spark.elastic import (
    PlanInfeasible,
    Simulator,
    fair_at_most,
    next_lower,
    plan,
    plan_deadline,
    procedure_spec,
    static_sizes,
    step_candidates,
)
from cerebro_spark.elastic._prices import load_catalog
from cerebro_spark.errors import ConfigError
from cerebro_spark.search import Cohort, ExperimentSpec, StageSpec
from tests.elastic.helpers import TYPE, catalog, profile, rubberband_like, sha_spec, two_stages

PRICES = "conf/prices/aws-us-east-1.yaml"
P3 = "p3.2xlarge"


def p3_simulator(spec: ExperimentSpec, scaling: object = None) -> Simulator:
    cat = load_catalog(PRICES)
    return Simulator(spec, rubberband_like(scaling).for_type(P3), cat, cat.price(P3))


def test_the_step_rule_keeps_workers_a_factor_or_a_multiple_of_the_trials() -> None:
    assert next_lower(12, 8) == 8
    assert next_lower(8, 8) == 4
    assert next_lower(4, 6) == 3
    assert next_lower(20, 6) == 18
    assert next_lower(6, 7) == 1
    assert next_lower(1, 5) is None
    assert [fair_at_most(w, 12) for w in (0, 1, 5, 11, 12, 30)] == [None, 1, 4, 6, 12, 24]
    assert static_sizes(3, 9) == list(range(3, 10))
    wide = static_sizes(1, 2000, exhaustive=10)
    assert wide[:10] == list(range(1, 11)) and wide[-1] == 2000
    assert all(b > a for a, b in itertools.pairwise(wide))


def test_greedy_candidates_take_larger_steps_and_clip_to_the_useful_workers() -> None:
    """Hyperband (R=50, eta=3) side by side has 49, 15, 4, 1 trials per stage; on 8
    partitions with the table scaling (flat from 8) the last stage can use 8 workers."""
    spec = procedure_spec("hyperband", 50, eta=3, min_epochs=1)
    sim = p3_simulator(spec)
    assert [s.trials for s in spec.stages] == [49, 15, 4, 1]
    assert [sim.useful_workers(i) for i in range(4)] == [392, 120, 32, 8]
    # Many fair counts in [147, 294): Alg. 2's step, a geometric ladder down to W/2, and
    # the clip to the useful workers.
    found = step_candidates(sim, 3, 294)
    assert found[0] == 293 and found[-1] == 8 and min(found[:-1]) == 147
    assert len(found) <= 12
    # Few: every one of them (the multiples of 49 from W/2).
    assert step_candidates(sim, 0, 294) == [245, 196, 147]
    assert step_candidates(sim, 3, 20) == [*range(19, 9, -1), 8]


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
        sim = p3_simulator(spec)
        again = sim.run(result.outcome.workers)
        assert (again.seconds, again.usd) == pytest.approx((result.seconds, result.usd))
        # No static allocation that meets the deadline is cheaper than the warm start.
        for w in range(1, 300):
            seconds, usd = sim.evaluate((w,) * len(spec.stages))
            assert seconds > deadline or usd >= result.static.usd - 1e-9


def test_sha_with_many_trials_early_and_one_late_saves_a_large_share() -> None:
    """RubberBand §6.3.1's shape: SHA(n=32, r=1, R=50, eta=3) under a tight deadline."""
    result = plan(sha_spec(32, 50, 1, eta=3), rubberband_like(), load_catalog(PRICES),
                  deadline=700)  # fmt: skip
    assert result.saving > 0.3, result.to_dict()
    workers = result.outcome.workers
    assert workers[0] > workers[-1]  # many workers early, few at the end
    assert max(result.outcome.stages[-1].groups) > 1  # the last trial trains in a group


def test_greedy_gets_past_steps_that_each_raise_the_cost() -> None:
    """Hyperband (R=50, eta=3) under sqrt scaling at 2700 s: the cheapest static plan holds
    294 workers ($674.73); dropping one worker from any stage forces re-homing and raises
    the cost, so Alg. 2's single step stopped there (saving 0 %). Larger steps and the
    clip to the useful workers reach (343, 105, 32, 8), $346.15."""
    spec = procedure_spec("hyperband", 50, eta=3, min_epochs=1)
    result = plan(spec, rubberband_like("sqrt"), load_catalog(PRICES), deadline=2700,
                  instance_type=P3)  # fmt: skip
    assert result.static.workers[0] == 294 and result.static.usd == pytest.approx(674.73, abs=0.01)
    assert result.seconds <= 2700
    assert result.usd <= 346.16 and result.saving > 0.45
    sim = p3_simulator(spec, "sqrt")
    single = [next_lower(294, stage.trials) for stage in spec.stages]
    for i, lower in enumerate(single):
        assert lower is not None
        w = [294] * len(spec.stages)
        w[i] = lower
        seconds, usd = sim.evaluate(w)
        assert seconds > 2700 or usd > result.static.usd  # every single step is worse


def test_the_plan_is_a_greedy_fixpoint() -> None:
    spec = two_stages()
    result = plan(spec, profile(), catalog(), deadline=200, instance_type=TYPE)
    assert result.usd <= result.static.usd
    sim = Simulator(spec, profile().for_type(TYPE), catalog(), catalog().price(TYPE))
    # No candidate of the result is feasible and cheaper.
    for i in range(len(spec.stages)):
        for lower in step_candidates(sim, i, result.outcome.workers[i]):
            w = list(result.outcome.workers)
            w[i] = lower
            seconds, usd = sim.evaluate(w)
            assert seconds > 200 or usd >= result.usd - 1e-9


def test_a_budget_only_an_elastic_plan_meets_is_met() -> None:
    """SHA(32, R=50, eta=3) at 700 s: the cheapest static plan costs $11.56, the elastic
    one $6.49; a budget of $8 is met elastically (the warm start alone would miss it)."""
    spec = sha_spec(32, 50, 1, eta=3)
    free = plan(spec, rubberband_like(), load_catalog(PRICES), deadline=700)
    assert free.usd < 8 < free.static.usd
    bound = plan(spec, rubberband_like(), load_catalog(PRICES), deadline=700, budget=8)
    assert bound.usd == pytest.approx(free.usd) and bound.budget == 8
    assert bound.to_dict()["static"]["usd"] > 8


def test_an_infeasible_budget_or_deadline_names_its_numbers() -> None:
    spec = sha_spec(32, 50, 1, eta=3)
    with pytest.raises(PlanInfeasible) as info:
        plan(spec, rubberband_like(), load_catalog(PRICES), deadline=1200, budget=1.0)
    message = str(info.value)
    assert "deadline 1200 s and budget $1.00" in message
    fastest, cheapest = info.value.fastest, info.value.cheapest
    # The cheapest found meets the deadline: it is the plan the budget would need.
    free = plan(spec, rubberband_like(), load_catalog(PRICES), deadline=1200)
    assert cheapest[1].usd == pytest.approx(free.usd) and cheapest[1].seconds <= 1200
    assert fastest[1].seconds <= cheapest[1].seconds
    assert f"the fastest found takes {fastest[1].seconds:.1f} s for ${fastest[1].usd:.2f}" in (
        message
    )
    assert (
        f"the cheapest found within the deadline takes {cheapest[1].seconds:.1f} s for "
        f"${cheapest[1].usd:.2f}" in message
    )
    as_json = info.value.to_dict()
    assert as_json["feasible"] is False and as_json["cheapest"]["usd"] == cheapest[1].usd
    assert as_json["fastest"]["workers"] == list(fastest[1].workers)
    with pytest.raises(PlanInfeasible, match="no allocation meets the deadline 10 s") as info:
        plan(spec, rubberband_like(), load_catalog(PRICES), deadline=10)
    assert "the cheapest found takes" in str(info.value)  # none meets it: the cheapest of all


def test_the_cheapest_instance_type_wins() -> None:
    both = profile(unit_seconds={TYPE: 1.0, "t2": 0.25}, validation_seconds={TYPE: 1.0, "t2": 0.25})
    result = plan(two_stages(), both, catalog(), deadline=400)
    assert set(result.candidates) == {TYPE, "t2"}
    cheapest = min((v[1], t) for t, v in result.candidates.items() if v is not None)[1]
    assert result.instance_type == cheapest
    assert result.price is not None and result.price.instance_type == cheapest
    only = plan(two_stages(), both, catalog(), deadline=400, instance_type="t2")
    assert only.instance_type == "t2"
    with pytest.raises(ConfigError, match=r"has no instance type 'p9'"):
        plan(two_stages(), both, catalog(), deadline=400, instance_type="p9")


def test_an_asynchronous_procedure_gets_one_allocation_within_its_trials_in_flight() -> None:
    spec = ExperimentSpec("grid", (StageSpec((Cohort(16, 8),)),), elastic=False, max_workers=3)
    result = plan(spec, profile(), catalog(), deadline=10_000, instance_type=TYPE)
    assert len(set(result.outcome.workers)) == 1 and result.outcome.workers[0] <= 3


def test_a_deadline_bound_procedure_is_planned_at_its_deadline() -> None:
    """HyperSched with deadline 300 on 2 workers ends at 300 s from the start, start-up
    (16 s) included: a plan for 300 s is feasible, one for 200 s is not."""
    fixed = ExperimentSpec("hypersched", (StageSpec((Cohort(4, 8),)),), elastic=False,
                           max_workers=2, fixed_seconds=300.0, deadline=300.0)  # fmt: skip
    result = plan(fixed, profile(), catalog(), deadline=300, instance_type=TYPE)
    assert result.outcome.workers == (2,) and result.seconds == pytest.approx(300.0)
    with pytest.raises(PlanInfeasible, match="no allocation meets the deadline 200 s"):
        plan(fixed, profile(), catalog(), deadline=200, instance_type=TYPE)
    with pytest.raises(PlanInfeasible, match="and budget"):
        plan(fixed, profile(), catalog(), deadline=300, budget=0.5, instance_type=TYPE)


def test_a_procedure_with_its_own_deadline_is_planned_to_end_by_it() -> None:
    spec = ExperimentSpec("seer", two_stages().stages, deadline=100.0)
    result = plan(spec, profile(), catalog(), deadline=1000, instance_type=TYPE)
    assert result.deadline == 100.0 and result.seconds <= 100.0
    loose = plan(two_stages(), profile(), catalog(), deadline=1000, instance_type=TYPE)
    assert loose.seconds > 100  # without it, a slower, cheaper plan


def test_the_deadline_to_plan_for_is_the_procedures_own() -> None:
    own = ExperimentSpec("seer", two_stages().stages, deadline=60.0)
    assert plan_deadline(own, None) == 60.0 and plan_deadline(own, 60.0) == 60.0
    assert plan_deadline(two_stages(), 90.0) == 90.0 and plan_deadline(two_stages(), None) is None
    with pytest.raises(ConfigError, match=r"asked, 90 s, differs from the deadline 60 s of"):
        plan_deadline(own, 90.0)


def test_an_assumed_epoch_time_far_from_the_profile_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    spec = ExperimentSpec("seer", two_stages().stages, epoch_seconds=2.0)
    with caplog.at_level(logging.WARNING, logger="cerebro_spark.elastic._planner"):
        plan(spec, profile(), catalog(), deadline=1000, instance_type=TYPE)
    assert "epoch_seconds=2, but a trial-epoch on one t1 worker takes 6 s" in caplog.text
    caplog.clear()
    close = ExperimentSpec("seer", two_stages().stages, epoch_seconds=6.5)
    with caplog.at_level(logging.WARNING, logger="cerebro_spark.elastic._planner"):
        plan(close, profile(), catalog(), deadline=1000, instance_type=TYPE)
    assert "epoch_seconds" not in caplog.text


def test_re_planning_with_running_workers() -> None:
    """With 8 workers already up, keeping them costs no start-up: the plan is faster and
    cheaper than from scratch, and says so."""
    spec = two_stages()
    fresh = plan(spec, profile(), catalog(), deadline=1000, instance_type=TYPE)
    again = plan(spec, profile(), catalog(), deadline=1000, instance_type=TYPE, running=8)
    assert again.running == 8 and again.to_dict()["running"] == 8
    assert again.usd < fresh.usd
    sim = Simulator(spec, profile().for_type(TYPE), catalog(), catalog().price(TYPE), running=8)
    assert sim.evaluate(again.outcome.workers) == pytest.approx((again.seconds, again.usd))
    with pytest.raises(ConfigError, match="running must be a number of workers >= 0"):
        plan(spec, profile(), catalog(), deadline=1000, running=-2)


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="deadline must be a number of seconds > 0"):
        plan(two_stages(), profile(), catalog(), deadline=0)
    with pytest.raises(ConfigError, match="budget must be a number of dollars > 0"):
        plan(two_stages(), profile(), catalog(), deadline=10, budget=-1)
    lonely = profile(unit_seconds={"x9": 1.0}, validation_seconds={"x9": 1.0})
    with pytest.raises(ConfigError, match=r"none of which price catalog catalog lists"):
        plan(two_stages(), lonely, catalog(), deadline=10)


def test_planning_sha_512_with_r_4096_at_a_tight_deadline_takes_under_5_s() -> None:
    """The issue's requirement, on the slowest case the benchmark measures (64 partitions,
    linear scaling, 38 000 s: the greedy search takes many steps; it took 16.5 s before
    the simulator memoized its stage pieces). A check of the search's complexity: it
    takes well under a second here; minutes would mean a blow-up."""
    spec = sha_spec(512, 4096, 1, eta=2)
    prof = rubberband_like("linear", partitions=64, unit_seconds={P3: 0.5}, hop_seconds=0.0625)
    begun = time.perf_counter()
    result = plan(spec, prof, load_catalog(PRICES), deadline=38_000, instance_type=P3)
    assert time.perf_counter() - begun < 5
    assert result.seconds <= 38_000 and result.saving > 0.1


def test_a_seer_plan_is_not_cheaper_for_cutting_its_stages_short() -> None:
    """SEER's stages end by the clock: on 1 worker they start later and are cut shorter
    (15 trial-epochs in 107 s, $0.147) than on 2 (17 in 76 s, $0.192). Both meet the
    120 s deadline; the plan keeps the work the static plans that meet it can do."""
    spec = procedure_spec("seer", 6, deadline=120, worker_seconds=200, epoch_seconds=6.0,
                          num_workers=2)  # fmt: skip
    spec = dataclasses.replace(spec, max_workers=2)
    sim = Simulator(spec, profile().for_type(TYPE), catalog(), catalog().price(TYPE))
    assert sim.trained((1, 1, 1)) == 15 and sim.trained((2, 2, 2)) == 17
    assert sim.evaluate((1, 1, 1)) == pytest.approx((107.0, 0.147))
    assert sim.evaluate((2, 2, 2)) == pytest.approx((76.0, 0.192))
    planned = plan(spec, profile(), catalog(), deadline=120)
    assert planned.outcome.workers == (2, 2, 2) and planned.static.workers == (2, 2, 2)
