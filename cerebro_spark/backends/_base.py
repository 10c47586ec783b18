"""The Backend seam: long-lived workers that hold partitions and run units.

A backend starts workers, each of which loads its train and validation partitions
**once** and keeps them in memory; the engine submits each unit to a worker holding its
partition. Models hop (through the store); data stays. Every backend here is a
:class:`~cerebro_spark.backends.WorkerPool` over a small transport. The rules the engine
relies on (``tests/backends/contract.py`` is the shared suite):

* :meth:`Backend.start` returns as soon as one initial worker has loaded its partitions
  (it raises only when none could); with ``placement`` it starts one worker per entry (a
  resumed run starts from its logged membership). Worker ids count up from
  ``w<first_worker>``. The other initial workers go on starting: each arrives through
  :meth:`Backend.changes` (``JOINED`` then ``READY``, or ``LOST`` with its reason) like
  any later worker, and :meth:`Backend.starting` counts those not ready yet;
  :meth:`Backend.wait_started` waits for them.
* :meth:`Backend.workers` lists the live workers that take units; every partition is
  held by at least one of them, or by a worker still starting, while any worker lives
  (the partitions of a worker lost before it was ready are re-homed on the ready ones).
* :meth:`Backend.submit` to a worker that is busy, unknown, retiring or lacks the
  partition raises :class:`ValueError` naming the worker and the partition.
* A unit's future resolves to its :class:`~cerebro_spark.units.UnitResult`, or fails with
  :class:`~cerebro_spark.errors.TrialError` (user code raised; the worker lives on) or
  :class:`~cerebro_spark.errors.WorkerLostError` (its worker died: the worker is no longer
  listed and its partitions are re-homed on live workers, read from Parquet).
* The future may be a :class:`UnitFuture`, whose ``freed`` resolves when its worker may
  take its next unit: before the result when a train unit's pass is done and only its
  checkpoint is left to write. From then on the worker is not busy (``submit`` takes a
  unit for it) while the unit is still not done: its result, reported once the checkpoint
  is durable, may still be a failure (``OSError`` of the store, ``WorkerLostError``).
* :meth:`Backend.retire` takes a worker out of service gracefully: it takes no new unit,
  finishes the one in flight, its sole-copy partitions are re-homed (and loaded) on the
  workers that remain, then it ends normally. A retire is not a loss: no unit fails.
* :meth:`Backend.add_worker` starts one more worker and returns its id once it has loaded
  its partitions (replicas of those held by the fewest, unless it is told which); it is
  reported by :meth:`Backend.changes` like any other (``JOINED``, ``READY``). A backend
  that cannot add workers keeps the default, which raises :class:`NotImplementedError`
  naming the backend (the elastic layer then reports the resize as failed).
* :meth:`Backend.changes` reports every membership change, oldest first, each once.
* :attr:`WorkerInfo.bytes_read` counts every byte a worker read for partitions, so that
  "each partition is read once" can be checked.
* :meth:`Backend.close` stops every worker and is idempotent.

Packed units (issue 27, semantics in :mod:`cerebro_spark.training._pack`):
:meth:`Backend.submit_pack` runs ``k`` train units of ``k`` distinct trials on one
partition together on one worker (one pass trains them all):

* The tasks must be ordinary train units (no group rank) of distinct trials on one
  partition, each with its own ``checkpoint_out``, else
  :class:`~cerebro_spark.errors.ConfigError` is raised and nothing is sent; the worker
  must be live, idle and hold the partition, else :class:`ValueError` as for
  :meth:`Backend.submit`. A pack of one may go through :meth:`Backend.submit`.
* It returns ``k`` futures, one per task, in task order. Each resolves to its trial's
  :class:`~cerebro_spark.units.UnitResult` or fails on its own with
  :class:`~cerebro_spark.errors.TrialError` (that trial alone: its loss turned NaN, its
  own code raised; the others go on); all fail with
  :class:`~cerebro_spark.errors.WorkerLostError` when the worker died, with
  :class:`~cerebro_spark.errors.TrialError` when code the pack shares raised, and with a
  store error (``OSError``: retry) when reading a checkpoint failed; a member whose own
  checkpoint write failed fails alone with that store error.
* The futures may be :class:`UnitFuture` s: every member's ``freed`` resolves once the
  pack's pass is done, before the ``k`` checkpoints are written (as for one train unit).
* A backend that cannot pack keeps the default, which runs a pack of one through
  :meth:`Backend.submit` and raises :class:`NotImplementedError` naming the backend
  for more.

Reading ahead (issue 27 part 3): :meth:`Backend.prefetch` tells a worker which
checkpoints (store key, SHA-256) its next units will likely restore, so that it reads,
verifies and decodes them while it trains. It is a hint: it returns at once, never fails,
changes no result (a unit reads a checkpoint the same way whether it was read ahead or
not) and may be ignored (the default does nothing; a busy, retiring or lost worker's
hint may be dropped).

Group units (Cerebro §5.7, semantics in :mod:`cerebro_spark.training._group`):
:meth:`Backend.submit_group` starts the ``k`` rank tasks of one group unit on ``k`` idle
workers *together* (a rank blocks until its peers join):

* The tasks must pass :func:`cerebro_spark.units.check_group` and every worker must be
  live, idle and hold its rank's partition, else :class:`ValueError` (or
  :class:`~cerebro_spark.errors.ConfigError`) is raised and **no** task is sent;
  :meth:`Backend.submit` refuses a group task.
* When ``group.port`` is 0, rank 0's worker binds a free port on its host and the backend
  passes that host and port on to the other ranks (it holds their tasks until then).
* A rank whose worker died fails with ``WorkerLostError``; the surviving ranks fail with
  :class:`~cerebro_spark.units.GroupBrokenError` (a ``WorkerLostError``) within about
  ``group.timeout_s``, and their workers live on.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import enum
import time
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from types import TracebackType
from typing import TypeVar

from cerebro_spark.store import Store
from cerebro_spark.units import UnitResult, UnitTask


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    """A live worker as the driver sees it.

    Attributes:
        worker_id: Stable id, unique within a run (``"w0"``, ``"w1"`` ...).
        partitions: Indices of the partitions it holds (train and validation alike).
        host: Where it runs.
        device: Torch device it trains on (``"cpu"``, ``"cuda:0"``).
        bytes_read: Bytes of partition data it has read from storage so far.
        executor_id: The Spark executor it runs on (``"driver"`` in local mode), for a
            cluster manager choosing whom to release; ``None`` outside Spark.
    """

    worker_id: str
    partitions: frozenset[int]
    host: str = "localhost"
    device: str = "cpu"
    bytes_read: int = 0
    executor_id: str | None = None


class Membership(str, enum.Enum):
    """What happened to a worker (the engine logs each as ``worker_<value>``)."""

    JOINED = "joined"
    """It registered with the driver (host, executor and device are known)."""
    READY = "ready"
    """It loaded its partitions and takes units."""
    PARTITIONS = "partitions"
    """It was given partitions to hold (re-homed from a worker that left)."""
    RETIRING = "retiring"
    """It takes no new unit; it finishes the one in flight, then leaves."""
    RETIRED = "retired"
    """It left normally (its process or task ended after a retire)."""
    LOST = "lost"
    """It died or failed; ``reason`` says how."""


@dataclasses.dataclass(frozen=True)
class WorkerChange:
    """One membership change, as :meth:`Backend.changes` reports it.

    Attributes:
        kind: What happened.
        worker: The worker as it was right after the change (its partitions, host,
            executor, device, bytes read).
        reason: Why it was lost (``LOST`` only).
    """

    kind: Membership
    worker: WorkerInfo
    reason: str | None = None


@dataclasses.dataclass(frozen=True)
class WorkerJob:
    """What every worker needs to start: where the data and the checkpoints are.

    Attributes:
        dataset_uri: URI of the prepared dataset directory.
        store: Store holding checkpoints (pickled to workers).
        torch_threads: Intra-op threads per worker; fixed so results do not depend on
            the number of workers (bit-identical replays).
        worker_memory: Bytes of held partitions a worker keeps in RAM; the rest is
            spilled to its local disk. ``None``: derived from the executor's memory
            (:func:`cerebro_spark.data._residence.default_worker_memory`).
    """

    dataset_uri: str
    store: Store
    torch_threads: int = 1
    worker_memory: int | None = None


_B = TypeVar("_B", bound="Backend")
_STARTED_POLL_S = 0.05


class UnitFuture(Future[UnitResult]):
    """A submitted unit's result, and when its worker is free (see the module rules).

    :attr:`freed` resolves with the result at the latest, or before it (:meth:`free`) when
    the worker may take its next unit while this one's checkpoint is being written. The
    future cannot be cancelled: the worker runs the unit anyway.
    """

    def __init__(self) -> None:
        super().__init__()
        self.set_running_or_notify_cancel()
        self.freed: Future[None] = Future()
        self.add_done_callback(lambda _: self.free())

    def free(self) -> None:
        """Resolve :attr:`freed` (once; later calls do nothing)."""
        with contextlib.suppress(InvalidStateError):
            self.freed.set_result(None)


class Backend(abc.ABC):
    """Runs units on workers that keep their partitions in memory."""

    @abc.abstractmethod
    def start(
        self,
        job: WorkerJob,
        *,
        placement: Sequence[Collection[int]] | None = None,
        first_worker: int = 0,
    ) -> None:
        """Start the workers; return once one of them has loaded its partitions.

        Args:
            job: What every worker needs.
            placement: The partitions of each worker to start; ``None`` places partition
                ``i`` on worker ``i mod n``.
            first_worker: Index of the first worker's id, so that ids stay unique across
                the sessions of one experiment.
        """

    @abc.abstractmethod
    def workers(self) -> Mapping[str, WorkerInfo]:
        """Return the live workers that take units, by id."""

    def starting(self) -> int:
        """Return how many workers were started but are neither ready nor gone yet.

        While it is above 0 the engine waits for them instead of failing a round that no
        ready worker can go on with. A backend whose :meth:`start` waits for every worker
        (and that starts none later) keeps this default.
        """
        return 0

    def wait_started(self, timeout_s: float | None = None) -> None:
        """Wait until no worker is starting (each is ready or gone), e.g. after :meth:`start`.

        Raises:
            TimeoutError: Workers were still starting after ``timeout_s`` seconds.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while (count := self.starting()) > 0:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{count} workers were still starting after {timeout_s} s")
            time.sleep(_STARTED_POLL_S)

    @abc.abstractmethod
    def changes(self) -> list[WorkerChange]:
        """Return the membership changes since the last call, oldest first."""

    @abc.abstractmethod
    def retire(self, worker_id: str) -> Future[None]:
        """Take a worker out of service gracefully; the future resolves once it ended.

        Raises:
            ValueError: No such live worker, or no other worker would remain to hold its
                sole-copy partitions.
        """

    def add_worker(self, partitions: Collection[int] | None = None) -> str:
        """Start one more worker; return its id once it has loaded its partitions.

        The default is for a backend that cannot add workers: it raises.

        Args:
            partitions: Load exactly these partition indices; ``None`` lets the backend
                choose replicas of the partitions held by the fewest workers (all of them
                when no worker is left).

        Raises:
            NotImplementedError: This backend cannot add workers (the message names it).
            ValueError: A partition index is outside the dataset's.
            RuntimeError: The backend is not started, or is closed.
            WorkerLostError: The worker was lost before it was ready.
        """
        del partitions
        raise NotImplementedError(
            f"{type(self).__name__} cannot add workers (Backend.add_worker); an elastic run "
            "needs a backend that can, such as a WorkerPool"
        )

    @abc.abstractmethod
    def submit(self, worker_id: str, task: UnitTask) -> Future[UnitResult]:
        """Run ``task`` on ``worker_id``; the future resolves when the unit ends.

        It may be a :class:`UnitFuture` (its worker free before the result).
        """

    def submit_pack(self, worker_id: str, tasks: Sequence[UnitTask]) -> list[Future[UnitResult]]:
        """Run the train ``tasks`` of distinct trials together on ``worker_id`` (one pass).

        See the module's rules on packed units. The default runs a pack of one through
        :meth:`submit` and cannot run more.

        Returns:
            One future per task, in task order.

        Raises:
            ConfigError: The tasks cannot form a pack.
            ValueError: The worker cannot take the pack now.
            NotImplementedError: This backend cannot run packs of more than one trial.
        """
        if len(tasks) == 1:
            return [self.submit(worker_id, tasks[0])]
        raise NotImplementedError(
            f"{type(self).__name__} cannot run packed units (Backend.submit_pack); run with "
            "pack: off, or on a backend that can, such as a WorkerPool"
        )

    def prefetch(self, worker_id: str, checkpoints: Sequence[tuple[str, str]]) -> None:
        """Hint that ``worker_id``'s next units will likely read ``checkpoints``.

        See the module's rules on reading ahead; the default ignores the hint.

        Args:
            worker_id: The worker (busy or idle).
            checkpoints: ``(store key, SHA-256)`` of each checkpoint, the likeliest first.
        """
        del worker_id, checkpoints

    @abc.abstractmethod
    def submit_group(self, assignments: Mapping[str, UnitTask]) -> dict[str, Future[UnitResult]]:
        """Start the ranks of one group unit together: worker id to rank task, one per rank.

        Returns:
            Worker id to the future of its rank's result.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Stop all workers (idempotent)."""

    def __enter__(self: _B) -> _B:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
