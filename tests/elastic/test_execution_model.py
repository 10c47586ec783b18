"""The execution model and simulator (RubberBand §4.2 adapted to MOP), checked by hand.

Numbers of ``helpers.profile()``: P = 4, a trial-epoch is T(1) = 4 * (1 + 0.25) + 1 = 6 s on
one worker and T(2) = 4 * (1/1.5 + 0.25) + 1 = 4.667 s on a group of 2; scale 5 s, worker
start 10 s, a partition load 0.5 s; one instance is $0.001 per second (60 s minimum), a
partition 1 GB at $0.01.
"""

from __future__ import annotations

import pytest

from cerebro_spark.elastic import NodeKind, Simulator, parse_catalog
from cerebro_spark.errors import ConfigError
from cerebro_spark.search import Cohort, ExperimentSpec, StageSpec
from tests.elastic.helpers import TYPE, catalog, profile, two_stages


def simulator(spec: ExperimentSpec | None = None, **kwargs: object) -> Simulator:
    cat = kwargs.pop("catalog", None) or catalog()
    prof = kwargs.pop("profile", None) or profile()
    return Simulator(spec or two_stages(), prof.for_type(TYPE), cat, cat.price(TYPE), **kwargs)  # type: ignore[arg-type]


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
    assert out.loads == 6
    assert out.data_usd == pytest.approx(0.06)
    assert out.usd == pytest.approx(0.308)
    assert first.usd == pytest.approx(2 * 0.0395 + 2 * (0.060 - 0.0395) + 2 * 0.0395 + 0.04)
    assert sum(s.usd for s in out.stages) == pytest.approx(out.usd)


def test_per_function_billing_charges_only_starting_and_training() -> None:
    cat = parse_catalog(
        {
            "billing": {"model": "per_function"},
            "data": {"ingress_usd_per_gb": 0.0},
            "instances": {TYPE: {"usd_per_hour": 3.6}},
        }
    )
    out = simulator(catalog=cat).run((4, 2))
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


def test_seer_resources_are_kept_and_a_deadline_bound_stage_lasts_its_time() -> None:
    spec = ExperimentSpec("seer", (StageSpec((Cohort(2, 1), Cohort(1, 1, resources=2))),))
    assert simulator(spec).groups(0, 4) == (1, 2)
    fixed = ExperimentSpec("hypersched", (StageSpec((Cohort(4, 9),)),), elastic=False,
                           max_workers=2, fixed_seconds=100.0)  # fmt: skip
    out = simulator(fixed).run((2,))
    assert out.stages[0].seconds == pytest.approx(100.0)
    assert out.seconds == pytest.approx(115.5 + 0.5)  # start-up with 2 loads per worker


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


def test_bad_allocations_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"each of the 2 stages >= 1 worker, got \[4\]"):
        simulator().run((4,))
    with pytest.raises(ConfigError, match=r"got \[4, 0\]"):
        simulator().run((4, 0))
