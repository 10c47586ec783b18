"""LocalBackend: every worker is a separate OS process on this machine.

Each worker process runs :func:`_serve`, a loop around a :class:`~._worker.Worker`, and
talks to the driver over its own duplex :func:`multiprocessing.Pipe`.

Message protocol (pickled by :mod:`multiprocessing`; the pipes are private to this
machine and this driver, so no authentication is needed -- ``SparkBackend`` sends
authenticated messages instead):

* driver → worker: :class:`_Command` with ``op`` one of

  - ``"load"`` + ``partitions``: load the train and validation split of each index;
  - ``"run"`` + ``task``: run one :class:`~cerebro_spark.units.UnitTask`;
  - ``"stop"``: leave the loop and exit (no reply).

* worker → driver: exactly one :class:`_Reply` per ``load``/``run``, in command order,
  carrying the value (``None`` for ``load``, the :class:`UnitResult` for ``run``) or a
  :class:`_RemoteError`, and always the worker's :class:`_State` (partitions held, bytes
  read).

A worker also exits when the driver's end of its pipe closes, so a driver that dies
without :meth:`LocalBackend.close` leaves no orphans; worker processes are daemonic and
are killed at interpreter exit as well.

Placement: partition ``i`` starts on worker ``w{i mod n}``; more workers than partitions
is refused (:class:`~cerebro_spark.errors.ConfigError`) because such a worker could never
run a unit. One monitor thread on the driver reads every reply and watches every process
sentinel; when a process dies, its queued and running units fail with
:class:`~cerebro_spark.errors.WorkerLostError`, it leaves :meth:`LocalBackend.workers`,
and each partition no live worker holds any more is re-homed on the live worker holding
the fewest partitions (which reads it from Parquet). A re-homed partition is listed on
its new worker as soon as it is assigned; units submitted for it run after the load.
:meth:`LocalBackend.add_worker` starts a worker that loads *replicas* of a fair share of
the partitions (Cerebro §5.5-5.6: the scheduler uses the availability map), so it can
take units at once and no live worker has to give anything up.

Group units (:meth:`LocalBackend.submit_group`): the ``k`` rank tasks are checked, then
sent to their ``k`` idle workers under one lock acquisition, so they start together;
a task whose ``group.port`` is 0 gets ``127.0.0.1`` and a port that was free when chosen
(bound to port 0 and released; another process could take it in between, in which case
the group fails with :class:`~cerebro_spark.units.GroupBrokenError` and can be resubmitted).
A :class:`~cerebro_spark.units.GroupBrokenError` raised in a worker reaches the driver as
itself (not as a ``TrialError``): the worker lives on.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import multiprocessing
import os
import pickle
import signal
import socket
import sys
import threading
import traceback
import weakref
from collections import deque
from collections.abc import Collection, Mapping
from concurrent.futures import Future
from multiprocessing.connection import Connection, wait
from multiprocessing.context import ForkServerContext, SpawnContext
from multiprocessing.process import BaseProcess
from typing import Any, Literal

from cerebro_spark.backends._base import Backend, WorkerInfo, WorkerJob
from cerebro_spark.backends._placement import rehome, replica_share
from cerebro_spark.backends._worker import Worker
from cerebro_spark.errors import ConfigError, StoreError, TrialError, WorkerLostError
from cerebro_spark.units import GroupBrokenError, UnitResult, UnitTask, check_group

logger = logging.getLogger(__name__)

_STOP_GRACE_S = 10.0
_JOIN_S = 5.0


@dataclasses.dataclass(frozen=True)
class _Command:
    """A driver → worker message."""

    op: Literal["load", "run", "stop"]
    partitions: tuple[int, ...] = ()
    task: UnitTask | None = None


@dataclasses.dataclass(frozen=True)
class _State:
    """What a worker holds after a command."""

    partitions: frozenset[int]
    bytes_read: int


@dataclasses.dataclass(frozen=True)
class _RemoteError:
    """An exception raised in a worker, as text (and pickled, when it pickles)."""

    type_name: str
    message: str
    traceback: str
    trial_error: bool
    transient: bool
    pickled: bytes | None
    group_broken: bool = False

    @classmethod
    def capture(cls, exc: BaseException) -> _RemoteError:
        """Describe ``exc`` (call inside the ``except`` block)."""
        try:
            pickled: bytes | None = pickle.dumps(exc)
        except Exception:  # any exception may refuse to pickle
            pickled = None
        return cls(
            type_name=type(exc).__name__,
            message=str(exc),
            traceback=traceback.format_exc(),
            trial_error=isinstance(exc, TrialError),
            transient=isinstance(exc, OSError),
            pickled=pickled,
            group_broken=isinstance(exc, GroupBrokenError),
        )


@dataclasses.dataclass(frozen=True)
class _Reply:
    """A worker → driver message: the outcome of one command."""

    state: _State
    value: UnitResult | None = None
    error: _RemoteError | None = None


class _RemoteTraceback(Exception):
    """Carries a worker's traceback text as the ``__cause__`` of a re-raised error."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


def _process_main(worker_id: str, job: WorkerJob, device: str, conn: Connection) -> None:
    """Entry point of a worker process: serve, then exit without interpreter teardown.

    Tearing down an interpreter that imported torch takes seconds; a worker owns nothing
    that needs it, so it flushes its output and leaves with ``os._exit``.
    """
    code = 0
    try:
        _serve(worker_id, job, device, conn)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    os._exit(code)


def _serve(worker_id: str, job: WorkerJob, device: str, conn: Connection) -> None:
    """Worker-process main loop: execute commands until ``stop`` or the driver is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    worker = Worker(worker_id, job, device)
    while True:
        try:
            command: _Command = conn.recv()
        except (EOFError, OSError):
            return  # the driver closed its end or died
        if command.op == "stop":
            return
        reply = _execute(worker, command)
        try:
            conn.send(reply)
        except (BrokenPipeError, EOFError, ConnectionResetError):
            return
        except Exception as exc:  # the value did not pickle: report that instead
            conn.send(
                _Reply(state=reply.state, error=_RemoteError.capture(exc)),
            )


def _execute(worker: Worker, command: _Command) -> _Reply:
    """Run one command on ``worker`` and describe its outcome."""
    value: UnitResult | None = None
    error: _RemoteError | None = None
    try:
        if command.op == "load":
            worker.load(command.partitions)
        elif command.op == "run" and command.task is not None:
            value = worker.run(command.task)
        else:
            raise ValueError(f"malformed command {command!r}")
    except Exception as exc:
        error = _RemoteError.capture(exc)
    return _Reply(state=_State(worker.partitions, worker.bytes_read), value=value, error=error)


@dataclasses.dataclass
class _Pending:
    """A command sent to a worker whose reply has not arrived yet."""

    command: _Command
    future: Future[Any]


class _Handle:
    """The driver's view of one worker process."""

    def __init__(self, worker_id: str, order: int, process: BaseProcess, conn: Connection) -> None:
        self.worker_id = worker_id
        self.order = order
        self.process = process
        self.conn = conn
        self.partitions: set[int] = set()
        self.bytes_read = 0
        self.pending: deque[_Pending] = deque()
        self.listed = False
        self.gone = threading.Event()

    @property
    def running(self) -> UnitTask | None:
        """The unit sent to this worker and not finished, if any."""
        for pending in self.pending:
            if pending.command.op == "run":
                return pending.command.task
        return None

    def describe_exit(self) -> str:
        """Return ``"pid P, exit code C (SIGNAL)"`` for log and error messages."""
        code = self.process.exitcode
        text = f"pid {self.process.pid}, exit code {code}"
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                text += f" ({signal.Signals(-code).name})"
        return text


def _kill_processes(processes: Mapping[str, BaseProcess]) -> None:
    """Kill and reap every process still alive (finalizer: runs at exit at the latest)."""
    for process in list(processes.values()):
        if process.is_alive():
            process.kill()
        process.join(_JOIN_S)


def _describe(task: UnitTask) -> str:
    return (
        f"{task.kind.value} unit of trial {task.trial_id} "
        f"(epoch {task.epoch}, partition {task.partition})"
    )


class LocalBackend(Backend):
    """Workers as separate OS processes on this machine (see the module docstring).

    Args:
        num_workers: Worker processes started by :meth:`start`; at most the dataset's
            number of partitions.
        start_method: :mod:`multiprocessing` start method, ``"spawn"`` or
            ``"forkserver"`` (``"fork"`` is refused: torch and a threaded driver do not
            survive a fork).
        device: Torch device every worker trains on.
        start_timeout_s: Seconds :meth:`start` and :meth:`add_worker` wait for workers to
            load their partitions.

    Raises:
        ConfigError: An argument breaks the rules above.
    """

    def __init__(
        self,
        num_workers: int,
        *,
        start_method: str = "spawn",
        device: str = "cpu",
        start_timeout_s: float = 300.0,
    ) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ConfigError(f"num_workers must be an integer >= 1, got {num_workers!r}")
        if start_method not in ("spawn", "forkserver"):
            raise ConfigError(
                f"start_method must be 'spawn' or 'forkserver', got {start_method!r} "
                "(fork copies torch's threads and the driver's locks)"
            )
        if start_method not in multiprocessing.get_all_start_methods():
            raise ConfigError(f"start_method {start_method!r} is not available on this system")
        if not start_timeout_s > 0:
            raise ConfigError(f"start_timeout_s must be > 0, got {start_timeout_s!r}")
        self._num_workers = num_workers
        self._ctx: SpawnContext | ForkServerContext = (
            multiprocessing.get_context("spawn")
            if start_method == "spawn"
            else multiprocessing.get_context("forkserver")
        )
        self._device = device
        self._start_timeout_s = start_timeout_s
        self._lock = threading.RLock()
        self._handles: dict[str, _Handle] = {}
        self._processes: dict[str, BaseProcess] = {}
        self._next_order = 0
        self._job: WorkerJob | None = None
        self._num_partitions = 0
        self._closed = False
        self._monitor: threading.Thread | None = None
        self._wake_r, self._wake_w = multiprocessing.Pipe(duplex=False)
        self._finalizer = weakref.finalize(self, _kill_processes, self._processes)

    # -- Backend -------------------------------------------------------------------------

    def start(self, job: WorkerJob) -> None:
        """Start ``num_workers`` processes; return when each has loaded its partitions.

        Raises:
            ConfigError: ``job.torch_threads < 1`` or more workers than partitions.
            WorkerLostError: A worker process died before it was ready (the message has
                its exit code; its traceback, if any, went to stderr).
            TimeoutError: Workers were not ready within ``start_timeout_s``.
            Exception: A worker failed to load its partitions; the worker's exception is
                re-raised with its traceback as the cause.
        """
        from cerebro_spark.data import read_manifest

        if job.torch_threads < 1:
            raise ConfigError(f"WorkerJob.torch_threads must be >= 1, got {job.torch_threads}")
        with self._lock:
            if self._closed:
                raise RuntimeError("LocalBackend is closed; create a new one")
            if self._job is not None:
                raise RuntimeError("LocalBackend.start was already called")
            manifest = read_manifest(job.dataset_uri)
            if self._num_workers > manifest.num_partitions:
                raise ConfigError(
                    f"num_workers={self._num_workers} exceeds num_partitions="
                    f"{manifest.num_partitions} of dataset {job.dataset_uri}: a worker "
                    "without a partition could never run a unit"
                )
            self._job = job
            self._num_partitions = manifest.num_partitions
            self._monitor = threading.Thread(
                target=self._monitor_loop, name="cerebro-local-backend-monitor", daemon=True
            )
            self._monitor.start()
        loads: list[tuple[_Handle, Future[Any]]] = []
        try:
            with self._lock:
                for worker_index in range(self._num_workers):
                    handle = self._spawn_locked()
                    share = range(worker_index, manifest.num_partitions, self._num_workers)
                    loads.append((handle, self._load_locked(handle, share)))
            self._await_loads(loads)
        except BaseException:
            self.close()
            raise
        with self._lock:
            for handle, _ in loads:
                handle.listed = True
        logger.info("LocalBackend started %d workers on %s", self._num_workers, job.dataset_uri)

    def workers(self) -> dict[str, WorkerInfo]:
        """Return the live, ready workers by id, in the order they were started."""
        with self._lock:
            handles = sorted((h for h in self._handles.values() if h.listed), key=lambda h: h.order)
            return {
                h.worker_id: WorkerInfo(
                    worker_id=h.worker_id,
                    partitions=frozenset(h.partitions),
                    host="localhost",
                    device=self._device,
                    bytes_read=h.bytes_read,
                )
                for h in handles
            }

    def submit(self, worker_id: str, task: UnitTask) -> Future[UnitResult]:
        """Send ``task`` to ``worker_id``.

        Raises:
            ValueError: The worker is unknown (or dead), busy with another unit, or does
                not hold ``task.partition``; the message names worker and partition.
        """
        with self._lock:
            handle = self._handles.get(worker_id)
            if handle is None or not handle.listed:
                raise ValueError(
                    f"cannot run partition {task.partition} on worker {worker_id!r}: no "
                    f"such live worker (live: {sorted(self.workers())})"
                )
            running = handle.running
            if running is not None:
                raise ValueError(
                    f"cannot run partition {task.partition} on worker {worker_id}: it is "
                    f"busy with the {_describe(running)}"
                )
            if task.partition not in handle.partitions:
                raise ValueError(
                    f"cannot run partition {task.partition} on worker {worker_id}: it "
                    f"holds partitions {sorted(handle.partitions)}"
                )
            if task.group is not None:
                raise ValueError(
                    f"cannot run partition {task.partition} on worker {worker_id} alone: "
                    f"the task is rank {task.group.rank} of group {task.group.group_id!r}; "
                    "use submit_group"
                )
            future: Future[UnitResult] = self._send_locked(handle, _Command("run", task=task))
            return future

    def submit_group(self, assignments: Mapping[str, UnitTask]) -> dict[str, Future[UnitResult]]:
        """Start the ``k`` ranks of one group unit together, one per worker.

        Tasks with ``group.port == 0`` get the rendezvous ``127.0.0.1:<free port>``.

        Args:
            assignments: Worker id to the rank task it runs (see
                :func:`cerebro_spark.units.group_tasks`); ``k`` distinct workers.

        Returns:
            Worker id to the future of its rank's :class:`UnitResult`.

        Raises:
            ConfigError: The tasks are not the ranks of one group unit (``check_group``).
            ValueError: A worker is unknown (or dead), busy, or lacks its rank's partition;
                nothing was sent.
        """
        check_group(list(assignments.values()))
        first = next(iter(assignments.values())).group
        assert first is not None  # ok: check_group
        if first.port == 0:
            port = _free_port()
            tasks = {
                worker_id: dataclasses.replace(
                    task,
                    group=dataclasses.replace(task.group, address="127.0.0.1", port=port),
                )
                for worker_id, task in assignments.items()
                if task.group is not None
            }
        else:
            tasks = dict(assignments)
        with self._lock:
            handles: list[tuple[_Handle, UnitTask]] = []
            for worker_id, task in tasks.items():
                handle = self._handles.get(worker_id)
                what = f"rank {task.group.rank if task.group else '?'} (partition {task.partition})"
                if handle is None or not handle.listed:
                    raise ValueError(
                        f"cannot run {what} of group {first.group_id!r} on worker {worker_id!r}: "
                        f"no such live worker (live: {sorted(self.workers())})"
                    )
                running = handle.running
                if running is not None:
                    raise ValueError(
                        f"cannot run {what} of group {first.group_id!r} on worker {worker_id}: "
                        f"it is busy with the {_describe(running)}"
                    )
                if task.partition not in handle.partitions:
                    raise ValueError(
                        f"cannot run {what} of group {first.group_id!r} on worker {worker_id}: "
                        f"it holds partitions {sorted(handle.partitions)}"
                    )
                handles.append((handle, task))
            futures: dict[str, Future[UnitResult]] = {}
            for handle, task in handles:
                futures[handle.worker_id] = self._send_locked(handle, _Command("run", task=task))
        logger.debug(
            "group %s of trial %s started on workers %s",
            first.group_id,
            next(iter(tasks.values())).trial_id,
            list(futures),
        )
        return futures

    def close(self) -> None:
        """Stop every worker process and the monitor thread (idempotent).

        Units still queued or running fail with :class:`WorkerLostError`.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            handles = list(self._handles.values())
            self._handles.clear()
            abandoned = [p for h in handles for p in h.pending]
            busy = [bool(h.pending) for h in handles]
            for handle in handles:
                handle.pending.clear()
        self._wake()
        monitor = self._monitor
        if monitor is not None and monitor is not threading.current_thread():
            monitor.join()
        for handle, working in zip(handles, busy, strict=True):
            if working:
                handle.process.terminate()  # its work is abandoned: don't wait for it
            else:
                with contextlib.suppress(OSError, ValueError):  # already dead
                    handle.conn.send(_Command("stop"))
        for handle in handles:
            handle.process.join(_STOP_GRACE_S)
            if handle.process.is_alive():
                logger.warning("worker %s did not stop; killing it", handle.worker_id)
                handle.process.kill()
                handle.process.join(_JOIN_S)
            handle.conn.close()
            handle.gone.set()
        self._finalizer()
        self._wake_r.close()
        self._wake_w.close()
        for pending in abandoned:
            _fail(pending.future, WorkerLostError("LocalBackend was closed before the unit ended"))
        if handles:
            logger.info("LocalBackend stopped %d workers", len(handles))

    # -- LocalBackend only ---------------------------------------------------------------

    def add_worker(self, partitions: Collection[int] | None = None) -> str:
        """Start one more worker and return its id once it has loaded its partitions.

        The new worker holds **replicas**: no live worker gives anything up. By default it
        loads ``ceil(P / m)`` partitions (``m`` = live workers including it), chosen
        among those with the fewest holders, preferring partitions whose holders hold the
        most; with no live worker left it loads all ``P``.

        Args:
            partitions: Load exactly these partition indices instead.

        Raises:
            ValueError: An index is outside ``range(num_partitions)``.
            RuntimeError: The backend is not started or is closed.
            WorkerLostError: The new worker died while loading.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("LocalBackend is closed; create a new one")
            if self._job is None:
                raise RuntimeError("add_worker needs a started LocalBackend: call start first")
            if partitions is None:
                chosen = self._replica_share_locked()
            else:
                chosen = sorted(set(partitions))
                bad = [p for p in chosen if not 0 <= p < self._num_partitions]
                if bad:
                    raise ValueError(
                        f"partitions {bad} are outside range(num_partitions={self._num_partitions})"
                    )
            handle = self._spawn_locked()
            load = self._load_locked(handle, chosen)
        try:
            self._await_loads([(handle, load)])
        except BaseException:
            handle.process.kill()
            handle.gone.wait(_JOIN_S)
            raise
        with self._lock:
            handle.listed = True
        logger.info("worker %s joined with partitions %s", handle.worker_id, chosen)
        return handle.worker_id

    def kill_worker(self, worker_id: str, timeout_s: float = 30.0) -> None:
        """SIGKILL a worker's process and wait until the driver has handled the loss.

        For tests and failure demos. When this returns, :meth:`workers` no longer lists
        the worker, its units have failed with :class:`WorkerLostError` and its partitions
        are re-homed. Do not call it from a future's callback (the monitor thread).

        Raises:
            ValueError: No such live worker.
            TimeoutError: The loss was not handled within ``timeout_s``.
        """
        with self._lock:
            handle = self._handles.get(worker_id)
            if handle is None:
                raise ValueError(f"no live worker {worker_id!r} to kill")
        handle.process.kill()
        if not handle.gone.wait(timeout_s):
            raise TimeoutError(f"worker {worker_id} was killed but not reaped in {timeout_s} s")

    def pids(self) -> dict[str, int]:
        """Return the process id of every live worker (ready or still loading)."""
        with self._lock:
            return {
                h.worker_id: h.process.pid
                for h in self._handles.values()
                if h.process.pid is not None
            }

    # -- internals -----------------------------------------------------------------------

    def _spawn_locked(self) -> _Handle:
        """Start one worker process (caller holds the lock)."""
        if self._job is None:
            raise RuntimeError("LocalBackend is not started")
        order = self._next_order
        self._next_order += 1
        worker_id = f"w{order}"
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=_process_main,
            args=(worker_id, self._job, self._device, child_conn),
            name=f"cerebro-worker-{worker_id}",
            daemon=True,
        )
        process.start()
        child_conn.close()  # the child's copy is its only one: its exit means EOF for us
        handle = _Handle(worker_id, order, process, parent_conn)
        self._handles[worker_id] = handle
        self._processes[worker_id] = process
        logger.debug("spawned worker %s (pid %s)", worker_id, process.pid)
        self._wake()
        return handle

    def _load_locked(self, handle: _Handle, partitions: Collection[int]) -> Future[Any]:
        handle.partitions.update(partitions)
        return self._send_locked(handle, _Command("load", partitions=tuple(sorted(partitions))))

    def _send_locked(self, handle: _Handle, command: _Command) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_running_or_notify_cancel()  # not cancellable: the worker runs it anyway
        handle.pending.append(_Pending(command, future))
        try:
            handle.conn.send(command)
        except (OSError, ValueError):
            # The process is gone; the monitor sees its sentinel and fails the future.
            logger.debug("send to worker %s failed", handle.worker_id, exc_info=True)
        return future

    def _await_loads(self, loads: list[tuple[_Handle, Future[Any]]]) -> None:
        futures = [future for _, future in loads]
        done, not_done = concurrent.futures.wait(
            futures,
            timeout=self._start_timeout_s,
            return_when=concurrent.futures.FIRST_EXCEPTION,
        )
        for handle, future in loads:
            if future in done and future.exception() is not None:
                logger.error("worker %s failed to start", handle.worker_id)
                future.result()  # re-raises the worker's error
        if not_done:
            late = [h.worker_id for h, f in loads if f in not_done]
            raise TimeoutError(
                f"workers {late} did not load their partitions within "
                f"start_timeout_s={self._start_timeout_s}"
            )

    def _replica_share_locked(self) -> list[int]:
        """Choose the partitions a joining worker replicates (see :meth:`add_worker`)."""
        return replica_share(self._num_partitions, self._holdings_locked())

    def _holdings_locked(self, leaving: _Handle | None = None) -> list[tuple[str, set[int]]]:
        live = sorted(
            (h for h in self._handles.values() if h.listed and h is not leaving),
            key=lambda h: h.order,
        )
        return [(h.worker_id, h.partitions) for h in live]

    def _rehome_locked(self, dead: _Handle) -> None:
        """Assign the dead worker's partitions that nobody else holds to live workers."""
        holdings = self._holdings_locked(leaving=dead)
        if not holdings and dead.partitions:
            logger.error(
                "no live worker left to re-home partitions %s of worker %s",
                sorted(dead.partitions),
                dead.worker_id,
            )
            return
        assigned = rehome(dead.partitions, holdings)
        for worker_id, moved in assigned.items():
            target = self._handles[worker_id]
            target.partitions.update(moved)
            logger.warning(
                "re-homing partitions %s of lost worker %s on worker %s",
                moved,
                dead.worker_id,
                worker_id,
            )
            future = self._send_locked(target, _Command("load", partitions=tuple(moved)))
            future.add_done_callback(_log_failed_rehome(worker_id, moved))

    def _wake(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # closed
            self._wake_w.send(None)

    def _monitor_loop(self) -> None:
        """Read replies and watch process sentinels until the backend closes."""
        while True:
            with self._lock:
                if self._closed:
                    return
                by_conn = {h.conn: h for h in self._handles.values()}
                by_sentinel = {h.process.sentinel: h for h in self._handles.values()}
            try:
                ready = wait([self._wake_r, *by_conn, *by_sentinel])
            except OSError:
                if self._closed:
                    return
                raise
            for obj in ready:
                try:
                    if obj is self._wake_r:
                        while self._wake_r.poll():
                            self._wake_r.recv()
                    elif isinstance(obj, Connection):
                        self._receive(by_conn[obj])
                    elif isinstance(obj, int):
                        self._on_exit(by_sentinel[obj])
                except Exception:
                    if self._closed:
                        return
                    logger.exception("LocalBackend monitor failed on %r", obj)

    def _receive(self, handle: _Handle) -> None:
        try:
            reply = handle.conn.recv()
        except (EOFError, OSError):
            self._on_exit(handle)
            return
        except Exception:  # a reply that does not unpickle: the worker is unusable
            logger.exception("unreadable reply from worker %s; killing it", handle.worker_id)
            handle.process.kill()
            return
        self._on_reply(handle, reply)

    def _on_reply(self, handle: _Handle, reply: _Reply) -> None:
        with self._lock:
            if not handle.pending:
                if not self._closed:
                    logger.warning("unexpected reply from worker %s", handle.worker_id)
                return
            pending = handle.pending.popleft()
            handle.bytes_read = reply.state.bytes_read
            if pending.command.op == "load" and reply.error is not None:
                handle.partitions -= set(pending.command.partitions) - reply.state.partitions
        if reply.error is None:
            pending.future.set_result(reply.value)
        else:
            _fail(pending.future, self._error_for(handle, pending.command, reply.error))

    def _error_for(self, handle: _Handle, command: _Command, error: _RemoteError) -> Exception:
        cause = _RemoteTraceback(f"\nworker {handle.worker_id} traceback:\n{error.traceback}")
        exc: Exception
        if command.op == "run" and command.task is not None:
            if error.group_broken:
                exc = GroupBrokenError(f"on worker {handle.worker_id}: {error.message}")
            elif error.trial_error:
                exc = TrialError(error.message)
            elif error.transient:
                exc = StoreError(
                    f"{_describe(command.task)} hit an I/O error on worker {handle.worker_id}: "
                    f"{error.type_name}: {error.message}"
                )
            else:
                exc = TrialError(
                    f"{_describe(command.task)} failed on worker {handle.worker_id}: "
                    f"{error.type_name}: {error.message}\n{error.traceback}"
                )
        else:
            exc = RuntimeError(
                f"worker {handle.worker_id} failed to load partitions "
                f"{list(command.partitions)}: {error.type_name}: {error.message}"
            )
            if error.pickled is not None:
                try:
                    original = pickle.loads(error.pickled)  # ok: our own child's pipe
                except Exception:
                    original = None
                if isinstance(original, Exception):
                    exc = original
        exc.__cause__ = cause
        return exc

    def _on_exit(self, handle: _Handle) -> None:
        """Handle a worker process that ended (killed, crashed, or lost its pipe)."""
        # Replies written before the exit still count.
        try:
            while handle.conn.poll():
                reply = handle.conn.recv()
                self._on_reply(handle, reply)
        except (EOFError, OSError):
            pass
        handle.process.join(_JOIN_S)
        if handle.process.is_alive():  # it closed its pipe but lives on: unusable
            handle.process.kill()
            handle.process.join(_JOIN_S)
        with self._lock:
            if self._handles.get(handle.worker_id) is not handle:
                return
            del self._handles[handle.worker_id]
            self._processes.pop(handle.worker_id, None)
            lost = list(handle.pending)
            handle.pending.clear()
            if handle.listed:
                self._rehome_locked(handle)
        handle.conn.close()
        how = handle.describe_exit()
        logger.warning("worker %s is lost (%s)", handle.worker_id, how)
        handle.gone.set()
        for pending in lost:
            if pending.command.op == "run" and pending.command.task is not None:
                what = f"while it ran the {_describe(pending.command.task)}"
            elif handle.listed:
                what = f"while it loaded partitions {list(pending.command.partitions)}"
            else:
                what = (
                    f"before it had loaded partitions {list(pending.command.partitions)}; "
                    "its traceback, if any, is on stderr"
                )
            _fail(pending.future, WorkerLostError(f"worker {handle.worker_id} died ({how}) {what}"))


def _free_port() -> int:
    """Return a TCP port of 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def _fail(future: Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _log_failed_rehome(worker_id: str, partitions: list[int]) -> Any:
    def callback(future: Future[Any]) -> None:
        exc = future.exception()
        if exc is not None and not isinstance(exc, WorkerLostError):
            logger.error(
                "worker %s failed to load re-homed partitions %s: %s",
                worker_id,
                partitions,
                exc,
            )

    return callback
