"""Membership: the backend's worker changes as events, and the round's schedule that follows them.

Who holds which partitions is a fact of the log (``worker_*`` events, folded by
:class:`~cerebro_spark.driver._state.ExperimentState`); the round's MOP scheduler keeps the
same facts for its own decisions (Cerebro §5.6). Both come from one place:
:func:`membership_events` turns :meth:`Backend.changes` into events (a pure function), and
:class:`RoundMembership` applies each event to the scheduler, keeping a worker that left in
the schedule until it runs nothing there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from cerebro_spark.backends import Membership, WorkerChange
from cerebro_spark.mop import MopScheduler, Unit

logger = logging.getLogger(__name__)

MembershipEvent = tuple[str, dict[str, Any]]
"""An event to log, ``(name, fields)``."""


def membership_events(
    changes: Sequence[WorkerChange], unit_of: Callable[[str], Unit | None]
) -> list[MembershipEvent]:
    """The ``worker_*`` events of a backend's membership changes, in their order.

    Args:
        changes: What :meth:`~cerebro_spark.backends.Backend.changes` returned.
        unit_of: The unit a worker runs in the round under way, if any (a lost worker's
            ``unit`` field names it).
    """
    events: list[MembershipEvent] = []
    for change in changes:
        info = change.worker
        worker = info.worker_id
        where = {"host": info.host, "executor_id": info.executor_id, "device": info.device}
        if change.kind is Membership.JOINED:
            events.append(("worker_joined", {"worker": worker, **where}))
        elif change.kind is Membership.READY:
            fields = {
                "worker": worker,
                "partitions": sorted(info.partitions),
                "bytes_read": info.bytes_read,
                **where,
            }
            events.append(("worker_ready", fields))
        elif change.kind is Membership.PARTITIONS:
            events.append(
                ("worker_partitions", {"worker": worker, "partitions": sorted(info.partitions)})
            )
        else:
            left: dict[str, Any] = {"worker": worker, "bytes_read": info.bytes_read}
            if change.kind is Membership.LOST:
                unit = unit_of(worker)
                left["reason"] = change.reason
                named = None if unit is None else [unit.trial, unit.kind.value, unit.partition]
                left["unit"] = named
            events.append((f"worker_{change.kind.value}", left))
    return events


class RoundMembership:
    """The round's scheduler, kept to the membership events as they are logged.

    A worker that left (lost, retiring, retired) leaves the schedule at once when it runs
    nothing; otherwise when its unit -- or its group's last rank -- has been handled
    (:meth:`depart`): until then its assignment stays in Q', so a group's surviving ranks,
    still busy on the backend, get no other work.

    Args:
        scheduler: The round's scheduler; ``None`` between rounds (nothing to follow).
    """

    def __init__(self, scheduler: MopScheduler | None = None) -> None:
        self.scheduler = scheduler
        self._departing: set[str] = set()

    def unit_of(self, worker: str) -> Unit | None:
        """The unit ``worker`` runs in this round, if any."""
        if self.scheduler is None:
            return None
        running = self.scheduler.running.get(worker)
        return None if running is None else running.unit_of(worker)

    def follow(self, event: str, fields: Mapping[str, Any]) -> None:
        """Apply one logged membership event to the schedule."""
        worker = fields["worker"]
        if event == "worker_lost":
            logger.warning("worker %s was lost: %s", worker, fields["reason"])
        scheduler = self.scheduler
        if scheduler is None or event == "worker_joined":
            return
        if event == "worker_ready":
            if worker in scheduler.workers:
                scheduler.set_partitions(worker, fields["partitions"])
            else:
                scheduler.add_worker(worker, fields["partitions"])
        elif event == "worker_partitions":
            if worker in scheduler.workers:
                scheduler.set_partitions(worker, fields["partitions"])
        elif worker in scheduler.workers:  # it left
            self._departing.add(worker)
            self.depart([worker])

    def depart(self, workers: Iterable[str]) -> None:
        """Remove the workers that left from the schedule once they run nothing there.

        A worker that runs an assignment stays (busy: it gets no other work) until that
        assignment is handled or frees it. A unit whose checkpoint it was still writing
        does not hold it: that unit stays in Q' and is failed or completed by its result.
        """
        if not self._departing or self.scheduler is None:
            return
        running = self.scheduler.running
        for worker in workers:
            if worker in self._departing and worker not in running:
                self._departing.discard(worker)
                if worker in self.scheduler.workers:
                    self.scheduler.remove_worker(worker)
