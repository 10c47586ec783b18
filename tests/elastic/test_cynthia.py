"""Cynthia's performance model (§3, eqs. 3-5) as adapted to ring all-reduce groups."""

from __future__ import annotations

import pytest

from cerebro_spark.elastic import GroupModel, bandwidth_from
from cerebro_spark.errors import ConfigError


def test_the_step_time_of_a_group() -> None:
    model = GroupModel(step_seconds=0.1, param_bytes=1e6, bandwidth=1e8)
    assert model.step_time(1) == pytest.approx(0.1)  # no traffic alone
    # Eq. 4: 0.1 / 2; ring all-reduce: 2 * (1/2) * 1e6 / 1e8 = 0.01; no overlap: the sum.
    assert model.step_time(2) == pytest.approx(0.05 + 0.01)
    assert model.step_time(4) == pytest.approx(0.025 + 0.015)
    assert model.speedup(2) == pytest.approx(0.1 / 0.06)
    overlapping = GroupModel(0.1, 1e6, 1e8, overlap=True)
    assert overlapping.step_time(2) == pytest.approx(0.05)  # eq. 3's BSP max
    assert model.unit_seconds(2, steps=10) == pytest.approx(0.6)
    assert model.scaling_table((1, 2)) == {1: 1.0, 2: pytest.approx(1.666667)}
    # Past sqrt(0.1 * 1e8 / 2e6) ~ 2.2 workers the traffic outweighs the computation saved.
    assert model.largest_useful_group() == 3


def test_the_bandwidth_is_fitted_from_a_measured_group() -> None:
    truth = GroupModel(step_seconds=0.1, param_bytes=1e6, bandwidth=5e7)
    fitted = bandwidth_from(GroupModel(0.1, 1e6, 1.0), 2, truth.step_time(2))
    assert fitted == pytest.approx(5e7)
    with pytest.raises(ConfigError, match="not slower than its computation"):
        bandwidth_from(GroupModel(0.1, 1e6, 1.0), 2, 0.04)
    with pytest.raises(ConfigError, match=">= 2 workers"):
        bandwidth_from(truth, 1, 0.1)
    with pytest.raises(ConfigError, match="step_seconds must be a number > 0"):
        GroupModel(0.0, 1e6, 1e8)


def test_utilization_and_a_fixed_part_of_each_step() -> None:
    shared = GroupModel(0.1, 0.0, 1e8, utilization=0.5)
    assert shared.step_time(1) == pytest.approx(0.1)  # alone, nothing is shared
    assert shared.step_time(2) == pytest.approx(0.1)  # two at half speed: no gain
    fixed = GroupModel(0.1, 0.0, 1e8, fixed_step_seconds=0.04)
    assert fixed.step_time(2) == pytest.approx(0.06 / 2 + 0.04)
    with pytest.raises(ConfigError, match="utilization must be in"):
        GroupModel(0.1, 0.0, 1e8, utilization=0.0)
    with pytest.raises(ConfigError, match="fixed_step_seconds must be in"):
        GroupModel(0.1, 0.0, 1e8, fixed_step_seconds=0.1)
