"""The Transport seam: how a worker is started, where it runs and how it is stopped.

The :class:`~cerebro_spark.backends.WorkerPool` owns everything else (handles, pending
futures, heartbeats, loss detection, re-homing, joins, group rendezvous, retire). A
transport starts something -- a process, a Spark task, a thread -- that runs
:func:`cerebro_spark.backends._serve.serve` with the :class:`~._serve.WorkerSpec` it is
given; that worker then connects back to the pool's control server, so the bytes of every
transport travel in the same authenticated JSON frames.

Rules a transport keeps:

* :meth:`Transport.open` is called once, before any launch; it checks its settings and
  returns how many workers to start (``requested``, or its own default when ``None``).
* :meth:`Transport.launch` returns at once with a future that resolves -- with a short
  text saying how, or with an exception -- when the worker's process or task has ended,
  for whatever reason. The pool treats the end of a worker it did not stop as a loss.
* :meth:`Transport.kill` ends a worker abruptly (as a crash would); it is idempotent and
  never raises for a worker that already ended.
* :meth:`Transport.locate` says where a registered worker runs (its host and executor);
  by default, the address its control connection came from. ``None`` means "not known
  yet": the pool asks again for a while and meanwhile uses that address.
* :meth:`Transport.arrivals` says how many workers the pool should start for capacity
  that appeared since the last call (new executors); most transports have none.
* :meth:`Transport.close` is called once, after every worker ended or was killed.

A test fake needs :meth:`Transport.launch` only::

    class ThreadTransport(Transport):
        def launch(self, spec: WorkerSpec) -> Future[str]:
            ended: Future[str] = Future()
            threading.Thread(target=lambda: ended.set_result(serve(spec, TaskInfo()))).start()
            return ended
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Collection, Mapping
from concurrent.futures import Future
from typing import Any

from cerebro_spark.backends._serve import WorkerSpec
from cerebro_spark.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Location:
    """Where a worker runs.

    Attributes:
        host: The host other workers reach it at (a group's rendezvous address).
        executor_id: Its Spark executor (``"driver"`` in local mode); ``None`` outside Spark.
    """

    host: str
    executor_id: str | None = None


class Transport(abc.ABC):
    """Starts workers and tells when they end (rules in the module docstring)."""

    #: What a worker is called in messages ("process", "Spark task").
    noun = "worker"

    def open(self, requested: int | None, num_partitions: int, timeout_s: float) -> int:
        """Prepare to launch; return the number of workers to start.

        Args:
            requested: Workers asked for; ``None`` for the transport's default.
            num_partitions: Partitions of the dataset.
            timeout_s: Seconds the transport may wait for capacity to appear.

        Raises:
            ConfigError: ``requested`` is ``None`` and the transport has no default.
        """
        del num_partitions, timeout_s
        if requested is None:
            raise ConfigError(f"{type(self).__name__} needs the number of workers to start")
        return requested

    def control_address(self) -> tuple[str, str]:
        """Return where the control server listens and the host workers connect to."""
        return ("127.0.0.1", "127.0.0.1")

    @abc.abstractmethod
    def launch(self, spec: WorkerSpec) -> Future[str]:
        """Start a worker that runs ``serve(spec, ...)``; the future resolves when it ends."""

    def kill(self, worker_id: str) -> None:  # noqa: B027 (optional: a fake may not kill)
        """End a worker abruptly (idempotent)."""

    def locate(self, worker_id: str, registration: Mapping[str, Any], peer: str) -> Location | None:
        """Where a registered worker runs, or ``None`` if not known (yet).

        Args:
            worker_id: The worker.
            registration: Its ``register`` message (task attempt id, executor hint ...).
            peer: The address its control connection came from (the default answer).
        """
        del worker_id, registration
        return Location(peer)

    def arrivals(self, workers: int, draining: Collection[str]) -> int:
        """Workers to start for capacity that appeared since the last call.

        Args:
            workers: Workers starting or taking units.
            draining: Executors whose workers retired: their free slots are not capacity
                (they are about to be released).
        """
        del workers, draining
        return 0

    def close(self) -> None:  # noqa: B027 (optional)
        """Release what :meth:`open` acquired (called once, after the workers ended)."""
