"""Where partitions live: the placement rules every backend shares.

Pure functions over *holdings*, the live workers (oldest first) and the partition indices
each holds, so that LocalBackend and SparkBackend place, re-home and replicate alike.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

Holdings = Sequence[tuple[str, Collection[int]]]
"""Live workers, oldest first, each with the partitions it holds."""


def initial_shares(workers: int, num_partitions: int) -> list[list[int]]:
    """Each of ``workers <= num_partitions`` starting workers' partitions: ``i, i + p, ...``."""
    return [list(range(i, num_partitions, workers)) for i in range(workers)]


def replica_share(num_partitions: int, holdings: Holdings) -> list[int]:
    """Choose the partitions a joining worker loads as replicas.

    It takes ``ceil(P / (live + 1))`` partitions, those with the fewest holders first and,
    among them, those whose holders are busiest, so that the replica-aware scheduler
    (Cerebro §5.5) relieves the most loaded workers. With no live worker it takes all.
    """
    count = math.ceil(num_partitions / (len(holdings) + 1))
    holders = {p: [w for w, held in holdings if p in held] for p in range(num_partitions)}
    load = {worker: len(held) for worker, held in holdings}

    def key(partition: int) -> tuple[int, int, int]:
        busiest = max((load[w] for w in holders[partition]), default=0)
        return (len(holders[partition]), -busiest, partition)

    chosen: list[int] = []
    for _ in range(count):
        best = min((p for p in holders if p not in chosen), key=key)
        chosen.append(best)
        for worker in holders[best]:
            load[worker] -= 1
    return sorted(chosen)


def rehome(lost: Collection[int], holdings: Holdings) -> dict[str, list[int]]:
    """Assign a lost worker's partitions that no live worker holds (Cerebro §5.6).

    Each orphan goes to the live worker holding the fewest partitions (the oldest on a
    tie), counting what it was given already. Returns ``{worker: partitions to load}``;
    empty when nothing is orphaned or no worker lives.
    """
    held = {worker: set(partitions) for worker, partitions in holdings}
    order = {worker: rank for rank, (worker, _) in enumerate(holdings)}
    orphans = sorted(p for p in lost if not any(p in h for h in held.values()))
    assigned: dict[str, list[int]] = {}
    if not held:
        return assigned
    for partition in orphans:
        target = min(held, key=lambda w: (len(held[w]), order[w]))
        held[target].add(partition)
        assigned.setdefault(target, []).append(partition)
    return assigned
