"""Read access to a :class:`SearchSpace`'s parsed tree, for procedures that walk it.

PBT (mutations) and TPE (conversion to Optuna distributions) need the nodes of a space,
not only its samples. ``space.py`` keeps the tree private; this module is the one place
that reads it, so a public accessor there would replace only these functions.

A node is a :class:`~cerebro_spark.search.space.Distribution`, a ``dict`` of nodes (a
sub-space) or a JSON constant (never a dict).
"""

from __future__ import annotations

from typing import Any

from cerebro_spark.search.space import (
    Choice,
    Grid,
    IntUniform,
    LogUniform,
    Quantized,
    SearchSpace,
    Uniform,
)

DISTRIBUTION_NAMES = frozenset(
    cls.name for cls in (Choice, Grid, Uniform, LogUniform, IntUniform, Quantized)
)
"""Keys that make a dict of the config form a distribution rather than a sub-space."""


def space_root(space: SearchSpace) -> Any:
    """Return the root node of ``space`` (a dict, or a choice/grid of dicts)."""
    return space._root


def quantized_bounds(dist: Quantized) -> tuple[int, int]:
    """Return the smallest and largest multiplier ``k`` with ``k·q`` in the range."""
    return dist._k_min, dist._k_max


def quantized_value(dist: Quantized, k: int) -> int | float:
    """Return ``k·q`` as :class:`Quantized` writes it (an int for an int ``q``)."""
    return dist._value(k)
