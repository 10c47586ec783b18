"""Visit orders: seeded per-trial partition orders that pipeline well, and group-aware ones."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np

from cerebro_spark.errors import ConfigError
from cerebro_spark.mop._matching import Matcher


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


def grouped_visit_orders(
    orders: Mapping[str, Sequence[int]],
    group_sizes: Mapping[str, int],
    workers: Mapping[str, Collection[int]],
) -> dict[str, list[int]]:
    """Reorder the visit orders of group trials so that each group can be formed.

    A trial with group size ``k > 1`` trains its visit order in groups (Cerebro §5.7;
    :class:`~cerebro_spark.mop.MopScheduler`): the next group is the longest prefix of its
    next ``k`` partitions that distinct live workers can hold. Two partitions held only by
    the same worker cannot share a group, so an order that puts them side by side forms
    smaller groups than it could. This builds each trial's groups in turn from its order:
    scanning the partitions left in their order, a partition joins the group if the group
    can still be matched to distinct workers of ``workers``, until the group has ``min(k,
    left)`` partitions. The result is the groups concatenated, so the scheduler, given the
    same availability map, forms exactly these groups (a partition skipped by a group
    could not have joined it, nor any larger set). Trials with ``k = 1`` keep their order.

    Args:
        orders: Trial id to its visit order (e.g. :func:`seeded_visit_orders`).
        group_sizes: Trial id to its group size (missing: 1).
        workers: The availability map: worker id to the partitions it holds.

    Returns:
        Trial id to its visit order, each a permutation of the one given.
    """
    names = sorted(workers)
    held = {w: frozenset(int(p) for p in workers[w]) for w in names}
    result: dict[str, list[int]] = {}
    for trial, order in orders.items():
        left = [int(p) for p in order]
        size = int(group_sizes.get(trial, 1))
        if size < 2:
            result[trial] = left
            continue
        reordered: list[int] = []
        while left:
            matcher: Matcher[int, str] = Matcher(lambda p: [w for w in names if p in held[w]])
            limit = min(size, len(left))
            group: list[int] = []
            for partition in left:
                if len(group) == limit:
                    break
                if matcher.add(partition):
                    group.append(partition)
            if not group:  # nobody holds the next partition: keep the order
                group = [left[0]]
            reordered += group
            left = [p for p in left if p not in group]
        result[trial] = reordered
    return result


def packed_visit_orders(
    trials: Sequence[str],
    partitions: Sequence[int],
    rng: np.random.Generator,
    pack_keys: Mapping[str, str],
    pack_size: int,
) -> dict[str, list[int]]:
    """Return visit orders in which trials that may be packed share an order (issue 27).

    A pack forms among trials of one key whose next partition coincides
    (:class:`~cerebro_spark.mop.MopScheduler`, "Packs"); with visit orders, that holds
    all epoch long only if they share one order. This cuts each key's trials, in trial
    order, into chunks of ``pack_size`` (a trial without a key is a chunk of one) and
    gives the chunks the rotations of :func:`seeded_visit_orders` as if each were one
    trial: chunk ``i`` starts at offset ``rank_i * P // chunks`` of one random
    permutation, so the chunks pipeline as trials do there. With ``pack_size=1`` or no
    keys the orders are exactly :func:`seeded_visit_orders`' for the same ``rng``.

    Args:
        trials: Trial ids (unique).
        partitions: Partition indices (unique, at least one).
        rng: Source of randomness.
        pack_keys: Trial id to its pack key (missing: never packed).
        pack_size: Most trials in one pack (an integer ``>= 1``).

    Returns:
        Trial id to its visit order, a permutation of ``partitions``.

    Raises:
        ConfigError: As :func:`seeded_visit_orders`, or ``pack_size`` is not an integer
            ``>= 1``.
    """
    if isinstance(pack_size, bool) or not isinstance(pack_size, int) or pack_size < 1:
        raise ConfigError(f"pack_size must be an integer >= 1 (1: packing off), got {pack_size!r}")
    if len(set(trials)) != len(trials):
        raise ConfigError(f"trials {list(trials)!r} has duplicates; trial ids must be unique")
    chunks: list[list[str]] = []
    open_chunk: dict[str, list[str]] = {}  # key -> its chunk being filled
    for trial in trials:
        key = pack_keys.get(trial)
        chunk = open_chunk.get(key) if key is not None else None
        if chunk is None or len(chunk) >= pack_size:
            chunk = []
            chunks.append(chunk)
            if key is not None:
                open_chunk[key] = chunk
        chunk.append(trial)
    heads = [chunk[0] for chunk in chunks]
    by_head = seeded_visit_orders(heads, partitions, rng)
    return {trial: list(by_head[chunk[0]]) for chunk in chunks for trial in chunk}
