"""Visit orders: rotations of one random permutation with evenly spread offsets."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from cerebro_spark.errors import ConfigError
from cerebro_spark.mop import (
    VisitSlots,
    homogeneous_instance,
    seeded_visit_orders,
    simulate,
    trial_visit_order,
)


def rotation_offset(order: list[int], base: list[int]) -> int:
    offset = base.index(order[0])
    assert order == base[offset:] + base[:offset], "not a rotation of the base"
    return offset


@pytest.mark.parametrize(
    ("n_trials", "partitions"), [(1, [3]), (3, [0, 1, 2, 3, 4]), (10, [9, 2, 5, 7])]
)
def test_orders_are_rotations_of_one_permutation_with_spread_offsets(
    n_trials: int, partitions: list[int]
) -> None:
    trials = [f"t{i}" for i in range(n_trials)]
    orders = seeded_visit_orders(trials, partitions, np.random.default_rng(5))
    assert list(orders) == trials
    base = orders["t0"]
    assert sorted(base) == sorted(partitions) and all(type(p) is int for p in base)
    offsets = Counter(rotation_offset(orders[t], base) for t in trials)
    low = n_trials // len(partitions)
    assert all(n in (low, low + 1) for n in offsets.values())
    assert len(offsets) == min(n_trials, len(partitions))


def test_orders_are_deterministic_and_seed_dependent() -> None:
    trials, parts = [f"t{i}" for i in range(6)], list(range(6))

    def orders(seed: int) -> dict[str, list[int]]:
        return seeded_visit_orders(trials, parts, np.random.default_rng(seed))

    assert orders(1) == orders(1) != orders(2)


def test_no_trials_give_no_orders() -> None:
    assert seeded_visit_orders([], [0, 1], np.random.default_rng(0)) == {}


def test_rotations_keep_every_worker_busy_where_random_orders_stall() -> None:
    """Homogeneous, |S| = p: rotations form a Latin square (makespan = bound); independent
    random permutations make trials queue for the same worker."""
    instance = homogeneous_instance(8, 8)
    rotated, independent = [], []
    for seed in range(10):
        rng = np.random.default_rng(seed)
        orders = seeded_visit_orders(instance.trials, instance.partitions, rng)
        rotated.append(simulate(instance, rng, visit_orders=orders).ratio)
        randoms = {t: [int(p) for p in rng.permutation(8)] for t in instance.trials}
        independent.append(simulate(instance, rng, visit_orders=randoms).ratio)
    assert rotated == [1.0] * 10
    assert min(independent) > 1.2


@pytest.mark.parametrize(
    ("trials", "partitions", "message"),
    [
        (["a", "a"], [0], r"trials \['a', 'a'\] has duplicates"),
        (["a"], [], r"partitions \[\] must be non-empty"),
        (["a"], [1, 1], r"partitions \[1, 1\] must be non-empty and without duplicates"),
    ],
)
def test_bad_input_names_the_value(trials: list[str], partitions: list[int], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        seeded_visit_orders(trials, partitions, np.random.default_rng(0))


# -- a trial's own stream (issue 29) ------------------------------------------------------


@pytest.mark.parametrize(("slots", "parts"), [(range(4), 4), (range(10), 4), (range(3, 8), 5)])
def test_consecutive_slots_at_one_epoch_are_rotations_with_spread_offsets(
    slots: range, parts: int
) -> None:
    orders = [trial_visit_order(range(parts), (7, 4), 2, slot) for slot in slots]
    base = orders[0]
    offsets = Counter(rotation_offset(order, base) for order in orders)
    low = len(slots) // parts
    assert all(n in (low, low + 1) for n in offsets.values())
    assert len(offsets) == min(len(slots), parts)


def test_a_trials_order_depends_on_its_slot_epoch_and_the_seed_only() -> None:
    partitions = [4, 1, 9, 6, 3, 0]
    order = trial_visit_order(partitions, (7, 4), 3, 5)
    assert order == trial_visit_order(list(partitions), [7, 4], 3, 5)  # a fresh call
    assert sorted(order) == sorted(partitions) and all(type(p) is int for p in order)
    epochs = {tuple(trial_visit_order(partitions, (7, 4), e, 5)) for e in range(12)}
    seeds = {tuple(trial_visit_order(partitions, (s, 4), 3, 5)) for s in range(12)}
    assert len(epochs) > 1 and len(seeds) > 1  # each epoch starts elsewhere; seeds differ
    # Every epoch's order is a rotation of one cycle (trials at different epochs pipeline).
    assert all(rotation_offset(list(o), order) >= 0 for o in epochs)


def test_a_trials_order_ignores_every_other_trial() -> None:
    """Slots come from the trials created before: no later trial, nor any trial's fate,
    moves them (the driver adds every trial it ever created, failed ones too)."""
    small, large = VisitSlots(2), VisitSlots(2)
    keys = ["a", "b", "a", None, "a", "b"]
    first = [small.add(f"t{i}", k) for i, k in enumerate(keys)]
    both = [large.add(f"t{i}", k) for i, k in enumerate([*keys, "a", "b", None, "a"])]
    assert both[: len(first)] == first


@pytest.mark.parametrize(
    ("partitions", "epoch", "slot", "message"),
    [
        ([], 0, 0, r"partitions \[\] must be non-empty"),
        ([1, 1], 0, 0, "without duplicates"),
        ([0, 1], -1, 0, r"epoch \(-1\) and slot \(0\) must be >= 0"),
        ([0, 1], 0, -2, r"epoch \(0\) and slot \(-2\) must be >= 0"),
    ],
)
def test_a_bad_stream_input_names_the_value(
    partitions: list[int], epoch: int, slot: int, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        trial_visit_order(partitions, (1, 4), epoch, slot)
