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

from cerebro_spark.errors import ConfigError
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
    """Work handed to one worker, or to a group of workers (Cerebro §5.7).

    An ordinary assignment is one unit on one worker. A *group assignment* is ``k > 1``
    train units of one trial, trained data-parallel by ``k`` workers at once (one group
    unit, :mod:`cerebro_spark.training._group`): rank ``r`` runs on ``workers[r]`` and
    trains ``partitions[r]``. Its units start, complete and fail together (Q/Q' of §5.6
    extended to groups). ``unit`` and ``worker`` are rank 0's; ``workers`` and
    ``partitions`` default to ``(worker,)`` and ``(unit.partition,)``, so an ordinary
    assignment is a group of one.

    Attributes:
        unit: The unit (rank 0's unit of a group).
        worker: The worker that runs it (rank 0's worker of a group).
        step: For a train unit, its position in the trial's visit order this epoch
            (``0 .. P-1``: the trial's train units completed before it); rank ``r`` of a
            group is at position ``step + r``. For a validate unit, the trial's validate
            units completed before it.
        workers: Every rank's worker, by rank (distinct).
        partitions: Every rank's partition, by rank (distinct).

    Raises:
        ConfigError: ``workers`` and ``partitions`` differ in length, repeat an element,
            disagree with ``worker`` and ``unit`` at rank 0, or form a group of validate
            units.
    """

    unit: Unit
    worker: str
    step: int
    workers: tuple[str, ...] = ()
    partitions: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.workers and not self.partitions:  # an ordinary assignment: valid as is
            object.__setattr__(self, "workers", (self.worker,))
            object.__setattr__(self, "partitions", (self.unit.partition,))
            return
        workers = tuple(self.workers) or (self.worker,)
        partitions = tuple(self.partitions) or (self.unit.partition,)
        object.__setattr__(self, "workers", workers)
        object.__setattr__(self, "partitions", partitions)
        if (
            len(workers) != len(partitions)
            or len(set(workers)) != len(workers)
            or len(set(partitions)) != len(partitions)
            or workers[0] != self.worker
            or partitions[0] != self.unit.partition
        ):
            raise ConfigError(
                f"assignment of {self.unit!r}: workers {list(workers)} and partitions "
                f"{list(partitions)} must be distinct, of equal length, and start with "
                f"worker {self.worker!r} and partition {self.unit.partition}"
            )
        if len(workers) > 1 and self.unit.kind is not UnitKind.TRAIN:
            raise ConfigError(f"a group assignment trains; got {self.unit!r}")

    @property
    def size(self) -> int:
        """Number of workers (1 for an ordinary assignment)."""
        return len(self.workers)

    @property
    def units(self) -> tuple[Unit, ...]:
        """Every rank's unit, by rank."""
        if len(self.partitions) == 1:
            return (self.unit,)
        return tuple(Unit(self.unit.trial, p, self.unit.kind) for p in self.partitions)

    def unit_of(self, worker: str) -> Unit:
        """Return the unit ``worker`` runs in this assignment.

        Raises:
            ConfigError: ``worker`` is not one of :attr:`workers`.
        """
        if worker not in self.workers:
            raise ConfigError(f"worker {worker!r} is not in {self!r}")
        return self.units[self.workers.index(worker)]


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
