"""The execution model and simulator (RubberBand §4.2 adapted to MOP), checked by hand.

Numbers of ``helpers.profile()``: P = 4, a trial-epoch is T(1) = 4 * (1 + 0.25) + 1 = 6 s on
one worker and T(2) = 4 * (1/1.5 + 0.25) + 1 = 4.667 s on a group of 2; scale 5 s, worker
start 10 s, a partition load 0.5 s; one instance is $0.001 per second (60 s minimum), a
partition 1 GB at $0.01. ``two_stages()``: 8 trials x 2 epochs, then 2 trials x 4 epochs.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import numpy as np
import pytest

from cerebro_spark.elastic import (
    NodeKind,
    Simulator,
    parse_catalog,
    partition_moves,
    procedure_spec,
)
from cerebro_spark.errors import ConfigError
from cerebro_spark.search import Cohort, ExperimentSpec, StageClock, StageSpec
from tests.elastic.helpers import TYPE, catalog, profile, two_stages

PER_FUNCTION = {
    "billing": {"model": "per_function"},
    "data": {"ingress_usd_per_gb": 0.0},
    "instances": {TYPE: {"usd_per_hour": 3.6}},
}


def simulator(spec: ExperimentSpec | None = None, **kwargs: Any) -> Simulator:
    cat = kwargs.pop("catalog", None) or catalog()
    prof = kwargs.pop("profile", None) or profile()
    return Simulator(spec or two_stages(), prof.for_type(TYPE), cat, cat.price(TYPE), **kwargs)


def one_stage(trials: int = 8, epochs: int = 1) -> ExperimentSpec:
    return ExperimentSpec("one", (StageSpec((Cohort(trials, epochs),)),))


def test_the_dag_of_a_grow_then_shrink_allocation() -> None:
    sim = simulator()
    kinds = [(n.kind, n.stage) for n in sim.to_dag((4, 2))]
    assert kinds == [
        (NodeKind.SCALE, 0),
        (NodeKind.INIT_INSTANCE, 0),
        (NodeKind.TRAIN, 0),
        (NodeKind.SYNC, 0),
        (NodeKind.REHOME, 1),
        (NodeKind.TRAIN, 1),
        (NodeKind.SYNC, 1),
    ]
    grow = [(n.kind, n.stage) for n in sim.to_dag((2, 4))]
    assert grow[4:6] == [(NodeKind.SCALE, 1), (NodeKind.INIT_INSTANCE, 1)]
    # Workers already running: nothing to scale or start before stage 1.
    running = [(n.kind, n.stage) for n in simulator(running=4).to_dag((4, 4))]
    assert running == [(NodeKind.TRAIN, 0), (NodeKind.SYNC, 0), (NodeKind.TRAIN, 1),
                       (NodeKind.SYNC, 1)]  # fmt: skip


def test_time_and_per_instance_cost_by_hand() -> None:
    """Stage 1: scale 5 + start 10 + one load 0.5 = 15.5; 8 trials x 2 epochs on 4 workers
    take max(8*2*6/4, 2*6) = 24 s -> 39.5. Stage 2: 2 of the 4 workers leave, their 2
    partitions are re-read by the 2 survivors (0.5 s) -> 40; 2 trials x 4 epochs on 2
    workers: max(2*4*6/2, 4*6) = 24 s -> 64."""
    out = simulator().run((4, 2))
    assert out.seconds == pytest.approx(64.0)
    first, second = out.stages
    assert (first.start, first.end) == pytest.approx((15.5, 39.5))
    assert (second.start, second.end) == pytest.approx((40.0, 64.0))
    assert first.groups == (1,) and second.groups == (1,)
    # 2 instances released at 39.5 s are billed the 60 s minimum, 2 run to 64 s.
    assert out.compute_usd == pytest.approx(2 * 0.060 + 2 * 0.064)
    # 4 initial loads + 2 re-homed, 1 GB each at $0.01.
    assert out.loads == 6 and (first.loads, second.loads) == (4, 2)
    assert out.data_usd == pytest.approx(0.06)
    assert out.usd == pytest.approx(0.308)
    assert first.usd == pytest.approx(2 * 0.0395 + 2 * (0.060 - 0.0395) + 2 * 0.0395 + 0.04)
    assert sum(s.usd for s in out.stages) == pytest.approx(out.usd)


def test_partition_moves_count_loads_once_for_time_and_ingress() -> None:
    # From none: placement i mod W (the busiest loads ceil(P/W)), one replica each past P.
    assert partition_moves(4, 0, 3) == (2, 4)
    assert partition_moves(4, 0, 4) == (1, 4)
    assert partition_moves(8, 0, 24) == (1, 24)
    # Joining: ceil(P/W) replicas per new worker.
    assert partition_moves(4, 2, 4) == (1, 2)
    assert partition_moves(8, 2, 3) == (3, 3)
    # Leaving: the leavers' share re-read by the survivors.
    assert partition_moves(4, 4, 2) == (1, 2)
    assert partition_moves(4, 6, 2) == (2, 3)
    assert partition_moves(4, 3, 3) == (0, 0)


def test_ingress_and_start_up_agree_when_workers_outnumber_partitions() -> None:
    """8 workers on 4 partitions load one each (8 GB, 8 loads, 0.5 s each in parallel); 3
    workers load 4 partitions (2 on the busiest: 1 s); growing 2 -> 4 loads 2 replicas."""
    wide = simulator(one_stage()).run((8,))
    assert wide.loads == 8 and wide.data_usd == pytest.approx(0.08)
    assert wide.stages[0].start == pytest.approx(5 + 10 + 0.5)
    narrow = simulator(one_stage()).run((3,))
    assert narrow.loads == 4 and narrow.stages[0].start == pytest.approx(5 + 10 + 2 * 0.5)
    grow = simulator().run((2, 4))
    assert [s.loads for s in grow.stages] == [4, 2]
    # Stage 2 waits for the new workers: scale 5 + start 10 + one replica 0.5.
    assert grow.stages[1].start - grow.stages[0].end == pytest.approx(15.5)


def test_per_function_billing_charges_only_starting_and_training() -> None:
    out = simulator(catalog=parse_catalog(PER_FUNCTION)).run((4, 2))
    # 4 workers start (10.5 s each), then 8*2*6 and 2*4*6 worker-seconds of training.
    assert out.usd == pytest.approx(0.001 * (4 * 10.5 + 96 + 48))


def test_a_stage_with_fewer_trials_than_workers_trains_in_groups() -> None:
    spec = ExperimentSpec("one", (StageSpec((Cohort(1, 2),)),))
    sim = simulator(spec)
    assert sim.groups(0, 1) == (1,)
    assert sim.groups(0, 2) == (2,)  # max(2*2*4.667/2, 2*4.667) = 9.33 < 12 on one worker
    out = sim.run((2,))
    assert out.stages[0].seconds == pytest.approx(2 * (4 * (1 / 1.5 + 0.25) + 1))
    # A group larger than the profile measured gains nothing: g stays 2 on 8 workers.
    assert sim.groups(0, 8) == (2,)
    # ... so 2 workers are all the stage can use; at most P = 4 under linear scaling.
    assert sim.useful_workers(0) == 2
    linear = simulator(spec, profile=profile(scaling="linear"))
    assert linear.useful_workers(0) == 4 and linear.groups(0, 4) == (4,)


def test_seer_resources_are_kept() -> None:
    spec = ExperimentSpec("seer", (StageSpec((Cohort(2, 1), Cohort(1, 1, resources=2))),))
    assert simulator(spec).groups(0, 4) == (1, 2)
    assert simulator(spec).groups(0, 1) == (1, 1)


def late_seer() -> ExperimentSpec:
    """SEER with T = 120 s, B = 200 worker-seconds, epochs of 6 s, at most 6 epochs a
    trial: 8 trials, stages ending at 6.25, 18.75, 43.75 and 93.75 s with 1, 2, 4 and 8
    epochs; the spec's stages (the cap applied) are 8 x 1, 4 x 2 and 2 x 3 epochs."""
    spec = procedure_spec("seer", 6, deadline=120, worker_seconds=200, epoch_seconds=6.0,
                          num_workers=2)  # fmt: skip
    assert [(s.trials, s.epochs) for s in spec.stages] == [(8, 1), (4, 2), (2, 3)]
    return spec


def test_seer_stages_that_start_late_train_what_their_clock_leaves() -> None:
    """SEER closes a stage at its end once each member trained an epoch. On 2 workers
    start-up (5 + 10 + 2 x 0.5 = 16 s) and a round of 8 trials (24 s) run past the ends of
    stages 1-3, so the run trains rounds of 8, 4, 2 trials (one epoch each), then the last
    trial's 3 epochs left (ends 64, 70, 76 s, within 93.75 s): counted into the spec's
    stages (1, 2 and 3 rounds), 24 s, 12 + 6 s and 3 x 6 s: 76 s, not the 82 s of the
    stages' epochs (stage 2: 4 trials x 2 epochs, 24 s), 17 trial-epochs, not 22."""
    sim = simulator(late_seer())
    out = sim.run((2, 2, 2))
    assert [s.seconds for s in out.stages] == pytest.approx([24.0, 18.0, 18.0])
    assert out.seconds == pytest.approx(76.0)
    assert sim.trained((2, 2, 2)) == 8 + 4 + 2 + 3
    # The spec's stages and epochs are kept: the elastic controller counts rounds by them.
    assert [(s.trials, s.epochs) for s in out.stages] == [(8, 1), (4, 2), (2, 3)]
    # A re-plan's stages left are priced by their epochs (the clock no longer applies).
    rest = dataclasses.replace(late_seer(), stages=late_seer().stages[1:])
    assert simulator(rest).run((2, 2)).stages[0].seconds == pytest.approx(24.0)


def test_a_stage_the_run_never_reaches_costs_nothing() -> None:
    """Stage ends passed (1, 2, 3 s) and a 39 s deadline: rounds of 4 trials (12 s, to
    28 s), 2 (6 s) and 1 (6 s, to 40 s: the deadline stops the run). The third stage's
    rounds never come: no re-homing to its 1 worker, no time, no money."""
    stages = (StageSpec((Cohort(4, 1),)), StageSpec((Cohort(2, 2),)), StageSpec((Cohort(1, 2),)))
    clock = StageClock(ends=(1.0, 2.0, 3.0), trials=((4,), (2,), (1,)),
                       epochs=((1,), (2,), (4,)), resources=(1,), max_epochs=5,
                       blocks=(1, 2, 2))  # fmt: skip
    spec = ExperimentSpec("seer", stages, deadline=39.0, clock=clock)
    sim = simulator(spec)
    out = sim.run((2, 2, 1))
    assert [s.seconds for s in out.stages] == pytest.approx([12.0, 12.0, 0.0])
    assert out.seconds == pytest.approx(40.0) and out.stages[2].start == pytest.approx(40.0)
    assert out.stages[2].usd == 0 and out.stages[2].loads == 0
    assert out.usd == pytest.approx(simulator(spec).run((2, 2, 2)).usd)
    assert [n.kind for n in sim.to_dag((2, 2, 1)) if n.stage == 2] == [NodeKind.TRAIN,
                                                                         NodeKind.SYNC]  # fmt: skip


def test_the_useful_workers_of_a_forced_group_that_stops_paying() -> None:
    """One SEER trial on resources=4 trains on min(4, W) workers; with scaling 1.9 on 2
    but 1.0 on 4 its epoch takes 6 s on 1 worker, 4.1 s on 2, 4.8 s on 3, 6 s on 4: the
    stage is fastest on 2 (the time is not monotone in W: no bisection)."""
    spec = ExperimentSpec("seer", (StageSpec((Cohort(1, 1, resources=4),)),))
    sim = simulator(spec, profile=profile(scaling={1: 1.0, 2: 1.9, 4: 1.0}))
    times = [sim.stage_seconds(0, w) for w in (1, 2, 3, 4)]
    assert times == pytest.approx([6.0, 4 * (1 / 1.9 + 0.25) + 1, 4 * (1 / 1.45 + 0.25) + 1, 6])
    assert sim.useful_workers(0) == 2


def test_a_deadline_bound_search_ends_at_its_deadline_from_the_start() -> None:
    """The procedure's clock starts before the workers: start-up (scale 5 + start 10 + 2
    loads of 0.5 = 16 s) is part of its 100 s, so it ends at 100 s, training 84 s; with a
    deadline shorter than the start-up it ends when start-up does."""
    fixed = ExperimentSpec("hypersched", (StageSpec((Cohort(4, 9),)),), elastic=False,
                           max_workers=2, fixed_seconds=100.0)  # fmt: skip
    out = simulator(fixed).run((2,))
    assert out.seconds == pytest.approx(100.0)
    assert (out.stages[0].start, out.stages[0].seconds) == pytest.approx((16.0, 84.0))
    # 2 instances held 100 s, 4 partitions of 1 GB.
    assert out.usd == pytest.approx(2 * 0.100 + 0.04)
    short = dataclasses.replace(fixed, fixed_seconds=10.0)
    out = simulator(short).run((2,))
    assert out.seconds == pytest.approx(16.0) and out.stages[0].seconds == 0
    assert out.compute_usd == pytest.approx(2 * 0.060)  # the minimum
    busy = simulator(fixed, catalog=parse_catalog(PER_FUNCTION)).run((2,))
    assert busy.usd == pytest.approx(0.001 * (2 * 11.0 + 2 * 84.0))


def test_running_workers_pay_no_start_up_nor_their_minimum_again() -> None:
    """Re-planning with 4 workers running at t = 0, allocation (4, 2): stage 1 trains at
    once (0 -> 24 s); 2 leave at 24 s, their 2 partitions re-read (0.5 s) -> 24.5; stage 2
    trains 24 s -> 48.5. Compute: 4 x 24 s + 2 x 24.5 s, and the 2 kept to the end are
    billed by the second from t = 0 (49 s, no 60 s minimum): $0.146; data: the 2
    re-homed partitions, $0.02."""
    out = simulator(running=4).run((4, 2))
    assert out.seconds == pytest.approx(48.5)
    assert [(s.start, s.end) for s in out.stages] == [
        pytest.approx((0.0, 24.0)),
        pytest.approx((24.5, 48.5)),
    ]
    assert out.compute_usd == pytest.approx(0.096 + 0.049 + 0.001)
    assert out.loads == 2 and out.data_usd == pytest.approx(0.02)
    assert out.usd == pytest.approx(0.166)


def test_growing_beyond_the_running_workers_pays_for_the_new_ones() -> None:
    """2 running, allocation (4, 2): 2 new workers scale (5), start (10) and load one
    replica each (0.5): 15.5 -> 39.5, then as from scratch: 64 s. The 2 new instances
    leave at 39.5 s and pay the 60 s minimum ($0.120); the 2 running ones are held 64 s
    ($0.128); data: 2 replicas + 2 re-homed."""
    out = simulator(running=2).run((4, 2))
    assert out.seconds == pytest.approx(64.0)
    assert out.stages[0].start == pytest.approx(15.5)
    assert out.compute_usd == pytest.approx(0.120 + 0.128)
    assert [s.loads for s in out.stages] == [2, 2]
    assert out.usd == pytest.approx(0.288)
    functions = simulator(running=2, catalog=parse_catalog(PER_FUNCTION)).run((4, 2))
    assert functions.usd == pytest.approx(0.001 * (2 * 10.5 + 96 + 48))


def test_shrinking_below_the_running_workers_releases_them_at_once() -> None:
    """6 running, allocation (2, 2): 4 leave at t = 0 (billed nothing more); their share,
    ceil(4 * 4/6) = 3 partitions, is re-read by the 2 survivors (2 loads each: 1 s);
    8 x 2 epochs on 2 workers take 48 s -> 49, then 24 s -> 73."""
    out = simulator(running=6).run((2, 2))
    assert out.seconds == pytest.approx(73.0)
    assert out.stages[0].start == pytest.approx(1.0)
    assert out.compute_usd == pytest.approx(2 * 0.073)
    assert out.loads == 3 and out.usd == pytest.approx(0.146 + 0.03)
    with pytest.raises(ConfigError, match="running must be a number of workers >= 0"):
        simulator(running=-1)


def test_executors_per_instance_and_the_billing_granularity() -> None:
    cat = catalog(instances={TYPE: {"usd_per_hour": 3.6, "executors": 4}},
                  billing={"granularity_seconds": 60, "minimum_seconds": 0})  # fmt: skip
    out = simulator(catalog=cat).run((4, 4))
    assert [s.instances for s in out.stages] == [1, 1]
    # Stage 2 trains its 2 trials in groups of 2: max(2*2*4*4.667/4, 4*4.667) = 18.67 s.
    assert out.seconds == pytest.approx(15.5 + 24 + 4 * 14 / 3)
    # The one instance is held 58.17 s and billed by the minute: 60 s.
    assert out.compute_usd == pytest.approx(0.060)
    assert simulator(catalog=cat).run((4, 1)).stages[1].instances == 1


def test_spreads_give_averages_over_seeded_samples() -> None:
    noisy = profile(unit_seconds_spread={TYPE: 0.3}, scale_seconds_spread=2.0)
    a = simulator(profile=noisy, samples=64, seed=1).run((4, 2))
    b = simulator(profile=noisy, samples=64, seed=1).run((4, 2))
    c = simulator(profile=noisy, samples=64, seed=2).run((4, 2))
    assert a == b and a != c
    assert a.seconds == pytest.approx(64.0, rel=0.1)


def test_samples_of_a_latency_no_allocation_uses_change_nothing() -> None:
    """A spread on SCALE makes the simulation sample (arrays) instead of the float fast
    path; with every worker already running nothing scales, so the hand numbers hold."""
    noisy = profile(scale_seconds_spread=3.0)
    sampled = simulator(profile=noisy, running=4, samples=16)
    assert sampled.samples == 16
    out = sampled.run((4, 2))
    exact = simulator(running=4).run((4, 2))
    assert (out.seconds, out.usd) == pytest.approx((exact.seconds, exact.usd))
    assert out.seconds == pytest.approx(48.5) and out.usd == pytest.approx(0.166)


@pytest.mark.parametrize("noisy", [False, True], ids=["floats", "samples"])
def test_the_dag_run_and_evaluate_agree(noisy: bool) -> None:
    changes: dict[str, Any] = (
        {"unit_seconds_spread": {TYPE: 0.3}, "worker_start_seconds_spread": 2.0} if noisy else {}
    )
    fixed = ExperimentSpec("asha", (StageSpec((Cohort(4, 9),)),), elastic=False,
                           max_workers=3, fixed_seconds=40.0)  # fmt: skip
    for spec, running in itertools.product((two_stages(), fixed, late_seer()), (0, 3)):
        sim = simulator(spec, profile=profile(**changes), running=running)
        for allocation in itertools.product((1, 2, 3, 5, 9), repeat=len(spec.stages)):
            out = sim.run(allocation)
            dag = sim.to_dag(allocation)
            finish = Simulator.critical_path(dag)
            assert float(np.mean(finish[-1])) == pytest.approx(out.seconds)
            assert sim.evaluate(allocation) == pytest.approx((out.seconds, out.usd))
            assert sum(s.usd for s in out.stages) == pytest.approx(out.usd)


def test_bad_allocations_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"each of the 2 stages >= 1 worker, got \[4\]"):
        simulator().run((4,))
    with pytest.raises(ConfigError, match=r"got \[4, 0\]"):
        simulator().run((4, 0))
    with pytest.raises(ConfigError, match=r"got \[4, 0\]"):
        simulator().evaluate((4, 0))
    with pytest.raises(ConfigError, match="samples must be an integer >= 1"):
        simulator(samples=0)


def test_a_spec_checks_its_deadline_parts() -> None:
    stage = (StageSpec((Cohort(4, 9),)),)
    with pytest.raises(ConfigError, match="fixed_seconds is for one asynchronous stage"):
        ExperimentSpec("x", stage, fixed_seconds=10.0)
    with pytest.raises(ConfigError, match=r"deadline must be a number of seconds > 0, got -1"):
        ExperimentSpec("x", stage, deadline=-1)
    spec = ExperimentSpec("seer", stage, deadline=60.0, epoch_seconds=2.0)
    assert spec.to_dict()["deadline"] == 60.0 and spec.to_dict()["epoch_seconds"] == 2.0


def test_the_drivers_start_delays_every_stage_and_is_not_billed() -> None:
    """3 s from ``run`` to the first request: every stage 3 s later (67 s), the bill as
    before (the instances are requested 3 s later and released 3 s later); a DRIVER_START
    node heads the DAG; a re-plan (workers running) has none."""
    driver = profile(driver_start_seconds=3.0)
    out = simulator(profile=driver).run((4, 2))
    base = simulator().run((4, 2))
    assert out.seconds == pytest.approx(base.seconds + 3.0)
    assert [s.start for s in out.stages] == pytest.approx([s.start + 3 for s in base.stages])
    assert out.usd == pytest.approx(base.usd)
    assert simulator(profile=driver).to_dag((4, 2))[0].kind is NodeKind.DRIVER_START
    replan = simulator(profile=driver, running=4).run((4, 2))
    assert replan.seconds == pytest.approx(simulator(running=4).run((4, 2)).seconds)


def test_instances_started_one_after_another() -> None:
    """``scale_seconds_each`` 2 s: 4 new instances are granted after 5 + 3 x 2 = 11 s (stage 1
    trains 21.5 -> 45.5, stage 2 46 -> 70), all billed from the request: the 2 that leave
    at 45.5 s pay the 60 s minimum, the 2 kept to the end are held 70 s."""
    out = simulator(profile=profile(scale_seconds_each=2.0)).run((4, 2))
    assert [(s.start, s.end) for s in out.stages] == [
        pytest.approx((21.5, 45.5)),
        pytest.approx((46.0, 70.0)),
    ]
    assert out.compute_usd == pytest.approx(2 * 0.060 + 2 * 0.070)
    # Growing by one instance pays no "each".
    assert simulator(profile=profile(scale_seconds_each=2.0), running=3).run((4, 4)).stages[
        0
    ].start == pytest.approx(simulator(running=3).run((4, 4)).stages[0].start)


@pytest.mark.parametrize("noisy", [False, True], ids=["floats", "samples"])
def test_the_dag_agrees_with_a_driver_start_and_serial_instances(noisy: bool) -> None:
    changes: dict[str, Any] = {"driver_start_seconds": 4.0, "scale_seconds_each": 1.5}
    if noisy:
        changes["driver_start_seconds_spread"] = 1.0
    for spec in (two_stages(), late_seer()):
        sim = simulator(spec, profile=profile(**changes))
        for allocation in itertools.product((1, 2, 5), repeat=len(spec.stages)):
            out = sim.run(allocation)
            finish = Simulator.critical_path(sim.to_dag(allocation))
            assert float(np.mean(finish[-1])) == pytest.approx(out.seconds)
            assert sum(s.usd for s in out.stages) == pytest.approx(out.usd)
