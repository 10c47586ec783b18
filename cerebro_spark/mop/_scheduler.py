"""The MOP scheduler: Cerebro's Alg. 1-2 with replica awareness and Q/Q' fault tolerance.

Pure: no I/O, threads, clock or global state. The engine calls :meth:`MopScheduler.assign`
whenever a worker may have become idle and reports what happened with
:meth:`~MopScheduler.complete`, :meth:`~MopScheduler.fail` and the membership calls.
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence

import numpy as np

from cerebro_spark.errors import ConfigError
from cerebro_spark.mop._base import Assignment, SchedulingRule, Unit
from cerebro_spark.mop._rules import RandomizedRule
from cerebro_spark.units import UnitKind


class MopScheduler:
    """Schedules one epoch of model hopper parallelism (Cerebro §3.1, §5.2-§5.6).

    Every trial has one TRAIN unit per partition. Q holds the units not yet started, Q'
    (:attr:`running`) the units running, one per worker. An idle worker is offered the
    units of idle trials on partitions it holds (§5.5: the availability map, worker to
    partitions, replaces Alg. 1's ``j' = j``) and the rule picks one (Alg. 1); it moves
    from Q to Q'. On completion it leaves Q' and its trial and worker are idle again
    (Alg. 2). If its worker fails or leaves, it moves back from Q' to Q (§5.6) and runs
    later on a worker holding its partition; workers may join, leave and be re-homed, and
    a trial whose user code failed may be dropped (:meth:`remove_trial`).
    The invariants of §3.1 hold throughout: each trial trains on each partition exactly
    once per epoch (completeness), two units of a trial never run at once (isolation), a
    worker runs one unit at a time (exclusivity), and a unit runs to its end or fails
    (non-preemption).

    With ``validate``, a trial's VALIDATE units (one per validation partition) become
    eligible once all its train units are complete; validation partition ``i`` is held by
    the workers holding partition ``i``, and a trial runs one validate unit at a time too.

    Args:
        trials: Ids of the trials trained this epoch (unique).
        partitions: Indices of the train partitions (unique, at least one).
        workers: The availability map: live worker id to the partition indices it holds.
        rng: Randomness for the rule; nothing else draws from it.
        rule: Picks among an idle worker's candidates; :class:`RandomizedRule` if None.
        visit_orders: If given, trial ``t``'s ``k``-th train unit is on partition
            ``visit_orders[t][k]`` (a permutation of ``partitions``), so replays train
            identical weights (§3.1 "Reproducibility"). If None, any remaining partition
            of an idle trial may go to an idle worker holding it (Alg. 1).
        validate: Whether the epoch ends with validate units.
        validation_partitions: Indices of the validation partitions; default
            ``partitions``. Only with ``validate``.
        completed: Units already complete this epoch (resume after a driver crash); with
            ``visit_orders``, a trial's completed train units must be a prefix of its order.

    Raises:
        ConfigError: An argument breaks the rules above (the message names the value).
    """

    def __init__(
        self,
        *,
        trials: Sequence[str],
        partitions: Sequence[int],
        workers: Mapping[str, Collection[int]],
        rng: np.random.Generator,
        rule: SchedulingRule | None = None,
        visit_orders: Mapping[str, Sequence[int]] | None = None,
        validate: bool = True,
        validation_partitions: Sequence[int] | None = None,
        completed: Iterable[Unit] = (),
    ) -> None:
        if len(set(trials)) != len(trials):
            raise ConfigError(f"trials {list(trials)!r} has duplicates; trial ids must be unique")
        self._trials = tuple(trials)
        self._partitions = _indices("partitions", partitions)
        if validation_partitions is not None and not validate:
            raise ConfigError(
                f"validation_partitions={list(validation_partitions)!r} given with "
                "validate=False; pass validate=True or leave them out"
            )
        if not validate:
            self._val_partitions: tuple[int, ...] = ()
        elif validation_partitions is None:
            self._val_partitions = self._partitions
        else:
            self._val_partitions = _indices("validation_partitions", validation_partitions)
        self._known = frozenset(self._partitions) | frozenset(self._val_partitions)
        self._rng = rng
        self._rule: SchedulingRule = RandomizedRule() if rule is None else rule
        self._ordered = visit_orders is not None
        self._orders = {t: self._partitions for t in self._trials}
        if visit_orders is not None:
            self._orders = _check_orders(visit_orders, self._trials, self._partitions)
        self._held: dict[str, frozenset[int]] = {}
        for worker, held in workers.items():
            self._held[worker] = self._check_held(worker, held)
        # Q, per trial and kind, in canonical order (visit order, else partition order).
        self._queue = {
            (t, kind): {p: Unit(t, p, kind) for p in self._canonical(t, kind)}
            for t in self._trials
            for kind in UnitKind
        }
        self._steps = {(t, kind): 0 for t in self._trials for kind in UnitKind}
        self._running: dict[str, Assignment] = {}  # Q', by worker
        self._busy: dict[str, str] = {}  # trial -> worker running it
        for unit in completed:
            self._take_completed(unit)
        self._check_resume_state()

    # ---------------------------------------------------------------- state

    @property
    def running(self) -> Mapping[str, Assignment]:
        """Q': the running assignments, by worker."""
        return dict(self._running)

    @property
    def remaining(self) -> Mapping[str, Sequence[Unit]]:
        """Q: every trial of the epoch to its units not yet started (train first)."""
        return dict(_QueueView(self._trials, self._queue))

    @property
    def workers(self) -> Mapping[str, frozenset[int]]:
        """The availability map: live worker id to the partitions it holds."""
        return dict(self._held)

    @property
    def finished(self) -> bool:
        """Whether every unit of the epoch is complete (Q and Q' are empty)."""
        return not self._running and not any(self._queue.values())

    @property
    def stalled(self) -> bool:
        """Whether units remain, none runs, and no live worker can take any of them.

        The engine must then re-home partitions (:meth:`set_partitions`, :meth:`add_worker`;
        see :attr:`unheld_partitions`) or give up.
        """
        if self.finished or self._running:
            return False
        return not any(self._candidates(worker) for worker in self._held)

    @property
    def unheld_partitions(self) -> frozenset[int]:
        """Partitions of units in Q that no live worker holds."""
        held = frozenset[int]().union(*self._held.values())
        return frozenset(p for units in self._queue.values() for p in units if p not in held)

    # ---------------------------------------------------------------- Alg. 1-2

    def assign(self) -> list[Assignment]:
        """Hand a unit to every idle worker that can get one (Alg. 1, one pass).

        Idle workers are served in sorted id order; for each, the rule picks among the
        units of idle trials on partitions it holds. The units move from Q to Q'.

        Returns:
            The new assignments, in the order they were made.

        Raises:
            ConfigError: The rule returned a unit that was not a candidate.
        """
        made = []
        for worker in sorted(self._held):
            if worker in self._running:
                continue
            candidates = self._candidates(worker)
            if not candidates:
                continue
            view = _QueueView(self._trials, self._queue)
            unit = self._rule.choose(worker, candidates, view, self._rng)
            if unit not in candidates:
                raise ConfigError(
                    f"rule {self._rule!r} chose {unit!r} for worker {worker!r}, which is not "
                    f"one of its candidates {list(candidates)!r}"
                )
            made.append(self._start(worker, unit))
        return made

    def complete(self, unit: Unit, *, worker: str | None = None) -> None:
        """Record that a running unit finished (Alg. 2): it leaves Q' for good.

        Args:
            unit: The unit.
            worker: If given, the worker that reports it; must be the one running it, so a
                stale report from a worker the unit was taken from is refused.

        Raises:
            ConfigError: ``unit`` is not running (on ``worker``).
        """
        self._release(unit, worker, "complete")
        self._steps[unit.trial, unit.kind] += 1

    def fail(self, unit: Unit, *, worker: str | None = None) -> None:
        """Record that a running unit must be retried (§5.6): it moves from Q' back to Q.

        Its trial and worker are idle again; the worker stays live.

        Args:
            unit: The unit.
            worker: If given, must be the worker running it.

        Raises:
            ConfigError: ``unit`` is not running (on ``worker``).
        """
        self._release(unit, worker, "fail")
        self._requeue(unit)

    def remove_trial(self, trial: str) -> None:
        """Drop a trial from the epoch (its user code failed, or the search stopped it).

        Its units leave Q, and Q' if one is running (that worker is idle again); units it
        completed stay complete. Completeness then holds for the other trials only.

        Raises:
            ConfigError: ``trial`` is not a trial of this epoch.
        """
        if trial not in self._orders:
            raise ConfigError(
                f"unknown trial {trial!r}; trials of this epoch: {list(self._trials)}"
            )
        worker = self._busy.pop(trial, None)
        if worker is not None:
            del self._running[worker]
        for kind in UnitKind:
            self._queue[trial, kind] = {}

    # ---------------------------------------------------------------- elasticity

    def add_worker(self, worker: str, partitions: Collection[int]) -> None:
        """Register a new live worker holding ``partitions`` (§5.6 scale-out).

        Raises:
            ConfigError: ``worker`` is already live, or holds an unknown partition.
        """
        if worker in self._held:
            raise ConfigError(f"worker {worker!r} is already registered")
        self._held[worker] = self._check_held(worker, partitions)

    def remove_worker(self, worker: str) -> Unit | None:
        """Forget a worker that left or died; its running unit moves back to Q (§5.6).

        Returns:
            The unit it was running, if any.

        Raises:
            ConfigError: ``worker`` is not live.
        """
        self._check_worker(worker)
        assignment = self._running.get(worker)
        if assignment is not None:
            self.fail(assignment.unit)
        del self._held[worker]
        return None if assignment is None else assignment.unit

    def set_partitions(self, worker: str, partitions: Collection[int]) -> None:
        """Re-home: ``worker`` now holds ``partitions``. A running unit runs on.

        Raises:
            ConfigError: ``worker`` is not live, or a partition is unknown.
        """
        self._check_worker(worker)
        self._held[worker] = self._check_held(worker, partitions)

    # ---------------------------------------------------------------- internals

    def _canonical(self, trial: str, kind: UnitKind) -> tuple[int, ...]:
        return self._orders[trial] if kind is UnitKind.TRAIN else self._val_partitions

    def _candidates(self, worker: str) -> list[Unit]:
        """Units of idle trials that ``worker`` may run (Alg. 1 line 10, §5.5)."""
        held = self._held[worker]
        in_order = sorted(held)
        found: list[Unit] = []
        for trial in self._trials:
            if trial in self._busy:
                continue
            train = self._queue[trial, UnitKind.TRAIN]
            queue = train or self._queue[trial, UnitKind.VALIDATE]
            if not queue:
                continue
            if self._ordered and queue is train:
                first = next(iter(train.values()))
                if first.partition in held:
                    found.append(first)
            elif len(held) < len(queue):
                found.extend(queue[p] for p in in_order if p in queue)
            else:
                found.extend(unit for p, unit in queue.items() if p in held)
        return found

    def _start(self, worker: str, unit: Unit) -> Assignment:
        del self._queue[unit.trial, unit.kind][unit.partition]
        assignment = Assignment(unit, worker, self._steps[unit.trial, unit.kind])
        self._running[worker] = assignment
        self._busy[unit.trial] = worker
        return assignment

    def _release(self, unit: Unit, worker: str | None, verb: str) -> Assignment:
        runner = self._busy.get(unit.trial)
        if runner is None or self._running[runner].unit != unit:
            raise ConfigError(f"cannot {verb} {unit!r}: it is not running")
        if worker is not None and worker != runner:
            raise ConfigError(
                f"cannot {verb} {unit!r} for worker {worker!r}: it runs on worker {runner!r}"
            )
        del self._busy[unit.trial]
        return self._running.pop(runner)

    def _requeue(self, unit: Unit) -> None:
        queue = self._queue[unit.trial, unit.kind]
        keep = set(queue) | {unit.partition}
        self._queue[unit.trial, unit.kind] = {
            p: queue.get(p, unit) for p in self._canonical(unit.trial, unit.kind) if p in keep
        }

    def _check_worker(self, worker: str) -> None:
        if worker not in self._held:
            raise ConfigError(f"unknown worker {worker!r}; live workers: {sorted(self._held)}")

    def _check_held(self, worker: str, partitions: Collection[int]) -> frozenset[int]:
        held = frozenset(_ints(f"partitions of worker {worker!r}", partitions))
        unknown = sorted(held - self._known)
        if unknown:
            raise ConfigError(
                f"worker {worker!r} holds unknown partitions {unknown}; known partitions: "
                f"{sorted(self._known)}"
            )
        return held

    def _take_completed(self, unit: Unit) -> None:
        if unit.trial not in self._orders:
            raise ConfigError(f"completed unit {unit!r} has an unknown trial {unit.trial!r}")
        queue = self._queue[unit.trial, unit.kind]
        if unit.partition not in self._canonical(unit.trial, unit.kind):
            raise ConfigError(
                f"completed unit {unit!r} has partition {unit.partition!r}, which is not a "
                f"{unit.kind.value} partition of this epoch"
            )
        if unit.partition not in queue:
            raise ConfigError(f"completed unit {unit!r} appears twice in completed")
        del queue[unit.partition]
        self._steps[unit.trial, unit.kind] += 1

    def _check_resume_state(self) -> None:
        for trial in self._trials:
            train = self._queue[trial, UnitKind.TRAIN]
            done = self._steps[trial, UnitKind.TRAIN]
            if self._ordered and tuple(train) != self._orders[trial][done:]:
                raise ConfigError(
                    f"completed train units of trial {trial!r} are not the first {done} "
                    f"partitions of its visit order {list(self._orders[trial])!r}"
                )
            if train and self._steps[trial, UnitKind.VALIDATE]:
                raise ConfigError(
                    f"completed has validate units of trial {trial!r} but its train "
                    f"partitions {list(train)} are not complete"
                )


class _QueueView(Mapping[str, Sequence[Unit]]):
    """Read-only view of Q by trial, train units before validate units."""

    def __init__(
        self, trials: Sequence[str], queue: Mapping[tuple[str, UnitKind], Mapping[int, Unit]]
    ) -> None:
        self._trials = trials
        self._queue = queue

    def __getitem__(self, trial: str) -> tuple[Unit, ...]:
        return (
            *self._queue[trial, UnitKind.TRAIN].values(),
            *self._queue[trial, UnitKind.VALIDATE].values(),
        )

    def __iter__(self) -> Iterator[str]:
        return iter(self._trials)

    def __len__(self) -> int:
        return len(self._trials)


def _ints(name: str, values: Iterable[int]) -> tuple[int, ...]:
    """Convert to Python ints, refusing anything that is not an integer."""
    values = list(values)
    try:
        return tuple(operator.index(v) for v in values)
    except TypeError:
        raise ConfigError(f"{name} {values!r} must be integers") from None


def _indices(name: str, values: Sequence[int]) -> tuple[int, ...]:
    """Validate a non-empty sequence of unique non-negative partition indices."""
    indices = _ints(name, values)
    if not indices or len(set(indices)) != len(indices) or min(indices) < 0:
        raise ConfigError(
            f"{name} {list(indices)!r} must be non-empty, unique and non-negative integers"
        )
    return indices


def _check_orders(
    visit_orders: Mapping[str, Sequence[int]], trials: Sequence[str], partitions: Sequence[int]
) -> dict[str, tuple[int, ...]]:
    """Validate visit orders: one per trial, each a permutation of ``partitions``."""
    extra = sorted(set(visit_orders) - set(trials))
    missing = [t for t in trials if t not in visit_orders]
    if extra or missing:
        raise ConfigError(
            f"visit_orders must have exactly one order per trial; missing {missing}, "
            f"unknown {extra}"
        )
    orders = {}
    for trial in trials:
        order = _ints(f"visit_orders[{trial!r}]", visit_orders[trial])
        if sorted(order) != sorted(partitions):
            raise ConfigError(
                f"visit_orders[{trial!r}] = {list(order)!r} is not a permutation of the "
                f"partitions {list(partitions)!r}"
            )
        orders[trial] = order
    return orders
