"""The Transport seam: how a worker is started, where it runs and how it is stopped.

A transport starts something -- a process, a Spark task, a thread -- that runs
:func:`~._serve.serve` with the :class:`~._serve.WorkerSpec` it is given; the worker then
connects back to the pool's control server. The :class:`~cerebro_spark.backends.WorkerPool`
owns everything else. Only :meth:`Transport.launch` is required; a test fake is::

    class ThreadTransport(Transport):
        def launch(self, spec: WorkerSpec) -> Future[str]:
            ended: Future[str] = Future()
            threading.Thread(target=lambda: ended.set_result(serve(spec, TaskInfo()))).start()
            return ended

The pool treats the end of a worker it did not stop as a loss.
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
    """Where a worker runs: the host peers reach it at, and its Spark executor (if any)."""

    host: str
    executor_id: str | None = None


class Transport(abc.ABC):
    """Starts workers and tells when they end (see the module docstring)."""

    noun = "worker"  # what a worker is called in messages ("process", "Spark task")

    def open(self, requested: int | None, timeout_s: float) -> int:
        """Prepare to launch (once); return how many workers to start.

        Args:
            requested: Workers asked for; ``None`` for the transport's default.
            timeout_s: Seconds the transport may wait for capacity to appear.

        Raises:
            ConfigError: ``requested`` is ``None`` and the transport has no default.
        """
        del timeout_s
        if requested is None:
            raise ConfigError(f"{type(self).__name__} needs the number of workers to start")
        return requested

    def control_address(self) -> tuple[str, str]:
        """Return where the control server listens and the host workers connect to."""
        return ("127.0.0.1", "127.0.0.1")

    @abc.abstractmethod
    def launch(self, spec: WorkerSpec) -> Future[str]:
        """Start a worker that runs ``serve(spec, ...)``; return at once.

        Returns:
            A future that resolves (with a short text saying how, or with an exception)
            when the worker's process or task has ended, for whatever reason.
        """

    def kill(self, worker_id: str) -> None:  # noqa: B027 (optional: a fake may not kill)
        """End a worker abruptly, as a crash would (idempotent, never raises)."""

    def kill_executor(self, executor_id: str) -> bool:
        """Kill a whole executor as if it crashed; whether the cluster manager agreed."""
        del executor_id
        return False

    def locate(self, worker_id: str, registration: Mapping[str, Any], peer: str) -> Location | None:
        """Where a registered worker runs; ``None``: not known yet (the pool asks again).

        Args:
            worker_id: The worker.
            registration: Its ``register`` message (task attempt id, executor hint ...).
            peer: The address its control connection came from (the default answer).
        """
        del worker_id, registration
        return Location(peer)

    def arrivals(self, workers: int, draining: Collection[str]) -> int:
        """Workers to start for capacity that appeared since the last call (new executors).

        Args:
            workers: Workers starting or taking units.
            draining: Executors whose workers retired (about to be released: no capacity).
        """
        del workers, draining
        return 0

    def close(self) -> None:  # noqa: B027 (optional)
        """Release what :meth:`open` acquired (once, after the workers ended)."""
