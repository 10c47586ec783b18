"""One round's units on the backend: submit, wait, handle, retry (Cerebro §5.5-§5.7).

:class:`RoundRunner` runs the round the driver opened: it asks the MOP scheduler for
assignments, submits each to the backend (one unit, or a group of ranks, §5.7), waits on
one queue for whichever finishes first, and logs each outcome through its ``emit`` sink:
``unit_end`` (:func:`~cerebro_spark.driver._running.unit_end_fields`, the one builder), or
``unit_failed`` with a reason, after which the unit is retried (a lost worker, an I/O
error, a broken group), or its trial fails (its own error, a corrupt checkpoint). A packed
assignment (issue 27) goes to ``Backend.submit_pack`` and each member is then handled as an
ordinary unit of its own trial (a member that failed alone is retried or fails its trial
alone; the pack's worker is freed once for all). What the
round needs from the run around it comes in :class:`RoundHooks`; it knows nothing else of
the driver.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import queue
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import Any

from cerebro_spark.backends import Backend
from cerebro_spark.driver._checkpoints import CheckpointKeeper
from cerebro_spark.driver._events import EventLog
from cerebro_spark.driver._membership import RoundMembership
from cerebro_spark.driver._progress import Progress
from cerebro_spark.driver._running import (
    Freed,
    Running,
    drain,
    group_failure,
    unit_end_fields,
    unit_task,
    unit_where,
)
from cerebro_spark.driver._state import READY, ExperimentState
from cerebro_spark.errors import (
    CerebroError,
    StoreError,
    StoreFullError,
    TrialError,
    WorkerLostError,
)
from cerebro_spark.mop import Assignment, MopScheduler, Unit
from cerebro_spark.units import UnitKind, UnitResult, UnitTask, group_tasks

logger = logging.getLogger(__name__)

WAIT_SECONDS = 0.5
"""How long the driver sleeps when idle before it looks again (no unit runs, none can)."""
# How long the driver waits for a worker's report before it counts as idle and flushes the
# event log. On an object store a flush is a PUT (tens of ms): flushing whenever no report
# was queued would put one in the driver's loop per unit while workers keep finishing.
# Busy, the log still lags by at most EventLog.flush_seconds.
_SETTLE_SECONDS = 0.05
_STARTING_POLL_SECONDS = 0.05
"""How often the driver looks for workers that became ready while units run and some are
still starting (a unit of a small model takes a fraction of a second: the first units
start while the other workers load, and each joins as soon as it is ready)."""
READ_AHEAD = 2
"""Checkpoints a busy worker is told to read ahead at most (a pack's worth when larger)."""
MAX_UNIT_RETRIES = 3
"""Times a unit is retried after I/O errors before the experiment gives up."""
GROUP_TIMEOUT_S = 60.0
"""Seconds a rank of a group unit waits for its peers (``GroupSpec.timeout_s``)."""
MAX_GROUP_BREAKS = 3
"""Times a trial's group may break in a round with no worker lost (a rendezvous that
keeps failing) before the trial trains one unit at a time for the rest of the round."""


@dataclasses.dataclass(frozen=True)
class RoundHooks:
    """What a round needs from the run around it.

    Attributes:
        emit: Logs an event and folds it into the state (``emit(name, **fields)``).
        sync: Logs the backend's membership changes; whether there were any.
        units_out: The round's first units are out (or none can be): the report may refresh.
        unit_done: A unit ended, in this many seconds (the unit-time estimates).
        validation_in: A validation unit of this trial ended: its epoch may be complete.
        fail_trial: The trial fails with this error (removed from the scheduler, logged,
            told to its procedure).
    """

    emit: Callable[..., None]
    sync: Callable[[Backend], bool]
    units_out: Callable[[], None]
    unit_done: Callable[[Unit, float], None]
    validation_in: Callable[[str], None]
    fail_trial: Callable[[str, CerebroError, MopScheduler], None]


@dataclasses.dataclass
class RoundCounters:
    """What a driver session counts across its rounds.

    Attributes:
        submissions: Numbers assignments in the order they were submitted.
        group_attempts: Numbers group attempts (group ids are unique in a session).
        retries: I/O retries by unit and epoch.
    """

    submissions: Iterator[int] = dataclasses.field(default_factory=itertools.count)
    group_attempts: Iterator[int] = dataclasses.field(default_factory=lambda: itertools.count(1))
    retries: dict[tuple[Unit, int], int] = dataclasses.field(default_factory=dict)


class RoundRunner:
    """Runs one round's units to the end.

    Args:
        scheduler: The round's MOP scheduler (its trials, partitions, workers, orders).
        backend: The workers.
        state: The experiment's state, folded from the log as events are emitted.
        log: The event log (``unit_start`` is appended unfolded; flushed when idle).
        progress: The progress line.
        checkpoints: Drops superseded checkpoints, verifies corrupt ones.
        membership: The round's schedule kept to the membership events.
        counters: The session's counters.
        hooks: What the round needs from the run around it.
        prefix: The experiment's folder in the store.
        epoch_units: Training units in an epoch (the dataset's partitions).
    """

    def __init__(
        self,
        scheduler: MopScheduler,
        backend: Backend,
        *,
        state: ExperimentState,
        log: EventLog,
        progress: Progress,
        checkpoints: CheckpointKeeper,
        membership: RoundMembership,
        counters: RoundCounters,
        hooks: RoundHooks,
        prefix: str,
        epoch_units: int,
    ) -> None:
        self.scheduler, self.backend = scheduler, backend
        self.state, self.log, self.progress = state, log, progress
        self.checkpoints, self.membership = checkpoints, membership
        self.counters, self.hooks = counters, hooks
        self.prefix, self.epoch_units = prefix, epoch_units
        self.running: dict[int, Running] = {}  # by submission number
        self.freed_at: dict[int, float] = {}  # by submission: when its worker was freed
        self.group_breaks: dict[str, int] = {}
        self.hinted: dict[str, set[tuple[str, str]]] = {}  # by worker: checkpoints hinted
        self.reads_ahead = type(backend).prefetch is not Backend.prefetch

    def run(self) -> None:
        """Submit and handle units until the scheduler has none left."""
        scheduler, backend, running = self.scheduler, self.backend, self.running
        # all ranks reported, or (Freed) a unit's worker free while it writes the checkpoint
        finished: queue.SimpleQueue[Running | Freed] = queue.SimpleQueue()
        while not scheduler.finished:
            requeued = False
            for assignment in scheduler.assign():
                submitted = self._submit(assignment)
                if submitted is None:
                    requeued = True
                for started in submitted or ():
                    running[started.number] = started
                    started.watch(finished)
            self.hooks.units_out()  # the round's first units are out (or none can be)
            self._read_ahead()
            if not running:
                if requeued:
                    continue  # a worker left since the last sync: assign again now
                if scheduler.stalled:
                    self._check_stalled()
                    continue  # workers are starting, or the sync brought some
                self.log.flush()  # idle: the log is made current while the driver waits
                time.sleep(WAIT_SECONDS)
                self.hooks.sync(backend)
                continue
            # returns at once if a report is queued; one due any moment is handled before
            # the log is flushed
            ready = drain(finished, _SETTLE_SECONDS)
            if not ready:
                self.log.flush()  # idle until a worker reports: make the log current
                # A worker takes its first unit once it is ready, not once a unit ends:
                # while some start, the driver looks often; one ready before it looked
                # is taken in now (counted first, so none falls between the two).
                starting = backend.starting()
                if self.hooks.sync(backend):
                    continue
                ready = drain(finished, _STARTING_POLL_SECONDS if starting else WAIT_SECONDS)
            freed = [r.running for r in ready if isinstance(r, Freed)]
            ended = sorted(  # in submission order, as they were started
                (r for r in ready if isinstance(r, Running)), key=lambda r: r.number
            )
            self.hooks.sync(backend)  # the workers of `ended` still count
            for item in ended:
                del running[item.number]
                if item.assignment.size == 1:
                    self._handle(item)
                else:
                    self._handle_group(item)
                self.membership.depart(item.assignment.workers)
            for item in freed:  # its checkpoint being written, its worker takes other work
                if item.number in running:
                    self.freed_at[item.number] = time.time()  # unit_end says when
                    scheduler.free_worker(item.assignment.worker, item.unit)
                    self.membership.depart(item.assignment.workers)  # unless it left
            self.progress.maybe_log()
        self.progress.maybe_log(force=True)

    def _read_ahead(self) -> None:
        """Hint each busy worker the checkpoints of the trials it may run next (issue 27).

        The trials :meth:`MopScheduler.upcoming` lists for it (at most a pack's worth, two
        at least), each checkpoint once a round; the worker reads them while it trains.
        """
        busy = list(self.scheduler.running)
        if not self.reads_ahead or not busy:
            return
        limit = max(READ_AHEAD, self.scheduler.pack_size)
        for worker, trial_ids in self.scheduler.upcoming(busy, limit).items():
            hinted = self.hinted.setdefault(worker, set())
            hints = []
            for trial_id in trial_ids:
                trial = self.state.trials[trial_id]
                if trial.checkpoint and trial.checkpoint_sha256:
                    ref = (trial.checkpoint, trial.checkpoint_sha256)
                    if ref not in hinted:
                        hinted.add(ref)
                        hints.append(ref)
            if hints:
                self.backend.prefetch(worker, hints)

    def _check_stalled(self) -> None:
        """Nothing runs and no ready worker can take a unit: wait, or fail.

        It waits for the workers still starting (or takes in those the last changes
        brought); with none, it fails naming what is missing.

        Raises:
            CerebroError: No worker is starting and no live worker can take a unit.
        """
        backend, scheduler = self.backend, self.scheduler
        starting = backend.starting()  # before the sync: a worker ready since is in it
        self.hooks.sync(backend)
        if not scheduler.stalled:
            return
        if starting:
            self.log.flush()  # idle: the log is made current while the driver waits
            logger.debug("no ready worker can take a unit; %d workers are starting", starting)
            time.sleep(WAIT_SECONDS)
            self.hooks.sync(backend)
            return
        unheld = sorted(scheduler.unheld_partitions)
        missing = (
            f"partitions {unheld} are held by no worker (their workers were lost or failed "
            "to load them: see the worker_lost events and the driver log)"
            if unheld
            else "no ready worker can take any of the remaining units"
        )
        raise CerebroError(
            f"no live worker holds the partitions the remaining units need: {missing}; "
            f"workers: {dict(sorted(scheduler.workers.items()))}"
        )

    def _task(self, assignment: Assignment, member: int = 0) -> UnitTask:
        """The task of an assignment (rank 0's, for a group; a member's, for a pack)."""
        trial = self.state.trials[assignment.pack[member].trial]
        return unit_task(assignment, trial, self.prefix, self.epoch_units, member)

    def _where(
        self, assignment: Assignment, index: int, group: str | None, member: int = 0
    ) -> dict[str, Any]:
        """The fields that place rank ``index`` (or pack member ``member``) in the event log."""
        epoch = self.state.trials[assignment.pack[member].trial].epochs
        return unit_where(assignment, index, group, self.state.round, epoch, member)

    def _submit(self, assignment: Assignment) -> list[Running] | None:
        """Start an assignment on the backend; None if it went back to the queue.

        Returns one :class:`Running` per pack member (one for any other assignment).
        """
        backend, scheduler = self.backend, self.scheduler
        task = self._task(assignment)
        group: str | None = None
        members: list[Future[UnitResult]] = []
        try:
            if assignment.packed:
                pack = [self._task(assignment, m) for m in range(len(assignment.pack))]
                members = backend.submit_pack(assignment.worker, pack)
                futures = {}
            elif self._packs_alone(assignment):  # its numbers are its packed ones
                futures = {assignment.worker: backend.submit_pack(assignment.worker, [task])[0]}
            elif assignment.size == 1:
                futures = {assignment.worker: backend.submit(assignment.worker, task)}
            else:
                group = self._group_id(assignment)
                tasks = group_tasks(task, assignment.partitions, group, timeout_s=GROUP_TIMEOUT_S)
                futures = backend.submit_group(dict(zip(assignment.workers, tasks, strict=True)))
        except ValueError:
            # A worker died or is retiring since the last sync (the backend refuses it):
            # queue the work again and learn who left; anything else is a bug.
            live = backend.workers()
            if all(w in live for w in assignment.workers):
                raise
            for unit in assignment.pack:
                scheduler.fail(unit)
            self.hooks.sync(backend)
            unexplained = [
                w for w in assignment.workers if w not in live and w in scheduler.workers
            ]
            if unexplained:  # else the scheduler would hand them work forever
                raise CerebroError(
                    f"the backend refused workers {unexplained} but reported no membership "
                    "change for them (Backend.changes)"
                ) from None
            return None
        if assignment.packed:
            started = []
            for member, future in enumerate(members):
                self.log.append("unit_start", **self._where(assignment, 0, None, member))
                number = next(self.counters.submissions)
                where = {assignment.worker: future}
                started.append(Running(assignment, where, None, number, member))
            return started
        for index in range(assignment.size):
            self.log.append("unit_start", **self._where(assignment, index, group))
        return [Running(assignment, futures, group, next(self.counters.submissions))]

    def _packs_alone(self, assignment: Assignment) -> bool:
        """A train unit of a trial that packs, with no mate this time (a pack of one).

        It trains in the packed kernel all the same, so that its weights do not depend on
        whether mates were there (:mod:`cerebro_spark.training._pack`): a resumed or
        replayed run, whose packs form anew, reproduces them bit for bit.
        """
        unit = assignment.unit
        return (
            self.scheduler.pack_size > 1
            and assignment.size == 1
            and unit.kind is UnitKind.TRAIN
            and unit.trial in self.scheduler.pack_keys
        )

    def _group_id(self, assignment: Assignment) -> str:
        """A group id unique to this attempt, also across resumed driver sessions."""
        attempt = next(self.counters.group_attempts)
        trial = self.state.trials[assignment.unit.trial]
        return (
            f"{trial.trial_id}-e{trial.epochs}-s{assignment.step}-d{self.state.sessions}-a{attempt}"
        )

    def _handle(self, item: Running) -> None:
        """Handle an ordinary unit's outcome, or one pack member's (as its trial's unit)."""
        scheduler = self.scheduler
        assignment = item.assignment
        unit = item.unit
        where = self._where(assignment, 0, None, item.member)
        future = item.futures[assignment.worker]
        try:
            result = future.result()
        except WorkerLostError as error:
            self.hooks.emit("unit_failed", **where, reason="worker_lost", error=str(error))
            scheduler.fail(unit, worker=assignment.worker)
            return
        except StoreError as error:
            corrupt = self.checkpoints.verify(unit.trial, [error])
            if corrupt is not None:
                self.hooks.emit(
                    "unit_failed", **where, reason="checkpoint_corrupt", error=str(error)
                )
                self.hooks.fail_trial(unit.trial, corrupt, scheduler)
                return
            self.hooks.emit("unit_failed", **where, reason="io_error", error=str(error))
            self._count_retry(unit, error)
            scheduler.fail(unit, worker=assignment.worker)
            return
        except TrialError as error:
            self.hooks.emit("unit_failed", **where, reason="trial_error", error=str(error))
            self.hooks.fail_trial(unit.trial, error, scheduler)
            return
        previous = self.state.trials[unit.trial].checkpoint
        freed_at = self.freed_at.pop(item.number, None)
        self.hooks.emit("unit_end", **where, **unit_end_fields(result, freed_at=freed_at))
        scheduler.complete(unit, worker=assignment.worker)
        self.progress.unit_done()
        self.hooks.unit_done(unit, result.seconds)
        if unit.kind is UnitKind.TRAIN:
            self.checkpoints.drop(previous, unit.trial)
        else:
            self.hooks.validation_in(unit.trial)

    def _handle_group(self, item: Running) -> None:
        """Combine the ranks of a group unit once all are in (Cerebro §5.6-§5.7).

        All ranks succeeded: one ``unit_end`` per partition, then the whole group
        completes. Otherwise the group failed as a whole: a ``TrialError`` on any rank
        fails the trial; a lost worker or a broken group (``GroupBrokenError``, whose
        worker lives on) and I/O errors put the group back in the queue. Workers leave
        the schedule only when the backend reported them gone (:meth:`RoundMembership.depart`).
        """
        assignment, scheduler = item.assignment, self.scheduler
        trial_id = assignment.unit.trial
        errors = {w: f.exception() for w, f in item.futures.items()}
        failed = {w: e for w, e in errors.items() if e is not None}
        if not failed:
            results = [item.futures[w].result() for w in assignment.workers]
            self._finish_group(item, results)
            return
        reason = group_failure(failed.values())
        corrupt = None
        if reason != "trial_error":  # a corrupt read on one rank breaks the others' group
            corrupt = self.checkpoints.verify(trial_id, failed.values())
            reason = "checkpoint_corrupt" if corrupt is not None else reason
        for index, worker in enumerate(assignment.workers):
            error = failed.get(worker)
            text = str(error) if error is not None else f"another rank failed ({reason})"
            where = self._where(assignment, index, item.group)
            self.hooks.emit("unit_failed", **where, reason=reason, error=text)
        if reason == "trial_error":
            first = next(e for e in failed.values() if isinstance(e, TrialError))
            self.hooks.fail_trial(trial_id, first, scheduler)
        elif corrupt is not None:
            self.hooks.fail_trial(trial_id, corrupt, scheduler)
        else:
            if reason == "io_error":
                first_io = next(e for e in failed.values() if isinstance(e, StoreError))
                self._count_retry(assignment.unit, first_io)
            scheduler.fail(assignment.unit)
        workers = self.state.workers
        lost = [w for w in assignment.workers if w not in workers or workers[w].status != READY]
        if reason == "group_broken" and not lost:
            self._group_broke(trial_id, failed.values())

    def _finish_group(self, item: Running, results: list[UnitResult]) -> None:
        assignment, scheduler = item.assignment, self.scheduler
        trial_id = assignment.unit.trial
        previous = self.state.trials[trial_id].checkpoint
        lead = results[0]  # rank 0 wrote the checkpoint
        for index, result in enumerate(results):
            where = self._where(assignment, index, item.group)
            self.hooks.emit("unit_end", **where, **unit_end_fields(result, lead=lead))
        scheduler.complete(assignment.unit, worker=assignment.worker)
        wall = max(result.seconds for result in results)
        for unit in assignment.units:
            self.progress.unit_done()
            self.hooks.unit_done(unit, wall / assignment.size)  # the trial's wall time per unit
        self.checkpoints.drop(previous, trial_id)

    def _group_broke(self, trial_id: str, errors: Iterable[BaseException]) -> None:
        breaks = self.group_breaks.get(trial_id, 0) + 1
        self.group_breaks[trial_id] = breaks
        if breaks < MAX_GROUP_BREAKS:
            return
        logger.warning(
            "the group of trial %s broke %d times with no worker lost (last: %s); it trains "
            "one unit at a time for the rest of round %d",
            trial_id,
            breaks,
            next(iter(errors), None),
            self.state.round,
        )
        self.scheduler.set_group_size(trial_id, 1)

    def _count_retry(self, unit: Unit, error: StoreError) -> None:
        if isinstance(error, StoreFullError) or f"{StoreFullError.__name__}:" in str(error):
            # A worker's disk is full: no retry frees space. The run ends here, its log
            # whole (the unit's failure is logged), and 'resume' goes on once it is freed.
            raise StoreFullError(f"unit {unit} could not write its checkpoint: {error}") from error
        key = (unit, self.state.trials[unit.trial].epochs)
        self.counters.retries[key] = self.counters.retries.get(key, 0) + 1
        if self.counters.retries[key] > MAX_UNIT_RETRIES:
            raise CerebroError(
                f"unit {unit} failed {self.counters.retries[key]} times with I/O errors; "
                f"last: {error}"
            ) from error
        logger.warning("retrying %s after an I/O error: %s", unit, error)
