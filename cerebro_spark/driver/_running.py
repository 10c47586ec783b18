"""Units in flight: what the driver submits, waits on and logs for each assignment.

The driver submits each assignment of the MOP scheduler (Cerebro §5.5) to the backend
(:func:`unit_task`), tracks it as :class:`Running` until every rank has reported (a group
unit, Cerebro §5.7, has one future per rank), and logs each rank's outcome placed by
:func:`unit_where`: ``unit_end`` with :func:`unit_end_fields`, or ``unit_failed`` with the
reason :func:`group_failure` gives a group. A packed assignment (issue 27: ``k`` trials
trained in one pass on one worker) is tracked as ``k`` :class:`Running` s, one per member
(:attr:`Running.member`), each handled as an ordinary unit of its trial; each member's
events carry a ``pack`` field, the pack's trial ids in pack order.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from typing import Any

from cerebro_spark.backends import UnitFuture
from cerebro_spark.driver._layout import logged_key
from cerebro_spark.driver._state import TrialState
from cerebro_spark.errors import StoreError, TrialError, WorkerLostError
from cerebro_spark.mop import Assignment, Unit
from cerebro_spark.units import GroupBrokenError, UnitKind, UnitResult, UnitTask, pack_states


@dataclasses.dataclass(frozen=True)
class Running:
    """An assignment submitted to the backend: one future per worker (rank)."""

    assignment: Assignment
    futures: Mapping[str, Future[UnitResult]]
    group: str | None = None
    number: int = 0
    """Submission number (the order the driver handles finished assignments in)."""
    member: int = 0
    """The member of a packed assignment this tracks (its position in the pack)."""

    @property
    def unit(self) -> Unit:
        """The unit this tracks: the assignment's unit, or its pack member's."""
        return self.assignment.pack[self.member]

    def done(self) -> bool:
        """Whether every rank has reported."""
        return all(future.done() for future in self.futures.values())

    def watch(self, finished: queue.SimpleQueue[Running | Freed]) -> None:
        """Put this assignment on ``finished`` once every rank has reported.

        The driver then waits on one queue instead of polling every running future. An
        ordinary unit whose worker is freed before its result (a :class:`UnitFuture`:
        its checkpoint being written) puts a :class:`Freed` there first.
        """
        if len(self.futures) == 1:  # an ordinary unit: no count to keep
            (future,) = self.futures.values()
            if isinstance(future, UnitFuture):
                future.freed.add_done_callback(
                    lambda _: None if future.done() else finished.put(Freed(self))
                )
            future.add_done_callback(lambda _: finished.put(self))
            return
        left = [len(self.futures)]
        lock = threading.Lock()

        def reported(_: Future[UnitResult]) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                finished.put(self)

        for future in self.futures.values():
            future.add_done_callback(reported)


def _trained_at(freed_at: float | None) -> dict[str, float]:
    """``unit_end``'s ``trained_at``: when the worker was freed, if before the unit's end."""
    return {} if freed_at is None else {"trained_at": round(freed_at, 6)}


@dataclasses.dataclass(frozen=True)
class Freed:
    """The worker of a running ordinary unit is free: only its checkpoint write is left."""

    running: Running


def drain(finished: queue.SimpleQueue[Running | Freed], wait_s: float) -> list[Running | Freed]:
    """Every finished assignment on the queue, waiting up to ``wait_s`` for the first.

    If none finished by then, it is empty.
    """
    try:
        ready = [finished.get(timeout=wait_s)]  # at once if one is queued
    except queue.Empty:
        return []
    while True:
        try:
            ready.append(finished.get_nowait())
        except queue.Empty:
            return ready


def _traffic(result: UnitResult) -> dict[str, float]:
    """A unit's checkpoint traffic and data wait for its ``unit_end`` event.

    Readers default each to 0 (older logs lack them).
    ``checkpoint_bytes_read``/``checkpoint_bytes_written``: bytes this rank moved from and
    to the store; ``checkpoint_cache_hits``: checkpoints its worker's cache answered;
    ``checkpoint_prefetched``: of those, the ones it had read ahead (issue 27);
    ``data_wait_seconds``: the part of ``seconds`` its loop waited for batches.
    """
    return {
        "checkpoint_bytes_read": result.checkpoint_bytes_read,
        "checkpoint_bytes_written": result.checkpoint_bytes_written,
        "checkpoint_cache_hits": result.checkpoint_cache_hits,
        "checkpoint_prefetched": result.checkpoint_prefetched,
        "data_wait_seconds": round(result.data_wait_seconds, 6),
    }


def _states(result: UnitResult) -> dict[str, Any]:
    """The ``metric_states`` field of a validation unit's ``unit_end``.

    None for training units (their running metrics are in ``metric_sums``), nor for
    results without states (older workers: the epoch's metrics fall back to the sums).
    Packed: metrics that share a state name the first of them (:func:`pack_states`).
    """
    if result.task.kind is UnitKind.VALIDATE and result.metric_states:
        return {"metric_states": pack_states(result.metric_states)}
    return {}


def group_failure(errors: Iterable[BaseException]) -> str:
    """Why a group unit failed, from its ranks' errors (the ``unit_failed`` reason).

    A trial error on any rank is the trial's fault; otherwise a lost worker, a broken
    group (``GroupBrokenError``: the reporting worker lives on) or an I/O error send the
    group back to the queue. Anything else is a bug and is raised.
    """
    errors = list(errors)
    if any(isinstance(e, TrialError) for e in errors):
        return "trial_error"
    if any(isinstance(e, WorkerLostError) and not isinstance(e, GroupBrokenError) for e in errors):
        return "worker_lost"
    if any(isinstance(e, GroupBrokenError) for e in errors):
        return "group_broken"
    if any(isinstance(e, StoreError) for e in errors):
        return "io_error"
    raise errors[0]


def unit_end_fields(
    result: UnitResult, *, lead: UnitResult | None = None, freed_at: float | None = None
) -> dict[str, Any]:
    """The fields of a rank's ``unit_end`` after its place (the one builder of them).

    Args:
        result: What the rank returned.
        lead: The rank that wrote the checkpoint (rank 0 of a group; default: ``result``).
        freed_at: When its worker was freed while it wrote the checkpoint, if it was.
    """
    lead = result if lead is None else lead
    out = lead.task.checkpoint_out
    return {
        "seconds": round(result.seconds, 6),
        "io_seconds": round(result.io_seconds, 6),
        "rows": result.rows,
        "metric_sums": dict(result.metric_sums),
        "checkpoint": None if out is None else logged_key(out),
        "checkpoint_bytes": lead.checkpoint_bytes,
        "checkpoint_sha256": lead.checkpoint_sha256,
        **_traffic(result),
        **_states(result),
        **_trained_at(freed_at),
    }


def unit_task(
    assignment: Assignment, trial: TrialState, prefix: str, epoch_units: int, member: int = 0
) -> UnitTask:
    """The task of an assignment (rank 0's, for a group; a member's, for a pack) of ``trial``.

    Args:
        assignment: What the scheduler assigned.
        trial: Its trial (the member's, for a pack), as the log has it now.
        prefix: The experiment's folder in the store (checkpoints go under it).
        epoch_units: Training units in an epoch (the dataset's partitions).
        member: The member of a packed assignment (its position in the pack).
    """
    unit = assignment.pack[member]
    step = assignment.steps[member]
    params = {k: v for k, v in trial.params.items() if k != "model"}
    checkpoint_out = None
    if unit.kind is UnitKind.TRAIN:
        checkpoint_out = f"{prefix}/checkpoints/{trial.trial_id}/e{trial.epochs:04d}-s{step:04d}.pt"
    return UnitTask(
        kind=unit.kind,
        trial_id=trial.trial_id,
        spec=trial.spec,
        params=params,
        trial_seed=trial.seed,
        epoch=trial.epochs,
        partition=unit.partition,
        step=step,
        epoch_units=epoch_units,
        checkpoint_in=trial.checkpoint,
        checkpoint_out=checkpoint_out,
        checkpoint_in_sha256=trial.checkpoint_sha256 if trial.checkpoint else None,
    )


def unit_where(
    assignment: Assignment,
    index: int,
    group: str | None,
    round_: int,
    epoch: int,
    member: int = 0,
) -> dict[str, Any]:
    """The fields that place rank ``index`` (or pack member ``member``) in the event log.

    A pack's members also carry ``pack``: its trial ids in pack order.
    """
    unit = assignment.pack[member]
    where: dict[str, Any] = {
        "round": round_,
        "trial": unit.trial,
        "epoch": epoch,
        "kind": unit.kind.value,
        "partition": assignment.partitions[index],
        "step": assignment.steps[member] + index,
        "worker": assignment.workers[index],
    }
    if assignment.packed:
        where["pack"] = list(assignment.trials)
    if group is not None:
        where["group"] = group
        where["group_partitions"] = list(assignment.partitions)
    return where
