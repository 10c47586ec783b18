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


class VisitSlots:
    """Each trial's *slot*: where its visit orders start, fixed when the trial is created.

    Issue 29: a trial's visit orders must not depend on the other trials (which of them
    failed, stopped, were cloned or how many the search has). A slot is a function of the
    trials created before it only: trials are added in the order the search created them,
    and each gets the next slot, so trials ``0 .. n-1`` of a search without packing get
    slots ``0 .. n-1`` whatever becomes of them. With packing (issue 27) the trials of one
    pack key are cut, in creation order, into chunks of ``pack_size`` that share a slot,
    hence an order all epoch long, so that they can pack; a trial without a key is a
    chunk of one. :func:`trial_visit_order` turns a slot into an epoch's order.

    Args:
        pack_size: Most trials in one chunk (an integer ``>= 1``; 1: packing off).

    Raises:
        ConfigError: ``pack_size`` is not an integer ``>= 1``.
    """

    def __init__(self, pack_size: int = 1) -> None:
        if isinstance(pack_size, bool) or not isinstance(pack_size, int) or pack_size < 1:
            raise ConfigError(
                f"pack_size must be an integer >= 1 (1: packing off), got {pack_size!r}"
            )
        self.pack_size = pack_size
        self._slots: dict[str, int] = {}
        self._open: dict[str, tuple[int, int]] = {}  # key -> (its open chunk's slot, members)
        self._next = 0

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, trial: object) -> bool:
        return trial in self._slots

    def __getitem__(self, trial: str) -> int:
        return self._slots[trial]

    def add(self, trial: str, key: str | None = None) -> int:
        """Give ``trial``, the newest trial of the search, its slot and return it.

        Raises:
            ConfigError: ``trial`` already has a slot.
        """
        if trial in self._slots:
            raise ConfigError(f"trial {trial!r} already has a visit slot; trial ids are unique")
        chunk = self._open.get(key) if key is not None and self.pack_size > 1 else None
        if chunk is not None and chunk[1] < self.pack_size:
            slot, members = chunk[0], chunk[1] + 1
        else:
            slot, members = self._next, 1
            self._next += 1
        if key is not None and self.pack_size > 1:
            self._open[key] = (slot, members)
        self._slots[trial] = slot
        return slot


def trial_visit_order(
    partitions: Sequence[int], entropy: Sequence[int], epoch: int, slot: int
) -> list[int]:
    """Return the visit order of the trial in ``slot`` for ``epoch`` (issue 29).

    The order is a function of ``(entropy, epoch, slot)`` alone, so no other trial's
    fate changes it. It keeps :func:`seeded_visit_orders`' pipelining: every order is a
    rotation of one permutation ``base`` of ``partitions`` (drawn once from ``entropy``),
    trial ``slot`` starting at ``(slot + shift_epoch) mod P``, with ``shift_epoch`` drawn
    from ``(entropy, epoch)``. Trials of consecutive slots at one epoch thus start at
    distinct offsets, each used ``floor`` or ``ceil`` of ``n / P`` times, and form
    Cerebro's Latin square (see :func:`seeded_visit_orders`); where the live trials are
    not consecutive (the survivors of a rung) or are at different epochs (asynchronous
    procedures), some start at the same offset and queue one unit behind each other
    (``benchmarks/mop_makespan.py`` measures the cost). One ``base`` for every epoch
    keeps trials at different epochs on one cycle; each epoch still starts each trial
    at a new place, and every unit reads its rows in an order of its own
    (:mod:`~cerebro_spark.training`).

    Args:
        partitions: Partition indices (unique, at least one).
        entropy: The experiment's seed material (e.g. ``(seed, stream)``).
        epoch: The epoch the order is for (``>= 0``).
        slot: The trial's slot (:class:`VisitSlots`, ``>= 0``).

    Returns:
        A permutation of ``partitions``.

    Raises:
        ConfigError: ``partitions`` is empty or has duplicates, or ``epoch`` or ``slot``
            is negative.
    """
    parts = [int(p) for p in partitions]
    if not parts or len(set(parts)) != len(parts):
        raise ConfigError(f"partitions {parts!r} must be non-empty and without duplicates")
    if epoch < 0 or slot < 0:
        raise ConfigError(f"epoch ({epoch}) and slot ({slot}) must be >= 0")
    seeds = [int(e) for e in entropy]
    order = np.random.default_rng(np.random.SeedSequence([*seeds, 0])).permutation(len(parts))
    shift = int(
        np.random.default_rng(np.random.SeedSequence([*seeds, 1, epoch])).integers(len(parts))
    )
    offset = (slot + shift) % len(parts)
    base = [parts[i] for i in order]
    return base[offset:] + base[:offset]
