"""SparkBackend: every worker is a long-lived Spark task on an executor.

Runtime (``shared/design.md``, "Runtime on Spark"):

* **One Spark job per worker.** Each worker is the single task of its own Spark job,
  started from a driver thread under its own job group
  (``setJobGroup(group, ..., interruptOnCancel=True)``), so it can be cancelled alone.
  Not a barrier stage: barrier stages refuse dynamic allocation and die whole when one
  executor dies. The task body is :func:`._spark_task.run_worker_task`.
* **Slots.** A worker occupies one task slot (``spark.task.cpus`` cores) for the life of
  the backend. Set ``spark.task.cpus`` to the executor's cores to give each worker a whole
  executor (one worker per executor, torch using its cores through
  ``WorkerJob.torch_threads``); in ``local[N]`` every task gets one core and there are
  ``N`` slots. ``num_workers=None`` means one worker per slot: ``sum(executor cores //
  spark.task.cpus)`` over the registered executors (``local[N]``: ``N``). Spark jobs the
  application runs besides the workers need free slots of their own.
* **Placement.** Tasks land wherever Spark puts them (PySpark cannot set preferred
  locations); the driver learns each worker's executor from Spark's status store by the
  task attempt id the worker reports when it registers (``executors()``), and its host.
  Partition ``i`` starts on worker ``w{i mod n}``, as in ``LocalBackend``.
* **Control.** A :class:`~._control.ControlServer` on the driver (bound to
  ``spark.driver.bindAddress``, advertised as ``spark.driver.host``, port 0) receives one
  connection per worker; every message is HMAC-SHA256-authenticated JSON (wire format and
  trust boundary in :mod:`._control`). The driver sends ``load``/``run``/``drop``/``stop``
  and a ``ping`` every ``heartbeat_s``; workers reply in command order and send a
  ``heartbeat`` every ``heartbeat_s``. Data never goes through the driver; checkpoints hop
  through the store.
* **Devices.** A task given the Spark resource ``gpu`` trains on ``cuda:<address>``,
  others on ``cpu`` (:func:`._spark_task.choose_device`); ``WorkerInfo.device`` says which.

Losses (Cerebro §5.6). A worker is lost when its control connection closes or fails a
check, when no message came from it for ``heartbeat_timeout_s`` (a silently dead or hung
executor), or when its Spark job ends. Then, as in ``LocalBackend``: its queued and running
units fail with :class:`~cerebro_spark.errors.WorkerLostError` (the engine puts them back in
Q), it leaves :meth:`SparkBackend.workers`, and each partition no live worker holds is
re-homed on the live worker holding the fewest (which reads it from Parquet). Its job group
is cancelled, which also drops the task attempt Spark schedules again after an executor
loss; an attempt that still gets through is **refused** when it registers (a worker id
registers once), and exits at once. Lost workers are never revived: capacity is refilled by
new workers with new ids.

Arrivals. Every ``poll_s`` the driver lists the executors. When executors it has not seen
before appear (and ``join_new_executors``), it starts as many new workers as those
executors have task slots, but no more than the cluster's free slots (slots minus workers
starting or live: executors that merely registered late while :meth:`SparkBackend.start`
filled them bring nothing). Such a worker -- like one from :meth:`SparkBackend.add_worker`
-- joins holding *replicas* of a fair share of the partitions (Cerebro §5.5-5.6), so the
replica-aware scheduler can use it at once and no live worker gives anything up. A new
worker's task can only land where a slot is free, so in a cluster whose slots are all held
by workers it lands on the new executor. A worker lost while its executor lives on (a
crashed Python process) is not replaced by itself: call :meth:`SparkBackend.add_worker`.

Retries. ``spark.task.maxFailures`` is a global setting and is left alone: a task that
fails before it registers may be retried by Spark (and then registers normally), a retry
after registration is refused as above. ``spark.speculation`` is refused
(:func:`check_spark_conf`). User code (``ModelSpec`` modules) must be importable on the
executors (installed, ``--py-files``, or ``spark.executorEnv.PYTHONPATH``). Group units
(:meth:`Backend.submit_group`) are not supported yet.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Literal

from cerebro_spark.backends._base import Backend, WorkerInfo, WorkerJob
from cerebro_spark.backends._control import (
    Channel,
    ControlServer,
    new_secret,
    result_from_json,
)
from cerebro_spark.backends._placement import rehome, replica_share
from cerebro_spark.backends._spark_task import TaskSpec, run_worker_task
from cerebro_spark.errors import ConfigError, DataError, StoreError, TrialError, WorkerLostError
from cerebro_spark.units import UnitResult, UnitTask

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

_STOP_GRACE_S = 15.0
_CANCEL_GRACE_S = 10.0
_LOCATE_S = 60.0
_LOCATE_WAIT_S = 3.0
_TICK_S = 0.25

_State = Literal["starting", "live", "lost", "closed"]

# Exceptions a failed load is re-raised as, by the remote type name (never unpickled).
_LOAD_ERRORS: dict[str, type[Exception]] = {
    "DataError": DataError,
    "ConfigError": ConfigError,
    "StoreError": StoreError,
    "FileNotFoundError": FileNotFoundError,
    "PermissionError": PermissionError,
    "ValueError": ValueError,
}


@dataclasses.dataclass(frozen=True)
class SparkBackendStats:
    """Counters of a :class:`SparkBackend`, for tests, logs and benchmarks.

    Attributes:
        started: Workers started (Spark jobs submitted).
        registered: Workers that registered with the driver.
        refused: Registrations refused (a retried task attempt of a lost worker, an
            unknown worker id, or a registration after close).
        lost: Workers lost, by how the loss was noticed: ``"connection"`` (closed or
            failed a check), ``"heartbeat"`` (silent), ``"job"`` (its Spark job ended),
            ``"load"`` (its initial load failed), ``"start"`` (not ready in time).
        register_seconds: Per worker, seconds from starting its Spark job to its
            registration (task scheduling, Python worker start, connect).
        ready_seconds: Per worker, seconds from starting its Spark job until it had loaded
            its partitions (includes the first ``import torch``).
    """

    started: int
    registered: int
    refused: int
    lost: Mapping[str, int]
    register_seconds: Mapping[str, float]
    ready_seconds: Mapping[str, float]


@dataclasses.dataclass
class _Pending:
    """A command sent to a worker whose reply has not arrived yet."""

    id: int
    op: str
    partitions: tuple[int, ...]
    task: UnitTask | None
    future: Future[Any]


class _Handle:
    """The driver's view of one worker (its Spark job, connection and state)."""

    def __init__(self, worker_id: str, order: int, group: str, initial: list[int] | None) -> None:
        self.worker_id = worker_id
        self.order = order
        self.group = group
        self.initial = initial  # None: a replica share chosen when it registers
        self.state: _State = "starting"
        self.listed = False
        self.channel: Channel | None = None
        self.partitions: set[int] = set()
        self.pending: deque[_Pending] = deque()
        self.next_id = 0
        self.bytes_read = 0
        self.host = "unknown"
        self.device = "cpu"
        self.executor_id: str | None = None
        self.task_attempt_id: int | None = None
        self.located = False  # executor id and host known from Spark
        self.pid: int | None = None
        self.spawned_at = time.monotonic()
        self.last_seen = self.spawned_at
        self.registered_at = self.spawned_at
        self.ready: Future[None] = Future()
        self.ready.set_running_or_notify_cancel()
        self.gone = threading.Event()
        self.job_done = threading.Event()
        self.thread: threading.Thread | None = None
        self.spec: TaskSpec | None = None

    @property
    def running(self) -> UnitTask | None:
        """The unit sent to this worker and not finished, if any."""
        for pending in self.pending:
            if pending.op == "run":
                return pending.task
        return None


def _describe(task: UnitTask) -> str:
    return f"{task.kind.value} unit of trial {task.trial_id} on partition {task.partition}"


def _fail(future: Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _summarise(exc: BaseException) -> str:
    """The first informative line of a (usually very long) Py4J error."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in lines:
        if "Exception" in line or "Error" in line:
            return line[:400]
    return (lines[0] if lines else type(exc).__name__)[:400]


class _RemoteTraceback(Exception):
    """Carries a worker's traceback text as the ``__cause__`` of a re-raised error."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


class SparkBackend(Backend):
    """Runs each worker as a long-lived task in its own Spark job (see the module docs).

    Args:
        num_workers: Workers :meth:`start` starts; ``None``: one per executor task slot.
            At most the number of partitions; in ``local[N]`` at most ``N``.
        spark: The Spark session; ``None`` uses the active one or creates one with
            :func:`cerebro_spark.spark_session.spark_session`.
        device: Torch device of every worker; ``None`` chooses per task (``cuda:<i>``
            for a task given a Spark ``gpu`` resource, else ``cpu``).
        start_timeout_s: Seconds :meth:`start` and :meth:`add_worker` wait for workers to
            register and load their partitions.
        heartbeat_s: Seconds between heartbeats (worker → driver) and pings (driver →
            worker).
        heartbeat_timeout_s: Seconds without a message after which a worker is lost (and
            a worker ends when its driver was silent that long).
        poll_s: Seconds between looks at the executor list (arrivals).
        join_new_executors: Start workers on executors that appear after :meth:`start`.

    Raises:
        ConfigError: An argument breaks the rules above.
    """

    def __init__(
        self,
        num_workers: int | None = None,
        *,
        spark: SparkSession | None = None,
        device: str | None = None,
        start_timeout_s: float = 300.0,
        heartbeat_s: float = 5.0,
        heartbeat_timeout_s: float = 30.0,
        poll_s: float = 2.0,
        join_new_executors: bool = True,
    ) -> None:
        if num_workers is not None and (
            isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1
        ):
            raise ConfigError(f"num_workers must be an integer >= 1 or None, got {num_workers!r}")
        for name, value in (
            ("start_timeout_s", start_timeout_s),
            ("heartbeat_s", heartbeat_s),
            ("heartbeat_timeout_s", heartbeat_timeout_s),
            ("poll_s", poll_s),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"{name} must be a number > 0, got {value!r}")
        if heartbeat_timeout_s < 2 * heartbeat_s:
            raise ConfigError(
                f"heartbeat_timeout_s must be at least 2 * heartbeat_s = {2 * heartbeat_s}, "
                f"got {heartbeat_timeout_s}"
            )
        self._num_workers = num_workers
        self._spark = spark
        self._device = device
        self._start_timeout_s = float(start_timeout_s)
        self._heartbeat_s = float(heartbeat_s)
        self._heartbeat_timeout_s = float(heartbeat_timeout_s)
        self._poll_s = float(poll_s)
        self._join_new_executors = join_new_executors
        self._secret = new_secret()
        self._backend_id = self._secret[:4].hex()
        self._lock = threading.RLock()
        self._handles: dict[str, _Handle] = {}
        self._lost: dict[str, _Handle] = {}
        self._next_order = 0
        self._job: WorkerJob | None = None
        self._num_partitions = 0
        self._closed = False
        self._stopping = threading.Event()
        self._sc: SparkContext | None = None
        self._server: ControlServer | None = None
        self._advertised: tuple[str, int] | None = None
        self._monitor: threading.Thread | None = None
        self._seen_executors: set[str] = set()
        self._started = 0
        self._registered = 0
        self._refused = 0
        self._lost_by: dict[str, int] = {}
        self._register_seconds: dict[str, float] = {}
        self._ready_seconds: dict[str, float] = {}

    # -- Backend -------------------------------------------------------------------------

    def start(self, job: WorkerJob) -> None:
        """Start the workers; return when each has registered and loaded its partitions.

        Raises:
            ConfigError: ``job.torch_threads < 1``, more workers than partitions, or (in
                ``local[N]``) more workers than task slots.
            WorkerLostError: A worker's Spark job failed or its connection broke before
                it was ready (the message has Spark's error).
            TimeoutError: Workers were not ready within ``start_timeout_s`` (the message
                says which had not even registered: their tasks found no free slot).
            Exception: A worker failed to load its partitions; its error is re-raised by
                type name (``DataError`` ...) with the worker's traceback as the cause.
        """
        from cerebro_spark.data import read_manifest

        if job.torch_threads < 1:
            raise ConfigError(f"WorkerJob.torch_threads must be >= 1, got {job.torch_threads}")
        with self._lock:
            if self._closed:
                raise RuntimeError("SparkBackend is closed; create a new one")
            if self._job is not None:
                raise RuntimeError("SparkBackend.start was already called")
        manifest = read_manifest(job.dataset_uri)
        sc = self._spark_context()
        check_spark_conf(sc.getConf().get)
        slots = self._executor_slots(sc)
        if self._num_workers is None:
            slots = self._wait_for_executors(sc, slots)
        num_workers = self._num_workers or sum(slots.values())
        if num_workers > manifest.num_partitions:
            raise ConfigError(
                f"num_workers={num_workers} exceeds num_partitions={manifest.num_partitions} "
                f"of dataset {job.dataset_uri}: a worker without a partition could never run "
                "a unit"
            )
        if _is_local(sc.master or "") and num_workers > sum(slots.values()):
            raise ConfigError(
                f"num_workers={num_workers} exceeds the {sum(slots.values())} task slots of "
                f"master {sc.master} (spark.task.cpus={_task_cpus(sc)}): each worker holds a "
                "slot for its whole life"
            )
        with self._lock:
            if self._closed or self._job is not None:
                raise RuntimeError("SparkBackend was closed or started meanwhile")
            self._job = job
            self._num_partitions = manifest.num_partitions
            self._sc = sc
            self._seen_executors = set(slots)
            conf = sc.getConf()
            advertised = conf.get("spark.driver.host") or "127.0.0.1"
            bind = conf.get("spark.driver.bindAddress") or advertised
            self._server = ControlServer(self._secret, self._on_connection, host=bind)
            self._advertised = (advertised, self._server.address[1])
            self._monitor = threading.Thread(
                target=self._monitor_loop, name="cerebro-spark-backend-monitor", daemon=True
            )
            self._monitor.start()
        handles: list[_Handle] = []
        try:
            with self._lock:
                for index in range(num_workers):
                    share = list(range(index, manifest.num_partitions, num_workers))
                    handles.append(self._spawn_locked(share))
            self._await_ready(handles)
        except BaseException:
            self.close()
            raise
        deadline = time.monotonic() + _LOCATE_S / 6
        for handle in handles:  # report where the workers run (Spark's listener may lag)
            if not handle.located:
                self._locate(handle, wait_s=max(0.0, deadline - time.monotonic()))
        logger.info(
            "SparkBackend started %d workers on %s (master %s): %s",
            num_workers,
            job.dataset_uri,
            sc.master,
            {h.worker_id: f"executor {h.executor_id} on {h.host}" for h in handles},
        )

    def workers(self) -> dict[str, WorkerInfo]:
        """Return the live, ready workers by id, in the order they were started."""
        with self._lock:
            handles = sorted((h for h in self._handles.values() if h.listed), key=lambda h: h.order)
            return {
                h.worker_id: WorkerInfo(
                    worker_id=h.worker_id,
                    partitions=frozenset(h.partitions),
                    host=h.host,
                    device=h.device,
                    bytes_read=h.bytes_read,
                )
                for h in handles
            }

    def submit(self, worker_id: str, task: UnitTask) -> Future[UnitResult]:
        """Send ``task`` to ``worker_id``.

        Raises:
            ValueError: The worker is unknown (or lost), busy with another unit, or does
                not hold ``task.partition``; the message names worker and partition.
        """
        with self._lock:
            handle = self._handles.get(worker_id)
            if handle is None or not handle.listed:
                raise ValueError(
                    f"cannot run partition {task.partition} on worker {worker_id!r}: no "
                    f"such live worker (live: {sorted(self.workers())})"
                )
            if task.group is not None:
                raise ValueError(
                    f"cannot run partition {task.partition} on worker {worker_id}: the task "
                    "is a rank of a group unit, which SparkBackend does not run"
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
            future: Future[UnitResult] = self._send_locked(
                handle, "run", {"task": task.to_json()}, task=task
            )
            return future

    def close(self) -> None:
        """Stop every worker, end their Spark jobs and the control server (idempotent).

        Idle workers get ``stop`` and end their tasks; the jobs of busy or unresponsive
        workers are cancelled. Units still queued or running fail with
        :class:`WorkerLostError`.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            handles = list(self._handles.values())
            self._handles.clear()
            abandoned = [p for h in handles for p in h.pending]
            busy = {h.worker_id for h in handles if h.pending}
            for handle in handles:
                handle.pending.clear()
                handle.state = "closed"
        self._stopping.set()
        closed = WorkerLostError("SparkBackend was closed before the unit ended")
        for pending in abandoned:
            _fail(pending.future, closed)
        for handle in handles:
            channel = handle.channel
            if handle.worker_id in busy or channel is None:
                self._cancel_job(handle)  # abandoned work, or a task not connected yet
            else:
                try:
                    channel.send({"op": "stop"})
                except OSError:
                    self._cancel_job(handle)
        deadline = time.monotonic() + _STOP_GRACE_S
        for handle in handles:
            if not handle.job_done.wait(max(0.0, deadline - time.monotonic())):
                logger.warning("worker %s did not stop; cancelling its job", handle.worker_id)
                self._cancel_job(handle)
        for handle in handles:
            if not handle.job_done.wait(_CANCEL_GRACE_S) and handle.thread is not None:
                logger.warning("the Spark job of worker %s did not end", handle.worker_id)
            if handle.channel is not None:
                handle.channel.close()
        if self._server is not None:
            self._server.close()
        monitor = self._monitor
        if monitor is not None and monitor is not threading.current_thread():
            monitor.join(timeout=_CANCEL_GRACE_S)
        for handle in handles:
            _fail(
                handle.ready,
                WorkerLostError(
                    f"SparkBackend was closed before worker {handle.worker_id} was ready"
                ),
            )
            handle.gone.set()
        if handles:
            logger.info("SparkBackend stopped %d workers", len(handles))

    # -- SparkBackend only ---------------------------------------------------------------

    def add_worker(self, partitions: Collection[int] | None = None) -> str:
        """Start one more worker and return its id once it has loaded its partitions.

        The new worker holds **replicas**: by default ``ceil(P / m)`` partitions (``m`` =
        live workers including it) chosen when it registers among those with the fewest
        holders, preferring partitions whose holders hold the most; with no live worker
        left, all ``P``. Its task needs a free task slot.

        Args:
            partitions: Load exactly these partition indices instead.

        Raises:
            ValueError: An index is outside ``range(num_partitions)``.
            RuntimeError: The backend is not started or is closed.
            WorkerLostError: The worker's job failed before it was ready.
            TimeoutError: It was not ready within ``start_timeout_s``.
        """
        with self._lock:
            if self._closed:
                raise RuntimeError("SparkBackend is closed; create a new one")
            if self._job is None:
                raise RuntimeError("add_worker needs a started SparkBackend: call start first")
            chosen: list[int] | None = None
            if partitions is not None:
                chosen = sorted(set(partitions))
                bad = [p for p in chosen if not 0 <= p < self._num_partitions]
                if bad:
                    raise ValueError(
                        f"partitions {bad} are outside range(num_partitions={self._num_partitions})"
                    )
            handle = self._spawn_locked(chosen)
        try:
            self._await_ready([handle])
        except BaseException:
            self._lose(handle, "it was not ready in time", cause="start")
            raise
        logger.info(
            "worker %s joined with partitions %s", handle.worker_id, sorted(handle.partitions)
        )
        return handle.worker_id

    def kill_worker(
        self, worker_id: str, *, executor: bool = False, timeout_s: float = 60.0
    ) -> None:
        """End a worker abruptly and wait until the driver has handled the loss.

        By default its Spark job group is cancelled (Spark interrupts the task and kills
        its Python process); with ``executor=True`` its whole executor is killed, as if it
        had crashed (``SparkContext.killAndReplaceExecutor``; cluster managers only: the
        cluster manager may start a replacement, which then gets a new worker). When this
        returns,
        :meth:`workers` no longer lists it, its units have failed with
        :class:`WorkerLostError` and its partitions are re-homed. For tests and failure
        drills.

        Raises:
            ValueError: No such live worker, or ``executor=True`` for a worker whose
                executor is unknown or is the driver (local mode).
            TimeoutError: The loss was not handled within ``timeout_s``.
        """
        with self._lock:
            handle = self._handles.get(worker_id)
            if handle is None:
                raise ValueError(f"no live worker {worker_id!r} to kill")
            sc = self._sc
        if executor:
            if handle.executor_id in (None, "driver") or sc is None:
                raise ValueError(
                    f"worker {worker_id} runs on executor {handle.executor_id!r}, which "
                    "cannot be killed alone (local mode has only the driver)"
                )
            # Like a crash: the cluster manager may replace the executor (killExecutor
            # would lower the application's executor target for good in standalone mode).
            killed = bool(sc._jsc.sc().killAndReplaceExecutor(handle.executor_id))
            logger.warning(
                "killing executor %s of worker %s: %s",
                handle.executor_id,
                worker_id,
                "requested" if killed else "refused by the cluster manager",
            )
        else:
            logger.warning("killing worker %s (cancelling its Spark job)", worker_id)
            self._cancel_job(handle)
        if not handle.gone.wait(timeout_s):
            raise TimeoutError(
                f"worker {worker_id} was killed but its loss was not seen in {timeout_s} s"
            )

    def pids(self) -> dict[str, int]:
        """Return the Python process id of every registered live worker (on its host)."""
        with self._lock:
            return {h.worker_id: h.pid for h in self._handles.values() if h.pid is not None}

    def executors(self) -> dict[str, str | None]:
        """Return the Spark executor id of every live, ready worker (``"driver"`` locally)."""
        with self._lock:
            return {h.worker_id: h.executor_id for h in self._handles.values() if h.listed}

    @property
    def control_address(self) -> tuple[str, int] | None:
        """The ``(host, port)`` workers connect to; ``None`` before :meth:`start`."""
        return self._advertised

    def stats(self) -> SparkBackendStats:
        """Return the backend's counters and worker start latencies."""
        with self._lock:
            return SparkBackendStats(
                started=self._started,
                registered=self._registered,
                refused=self._refused,
                lost=dict(self._lost_by),
                register_seconds=dict(self._register_seconds),
                ready_seconds=dict(self._ready_seconds),
            )

    # -- Spark ---------------------------------------------------------------------------

    def _spark_context(self) -> SparkContext:
        if self._spark is None:
            from cerebro_spark.spark_session import spark_session

            self._spark = spark_session()
        return self._spark.sparkContext

    def _executor_slots(self, sc: SparkContext) -> dict[str, int]:
        """Return the active executors and their task slots (``{"driver": N}`` locally)."""
        cpus = _task_cpus(sc)
        summaries = sc._jsc.sc().statusStore().executorList(True)
        slots: dict[str, int] = {}
        for i in range(summaries.size()):
            summary = summaries.apply(i)
            if summary.isActive() and summary.totalCores() > 0:
                slots[str(summary.id())] = int(summary.totalCores()) // cpus
        if len(slots) > 1:
            slots.pop("driver", None)
        return slots

    def _wait_for_executors(self, sc: SparkContext, slots: dict[str, int]) -> dict[str, int]:
        """Wait (up to ``start_timeout_s``) until some executor offers a slot."""
        deadline = time.monotonic() + self._start_timeout_s
        while sum(slots.values()) == 0:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no executor with a free task slot registered within start_timeout_s="
                    f"{self._start_timeout_s} (master {sc.master}); pass num_workers to "
                    "start workers as executors come"
                )
            time.sleep(0.5)
            slots = self._executor_slots(sc)
        return slots

    def _run_job(self, handle: _Handle, spec: TaskSpec) -> None:
        """Body of a worker's driver thread: run its Spark job until the task ends."""
        sc = self._sc
        assert sc is not None  # ok: set in start() before any spawn
        error: BaseException | None = None
        outcome: list[str] = []
        try:
            sc.setJobGroup(
                handle.group, f"cerebro-spark worker {handle.worker_id}", interruptOnCancel=True
            )
            body = functools.partial(run_worker_task, spec)
            outcome = sc.parallelize([handle.worker_id], 1).mapPartitions(body).collect()
        except BaseException as exc:
            error = exc
        finally:
            handle.job_done.set()
        if error is not None:
            what = f"its Spark job failed: {_summarise(error)}"
            logger.debug("Spark job of worker %s failed", handle.worker_id, exc_info=error)
        else:
            what = f"its Spark task ended ({', '.join(outcome) or 'no outcome'})"
            logger.debug("worker %s: %s", handle.worker_id, what)
        self._lose(handle, what, cause="job")

    def _cancel_job(self, handle: _Handle) -> None:
        sc = self._sc
        if sc is None or handle.job_done.is_set():
            return
        try:
            sc.cancelJobGroup(handle.group)
        except Exception:
            logger.warning(
                "could not cancel the Spark job of worker %s", handle.worker_id, exc_info=True
            )

    def _executor_of(self, handle: _Handle) -> tuple[str, str] | None:
        """Find ``(executor id, host)`` of a worker's task in Spark's status store."""
        sc = self._sc
        if sc is None or handle.task_attempt_id is None:
            return None
        try:
            tracker = sc.statusTracker()
            store = sc._jsc.sc().statusStore()
            for job_id in tracker.getJobIdsForGroup(handle.group):
                job = tracker.getJobInfo(job_id)
                for stage_id in job.stageIds if job is not None else ():
                    stage = tracker.getStageInfo(stage_id)
                    attempt = stage.currentAttemptId if stage is not None else 0
                    tasks = store.taskList(stage_id, attempt, 1000)
                    for i in range(tasks.size()):
                        task = tasks.apply(i)
                        if int(task.taskId()) == handle.task_attempt_id:
                            return str(task.executorId()), str(task.host())
        except Exception:
            logger.debug("executor lookup of worker %s failed", handle.worker_id, exc_info=True)
        return None

    def _locate(self, handle: _Handle, wait_s: float = 0.0) -> bool:
        """Fill in a worker's executor id and host; False while Spark does not know yet.

        In local mode the executor is the driver (Spark calls its host ``localhost``).
        Otherwise Spark's status store is asked, for up to ``wait_s`` seconds: its
        listener may lag behind the task's start.
        """
        sc = self._sc
        if sc is not None and _is_local(sc.master or ""):
            located: tuple[str, str] | None = ("driver", "localhost")
        else:
            deadline = time.monotonic() + wait_s
            while (located := self._executor_of(handle)) is None and time.monotonic() < deadline:
                time.sleep(0.1)
        if located is None:
            return False
        with self._lock:
            handle.executor_id, handle.host = located
            handle.located = True
        return True

    # -- workers -------------------------------------------------------------------------

    def _spawn_locked(self, initial: list[int] | None) -> _Handle:
        """Start one worker's Spark job (caller holds the lock)."""
        if self._job is None or self._advertised is None:
            raise RuntimeError("SparkBackend is not started")
        order = self._next_order
        self._next_order += 1
        worker_id = f"w{order}"
        handle = _Handle(worker_id, order, f"cerebro-{self._backend_id}-{worker_id}", initial)
        if initial is not None:
            handle.partitions.update(initial)
        spec = TaskSpec(
            worker_id=worker_id,
            driver_host=self._advertised[0],
            driver_port=self._advertised[1],
            secret=self._secret,
            job=self._job,
            device=self._device,
            heartbeat_s=self._heartbeat_s,
            driver_timeout_s=self._heartbeat_timeout_s,
            connect_timeout_s=self._start_timeout_s,
        )
        handle.spec = spec
        handle.thread = threading.Thread(
            target=self._run_job,
            args=(handle, spec),
            name=f"cerebro-spark-job-{worker_id}",
            daemon=True,
        )
        self._handles[worker_id] = handle
        self._started += 1
        handle.thread.start()
        logger.debug("started the Spark job of worker %s", worker_id)
        return handle

    def _task_spec(self, worker_id: str) -> TaskSpec:
        """The spec a worker's task was started with, live or lost (for tests)."""
        with self._lock:
            handle = self._handles.get(worker_id) or self._lost.get(worker_id)
            if handle is None or handle.spec is None:
                raise ValueError(f"no worker {worker_id!r}")
            return handle.spec

    def _await_ready(self, handles: list[_Handle]) -> None:
        futures = {h.ready: h for h in handles}
        done, not_done = concurrent.futures.wait(
            futures,
            timeout=self._start_timeout_s,
            return_when=concurrent.futures.FIRST_EXCEPTION,
        )
        for future in done:
            if future.exception() is not None:
                logger.error("worker %s failed to start", futures[future].worker_id)
                future.result()  # re-raises the worker's error
        if not_done:
            late = sorted((futures[f] for f in not_done), key=lambda h: h.order)
            unregistered = [h.worker_id for h in late if h.state == "starting"]
            raise TimeoutError(
                f"workers {[h.worker_id for h in late]} were not ready within start_timeout_s="
                f"{self._start_timeout_s}"
                + (
                    f"; {unregistered} never registered (their Spark tasks found no free task "
                    "slot, or could not reach the driver's control server at "
                    f"{self._advertised})"
                    if unregistered
                    else ""
                )
            )

    def _on_connection(self, channel: Channel) -> None:
        """Serve one worker connection: registration, then its replies and heartbeats."""
        channel.settimeout(30.0)
        try:
            message = channel.recv()
        except OSError:
            return  # logged by the channel when it was a protocol violation
        channel.settimeout(None)
        worker_id = message.get("worker_id")
        if message["op"] != "register" or not isinstance(worker_id, str):
            logger.warning(
                "control peer %s sent %r instead of register", channel.peer, message["op"]
            )
            channel.close()
            return
        attempt = message.get("attempt")
        with self._lock:
            handle = self._handles.get(worker_id)
            accept = handle is not None and handle.state == "starting" and not self._closed
            if handle is not None and accept:
                handle.state = "live"
                handle.channel = channel
                handle.last_seen = handle.registered_at = time.monotonic()
                handle.pid = _int_or_none(message.get("pid"))
                handle.device = str(message.get("device") or "cpu")
                handle.host = channel.peer.rsplit(":", 1)[0]
                self._registered += 1
                self._register_seconds[worker_id] = time.monotonic() - handle.spawned_at
            else:
                self._refused += 1
        if handle is None or not accept:
            reason = (
                "the backend is closed"
                if self._closed
                else f"worker {worker_id!r} is unknown or already registered once (a lost "
                "worker is never revived)"
            )
            logger.warning(
                "refusing registration of worker %r (task attempt %s) from %s: %s",
                worker_id,
                attempt,
                channel.peer,
                reason,
            )
            with contextlib.suppress(OSError):
                channel.send({"op": "refuse", "reason": reason})
            channel.close()
            return
        hint = message.get("executor_hint")
        with self._lock:
            handle.task_attempt_id = _int_or_none(message.get("task_attempt_id"))
            if isinstance(hint, str):
                handle.executor_id = hint
        if not self._locate(handle, wait_s=_LOCATE_WAIT_S):
            logger.debug("Spark does not list the task of worker %s yet", worker_id)
        with self._lock:
            if handle.state != "live":
                return  # lost meanwhile
            try:
                channel.send({"op": "welcome"})
            except OSError:
                pass  # the read loop below notices
            else:
                if handle.initial is None:
                    handle.initial = self._replica_share_locked()
                    handle.partitions.update(handle.initial)
                load = self._send_locked(handle, "load", {"partitions": handle.initial})
                load.add_done_callback(functools.partial(self._on_initial_load, handle))
        logger.info(
            "worker %s registered from %s (executor %s, pid %s, device %s, attempt %s) "
            "after %.1f s",
            worker_id,
            channel.peer,
            handle.executor_id,
            handle.pid,
            handle.device,
            attempt,
            self._register_seconds.get(worker_id, math.nan),
        )
        self._read_loop(handle, channel)

    def _on_initial_load(self, handle: _Handle, future: Future[Any]) -> None:
        error = future.exception()
        if error is not None:
            logger.error("worker %s failed to load its partitions: %s", handle.worker_id, error)
            _fail(handle.ready, error)
            self._lose(handle, f"it failed to load its partitions ({error})", cause="load")
            return
        with self._lock:
            if handle.state != "live":
                return
            handle.listed = True
            self._ready_seconds[handle.worker_id] = time.monotonic() - handle.spawned_at
        if not handle.ready.done():
            handle.ready.set_result(None)
        logger.info(
            "worker %s is ready with partitions %s after %.1f s",
            handle.worker_id,
            sorted(handle.partitions),
            self._ready_seconds[handle.worker_id],
        )

    def _read_loop(self, handle: _Handle, channel: Channel) -> None:
        while True:
            try:
                message = channel.recv()
            except OSError as exc:
                self._lose(handle, f"its control connection closed ({exc})", cause="connection")
                return
            handle.last_seen = time.monotonic()
            op = message["op"]
            if op == "heartbeat":
                continue
            if op == "reply":
                try:
                    self._on_reply(handle, message)
                except Exception as exc:
                    logger.exception("bad reply from worker %s", handle.worker_id)
                    channel.close()
                    self._lose(handle, f"it sent a malformed reply ({exc})", cause="connection")
                    return
            else:
                logger.warning("worker %s sent an unexpected %r message", handle.worker_id, op)

    def _on_reply(self, handle: _Handle, message: Mapping[str, Any]) -> None:
        state = message["state"]
        held = {int(p) for p in state["partitions"]}
        with self._lock:
            if not handle.pending:
                if handle.state == "live":
                    raise ValueError("a reply with no command pending")
                return
            if handle.pending[0].id != message.get("id"):
                raise ValueError(
                    f"reply to command {message.get('id')!r}, expected {handle.pending[0].id}"
                )
            pending = handle.pending.popleft()
            handle.bytes_read = int(state["bytes_read"])
            if pending.op == "load" and not message.get("ok"):
                handle.partitions -= set(pending.partitions) - held
            if pending.op == "drop":
                handle.partitions -= set(pending.partitions)
        outcome: UnitResult | None = None
        error: Exception | None = None
        try:
            if message.get("ok"):
                value = message.get("value")
                outcome = result_from_json(value) if pending.op == "run" and value else None
            else:
                error = self._error_for(handle, pending, message["error"])
        except Exception as exc:  # a worker of another version? It cannot be trusted now
            _fail(
                pending.future,
                WorkerLostError(f"worker {handle.worker_id} sent a malformed reply: {exc!r}"),
            )
            raise
        if error is None:
            pending.future.set_result(outcome)
        else:
            _fail(pending.future, error)

    def _error_for(self, handle: _Handle, pending: _Pending, error: Mapping[str, Any]) -> Exception:
        type_name = str(error.get("type_name", "Exception"))
        message = str(error.get("message", ""))
        text = str(error.get("traceback", ""))
        cause = _RemoteTraceback(f"\nworker {handle.worker_id} traceback:\n{text}")
        exc: Exception
        if pending.op == "run" and pending.task is not None:
            if error.get("trial_error"):
                exc = TrialError(message)
            elif error.get("transient"):
                exc = StoreError(
                    f"{_describe(pending.task)} hit an I/O error on worker {handle.worker_id}: "
                    f"{type_name}: {message}"
                )
            else:
                exc = TrialError(
                    f"{_describe(pending.task)} failed on worker {handle.worker_id}: "
                    f"{type_name}: {message}\n{text}"
                )
        elif type_name in _LOAD_ERRORS:
            exc = _LOAD_ERRORS[type_name](message)
        else:
            exc = RuntimeError(
                f"worker {handle.worker_id} failed to {pending.op} partitions "
                f"{list(pending.partitions)}: {type_name}: {message}"
            )
        exc.__cause__ = cause
        return exc

    def _send_locked(
        self,
        handle: _Handle,
        op: str,
        fields: Mapping[str, Any],
        *,
        task: UnitTask | None = None,
    ) -> Future[Any]:
        """Send a command and queue its pending reply (caller holds the lock)."""
        command_id = handle.next_id
        handle.next_id += 1
        partitions = tuple(int(p) for p in fields.get("partitions", ()))
        future: Future[Any] = Future()
        future.set_running_or_notify_cancel()  # not cancellable: the worker runs it anyway
        handle.pending.append(_Pending(command_id, op, partitions, task, future))
        channel = handle.channel
        try:
            if channel is None:
                raise ConnectionError("not connected")
            channel.send({"op": op, "id": command_id, **fields})
        except OSError:
            # The connection is gone: the read loop (or the job thread) fails the future.
            logger.debug("send to worker %s failed", handle.worker_id, exc_info=True)
            if channel is not None:
                channel.close()
        return future

    def _lose(self, handle: _Handle, reason: str, *, cause: str) -> None:
        """Handle the loss of a worker (idempotent): fail its units, re-home, cancel."""
        with self._lock:
            if handle.state in ("lost", "closed"):
                return
            starting = handle.state == "starting"
            handle.state = "lost"
            if self._handles.get(handle.worker_id) is handle:
                del self._handles[handle.worker_id]
            self._lost[handle.worker_id] = handle
            self._lost_by[cause] = self._lost_by.get(cause, 0) + 1
            lost = list(handle.pending)
            handle.pending.clear()
            if handle.listed:
                self._rehome_locked(handle)
            listed = handle.listed
            handle.listed = False
            channel = handle.channel
        if channel is not None:
            channel.close()
        self._cancel_job(handle)
        logger.warning("worker %s is lost: %s", handle.worker_id, reason)
        handle.gone.set()
        for pending in lost:
            if pending.op == "run" and pending.task is not None:
                what = f"while it ran the {_describe(pending.task)}"
            elif listed:
                what = f"while it loaded partitions {list(pending.partitions)}"
            else:
                what = f"before it had loaded partitions {list(pending.partitions)}"
            _fail(
                pending.future,
                WorkerLostError(f"worker {handle.worker_id} was lost ({reason}) {what}"),
            )
        if not handle.ready.done():
            stage = "before it registered" if starting else "before it was ready"
            _fail(
                handle.ready,
                WorkerLostError(f"worker {handle.worker_id} was lost {stage}: {reason}"),
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
                "no live worker left to re-home partitions %s of worker %s; a joining worker "
                "will load every partition",
                sorted(dead.partitions),
                dead.worker_id,
            )
            return
        assigned = rehome(dead.partitions, holdings)
        for worker_id, moved in assigned.items():
            self._handles[worker_id].partitions.update(moved)
            logger.warning(
                "re-homing partitions %s of lost worker %s on worker %s",
                moved,
                dead.worker_id,
                worker_id,
            )
            future = self._send_locked(self._handles[worker_id], "load", {"partitions": moved})
            future.add_done_callback(functools.partial(_log_failed_rehome, worker_id, moved))

    # -- monitor -------------------------------------------------------------------------

    def _monitor_loop(self) -> None:
        """Ping workers, detect silent ones, and start workers on new executors."""
        next_ping = next_poll = time.monotonic()
        while not self._stopping.wait(_TICK_S):
            try:
                now = time.monotonic()
                with self._lock:
                    live = [h for h in self._handles.values() if h.state == "live"]
                for handle in live:
                    silent = now - handle.last_seen
                    if silent > self._heartbeat_timeout_s:
                        self._lose(
                            handle,
                            f"no message from it for {silent:.1f} s "
                            f"(heartbeat_timeout_s={self._heartbeat_timeout_s})",
                            cause="heartbeat",
                        )
                for handle in live:
                    if not handle.located and now - handle.registered_at < _LOCATE_S:
                        self._locate(handle)
                if now >= next_ping:
                    next_ping = now + self._heartbeat_s
                    for handle in live:
                        channel = handle.channel
                        if handle.listed and channel is not None:
                            with contextlib.suppress(OSError):
                                channel.send({"op": "ping"})
                if now >= next_poll and self._join_new_executors:
                    next_poll = now + self._poll_s
                    self._poll_executors()
            except Exception:
                if self._stopping.is_set():
                    return
                logger.exception("SparkBackend monitor failed")

    def _poll_executors(self) -> None:
        """Start workers on executors that appeared, as far as free slots allow."""
        sc = self._sc
        if sc is None or sc._jsc is None:  # not started, or the SparkContext was stopped
            return
        slots = self._executor_slots(sc)
        with self._lock:
            if self._closed:
                return
            new = {e: n for e, n in slots.items() if e not in self._seen_executors}
            self._seen_executors.update(new)
            if not new:
                return
            # Executors that registered late while start() was already filling their slots
            # bring no spare capacity: only free slots get new workers.
            spare = sum(slots.values()) - sum(
                1 for h in self._handles.values() if h.state in ("starting", "live")
            )
            count = max(0, min(spare, sum(new.values())))
            spawned = [self._spawn_locked(None) for _ in range(count)]
        logger.info(
            "executors %s appeared (%d task slots, %d free): started workers %s",
            sorted(new),
            sum(new.values()),
            max(0, spare),
            [h.worker_id for h in spawned],
        )


def check_spark_conf(get: Callable[[str], str | None]) -> None:
    """Refuse Spark settings under which long-lived worker tasks cannot work.

    Speculative execution (``spark.speculation``) would start a copy of a worker's
    never-ending task; the driver refuses the copy, which then ends first and makes Spark
    kill the real worker as the "slower" attempt.

    Args:
        get: Reads a Spark setting (``SparkConf.get``); ``None`` when unset.

    Raises:
        ConfigError: A setting breaks the rule above.
    """
    if (get("spark.speculation") or "false").strip().lower() == "true":
        raise ConfigError(
            "spark.speculation=true is not supported by SparkBackend: a speculative copy of "
            "a long-lived worker task would make Spark kill the worker; set "
            "spark.speculation=false"
        )


def _log_failed_rehome(worker_id: str, partitions: list[int], future: Future[Any]) -> None:
    exc = future.exception()
    if exc is not None and not isinstance(exc, WorkerLostError):
        logger.error(
            "worker %s failed to load re-homed partitions %s: %s", worker_id, partitions, exc
        )


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _is_local(master: str) -> bool:
    """Whether ``master`` runs tasks in the driver's JVM (``local``, ``local[N]`` ...)."""
    return master.startswith("local") and not master.startswith("local-cluster")


def _task_cpus(sc: SparkContext) -> int:
    return max(1, int(sc.getConf().get("spark.task.cpus") or "1"))
