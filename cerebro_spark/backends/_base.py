"""The Backend seam: long-lived workers that hold partitions and run units.

A backend starts workers, each of which loads its assigned train and validation
partitions **once** and keeps them in memory; the engine then submits units to the worker
holding the unit's partition. Models hop (through the store); data stays.

Rules every implementation keeps (``tests/backends/contract.py`` is the shared suite):

* :meth:`Backend.start` returns when every initial worker has loaded its partitions.
* :meth:`Backend.workers` lists live workers and the partition indices each holds; every
  partition is held by at least one live worker while any worker lives.
* :meth:`Backend.submit` to a worker that is busy, unknown or lacks the partition raises
  :class:`ValueError` naming the worker and the partition.
* A unit's future resolves to its :class:`~cerebro_spark.units.UnitResult`; a unit whose
  user code raised fails with :class:`~cerebro_spark.errors.TrialError` (the worker lives
  on); a unit whose worker died fails with :class:`~cerebro_spark.errors.WorkerLostError`.
  After a loss, :meth:`Backend.workers` no longer lists the dead worker and its partitions
  are re-homed on live workers (loaded from Parquet, the source of truth).
* :attr:`WorkerInfo.bytes_read` counts every byte a worker read from storage for
  partitions, so that "each partition is read once" can be checked.
* :meth:`Backend.close` stops every worker and is idempotent.

Group units (optional; Cerebro §5.7's "Horovod hybrid", semantics in
:mod:`cerebro_spark.training._group`): :meth:`Backend.submit_group` starts the ``k`` rank
tasks of one group unit on ``k`` workers *together* (a rank blocks until its peers join).
A backend that cannot keeps the default, which raises :class:`NotImplementedError` naming
the backend; one that can keeps these rules:

* The tasks pass :func:`cerebro_spark.units.check_group`; every worker is live, idle and
  holds its rank's partition; otherwise :class:`ValueError` (or
  :class:`~cerebro_spark.errors.ConfigError`) is raised and **no** task is sent.
* A task whose ``group.port`` is 0 gets a rendezvous address and port the backend chose,
  reachable by every rank (rank 0's host); other tasks are sent as given.
  :meth:`Backend.submit` refuses a group task with :class:`ValueError`.
* Each rank's future resolves to that rank's :class:`~cerebro_spark.units.UnitResult`. A
  rank whose worker died fails with ``WorkerLostError``; the surviving ranks fail with
  :class:`~cerebro_spark.units.GroupBrokenError` (a ``WorkerLostError`` subclass) within
  about ``group.timeout_s``, and their workers live on and serve the next unit.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping
from concurrent.futures import Future
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
    """

    worker_id: str
    partitions: frozenset[int]
    host: str = "localhost"
    device: str = "cpu"
    bytes_read: int = 0


@dataclasses.dataclass(frozen=True)
class WorkerJob:
    """What every worker needs to start: where the data and the checkpoints are.

    Attributes:
        dataset_uri: URI of the prepared dataset directory.
        store: Store holding checkpoints (pickled to workers).
        torch_threads: Intra-op threads per worker; fixed so results do not depend on
            the number of workers (bit-identical replays).
    """

    dataset_uri: str
    store: Store
    torch_threads: int = 1


_B = TypeVar("_B", bound="Backend")


class Backend(abc.ABC):
    """Runs units on workers that keep their partitions in memory."""

    @abc.abstractmethod
    def start(self, job: WorkerJob) -> None:
        """Start the workers and wait until each has loaded its partitions."""

    @abc.abstractmethod
    def workers(self) -> Mapping[str, WorkerInfo]:
        """Return the live workers by id."""

    @abc.abstractmethod
    def submit(self, worker_id: str, task: UnitTask) -> Future[UnitResult]:
        """Run ``task`` on ``worker_id``; the future resolves when the unit ends."""

    def submit_group(self, assignments: Mapping[str, UnitTask]) -> dict[str, Future[UnitResult]]:
        """Start the ranks of one group unit together (see the module docstring).

        Args:
            assignments: Worker id to the rank task it runs, one per rank.

        Returns:
            Worker id to the future of its rank's result.

        Raises:
            NotImplementedError: This backend does not run group units (the default).
        """
        raise NotImplementedError(
            f"{type(self).__name__} does not run group units (data-parallel trials); "
            "run the trial's units one at a time with submit()"
        )

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
