"""The candidate index of the MOP scheduler: idle trials' units by partition and priority.

Cerebro's Alg. 1 offers an idle worker every unit of an idle trial on a partition it holds
(§5.5), and the rule picks one. Listing those candidates costs ``O(|S|)`` per decision;
with thousands of trials that makes the driver the bottleneck. When the rule ranks trials
by a key that is the same for every worker (:meth:`RandomizedRule.trial_key`: all alike;
:meth:`WorkAwareRule.trial_key`: the work left) and picks uniformly among the candidates
of the best-ranked trials, the index answers a decision in ``O(log |S|)`` per partition
the worker holds, drawing from the generator exactly as the rule would on the full list.

Per partition it keeps the trials offering a unit there, bucketed by key, each bucket a
sorted list of trial positions (the candidates' order: trial order, then partition), and
a max-heap of its keys (stale keys are dropped lazily).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence

import numpy as np

_MERGE = 64
"""Up to this many tied candidates over several partitions are merged, not searched."""


class Offers:
    """Trial positions offering a unit on each partition, bucketed by the trial's key."""

    def __init__(self) -> None:
        self._buckets: dict[int, dict[float, list[int]]] = {}
        self._heaps: dict[int, list[float]] = {}  # negated keys, possibly stale
        self._entries: dict[int, tuple[float, tuple[int, ...]]] = {}

    def __contains__(self, position: int) -> bool:
        return position in self._entries

    def put(self, position: int, key: float, partitions: Sequence[int]) -> None:
        """Offer trial ``position`` on ``partitions`` with ``key`` (replacing its offers)."""
        self.drop(position)
        if not partitions:
            return
        for partition in partitions:
            buckets = self._buckets.setdefault(partition, {})
            bucket = buckets.get(key)
            if bucket is None:
                buckets[key] = [position]
                heapq.heappush(self._heaps.setdefault(partition, []), -key)
            else:
                bisect.insort(bucket, position)
        self._entries[position] = (key, tuple(partitions))

    def drop(self, position: int) -> None:
        """Withdraw every offer of trial ``position`` (none: nothing happens)."""
        entry = self._entries.pop(position, None)
        if entry is None:
            return
        key, partitions = entry
        for partition in partitions:
            buckets = self._buckets[partition]
            bucket = buckets[key]
            del bucket[bisect.bisect_left(bucket, position)]
            if not bucket:
                del buckets[key]

    def top(self, partition: int) -> float | None:
        """The highest key offered on ``partition``, if any."""
        buckets = self._buckets.get(partition)
        if not buckets:
            return None
        heap = self._heaps[partition]
        while -heap[0] not in buckets:
            heapq.heappop(heap)
        return -heap[0]

    def any_on(self, partitions: Sequence[int]) -> bool:
        """Whether any trial offers a unit on one of ``partitions``."""
        buckets = self._buckets
        return any(buckets.get(p) for p in partitions)

    def pick(self, held: Sequence[int], rng: np.random.Generator) -> tuple[int, int] | None:
        """Draw a candidate of the best-ranked trials offering on ``held`` (sorted).

        Among the units offered on ``held`` by the trials with the highest key, ordered by
        trial position then partition, draws index ``rng.integers(count)`` -- the draw a
        rule makes on the full candidate list. Returns ``(position, partition)``, or
        ``None`` (no draw) when nothing is offered on ``held``.
        """
        # top() inlined: this loop runs for every partition a worker holds, every decision.
        all_buckets, heaps, pop = self._buckets, self._heaps, heapq.heappop
        most: float | None = None
        offered = []
        for partition in held:
            by_key = all_buckets.get(partition)
            if not by_key:
                continue
            heap = heaps[partition]
            while -heap[0] not in by_key:
                pop(heap)
            key = -heap[0]
            if most is None or key > most:
                most = key
            offered.append((partition, by_key))
        if most is None:
            return None
        lists = []
        for partition, by_key in offered:
            bucket = by_key.get(most)
            if bucket:
                lists.append((partition, bucket))
        count = sum(len(bucket) for _, bucket in lists)
        # One candidate (most decisions once keys differ): ``rng.integers(1)`` is 0 and
        # leaves the generator as it was (numpy draws nothing for a range of one value;
        # tests/mop/test_scheduler_index.py checks it), so it is not called.
        index = int(rng.integers(count)) if count > 1 else 0
        if len(lists) == 1:
            partition, bucket = lists[0]
            return bucket[index], partition
        if count <= _MERGE:  # few: merge them in candidate order
            merged = sorted((position, p) for p, bucket in lists for position in bucket)
            return merged[index]
        # The smallest position whose offers (and those before it) cover ``index``.
        buckets = [bucket for _, bucket in lists]
        low = min(bucket[0] for bucket in buckets)
        high = max(bucket[-1] for bucket in buckets)
        right = bisect.bisect_right
        while low < high:
            middle = (low + high) // 2
            covered = 0
            for bucket in buckets:  # a loop, not sum(): this is the hot path of a decision
                covered += right(bucket, middle)
            if covered > index:
                high = middle
            else:
                low = middle + 1
        before = sum(bisect.bisect_left(bucket, low) for _, bucket in lists)
        here = [
            partition
            for partition, bucket in lists
            if bisect.bisect_right(bucket, low) > bisect.bisect_left(bucket, low)
        ]
        return low, here[index - before]
