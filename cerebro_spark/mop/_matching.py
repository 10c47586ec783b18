"""Incremental bipartite matching, for forming group units (Cerebro §5.7).

A group unit of ``k`` partitions needs ``k`` *distinct* workers, each holding its rank's
partition: a matching between partitions and workers in the availability map (§5.5).
:class:`Matcher` grows a matching one left vertex at a time with Kuhn's augmenting paths;
adding every left vertex once gives a maximum matching, and a vertex that cannot be added
leaves the matching unchanged. A free neighbour is taken before anybody is re-matched;
neighbours are tried in the order the caller gives, so the result is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

L = TypeVar("L", bound=Hashable)
R = TypeVar("R", bound=Hashable)


class Matcher(Generic[L, R]):
    """A matching between left and right vertices, grown by :meth:`add`.

    Args:
        neighbours: The right vertices a left vertex may be matched to, in preference
            order (called once per visit; must be deterministic).
    """

    def __init__(self, neighbours: Callable[[L], Sequence[R]]) -> None:
        self._neighbours = neighbours
        self.left: dict[L, R] = {}
        """Matched left vertex to its right vertex."""
        self.right: dict[R, L] = {}
        """Matched right vertex to its left vertex."""

    def add(self, vertex: L) -> bool:
        """Match ``vertex`` too, re-matching others along an augmenting path if needed.

        Returns:
            Whether ``vertex`` is now matched; if not, the matching is unchanged.
        """
        if vertex in self.left:
            return True
        return self._augment(vertex, set())

    def _augment(self, vertex: L, seen: set[R]) -> bool:
        options = [other for other in self._neighbours(vertex) if other not in seen]
        free = next((other for other in options if other not in self.right), None)
        if free is not None:  # take a free neighbour before re-matching anybody
            self._pair(vertex, free)
            return True
        for other in options:
            if other in seen:
                continue
            seen.add(other)
            if self._augment(self.right[other], seen):
                self._pair(vertex, other)
                return True
        return False

    def _pair(self, vertex: L, other: R) -> None:
        self.right[other] = vertex
        self.left[vertex] = other
