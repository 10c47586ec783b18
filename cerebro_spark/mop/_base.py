"""The scheduling seam: units, assignments, and the rule that picks among candidates.

The MOP scheduler (Cerebro §5.2-§5.6) decides *which* units an idle worker may run; a
:class:`SchedulingRule` decides *which one of those* it runs. Rules every implementation
keeps:

* :meth:`SchedulingRule.choose` returns one element of ``candidates`` (the scheduler
  raises :class:`~cerebro_spark.errors.ConfigError` otherwise). ``candidates`` is never
  empty; every candidate belongs to an idle trial and lies on a partition ``worker`` holds.
* Randomness comes only from ``rng``: equal arguments and an equal ``rng`` state give an
  equal choice. No I/O, no clock, no global state.
* ``remaining`` is a read-only view of the queue Q (every trial of the epoch to its units
  not yet started, train units before validate units), valid during the call only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from cerebro_spark.units import UnitKind


@dataclasses.dataclass(frozen=True)
class Unit:
    """One unit of work of the current epoch (a *training unit*, Cerebro §3.1).

    Attributes:
        trial: The trial it belongs to.
        partition: Index of the partition it reads (train or validation split).
        kind: Train (one sub-epoch) or validate (evaluates the trial's checkpoint).
    """

    trial: str
    partition: int
    kind: UnitKind = UnitKind.TRAIN


@dataclasses.dataclass(frozen=True)
class Assignment:
    """A unit handed to a worker.

    Attributes:
        unit: The unit.
        worker: The worker that runs it.
        step: For a train unit, its position in the trial's visit order this epoch
            (``0 .. P-1``: the trial's train units completed before it); for a validate
            unit, the trial's validate units completed before it.
    """

    unit: Unit
    worker: str
    step: int


class SchedulingRule(Protocol):
    """Picks the unit an idle worker runs next (see the module docstring for the rules)."""

    def choose(
        self,
        worker: str,
        candidates: Sequence[Unit],
        remaining: Mapping[str, Sequence[Unit]],
        rng: np.random.Generator,
    ) -> Unit:
        """Return the element of ``candidates`` that ``worker`` runs next."""
        ...
