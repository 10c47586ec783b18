"""The planner and simulator know packs (issue 27): a pack of ``k`` takes the profile's
time for ``k``.

``helpers.profile(packing=PACKING)``: P = 4, unit 1 s, hop 0.25 s, validation 1 s; a pack of
4 trains 2.5x one trial's rows a second, so a member's share of a pass is 0.4 s. A member's
trial-epoch takes ``4 * 4 * (0.4 + 0.25) + 1 = 11.4 s`` (its pack's four passes in sequence)
and costs the workers ``4 * (0.4 + 0.25) + 1 = 3.6`` worker-seconds; unpacked, 6 s and 6.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from cerebro_spark.elastic import Simulator, format_plan, parse_profile, plan
from cerebro_spark.engine import parse_config
from cerebro_spark.engine._elastic import planned_pack_size
from cerebro_spark.errors import ConfigError
from cerebro_spark.search import Cohort, ExperimentSpec, StageSpec
from tests.driver.test_config import minimal
from tests.elastic.helpers import TYPE, catalog, profile

PACKING = {1: 1.0, 2: 1.6, 4: 2.5}


def one_stage(trials: int = 8, epochs: int = 1, resources: int = 1) -> ExperimentSpec:
    return ExperimentSpec("one", (StageSpec((Cohort(trials, epochs, resources),)),))


def simulator(pack_size: int, spec: ExperimentSpec | None = None, **changes: Any) -> Simulator:
    cat = catalog()
    view = profile(**{"packing": PACKING, **changes}).for_type(TYPE)
    return Simulator(spec or one_stage(), view, cat, cat.price(TYPE), pack_size=pack_size)


def test_a_pack_costs_its_measured_time_by_hand() -> None:
    packed, unpacked = simulator(4), simulator(1)
    assert packed.epoch_costs(1, 4) == pytest.approx((11.4, 3.6))
    assert packed.epoch_costs(1, 1) == unpacked.epoch_costs(1, 1) == pytest.approx((6.0, 6.0))
    # 8 trials, 1 epoch: work 8 * 3.6 = 28.8 worker-seconds packed, 48 unpacked
    assert packed.stage_seconds(0, 2) == pytest.approx(14.4)  # the work bound
    assert unpacked.stage_seconds(0, 2) == pytest.approx(24.0)
    assert packed.stage_seconds(0, 4) == pytest.approx(11.4)  # a member's epoch bounds it
    assert unpacked.stage_seconds(0, 4) == pytest.approx(12.0)
    assert packed.stage_seconds(0, 8) == pytest.approx(11.4)  # more workers do not help packs
    assert unpacked.stage_seconds(0, 8) == pytest.approx(6.0)
    # 16 workers: groups of 2 (T(2) = 4.667 s, never packed) beat packs of 4
    assert packed.groups(0, 16) == unpacked.groups(0, 16) == (2,)
    assert packed.stage_seconds(0, 16) == pytest.approx(4 * (1 / 1.5 + 0.25) + 1)


def test_who_packs_and_how_many() -> None:
    sim = simulator(4)
    assert sim.pack_of(Cohort(8, 1), 1) == 4
    assert sim.pack_of(Cohort(3, 1), 1) == 3  # a cohort of 3 packs 3: packing(3) interpolated
    assert sim.epoch_costs(1, 3)[1] == pytest.approx(4 * (1 / 2.05 + 0.25) + 1)
    assert sim.pack_of(Cohort(8, 1), 2) == 1  # a group unit is never packed
    assert sim.pack_of(Cohort(8, 1, 2), 2) == 1  # nor a trial with resources (SEER)
    assert simulator(1).pack_of(Cohort(8, 1), 1) == 1
    # past the largest measured size the speedup stays at its value: 8 packs gain 2.5x too
    assert simulator(16).epoch_costs(1, 8) == pytest.approx((4 * 8 * 0.65 + 1, 3.6))
    with pytest.raises(ConfigError, match="pack_size must be an integer >= 1, got 0"):
        simulator(0)


def test_without_a_measured_packing_a_pack_gains_nothing() -> None:
    cat = catalog()
    view = profile().for_type(TYPE)
    sim = Simulator(one_stage(), view, cat, cat.price(TYPE), pack_size=4)
    assert sim.epoch_costs(1, 4) == pytest.approx((4 * 4 * 1.25 + 1, 6.0))


def test_a_packed_plan_is_cheaper_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    spec = one_stage(trials=16, epochs=2)
    packed_profile = profile(packing=PACKING)
    packed = plan(spec, packed_profile, catalog(), deadline=600, pack_size=4)
    unpacked = plan(spec, packed_profile, catalog(), deadline=600)
    assert packed.pack_size == 4 and packed.to_dict()["pack_size"] == 4
    assert unpacked.pack_size == 1
    assert packed.usd < unpacked.usd
    assert "packs of up to 4" in format_plan(packed)
    assert "packs" not in format_plan(unpacked)
    # the simulator the plan used is the packed one: its time is the packed simulation's
    sim = simulator(4, spec)
    assert packed.seconds == pytest.approx(sim.run(packed.outcome.workers).seconds)
    with caplog.at_level(logging.WARNING, logger="cerebro_spark.elastic._planner"):
        plan(spec, profile(), catalog(), deadline=600, pack_size=4)
    assert "measured no packing" in caplog.text


def test_the_profile_reads_writes_and_checks_packing() -> None:
    read = profile(packing=PACKING)
    assert read.packing is not None and read.packing(4) == 2.5 and read.packing(3) == 2.05
    assert parse_profile(read.to_dict()) == read
    assert profile().packing is None and "packing" not in profile().to_dict()
    with pytest.raises(ConfigError, match=r"'packing.2' must be at most 2 \(a pack of 2 trials"):
        profile(packing={1: 1.0, 2: 2.5})
    with pytest.raises(ConfigError, match=r"'packing' must give 1 trial the speedup 1.0"):
        profile(packing={1: 0.9, 2: 1.5})
    with pytest.raises(ConfigError, match=r"'packing': pack size 'x' is not an integer"):
        profile(packing={1: 1.0, "x": 1.5})


def test_the_pack_size_a_plan_assumes() -> None:
    measured, unmeasured = profile(packing=PACKING), profile()
    config = parse_config(minimal(pack=4))
    assert planned_pack_size(config, unmeasured) == 4
    assert planned_pack_size(parse_config(minimal()), measured) == 1
    auto = parse_config(minimal(pack="auto"))
    assert planned_pack_size(auto, measured) == 4  # the smallest within 5 % of the best
    assert planned_pack_size(auto, profile(packing={1: 1.0, 2: 1.9, 4: 1.95})) == 2
    assert planned_pack_size(auto, unmeasured) == 1
