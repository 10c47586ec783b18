"""The MOP epoch model: makespan and driver load from per-unit overheads (fast, no Spark)."""

from __future__ import annotations

import pytest

from cerebro_spark.errors import ConfigError
from cerebro_spark.simulate import UnitOverheads, epoch_bound, placement, predict_epoch

PLAIN = UnitOverheads(
    train_seconds=0.8,
    validate_seconds=0.3,
    hop_seconds=0.2,
    validate_hop_seconds=0.2,
    dispatch_seconds=0.0,
    startup_seconds=3.0,
)


def test_placement_is_the_pools() -> None:
    assert placement(2, 5) == {"w0": (0, 2, 4), "w1": (1, 3)}
    assert placement(4, 2) == {"w0": (0,), "w1": (1,), "w2": (0,), "w3": (1,)}
    with pytest.raises(ConfigError, match="workers must be an integer >= 1, got 0"):
        placement(0, 2)


def test_a_balanced_epoch_takes_the_work_over_the_workers() -> None:
    # 4 trials x 2 partitions x (1.0 train + 0.5 validate) = 12 s of work on 2 workers
    found = predict_epoch(PLAIN, trials=4, partitions=2, workers=2)
    assert found.units == 16
    assert found.makespan == pytest.approx(6.0) == found.bound
    assert found.worker_busy == pytest.approx(1.0)
    assert found.driver_cpu == 0.0 and found.driver_load == 0.0


def test_dispatch_and_round_overheads_add_up() -> None:
    slow = UnitOverheads(0.8, 0.3, 0.2, 0.2, dispatch_seconds=0.1, startup_seconds=0.0,
                         round_seconds=0.5, between_rounds_seconds=0.25)  # fmt: skip
    found = predict_epoch(slow, trials=4, partitions=2, workers=2)
    # 8 units a worker, 7 dispatches between them, then the round's end
    assert found.makespan == pytest.approx(6.0 + 7 * 0.1 + 0.5)
    assert found.makespan == pytest.approx(found.bound)
    assert found.period == pytest.approx(found.makespan + 0.25)


def test_more_workers_and_trials_in_proportion_keep_the_epoch() -> None:
    small = predict_epoch(PLAIN, trials=8, partitions=8, workers=8, driver_cpu_seconds=1e-4)
    large = predict_epoch(PLAIN, trials=64, partitions=8, workers=64, driver_cpu_seconds=1e-4)
    assert large.units == 8 * small.units
    assert large.makespan == pytest.approx(small.makespan, rel=0.1)
    assert large.driver_load == pytest.approx(8 * small.driver_load, rel=0.1)


def test_a_saturated_driver_sets_the_pace() -> None:
    # 0.5 s of driver CPU a unit against 1.5 s of work per trial pair on 16 workers
    found = predict_epoch(PLAIN, trials=16, partitions=4, workers=16, driver_cpu_seconds=0.5)
    assert found.makespan >= found.units * 0.5
    assert found.driver_load == pytest.approx(1.0, rel=0.02)
    assert found.bound == pytest.approx(found.units * 0.5)
    assert epoch_bound(PLAIN, trials=16, partitions=4, workers=16) == pytest.approx(6.0)


def test_workers_that_start_late_and_slow_trials() -> None:
    # 4 workers, 2 partitions: two replicas each; the second pair ready only at 100 s
    replicas = predict_epoch(PLAIN, trials=4, partitions=2, workers=4)
    late = predict_epoch(PLAIN, trials=4, partitions=2, workers=4, ready_at=[0, 0, 100, 100])
    assert replicas.makespan == pytest.approx(3.0)
    assert late.makespan == pytest.approx(6.0)  # as on the first two alone
    # a partition held only by a late worker waits for it
    alone = predict_epoch(PLAIN, trials=4, partitions=2, workers=2, ready_at=[0.0, 100.0])
    assert alone.makespan == pytest.approx(100.0 + 4 * 1.0 + 4 * 0.5)
    slow = predict_epoch(PLAIN, trials=2, partitions=2, workers=2, trial_scale=[1.0, 3.0])
    assert slow.makespan > predict_epoch(PLAIN, trials=2, partitions=2, workers=2).makespan


def test_bad_inputs_name_the_value() -> None:
    with pytest.raises(ConfigError, match="trials must be an integer >= 1, got 0"):
        predict_epoch(PLAIN, trials=0, partitions=2, workers=2)
    with pytest.raises(ConfigError, match="ready_at must hold 2 finite numbers >= 0, got 1"):
        predict_epoch(PLAIN, trials=2, partitions=2, workers=2, ready_at=[0.0])
    with pytest.raises(ConfigError, match="driver_cpu_seconds must be finite and >= 0"):
        predict_epoch(PLAIN, trials=2, partitions=2, workers=2, driver_cpu_seconds=-1.0)


def test_unequal_workers_end_a_placed_epoch_later() -> None:
    import dataclasses

    uneven = dataclasses.replace(PLAIN, worker_spread=0.2)
    even = predict_epoch(PLAIN, trials=8, partitions=4, workers=4)
    found = predict_epoch(uneven, trials=8, partitions=4, workers=4)
    assert found.makespan > even.makespan * 1.1  # the slowest worker's partition ends last
    assert found.makespan == predict_epoch(uneven, trials=8, partitions=4, workers=4).makespan


def test_packs_share_their_pass_as_the_profile_measured() -> None:
    """8 trials, 2 partitions, 2 workers; unpacked 8 * 2 * 1.5 s / 2 = 12 s. Packs of 4
    at 2.5x: a pack's pass 4 * 0.8 / 2.5 + 4 * 0.2 = 2.08 s for four trials, so the work is
    4 * 2.08 + 16 * 0.5 = 16.32 s: 8.16 s on 2 workers (the bound)."""
    packing = {1: 1.0, 2: 1.6, 4: 2.5}
    packed = predict_epoch(PLAIN, trials=8, partitions=2, workers=2, pack_size=4, packing=packing)
    assert packed.bound == pytest.approx(8.16)
    assert packed.bound - 1e-9 <= packed.makespan < 12.0
    assert packed.units == 32  # every member's unit counted, as the driver logs them
    # packs that gain nothing take what the units take one by one
    flat = predict_epoch(PLAIN, trials=8, partitions=2, workers=2, pack_size=4)
    assert flat.makespan >= 12.0 - 1e-9 and flat.bound == pytest.approx(12.0)
    with pytest.raises(ConfigError, match=r"'packing.2' must be at most 2"):
        predict_epoch(PLAIN, trials=8, partitions=2, workers=2, pack_size=4, packing={2: 3.0})
