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
    """Work handed to one worker: one unit, a group (Cerebro §5.7) or a pack (issue 27).

    An ordinary assignment is one unit on one worker. A *group assignment* is ``k > 1``
    train units of one trial, trained data-parallel by ``k`` workers at once (one group
    unit, :mod:`cerebro_spark.training._group`): rank ``r`` runs on ``workers[r]`` and
    trains ``partitions[r]``. Its units start, complete and fail together (Q/Q' of §5.6
    extended to groups). ``unit`` and ``worker`` are rank 0's; ``workers`` and
    ``partitions`` default to ``(worker,)`` and ``(unit.partition,)``, so an ordinary
    assignment is a group of one.

    A *packed assignment* is ``k > 1`` train units of ``k`` distinct trials on one
    partition, trained together on one worker in one pass (one packed unit,
    :mod:`cerebro_spark.training._pack`): :attr:`pack` is ``(unit, *packed)``. Each
    member completes or fails on its own; :attr:`steps` holds each member's position
    in its own trial's visit order. An ordinary assignment is a pack of one; a group is
    never a pack.

    Attributes:
        unit: The unit (rank 0's unit of a group, the first unit of a pack).
        worker: The worker that runs it (rank 0's worker of a group).
        step: For a train unit, its position in the trial's visit order this epoch
            (``0 .. P-1``: the trial's train units completed before it); rank ``r`` of a
            group is at position ``step + r``. For a validate unit, the trial's validate
            units completed before it.
        workers: Every rank's worker, by rank (distinct).
        partitions: Every rank's partition, by rank (distinct).
        packed: The other train units of a pack (distinct trials, none of them
            ``unit``'s, all on ``unit``'s partition); empty for a pack of one.
        steps: Every pack member's step, by pack position; ``(step,)`` by default.

    Raises:
        ConfigError: ``workers`` and ``partitions`` differ in length, repeat an element,
            disagree with ``worker`` and ``unit`` at rank 0, or form a group of validate
            units; or ``packed`` and ``steps`` do not form a pack as above (a pack of
            train units of distinct trials on one partition and one worker, one step
            per member, ``steps[0] == step``).
    """

    unit: Unit
    worker: str
    step: int
    workers: tuple[str, ...] = ()
    partitions: tuple[int, ...] = ()
    packed: tuple[Unit, ...] = ()
    steps: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        self._check_group()
        self._check_pack()

    def _check_group(self) -> None:
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

    def _check_pack(self) -> None:
        packed = tuple(self.packed)
        steps = tuple(self.steps) or ((self.step,) if not packed else ())
        object.__setattr__(self, "packed", packed)
        object.__setattr__(self, "steps", steps)
        if not packed:
            if steps != (self.step,):
                raise ConfigError(
                    f"assignment of {self.unit!r}: steps {list(steps)} of a pack of one "
                    f"must be (step,) = ({self.step},)"
                )
            return
        pack = (self.unit, *packed)
        if len(self.workers) > 1:
            raise ConfigError(
                f"assignment of {self.unit!r}: a group (workers {list(self.workers)}) "
                f"cannot also be a pack (packed {list(packed)})"
            )
        trials = [u.trial for u in pack]
        if any(
            u.kind is not UnitKind.TRAIN or u.partition != self.unit.partition for u in pack
        ) or len(set(trials)) != len(trials):
            raise ConfigError(
                f"a pack trains one partition for distinct trials; got {list(pack)!r}"
            )
        if len(steps) != len(pack) or steps[0] != self.step:
            raise ConfigError(
                f"pack {list(pack)!r}: steps {list(steps)} must give one step per member, "
                f"the first equal to step {self.step}"
            )

    @property
    def size(self) -> int:
        """Number of workers (1 for an ordinary assignment and for a pack)."""
        return len(self.workers)

    @property
    def units(self) -> tuple[Unit, ...]:
        """Every rank's unit, by rank (a pack's first unit only: see :attr:`pack`)."""
        if len(self.partitions) == 1:
            return (self.unit,)
        return tuple(Unit(self.unit.trial, p, self.unit.kind) for p in self.partitions)

    @property
    def pack(self) -> tuple[Unit, ...]:
        """Every member's unit, by pack position: ``(unit, *packed)``."""
        return (self.unit, *self.packed)

    @property
    def trials(self) -> tuple[str, ...]:
        """The trials it trains: a pack's in pack order, else the one trial."""
        return tuple(u.trial for u in self.pack)

    def unit_of(self, worker: str) -> Unit:
        """Return the unit ``worker`` runs in this assignment (a pack's first unit).

        Raises:
            ConfigError: ``worker`` is not one of :attr:`workers`.
        """
        if worker not in self.workers:
            raise ConfigError(f"worker {worker!r} is not in {self!r}")
        return self.units[self.workers.index(worker)]

    def step_of(self, unit: Unit) -> int:
        """Return ``unit``'s step: a group rank's ``step + r``, a pack member's own.

        Raises:
            ConfigError: ``unit`` is not one of :attr:`units` or :attr:`pack`.
        """
        if unit in self.packed:
            return self.steps[self.pack.index(unit)]
        if unit in self.units:
            return self.step + self.units.index(unit)
        raise ConfigError(f"unit {unit!r} is not in {self!r}")


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
