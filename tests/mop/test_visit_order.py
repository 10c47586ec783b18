"""Seeded visit orders: rotations of one random permutation with evenly spread offsets."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from cerebro_spark.errors import ConfigError
from cerebro_spark.mop import homogeneous_instance, seeded_visit_orders, simulate


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
