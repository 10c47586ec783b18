"""Seeded visit orders: pseudorandom per-trial partition orders that pipeline well."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cerebro_spark.errors import ConfigError


def seeded_visit_orders(
    trials: Sequence[str], partitions: Sequence[int], rng: np.random.Generator
) -> dict[str, list[int]]:
    """Return each trial's partition visit order for one epoch.

    Cerebro §3.1 needs only that each trial visits the partitions in *some* pseudorandom
    order, logged for replay ("Reproducibility"). Fixing the orders up front makes the
    weights a function of the orders alone, whatever the worker timing. The orders here
    are rotations of one random permutation ``base``: trial ``i`` starts at offset
    ``rank_i * P // |S|`` (``rank`` a random permutation of the trial indices), so the
    offsets are spread evenly, each used ``floor`` or ``ceil`` of ``|S| / P`` times.

    Why rotations: with one partition per worker and equal unit times, trials with
    distinct offsets form a Latin square. At every step they visit distinct partitions,
    and after one unit each moves on to the next partition of ``base``, which the trial
    ahead of it has just left. So a cohort of ``P`` trials with distinct offsets moves in
    lock-step and keeps every worker busy, and further cohorts queue behind it in a
    pipeline. Independent random permutations have no such structure: a trial's next
    partition is a random one, several idle trials often wait for the same worker while
    others have nobody to run, and a fixed order cannot route around that (a job shop
    with random routes, not an open shop), so workers stall.

    Args:
        trials: Trial ids (unique).
        partitions: Partition indices (unique, at least one).
        rng: Source of randomness.

    Returns:
        Trial id to its visit order, a permutation of ``partitions``.

    Raises:
        ConfigError: ``trials`` or ``partitions`` has duplicates, or ``partitions`` is
            empty.
    """
    if len(set(trials)) != len(trials):
        raise ConfigError(f"trials {list(trials)!r} has duplicates; trial ids must be unique")
    parts = [int(p) for p in partitions]
    if not parts or len(set(parts)) != len(parts):
        raise ConfigError(f"partitions {parts!r} must be non-empty and without duplicates")
    base = [parts[i] for i in rng.permutation(len(parts))]
    ranks = rng.permutation(len(trials))
    orders = {}
    for trial, rank in zip(trials, ranks, strict=True):
        offset = int(rank) * len(parts) // len(trials)
        orders[trial] = base[offset:] + base[:offset]
    return orders
