"""LocalBackend: every worker is a separate OS process on this machine.

Each worker is a daemonic :mod:`multiprocessing` process (``forkserver`` where the
system has it, else ``spawn``; ``fork`` is refused: torch and a threaded driver do not
survive it) that gets its spec (and the secret) from its parent and runs
:func:`~._serve.serve` against the pool's control server on 127.0.0.1: the wire format
Spark tasks speak. Its end is reported with its exit code (and signal); it also exits when
the driver's connection closes, so a driver that dies leaves no orphans.

With ``forkserver`` the worker's code and torch (:data:`PRELOAD`) are imported once, in
the fork server :mod:`multiprocessing` starts beside the driver at the first worker, and
every worker is forked from it: a worker starts in a fraction of a second instead of the
seconds a fresh interpreter takes to import torch (a tiny search of 4 trials on 2
workers, about 25 s with ``spawn``, 12 s). The server lives as long as the driver's
process. A forked worker gets the driver's environment *as it is when the worker starts*
(it is handed over and set before the worker runs), as a spawned one does; settings read
when torch is imported (``OMP_NUM_THREADS``, say) are the server's, fixed when it started.
As with ``spawn``, a script must guard its entry point (``if __name__ == "__main__":``).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
import traceback
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from multiprocessing.context import ForkServerContext, SpawnContext
from multiprocessing.process import BaseProcess
from typing import Any

from cerebro_spark.backends._pool import WorkerPool
from cerebro_spark.backends._serve import TaskInfo, WorkerSpec, serve
from cerebro_spark.backends._transport import Transport
from cerebro_spark.errors import ConfigError

logger = logging.getLogger(__name__)

_JOIN_S = 5.0
START_METHODS = ("forkserver", "spawn")
"""The start methods a worker may use, preferred first."""
PRELOAD = ("cerebro_spark.backends._local", "cerebro_spark.training")
"""What the fork server imports once (not ``__main__``: each worker imports it, as with
``spawn``, so an unguarded script gets multiprocessing's own error)."""


def default_start_method() -> str:
    """``"forkserver"`` where this system has it, else ``"spawn"``."""
    available = multiprocessing.get_all_start_methods()
    return next(method for method in START_METHODS if method in available)


def _process_main(
    spec: WorkerSpec, info: TaskInfo, environ: Mapping[str, str] | None = None
) -> None:
    """Serve, then leave with ``os._exit``: tearing down torch takes seconds, for nothing.

    ``environ``: the driver's environment when the worker started (a forked worker's own
    is the fork server's), set before anything runs.
    """
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    code = 0
    try:
        serve(spec, info)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    os._exit(code)


def _describe_exit(process: BaseProcess) -> str:
    """``"pid P, exit code C (SIGNAL)"``."""
    code = process.exitcode
    text = f"pid {process.pid}, exit code {code}"
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            text += f" ({signal.Signals(-code).name})"
    return text


def _kill_all(processes: Mapping[str, BaseProcess]) -> None:
    """Kill and reap every process still alive (finalizer: runs at exit at the latest)."""
    for process in list(processes.values()):
        if process.is_alive():
            process.kill()
        process.join(_JOIN_S)


def spread_gpu(gpus: Sequence[int], live: Sequence[int], per_gpu: int | None = None) -> int:
    """The GPU a new worker gets: the one with the fewest live workers (the lowest first).

    Args:
        gpus: The GPUs to hand out (at least one).
        live: The GPU of each live worker.
        per_gpu: Most live workers on one GPU (``None``: no limit).

    Raises:
        RuntimeError: Every GPU has ``per_gpu`` live workers (the message names them).
    """
    gpu = min(gpus, key=lambda g: (live.count(g), g))
    if per_gpu is not None and live.count(gpu) >= per_gpu:
        raise RuntimeError(
            f"every GPU {list(gpus)} already has workers_per_device={per_gpu} live workers; "
            "a worker more does not fit"
        )
    return gpu


class LocalTransport(Transport):
    """Worker processes on this machine (see the module docstring).

    Args:
        start_method: ``"forkserver"`` or ``"spawn"``; ``None``:
            :func:`default_start_method`.
        gpus: CUDA device indices to hand out, one to each worker (see the module
            docstring); empty: the workers are given none.
        workers_per_gpu: Most live workers given one GPU (``None``: no limit, the
            workers spread evenly); a worker that would be one too many fails to start.

    Raises:
        ConfigError: ``start_method`` is not one of those, or not available here, or a
            GPU index is not a non-negative integer.
    """

    noun = "process"

    def __init__(
        self,
        start_method: str | None = None,
        gpus: Sequence[int] = (),
        workers_per_gpu: int | None = None,
    ) -> None:
        if start_method is None:
            start_method = default_start_method()
        if start_method not in START_METHODS:
            raise ConfigError(
                f"start_method must be 'spawn' or 'forkserver', got {start_method!r} "
                "(fork copies torch's threads and the driver's locks)"
            )
        if start_method not in multiprocessing.get_all_start_methods():
            raise ConfigError(f"start_method {start_method!r} is not available on this system")
        self._ctx: SpawnContext | ForkServerContext
        if start_method == "spawn":
            self._ctx = multiprocessing.get_context("spawn")
        else:
            self._ctx = multiprocessing.get_context("forkserver")
            self._ctx.set_forkserver_preload(list(PRELOAD))  # used when the server starts
        if any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in gpus):
            raise ConfigError(f"gpus must be CUDA device indices (ints >= 0), got {list(gpus)!r}")
        if workers_per_gpu is not None and (
            isinstance(workers_per_gpu, bool)
            or not isinstance(workers_per_gpu, int)
            or workers_per_gpu < 1
        ):
            raise ConfigError(f"workers_per_gpu must be an int >= 1, got {workers_per_gpu!r}")
        self._gpus = tuple(gpus)
        self._per_gpu = workers_per_gpu
        self._gpu_of: dict[str, int] = {}  # worker id -> the GPU it was given
        self._processes: dict[str, BaseProcess] = {}
        self._finalizer = weakref.finalize(self, _kill_all, self._processes)

    def launch(self, spec: WorkerSpec) -> Future[str]:
        """Start a worker process; the future resolves with its exit status."""
        forked = isinstance(self._ctx, ForkServerContext)
        process = self._ctx.Process(
            target=_process_main,
            args=(spec, self._task_info(spec.worker_id), dict(os.environ) if forked else None),
            name=f"cerebro-worker-{spec.worker_id}",
            daemon=True,
        )
        process.start()
        self._processes[spec.worker_id] = process
        ended: Future[str] = Future()

        def watch() -> None:
            process.join()
            ended.set_result(_describe_exit(process))

        threading.Thread(target=watch, name=f"cerebro-watch-{spec.worker_id}", daemon=True).start()
        logger.debug("started worker %s (pid %s)", spec.worker_id, process.pid)
        return ended

    def _task_info(self, worker_id: str) -> TaskInfo:
        """The worker's resources: the GPU with the fewest live workers, if any."""
        if not self._gpus:
            return TaskInfo()
        live = [self._gpu_of[w] for w, p in self._processes.items() if p.is_alive()]
        gpu = spread_gpu(self._gpus, live, self._per_gpu)
        self._gpu_of[worker_id] = gpu
        return TaskInfo(resources={"gpu": (str(gpu),)})

    def kill(self, worker_id: str) -> None:
        """SIGKILL the worker's process (nothing if it already ended)."""
        process = self._processes.get(worker_id)
        if process is not None and process.is_alive():
            process.kill()

    def close(self) -> None:
        """Kill and reap any process still alive."""
        self._finalizer()


class LocalBackend(WorkerPool):
    """Workers as separate OS processes on this machine (see the module docstring).

    Args:
        num_workers: Worker processes started by :meth:`start`; at most the dataset's
            number of partitions.
        start_method: :mod:`multiprocessing` start method, ``"forkserver"`` or
            ``"spawn"``; ``None``: ``"forkserver"`` where the system has it (see the
            module docstring).
        gpus: CUDA device indices to spread the workers over (:class:`LocalTransport`);
            with the default ``device`` (``None``) a worker trains on the GPU it is given.
        workers_per_gpu: Most live workers on one GPU (``workers_per_device``; ``None``:
            no limit).
        **options: :class:`WorkerPool`'s other arguments.

    Raises:
        ConfigError: An argument breaks the rules above.
    """

    def __init__(
        self,
        num_workers: int,
        *,
        start_method: str | None = None,
        gpus: Sequence[int] = (),
        workers_per_gpu: int | None = None,
        **options: Any,
    ) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ConfigError(f"num_workers must be an integer >= 1, got {num_workers!r}")
        transport = LocalTransport(start_method, gpus, workers_per_gpu)
        super().__init__(transport, num_workers, **options)
