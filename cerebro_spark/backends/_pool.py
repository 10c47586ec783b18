"""WorkerPool: the one worker pool beneath every backend (the seam's rules are in ``_base``).

The transport starts workers and says when they end; the pool owns the rest, once:

* **Control.** Each worker connects to the pool's :class:`~._control.ControlServer`; the
  pool sends ``load``/``run``/``stop`` and a ``ping`` every ``heartbeat_s``, the worker
  replies in command order and sends a ``heartbeat`` every ``heartbeat_s``. A train
  unit's ``trained`` comes before its reply: the worker is free (its :class:`UnitFuture`
  freed) while it writes the checkpoint, and the unit is done with the reply.
* **Losses** (Cerebro §5.6). A worker is lost when its connection closes or fails a
  check, when it was silent for ``heartbeat_timeout_s``, when its process or task ends
  unasked, when it does not register within ``start_timeout_s``, or when its initial load
  fails. Each orphaned partition is re-homed on the live worker holding the fewest (those
  of a worker lost before it was ready, once one is ready). A worker id registers once: a
  retried Spark task attempt of a lost worker is refused; capacity is refilled by workers
  with new ids.
* **Placement.** Partition ``i`` starts on worker ``w{i mod n}`` unless ``placement``
  says otherwise; joining workers hold replicas (:meth:`WorkerPool.add_worker`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import dataclasses
import enum
import functools
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from cerebro_spark.backends._base import (
    Backend,
    Membership,
    UnitFuture,
    WorkerChange,
    WorkerInfo,
    WorkerJob,
)
from cerebro_spark.backends._control import (
    Channel,
    ControlServer,
    describe,
    error_from_json,
    new_secret,
)
from cerebro_spark.backends._placement import initial_shares, rehome, replica_share
from cerebro_spark.backends._serve import WorkerSpec
from cerebro_spark.backends._transport import Transport
from cerebro_spark.data import read_manifest
from cerebro_spark.errors import ConfigError, WorkerLostError
from cerebro_spark.units import (
    GroupBrokenError,
    GroupSpec,
    UnitResult,
    UnitTask,
    check_group,
    check_pack_tasks,
)

logger = logging.getLogger(__name__)

_STOP_GRACE_S = 15.0
_KILL_GRACE_S = 10.0
_LOCATE_S = 60.0
_LOCATE_WAIT_S = 3.0
_END_WAIT_S = 1.0
_TICK_S = 0.25
_LOADING_LOG_S = 60.0  # how often a start says which workers it still waits for
_UNITS = ("run", "pack")  # the commands that train or validate


class _State(enum.IntEnum):
    """Where a worker is in its life: it only moves down the list, but a called-off retire."""

    STARTING = enum.auto()  # launched, not registered
    JOINING = enum.auto()  # registered, being located and welcomed
    LOADING = enum.auto()  # welcomed (JOINED reported), loading its initial partitions
    READY = enum.auto()  # takes units (listed by WorkerPool.workers)
    RETIRING = enum.auto()  # takes no new unit; finishing the one in flight and re-home loads
    STOPPING = enum.auto()  # a retiring worker told to stop
    LEFT = enum.auto()  # retired, lost, or stopped by close


def next_worker_index(worker_ids: Collection[str]) -> int:
    """The first index whose worker id (``w<index>``) is after every id in ``worker_ids``."""
    indices = [int(w[1:]) for w in worker_ids if w[:1] == "w" and w[1:].isdigit()]
    return max(indices, default=-1) + 1


@dataclasses.dataclass
class PoolStats:
    """Counters of a :class:`WorkerPool`, for tests, logs and benchmarks.

    Attributes:
        started: Workers launched.
        registered: Workers that registered with the driver.
        refused: Registrations refused (a retried task attempt of a lost worker, an
            unknown worker id, or a registration after close).
        lost: Workers lost, by how the loss was noticed: ``"connection"``,
            ``"heartbeat"``, ``"ended"`` (its process or task ended unasked), ``"load"``
            (its initial load failed), ``"start"`` (it did not register within
            ``start_timeout_s``, or ``add_worker`` was interrupted).
        retired: Workers retired.
        register_seconds: Per worker, seconds from launch to registration.
        ready_seconds: Per worker, seconds from launch until it had loaded its partitions.
        startup: Per worker, when each start-up phase ended (``time.time()``):
            ``launched`` and ``listed`` as the driver saw them, the others (:mod:`._serve`)
            as the worker reported them, if it did.
    """

    started: int = 0
    registered: int = 0
    refused: int = 0
    lost: dict[str, int] = dataclasses.field(default_factory=dict)
    retired: int = 0
    register_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    ready_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    startup: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(eq=False)
class _Pending:
    """A command whose reply has not arrived; a ``held`` one waits (and those after it)."""

    id: int
    op: str
    partitions: tuple[int, ...]
    task: UnitTask | None
    future: Future[Any]
    held: bool = False  # a rank awaiting its rank 0's port
    sent: bool = False
    trained: bool = False  # a train unit whose checkpoint the worker is writing
    peers: list[tuple[_Handle, _Pending]] | None = None  # rank 0: ranks awaiting its port
    tasks: tuple[UnitTask, ...] = ()  # a pack's tasks (``task`` is the first)
    members: tuple[UnitFuture, ...] = ()  # a pack's futures, one per task

    def message(self) -> dict[str, Any]:
        """The command on the wire: a ``load``, a ``run`` of its task, a ``pack`` of its tasks."""
        if self.op == "pack":
            return {"op": self.op, "id": self.id, "tasks": [t.to_json() for t in self.tasks]}
        if self.task is None:
            return {"op": self.op, "id": self.id, "partitions": list(self.partitions)}
        return {"op": self.op, "id": self.id, "task": self.task.to_json()}


class _Handle:
    """The driver's view of one worker."""

    def __init__(self, worker_id: str, initial: list[int] | None) -> None:
        self.worker_id = worker_id
        self.initial = initial  # None: a replica share chosen when it registers
        self.state = _State.STARTING
        self.channel: Channel | None = None
        self.partitions: set[int] = set(initial or ())
        self.pending: deque[_Pending] = deque()
        self.next_id = 0
        self.bytes_read = 0
        self.host = "unknown"
        self.device = "cpu"
        self.executor_id: str | None = None
        self.located = False
        self.pid: int | None = None
        self.registration: Mapping[str, Any] = {}
        self.spawned_at = self.last_seen = self.registered_at = time.monotonic()
        self.ready: Future[None] = _running_future()
        self.retired: Future[None] | None = None
        self.retire_loads: list[Future[Any]] = []
        self.ended: Future[str] = Future()  # the transport's, once launched
        self.gone = threading.Event()

    @property
    def running(self) -> UnitTask | None:
        """The unit sent to (or held for) this worker and not trained, if any.

        A unit whose checkpoint the worker is still writing is not running: the worker
        takes its next unit meanwhile.
        """
        return next((p.task for p in self.pending if p.op in _UNITS and not p.trained), None)

    def left(self, not_ready: str, not_retired: str | None) -> None:
        """Settle what waits on a worker that left, and mark it gone.

        Args:
            not_ready: The error :attr:`ready` fails with unless it is done.
            not_retired: The error :attr:`retired` fails with; ``None``: it retired as asked.
        """
        _fail(self.ready, WorkerLostError(not_ready))
        if self.retired is not None and not_retired is not None:
            _fail(self.retired, WorkerLostError(not_retired))
        elif self.retired is not None and not self.retired.done():
            self.retired.set_result(None)
        self.gone.set()

    def info(self) -> WorkerInfo:
        """The worker as :meth:`WorkerPool.workers` reports it."""
        return WorkerInfo(
            self.worker_id,
            frozenset(self.partitions),
            self.host,
            self.device,
            self.bytes_read,
            self.executor_id,
        )


def _running_future() -> Future[Any]:
    """A future that cannot be cancelled (the worker runs its command anyway)."""
    future: Future[Any] = Future()
    future.set_running_or_notify_cancel()
    return future


def _fail(future: Future[Any], exc: BaseException) -> None:
    """Fail ``future`` unless it is done."""
    if not future.done():
        future.set_exception(exc)


class WorkerPool(Backend):
    """Workers that hold partitions and run units, over any transport (see the module docs).

    Args:
        transport: Starts the workers and tells when they end.
        num_workers: Workers :meth:`start` starts; ``None`` lets the transport choose
            (Spark: one per executor task slot). At most the number of partitions.
        device: Torch device of every worker (:func:`~._serve.resolve_device`): ``None``
            or ``"auto"`` lets each choose (``cuda:<i>`` for a worker given a ``gpu``
            resource, else ``cpu``), ``"cuda"`` likewise but a worker given no GPU fails,
            ``"cpu"`` and ``"cuda:N"`` are used as given.
        start_timeout_s: Seconds a worker may take to register; then it is lost (and
            :meth:`start` or :meth:`add_worker` raise if it was the last hope). Loading its
            partitions afterwards is bounded by its heartbeats, not by time: a large share
            on slow storage is waited for as long as the worker beats (one that falls
            silent is lost), and logged every minute.
        heartbeat_s: Seconds between heartbeats (worker → driver) and pings (driver →
            worker).
        heartbeat_timeout_s: Seconds without a message after which a worker is lost (and
            a worker ends when its driver was silent that long).
        poll_s: Seconds between asking the transport for arrivals.

    Raises:
        ConfigError: An argument breaks the rules above.
    """

    def __init__(
        self,
        transport: Transport,
        num_workers: int | None,
        *,
        device: str | None = None,
        start_timeout_s: float = 300.0,
        heartbeat_s: float = 5.0,
        heartbeat_timeout_s: float = 30.0,
        poll_s: float = 2.0,
    ) -> None:
        if num_workers is not None and (
            isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1
        ):
            raise ConfigError(f"num_workers must be an integer >= 1 or None, got {num_workers!r}")
        seconds = {
            "start_timeout_s": start_timeout_s,
            "heartbeat_s": heartbeat_s,
            "heartbeat_timeout_s": heartbeat_timeout_s,
            "poll_s": poll_s,
        }
        for name, value in seconds.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"{name} must be a number > 0, got {value!r}")
        if heartbeat_timeout_s < 2 * heartbeat_s:
            raise ConfigError(
                f"heartbeat_timeout_s must be at least 2 * heartbeat_s = {2 * heartbeat_s}, "
                f"got {heartbeat_timeout_s}"
            )
        self._transport = transport
        self._num_workers = num_workers
        self._device = device
        self._start_timeout_s = float(start_timeout_s)
        self._heartbeat_s = float(heartbeat_s)
        self._heartbeat_timeout_s = float(heartbeat_timeout_s)
        self._poll_s = float(poll_s)
        self._secret = new_secret()
        self._lock = threading.RLock()
        self._handles: dict[str, _Handle] = {}  # live ones, in the order they were started
        self._changes: list[WorkerChange] = []
        self._draining: set[str] = set()  # executors of retired workers
        self._next_index = 0
        self._job: WorkerJob | None = None
        self._num_partitions = 0
        self._closed = threading.Event()
        self._server: ControlServer | None = None
        self._advertised: tuple[str, int] | None = None
        self._spec: WorkerSpec  # what every worker gets but its id (set by start)
        self._monitor: threading.Thread | None = None
        self._stats = PoolStats()

    # -- Backend -------------------------------------------------------------------------

    def start(
        self,
        job: WorkerJob,
        *,
        placement: Sequence[Collection[int]] | None = None,
        first_worker: int = 0,
    ) -> None:
        """Start the workers; return as soon as one has registered and loaded its partitions.

        The others go on starting: each is reported by :meth:`changes` (``JOINED``, then
        ``READY``, or ``LOST`` with its reason) and counted by :meth:`starting` until then.
        One that does not register within ``start_timeout_s`` is lost (``PoolStats.lost
        ["start"]``); the partitions of one lost before it was ready are re-homed on the
        ready workers. The errors below are raised only when no worker became ready.

        Raises:
            ConfigError: ``job.torch_threads < 1``, more workers than partitions, a bad
                ``placement``, or what the transport refuses (e.g. more workers than
                ``local[N]`` has slots).
            WorkerLostError: Every worker was lost before it was ready (the message of
                the first says how).
            TimeoutError: No worker registered within ``start_timeout_s`` (the message
                names them and the likely causes).
            Exception: Every worker failed (one at least to load its partitions): the
                first load error is re-raised by type name (``DataError`` ...) with the
                worker's traceback as the cause.
        """
        if job.torch_threads < 1:
            raise ConfigError(f"WorkerJob.torch_threads must be >= 1, got {job.torch_threads}")
        if isinstance(first_worker, bool) or not isinstance(first_worker, int) or first_worker < 0:
            raise ConfigError(f"first_worker must be an integer >= 0, got {first_worker!r}")
        self._check_startable()
        partitions = read_manifest(job.dataset_uri).num_partitions
        requested = len(placement) if placement is not None else self._num_workers
        if requested is not None:
            check_worker_count(requested, partitions, job.dataset_uri)
        count = self._transport.open(requested, self._start_timeout_s)
        check_worker_count(count, partitions, job.dataset_uri)
        shares = _shares(placement, count, partitions)
        with self._lock:
            self._check_startable()
            self._job = job
            self._num_partitions = partitions
            self._next_index = first_worker
            bind, advertised = self._transport.control_address()
            self._server = ControlServer(self._secret, self._on_connection, host=bind)
            self._advertised = (advertised, self._server.address[1])
            self._spec = WorkerSpec(
                "",  # each worker's id
                *self._advertised,
                secret=self._secret,
                job=job,
                device=self._device,
                heartbeat_s=self._heartbeat_s,
                driver_timeout_s=self._heartbeat_timeout_s,
                connect_timeout_s=self._start_timeout_s,
            )
            self._monitor = threading.Thread(
                target=self._monitor_loop, name="cerebro-pool-monitor", daemon=True
            )
            self._monitor.start()
        handles: list[_Handle] = []
        try:
            with self._lock:
                handles = [self._spawn_locked(share) for share in shares]
            first = self._await_ready(handles)
        except BaseException:
            self.close()
            raise
        logger.info(
            "%s started %d workers; %s is ready on %s (executor %s, if known yet), %d are "
            "still starting",
            type(self).__name__,
            len(handles),
            first.worker_id,
            first.host,
            first.executor_id or "none",
            self.starting(),
        )

    def workers(self) -> dict[str, WorkerInfo]:
        """Return the live workers that take units, by id, in the order they were started."""
        with self._lock:
            return {w: h.info() for w, h in self._handles.items() if h.state == _State.READY}

    def starting(self) -> int:
        """Return how many workers were launched but are neither ready nor gone yet."""
        with self._lock:
            return sum(1 for h in self._handles.values() if h.state < _State.READY)

    def wait_started(self, timeout_s: float | None = None) -> None:
        """Wait until no worker is starting, then (briefly) until each says where it runs.

        Spark's listener may lag behind the tasks: the executor of a ready worker is
        waited for up to 10 s in all (the monitor goes on asking after that).
        """
        super().wait_started(timeout_s)
        deadline = time.monotonic() + _LOCATE_S / 6
        with self._lock:
            ready = [h for h in self._handles.values() if h.state == _State.READY]
        for handle in ready:
            if not handle.located:
                self._locate(handle, wait_s=max(0.0, deadline - time.monotonic()))

    def changes(self) -> list[WorkerChange]:
        """Return the membership changes since the last call, oldest first."""
        with self._lock:
            changes, self._changes = self._changes, []
            return changes

    def submit(self, worker_id: str, task: UnitTask) -> Future[UnitResult]:
        """Send ``task`` to ``worker_id`` (rules in ``_base``).

        Raises:
            ValueError: The worker cannot take it now, or the task is a group rank.
        """
        with self._lock:
            handle = self._usable_locked(worker_id, task.partition, f"partition {task.partition}")
            if task.group is not None:
                raise ValueError(
                    f"cannot run partition {task.partition} on worker {worker_id} alone: "
                    f"the task is rank {task.group.rank} of group {task.group.group_id!r}; "
                    "use submit_group"
                )
            return self._send_locked(handle, "run", task=task).future

    def submit_pack(self, worker_id: str, tasks: Sequence[UnitTask]) -> list[Future[UnitResult]]:
        """Send the train ``tasks`` to ``worker_id`` as one packed unit (rules in ``_base``).

        A pack of one trains in the packed kernel too (beside a ghost of itself,
        :mod:`cerebro_spark.training._pack`): its numbers are those it would have in any
        pack, which a plain ``run`` does not give.

        Raises:
            ConfigError: The tasks cannot form a pack (``check_pack_tasks``).
            ValueError: The worker cannot take it now.
        """
        check_pack_tasks(tasks)
        partition = tasks[0].partition
        members = tuple(UnitFuture() for _ in tasks)
        with self._lock:
            handle = self._usable_locked(worker_id, partition, f"partition {partition}")
            pending = self._send_locked(handle, "pack", task=tasks[0], tasks=tuple(tasks))
            pending.members = members
            pending.future.add_done_callback(functools.partial(_settle_pack, members))
        logger.debug(
            "pack of %d trials on partition %d sent to worker %s", len(tasks), partition, worker_id
        )
        return list(members)

    def prefetch(self, worker_id: str, checkpoints: Sequence[tuple[str, str]]) -> None:
        """Send ``worker_id`` a ``prefetch`` hint at once (rules in ``_base``).

        The worker reads its commands on a thread of their own, so a hint sent while it
        trains is taken then (:mod:`._serve`). A worker that does not take units, or whose
        connection failed, gets nothing.
        """
        hints = [[str(key), str(sha256)] for key, sha256 in checkpoints]
        if not hints:
            return
        with self._lock:
            handle = self._handles.get(worker_id)
            if handle is None or handle.state != _State.READY or handle.channel is None:
                return
            channel = handle.channel
        with contextlib.suppress(OSError):  # the read loop reports the loss
            channel.send({"op": "prefetch", "checkpoints": hints})

    def submit_group(self, assignments: Mapping[str, UnitTask]) -> dict[str, Future[UnitResult]]:
        """Start the ``k`` ranks of one group unit, one per worker (rules in ``_base``).

        The ranks after 0 are held until rank 0 announces its port, then sent with rank 0's
        host as the transport located it.

        Raises:
            ConfigError: The tasks are not the ranks of one group unit (``check_group``).
            ValueError: A worker cannot take its rank now; nothing was sent.
        """
        check_group(list(assignments.values()))
        by_rank = sorted(assignments.items(), key=lambda item: _group_of(item[1]).rank)
        group = _group_of(by_rank[0][1])
        held = group.port == 0
        with self._lock:
            handles = [
                self._usable_locked(
                    worker_id,
                    task.partition,
                    f"rank {rank} (partition {task.partition}) of group {group.group_id!r}",
                )
                for rank, (worker_id, task) in enumerate(by_rank)
            ]
            # Rank 0 binds the address it is announced at; a fresh token per attempt keeps
            # whoever is not a rank out of the rendezvous (secrets: not the experiment seed).
            address = handles[0].host if held else group.address
            token = group.token or secrets.token_hex(16)
            sent: list[_Pending] = []
            for rank, (handle, (_, task)) in enumerate(zip(handles, by_rank, strict=True)):
                task = _regroup(task, address=address, token=token)
                sent.append(self._send_locked(handle, "run", task=task, held=held and rank > 0))
            if held:
                sent[0].peers = list(zip(handles[1:], sent[1:], strict=True))
        logger.debug("group %s started on workers %s", group.group_id, [w for w, _ in by_rank])
        return {h.worker_id: pending.future for h, pending in zip(handles, sent, strict=True)}

    def retire(self, worker_id: str) -> Future[None]:
        """Take a worker out of service gracefully (rules in ``_base``).

        Returns:
            The future of :meth:`Backend.retire`; it fails with :class:`WorkerLostError` if
            the worker is lost meanwhile, and with :class:`RuntimeError` if its partitions
            could not be re-homed (the worker then stays in service).
        """
        with self._lock:
            handle = self._listed_locked(worker_id, "retire")
            if handle.partitions and len(self._holdings_locked()) == 1:  # only itself
                raise ValueError(
                    f"cannot retire worker {worker_id}: it is the last live worker and no "
                    f"other holds its partitions {sorted(handle.partitions)}"
                )
            handle.state = _State.RETIRING
            if handle.executor_id is not None:
                self._draining.add(handle.executor_id)
            retired: Future[None] = _running_future()
            handle.retired = retired
            self._change_locked(Membership.RETIRING, handle)
            whose = f"retiring worker {worker_id}"
            handle.retire_loads = self._rehome_locked(handle.partitions, whose)
            for load in handle.retire_loads:
                load.add_done_callback(functools.partial(self._retire_step, handle))
            logger.info("retiring worker %s", worker_id)
        self._retire_step(handle)
        return retired

    def add_worker(self, partitions: Collection[int] | None = None) -> str:
        """Start one more worker; return its id once it has loaded its partitions (``_base``).

        The new worker holds **replicas**: by default ``ceil(P / m)`` partitions (``m`` =
        live workers including it) chosen when it registers among those with the fewest
        holders, preferring partitions whose holders hold the most; with no live worker
        left, all ``P``.

        Args:
            partitions: Load exactly these partition indices instead.

        Raises:
            ValueError: An index is outside ``range(num_partitions)``.
            RuntimeError: The pool is not started or is closed.
            WorkerLostError: The worker was lost before it was ready.
            TimeoutError: It did not register within ``start_timeout_s``.
        """
        with self._lock:
            if self._closed.is_set():
                raise RuntimeError(f"{type(self).__name__} is closed; create a new one")
            if self._job is None:
                raise RuntimeError("add_worker needs a started pool: call start first")
            chosen = None if partitions is None else sorted(set(partitions))
            bad = [p for p in chosen or () if not 0 <= p < self._num_partitions]
            if bad:
                raise ValueError(
                    f"partitions {bad} are outside range(num_partitions={self._num_partitions})"
                )
            handle = self._spawn_locked(chosen)
        try:
            self._await_ready([handle])
        except BaseException:
            self._leave(handle, "it was not ready in time", cause="start")
            raise
        return handle.worker_id

    def close(self) -> None:
        """Stop every worker and the control server (idempotent).

        Idle workers are told to stop and end normally (reported as ``RETIRED``); busy or
        unresponsive ones are killed (``LOST``). Units still queued or running fail with
        :class:`WorkerLostError`.
        """
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            handles = list(self._handles.values())
            self._handles.clear()
            joined = [h for h in handles if h.state >= _State.LOADING]
            abandoned = [p for h in handles for p in h.pending]
            busy = {  # a re-home load finishes; an initial one would only delay the close
                h.worker_id for h in handles if h.running is not None or h.state < _State.READY
            }
            for handle in handles:
                handle.pending.clear()
                handle.state = _State.LEFT
        name = type(self).__name__
        for pending in abandoned:
            _fail(pending.future, WorkerLostError(f"{name} was closed before the unit ended"))
        killed = {h.worker_id for h in handles if h.worker_id in busy or not _tell_stop(h)}
        for worker_id in sorted(killed):
            self._transport.kill(worker_id)
        ended = {h.ended: h for h in handles}
        late = concurrent.futures.wait(ended, timeout=_STOP_GRACE_S).not_done
        for future in late:
            logger.warning("worker %s did not stop; killing it", ended[future].worker_id)
            killed.add(ended[future].worker_id)
            self._transport.kill(ended[future].worker_id)
        for future in concurrent.futures.wait(late, timeout=_KILL_GRACE_S).not_done:
            logger.warning("worker %s did not end after a kill", ended[future].worker_id)
        for handle in handles:
            if handle.channel is not None:
                handle.channel.close()
        if self._server is not None:
            self._server.close()
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(timeout=_KILL_GRACE_S)
        if self._job is not None:
            self._transport.close()
        with self._lock:
            for handle in joined:
                if handle.worker_id in killed:
                    self._change_locked(Membership.LOST, handle, f"{name} was closed: killed")
                else:
                    self._change_locked(Membership.RETIRED, handle)
        for handle in handles:
            handle.left(
                f"{name} was closed before {handle.worker_id} was ready",
                f"{name} was closed during the retire",
            )
        if handles:
            logger.info("%s stopped %d workers", name, len(handles))

    # -- beyond the seam -----------------------------------------------------------------

    def kill_worker(
        self, worker_id: str, timeout_s: float = 60.0, *, executor: bool = False
    ) -> None:
        """End a worker abruptly and wait until the loss has been handled.

        By default its process is killed (Spark: its job group is cancelled); with
        ``executor=True`` its whole Spark executor is killed, as if it had crashed (the
        cluster manager may replace it). When this returns, :meth:`workers` no longer lists
        it, its units have failed with :class:`WorkerLostError` and its partitions are
        re-homed. For tests and failure drills; do not call it from a future's callback.

        Raises:
            ValueError: No such live worker, or ``executor=True`` for a worker whose
                executor is unknown or is the driver (local mode).
            TimeoutError: The loss was not handled within ``timeout_s``.
        """
        with self._lock:
            handle = self._handles.get(worker_id)
        if handle is None:
            raise ValueError(f"no live worker {worker_id!r} to kill")
        if not executor:
            logger.warning("killing worker %s", worker_id)
            self._transport.kill(worker_id)
        elif handle.executor_id in (None, "driver"):
            raise ValueError(
                f"worker {worker_id} runs on executor {handle.executor_id!r}, which cannot be "
                "killed alone (local mode has only the driver)"
            )
        else:
            killed = self._transport.kill_executor(handle.executor_id)
            logger.warning(
                "killing executor %s of worker %s: %s",
                handle.executor_id,
                worker_id,
                "requested" if killed else "refused by the cluster manager",
            )
        if not handle.gone.wait(timeout_s):
            raise TimeoutError(
                f"worker {worker_id} was killed but its loss was not seen in {timeout_s} s"
            )

    def pids(self) -> dict[str, int]:
        """Return the process id of every registered live worker (on its host)."""
        with self._lock:
            return {h.worker_id: h.pid for h in self._handles.values() if h.pid is not None}

    def executors(self) -> dict[str, str | None]:
        """Return the executor id of every worker that takes units."""
        return {w: info.executor_id for w, info in self.workers().items()}

    @property
    def control_address(self) -> tuple[str, int] | None:
        """The ``(host, port)`` workers connect to; ``None`` before :meth:`start`."""
        return self._advertised

    def stats(self) -> PoolStats:
        """Return (a copy of) the pool's counters and worker start latencies."""
        with self._lock:
            return copy.deepcopy(self._stats)

    def _worker_spec(self, worker_id: str) -> WorkerSpec:
        """The spec a worker is started with (tests re-register with it)."""
        return dataclasses.replace(self._spec, worker_id=worker_id)

    # -- workers -------------------------------------------------------------------------

    def _check_startable(self) -> None:
        """Refuse a second start, or a start after close."""
        if self._closed.is_set() or self._job is not None:
            raise RuntimeError(
                f"{type(self).__name__} was closed or already started; create a new one"
            )

    def _spawn_locked(self, initial: list[int] | None) -> _Handle:
        """Launch one worker."""
        handle = _Handle(f"w{self._next_index}", initial)
        self._next_index += 1
        self._handles[handle.worker_id] = handle
        self._stats.started += 1
        handle.ended = self._transport.launch(self._worker_spec(handle.worker_id))
        handle.ended.add_done_callback(functools.partial(self._on_ended, handle))
        return handle

    def _await_ready(self, handles: list[_Handle]) -> _Handle:
        """Wait until one of ``handles`` is ready and return it; if none can be, raise.

        Registering is bounded by ``start_timeout_s`` and loading by the worker's
        heartbeats (the monitor loses a worker that overruns either, which fails its
        ``ready``). When every worker failed, the first worker error is re-raised (a load's
        ``DataError`` ...), else one :class:`TimeoutError` naming those that never
        registered, else the first loss.
        """
        started = time.monotonic()
        next_log = started + _LOADING_LOG_S
        pending = {h.ready: h for h in handles}
        failed: list[tuple[_Handle, BaseException]] = []
        while pending:
            done, _ = concurrent.futures.wait(pending, _TICK_S, concurrent.futures.FIRST_COMPLETED)
            for future in sorted(done, key=lambda f: handles.index(pending[f])):
                handle = pending.pop(future)
                error = future.exception()
                if error is None:
                    return handle
                failed.append((handle, error))
            now = time.monotonic()
            if pending and now >= next_log:
                next_log = now + _LOADING_LOG_S
                logger.info(
                    "still waiting for workers %s to register or load their partitions "
                    "(%.0f s so far; each is watched by its heartbeats)",
                    [h.worker_id for h in pending.values()],
                    now - started,
                )
        errors = [e for _, e in failed if not isinstance(e, (TimeoutError, WorkerLostError))]
        if errors:
            raise errors[0]
        late = [h.worker_id for h, e in failed if isinstance(e, TimeoutError)]
        if late:
            raise TimeoutError(
                f"workers {late} did not register within start_timeout_s="
                f"{self._start_timeout_s}: no free slot for their {self._transport.noun}s, "
                f"or they could not reach the driver's control server at {self._advertised}"
            )
        raise failed[0][1]

    def _listed_locked(self, worker_id: str, what: str) -> _Handle:
        """The worker if it takes units, else :class:`ValueError` (``cannot <what> worker``)."""
        handle = self._handles.get(worker_id)
        if handle is not None and handle.state == _State.READY:
            return handle
        why = f"no such live worker (live: {sorted(self.workers())})"
        if handle is not None and handle.state > _State.READY:
            why = "it is retiring"
        raise ValueError(f"cannot {what} worker {worker_id!r}: {why}")

    def _usable_locked(self, worker_id: str, partition: int, what: str) -> _Handle:
        """The idle, listed worker holding ``partition``, or :class:`ValueError` naming ``what``."""
        handle = self._listed_locked(worker_id, f"run {what} on")
        if handle.running is None and partition in handle.partitions:
            return handle
        why = f"it holds partitions {sorted(handle.partitions)}"
        if handle.running is not None:
            why = f"it is busy with the {describe(handle.running)}"
        raise ValueError(f"cannot run {what} on worker {worker_id}: {why}")

    def _on_connection(self, channel: Channel) -> None:
        """Serve one worker connection: registration, then its messages."""
        channel.settimeout(30.0)
        try:
            message = channel.recv()
        except OSError:
            return  # logged by the channel when it was a protocol violation
        channel.settimeout(None)
        worker_id = message.get("worker_id")
        with self._lock:
            handle = self._handles.get(str(worker_id))
            if handle is None or message["op"] != "register" or handle.state != _State.STARTING:
                self._stats.refused += 1
                handle = None  # (after close no handle is left)
            else:
                handle.state = _State.JOINING
                handle.channel = channel
                handle.registration = dict(message)
                handle.last_seen = handle.registered_at = time.monotonic()
                pid = message.get("pid")
                handle.pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else None
                handle.device = str(message.get("device") or "cpu")
                handle.host = channel.peer.rsplit(":", 1)[0]
                hint = message.get("executor_hint")
                handle.executor_id = hint if isinstance(hint, str) else None
                self._stats.registered += 1
                self._stats.register_seconds[handle.worker_id] = (
                    handle.registered_at - handle.spawned_at
                )
        if handle is None:
            reason = f"worker {worker_id!r} is unknown or registered before (never revived)"
            if self._closed.is_set():
                reason = "the pool is closed"
            what = f"{message['op']!r} of worker {worker_id!r} (attempt {message.get('attempt')})"
            logger.warning("refusing %s from %s: %s", what, channel.peer, reason)
            with contextlib.suppress(OSError):
                channel.send({"op": "refuse", "reason": reason})
            channel.close()
            return
        self._locate(handle, wait_s=_LOCATE_WAIT_S)
        with self._lock:
            if handle.state != _State.JOINING:
                return  # lost meanwhile
            with contextlib.suppress(OSError):  # the read loop below notices
                channel.send({"op": "welcome"})
                if handle.initial is None:
                    handle.initial = replica_share(self._num_partitions, self._holdings_locked())
                    handle.partitions.update(handle.initial)
                handle.state = _State.LOADING
                self._change_locked(Membership.JOINED, handle)
                load = self._send_locked(handle, "load", handle.initial)
                load.future.add_done_callback(functools.partial(self._on_initial_load, handle))
        logger.info(
            "worker %s registered from %s (executor %s, pid %s, device %s)",
            handle.worker_id,
            channel.peer,
            handle.executor_id,
            handle.pid,
            handle.device,
        )
        self._read_loop(handle, channel)

    def _on_initial_load(self, handle: _Handle, future: Future[Any]) -> None:
        """List a worker once its partitions are loaded; lose it if the load failed."""
        error = future.exception()
        if error is not None:
            _fail(handle.ready, error)
            self._leave(handle, f"it failed to load its partitions ({error})", cause="load")
            return
        with self._lock:
            if handle.state != _State.LOADING:
                return
            handle.state = _State.READY
            self._stats.ready_seconds[handle.worker_id] = time.monotonic() - handle.spawned_at
            self._stats.startup[handle.worker_id] = _startup(handle, future.result())
            self._change_locked(Membership.READY, handle)
            self._rehome_orphans_locked()  # of workers that left before any was ready
        if not handle.ready.done():  # close() may have failed it meanwhile
            handle.ready.set_result(None)
        logger.info(
            "worker %s is ready with partitions %s", handle.worker_id, sorted(handle.partitions)
        )

    def _read_loop(self, handle: _Handle, channel: Channel) -> None:
        """Handle a worker's messages until its connection ends."""
        while True:
            try:
                message = channel.recv()
            except OSError as exc:
                if handle.state < _State.STOPPING:  # else it stops as told, or it left
                    # Prefer the transport's word on how the worker ended (its exit status).
                    concurrent.futures.wait([handle.ended], timeout=_END_WAIT_S)
                    if not handle.ended.done():
                        reason = f"its control connection closed ({exc})"
                        self._leave(handle, reason, cause="connection")
                return
            handle.last_seen = time.monotonic()
            op = message["op"]
            try:
                if op == "reply":
                    self._on_reply(handle, message)
                elif op == "trained":
                    self._on_trained(handle, message)
                elif op == "rendezvous":
                    self._on_rendezvous(handle, message)
                elif op != "heartbeat":
                    logger.warning("worker %s sent an unexpected %r message", handle.worker_id, op)
            except Exception as exc:
                logger.exception("bad %s from worker %s", op, handle.worker_id)
                channel.close()
                self._leave(handle, f"it sent a malformed {op} ({exc})", cause="connection")
                return

    def _on_reply(self, handle: _Handle, message: Mapping[str, Any]) -> None:
        """Resolve the oldest command's future with a worker's reply."""
        state = message["state"]
        held = {int(p) for p in state["partitions"]}
        with self._lock:
            if not handle.pending or not handle.pending[0].sent:
                if handle.state < _State.LEFT:
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
                if handle.state == _State.READY:  # a re-home load failed: the engine must know
                    self._change_locked(Membership.PARTITIONS, handle)
                    logger.error(
                        "worker %s failed to load partitions %s",
                        handle.worker_id,
                        pending.partitions,
                    )
            broken = self._abandon_peers_locked(pending, "ended before the rendezvous")
        for future, error in broken:
            _fail(future, error)
        try:
            if not message.get("ok"):
                error = error_from_json(
                    message["error"], handle.worker_id, pending.op, pending.task, pending.partitions
                )
                _fail(pending.future, error)
            elif pending.op == "run" and message.get("value"):
                outcome = UnitResult.from_json(message["value"])
                if pending.task is not None and pending.task.group:  # carry its rendezvous
                    outcome = dataclasses.replace(outcome, task=pending.task)
                pending.future.set_result(outcome)
            elif pending.op == "pack":
                pending.future.set_result(_pack_outcomes(handle.worker_id, pending, message))
            else:  # a first load's value is the worker's start-up phases
                pending.future.set_result(message.get("value") if pending.op == "load" else None)
        except Exception as exc:  # a worker of another version? It cannot be trusted now
            _fail(
                pending.future,
                WorkerLostError(f"worker {handle.worker_id} sent a malformed reply: {exc!r}"),
            )
            raise
        if handle.state == _State.RETIRING:
            self._retire_step(handle)

    def _on_trained(self, handle: _Handle, message: Mapping[str, Any]) -> None:
        """A unit's pass is done, its checkpoint being written: its worker is free."""
        with self._lock:
            pending = next((p for p in handle.pending if p.id == message.get("id")), None)
            if pending is None:
                if handle.state < _State.LEFT:
                    raise ValueError(f"trained for command {message.get('id')!r}, not pending")
                return
            if pending.op not in _UNITS or not pending.sent or pending.trained:
                raise ValueError(f"trained for command {pending.id}, which trains no unit")
            pending.trained = True
        if isinstance(pending.future, UnitFuture):
            pending.future.free()
        for member in pending.members:  # one pass trained the whole pack
            member.free()

    def _on_rendezvous(self, handle: _Handle, message: Mapping[str, Any]) -> None:
        """Rank 0 bound its port: send the held ranks their tasks with its address and port."""
        port = message.get("port")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port <= 65535:
            raise ValueError(f"rendezvous port must be in [1, 65535], got {port!r}")
        with self._lock:
            lead = next((p for p in handle.pending if p.id == message.get("id")), None)
            if lead is None or lead.peers is None:
                logger.warning(
                    "worker %s announced a rendezvous for command %r, which holds no group",
                    handle.worker_id,
                    message.get("id"),
                )
                return
            peers, lead.peers = lead.peers, None
            address = _group_of(lead.task).address
            for peer, pending in [(handle, lead), *peers]:
                pending.task = _regroup(pending.task, address=address, port=port)
                pending.held = False
                if pending in peer.pending:  # else: lost meanwhile
                    self._flush_locked(peer)
        logger.debug("worker %s hosts a rendezvous at %s:%d", handle.worker_id, address, port)

    def _abandon_peers_locked(
        self, lead: _Pending, why: str
    ) -> list[tuple[Future[Any], BaseException]]:
        """Drop the held ranks of a rank 0 that will never announce (the caller fails them)."""
        peers, lead.peers = lead.peers or [], None
        broken: list[tuple[Future[Any], BaseException]] = []
        for peer, pending in peers:
            if pending in peer.pending and not pending.sent:
                peer.pending.remove(pending)
                self._flush_locked(peer)
                assert lead.task is not None  # ok: a rank 0
                text = (
                    f"on worker {peer.worker_id}: rank 0 of group {_group_of(lead.task).group_id} "
                    f"({describe(lead.task)}) {why}; this rank was never sent"
                )
                broken.append((pending.future, GroupBrokenError(text)))
        return broken

    def _send_locked(
        self,
        handle: _Handle,
        op: str,
        partitions: Collection[int] = (),
        *,
        task: UnitTask | None = None,
        held: bool = False,
        tasks: tuple[UnitTask, ...] = (),
    ) -> _Pending:
        """Queue a ``load`` of ``partitions``, a ``run`` of ``task`` or a ``pack`` of ``tasks``.

        ``held``: not sent yet.
        """
        partitions = tuple(int(p) for p in partitions)
        future = UnitFuture() if op == "run" else _running_future()
        pending = _Pending(handle.next_id, op, partitions, task, future, held, tasks=tasks)
        handle.next_id += 1
        handle.pending.append(pending)
        self._flush_locked(handle)
        return pending

    def _flush_locked(self, handle: _Handle) -> None:
        """Send the queued commands up to the first one held."""
        for pending in handle.pending:
            if pending.sent:
                continue
            if pending.held or handle.channel is None:
                return
            pending.sent = True
            try:
                handle.channel.send(pending.message())
            except OSError:  # the read loop (or the transport) reports the loss
                handle.channel.close()
                return

    def _on_ended(self, handle: _Handle, ended: Future[str]) -> None:
        """The transport says the worker's process or task ended: retired, or lost."""
        try:
            how = f"its {self._transport.noun} ended: {ended.result() or 'no outcome'}"
        except BaseException as exc:  # the task failed: Spark's error, usually long
            how = f"its {self._transport.noun} failed: {_summarise(exc)}"
            logger.debug("worker %s failed", handle.worker_id, exc_info=exc)
        self._leave(handle, how, cause=None if handle.state == _State.STOPPING else "ended")

    def _leave(self, handle: _Handle, reason: str, *, cause: str | None) -> None:
        """A worker left (idempotent): it retired, or it was lost and its units fail.

        Args:
            handle: The worker.
            reason: How it left (for a loss: why, as logged and reported).
            cause: How a loss was noticed (:attr:`PoolStats.lost`); ``None``: it retired
                (its process or task ended after ``stop``).
        """
        with self._lock:
            before = handle.state
            if before == _State.LEFT:
                return
            handle.state = _State.LEFT
            self._handles.pop(handle.worker_id, None)
            lost = list(handle.pending)
            handle.pending.clear()
            broken = [
                b for p in lost for b in self._abandon_peers_locked(p, f"was lost ({reason})")
            ]
            if cause is None:
                self._stats.retired += 1
                self._change_locked(Membership.RETIRED, handle)
            else:
                self._stats.lost[cause] = self._stats.lost.get(cause, 0) + 1
                if before >= _State.LOADING:  # JOINED was reported
                    self._change_locked(Membership.LOST, handle, reason)
                if before >= _State.READY:
                    self._rehome_locked(handle.partitions, f"lost worker {handle.worker_id}")
                else:
                    self._rehome_orphans_locked()
        if handle.channel is not None:
            handle.channel.close()
        if cause is None:
            logger.info("worker %s retired: %s", handle.worker_id, reason)
            handle.left("", None)
            return
        self._transport.kill(handle.worker_id)
        logger.warning("worker %s is lost: %s", handle.worker_id, reason)
        for pending in lost:
            if pending.op == "pack":
                trials = [t.trial_id for t in pending.tasks]
                where = f"partition {pending.tasks[0].partition}"
                what = f"while it ran the packed unit of trials {trials} ({where})"
            elif pending.op == "run" and pending.task is not None:
                what = f"while it ran the {describe(pending.task)}"
            else:
                stage = "while it loaded" if before >= _State.READY else "before it had loaded"
                what = f"{stage} partitions {list(pending.partitions)}"
            error = WorkerLostError(f"worker {handle.worker_id} was lost ({reason}) {what}")
            broken.append((pending.future, error))
        for future, exc in broken:
            _fail(future, exc)
        stage = "before it registered" if before == _State.STARTING else "before it was ready"
        handle.left(
            f"worker {handle.worker_id} was lost {stage}: {reason}",
            f"worker {handle.worker_id} was lost while retiring: {reason}",
        )

    def _retire_step(self, handle: _Handle, _done: object = None) -> None:
        """Stop a retiring worker once its unit and its partitions' new loads are done.

        If a re-home load failed, the retire is called off: the worker stays in service.
        """
        with self._lock:
            if handle.state != _State.RETIRING or not all(f.done() for f in handle.retire_loads):
                return
            failed = [load.exception() for load in handle.retire_loads if load.exception()]
            if not failed:
                if not handle.pending:  # its unit (or a load) is no longer in flight
                    handle.state = _State.STOPPING
                    _tell_stop(handle)  # if it fails, the loss path reports it
                return
            handle.state = _State.READY
            self._draining.discard(handle.executor_id or "")
            self._change_locked(Membership.READY, handle)
            retired, handle.retired = handle.retired, None
        error = RuntimeError(
            f"retiring worker {handle.worker_id} was called off: its partitions could not be "
            f"re-homed ({failed[0]}); it stays in service"
        )
        logger.error("%s", error)
        if retired is not None:
            _fail(retired, error)

    # -- placement -----------------------------------------------------------------------

    def _holdings_locked(self) -> list[tuple[str, set[int]]]:
        """The workers that take units, oldest first, with their partitions."""
        return [(w, h.partitions) for w, h in self._handles.items() if h.state == _State.READY]

    def _rehome_locked(self, partitions: Collection[int], whose: str) -> list[Future[Any]]:
        """Load the partitions no listed worker holds on the live workers holding fewest.

        ``whose``: the worker leaving (``"lost worker w1"``), which takes no unit any more.
        """
        holdings = self._holdings_locked()
        if not holdings and partitions:
            logger.error(
                "no live worker left to re-home partitions %s of %s; a joining worker will "
                "load every partition",
                sorted(partitions),
                whose,
            )
        loads: list[Future[Any]] = []
        for worker_id, moved in rehome(partitions, holdings).items():
            target = self._handles[worker_id]
            target.partitions.update(moved)
            self._change_locked(Membership.PARTITIONS, target)
            logger.warning("re-homing partitions %s of %s on worker %s", moved, whose, worker_id)
            loads.append(self._send_locked(target, "load", moved).future)
        return loads

    def _rehome_orphans_locked(self) -> None:
        """Re-home the partitions no worker holds, nor will hold once it is ready.

        A worker lost before it was ready takes its initial share with it (and a re-home
        load may have failed): those partitions go to the ready workers holding the fewest,
        or, while none is ready, to the first that becomes ready (which calls this again).
        """
        kept: set[int] = set()
        for handle in self._handles.values():
            if handle.state <= _State.READY:
                kept |= handle.partitions
        orphans = [p for p in range(self._num_partitions) if p not in kept]
        if orphans and self._holdings_locked():
            self._rehome_locked(orphans, "workers that left before they were ready")

    def _change_locked(self, kind: Membership, handle: _Handle, reason: str | None = None) -> None:
        """Queue a membership change for :meth:`changes`."""
        self._changes.append(WorkerChange(kind, handle.info(), reason))

    # -- monitor -------------------------------------------------------------------------

    def _locate(self, handle: _Handle, wait_s: float = 0.0) -> None:
        """Ask the transport where a registered worker runs, for up to ``wait_s`` seconds."""
        deadline = time.monotonic() + wait_s
        peer = handle.channel.peer.rsplit(":", 1)[0] if handle.channel is not None else ""
        while True:
            try:
                where = self._transport.locate(handle.worker_id, handle.registration, peer)
            except Exception:
                logger.debug("locating worker %s failed", handle.worker_id, exc_info=True)
                where = None
            if where is not None:
                with self._lock:
                    handle.host, handle.executor_id = where.host, where.executor_id
                    handle.located = True
                return
            if time.monotonic() >= deadline:
                return
            time.sleep(0.1)

    def _monitor_loop(self) -> None:
        """Ping workers, detect silent ones, locate new ones, start workers on arrivals."""
        next_ping = next_poll = time.monotonic()
        while not self._closed.wait(_TICK_S):
            try:
                now = time.monotonic()
                with self._lock:
                    live = [h for h in self._handles.values() if h.state >= _State.JOINING]
                    late = [
                        h
                        for h in self._handles.values()
                        if h.state == _State.STARTING and now - h.spawned_at > self._start_timeout_s
                    ]
                for handle in late:
                    self._unregistered(handle)
                for handle in live:
                    silent = now - handle.last_seen
                    if silent > self._heartbeat_timeout_s:
                        self._leave(
                            handle,
                            f"no message from it for {silent:.1f} s "
                            f"(heartbeat_timeout_s={self._heartbeat_timeout_s})",
                            cause="heartbeat",
                        )
                    elif not handle.located and now - handle.registered_at < _LOCATE_S:
                        self._locate(handle)
                if now >= next_ping:
                    next_ping = now + self._heartbeat_s
                    for handle in live:
                        if _State.LOADING <= handle.state <= _State.RETIRING and handle.channel:
                            with contextlib.suppress(OSError):
                                handle.channel.send({"op": "ping"})
                if now >= next_poll:
                    next_poll = now + self._poll_s
                    self._start_arrivals()
            except Exception:
                if self._closed.is_set():
                    return
                logger.exception("%s monitor failed", type(self).__name__)

    def _unregistered(self, handle: _Handle) -> None:
        """Lose a worker that did not register within ``start_timeout_s``."""
        with self._lock:
            if handle.state != _State.STARTING:
                return  # it registered meanwhile
            _fail(
                handle.ready,
                TimeoutError(
                    f"worker {handle.worker_id} did not register within start_timeout_s="
                    f"{self._start_timeout_s}: no free slot for its {self._transport.noun}, "
                    f"or it could not reach the driver's control server at {self._advertised}"
                ),
            )
        reason = f"it did not register within start_timeout_s={self._start_timeout_s}"
        self._leave(handle, reason, cause="start")

    def _start_arrivals(self) -> None:
        """Start workers for the capacity the transport says appeared."""
        with self._lock:
            if self._closed.is_set():
                return
            serving = sum(1 for h in self._handles.values() if h.state <= _State.READY)
            count = self._transport.arrivals(serving, self._draining)
            spawned = [self._spawn_locked(None).worker_id for _ in range(max(0, count))]
        if spawned:
            logger.info("new capacity appeared: started workers %s", spawned)


def _startup(handle: _Handle, value: Any) -> dict[str, float]:
    """A worker's start-up phases (:attr:`PoolStats.startup`) from its first load's value."""
    now = time.time()
    phases = {"launched": now - (time.monotonic() - handle.spawned_at)}
    reported = value.get("startup") if isinstance(value, Mapping) else None
    if isinstance(reported, Mapping):
        phases.update(
            (str(k), float(v))
            for k, v in reported.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        )
    phases["listed"] = now
    return phases


def _tell_stop(handle: _Handle) -> bool:
    """Send ``stop`` to a worker; whether it could be sent."""
    with contextlib.suppress(OSError):
        if handle.channel is not None:
            handle.channel.send({"op": "stop"})
            return True
    return False


def _pack_outcomes(
    worker_id: str, pending: _Pending, message: Mapping[str, Any]
) -> list[UnitResult | Exception]:
    """Each member's outcome from a ``pack``'s reply: its result, or its own error."""
    outcomes = message["value"]["members"]
    if not isinstance(outcomes, list) or len(outcomes) != len(pending.tasks):
        raise ValueError(
            f"a pack of {len(pending.tasks)} tasks was answered with {outcomes!r} outcomes"
        )
    out: list[UnitResult | Exception] = []
    for task, outcome in zip(pending.tasks, outcomes, strict=True):
        if outcome.get("ok"):
            out.append(UnitResult.from_json(outcome["value"]))
        else:
            out.append(error_from_json(outcome["error"], worker_id, "run", task, ()))
    return out


def _settle_pack(members: tuple[UnitFuture, ...], pack: Future[Any]) -> None:
    """Resolve a pack's member futures from the pack's command: its outcomes, or its error."""
    error = pack.exception()
    if error is not None:
        for member in members:
            _fail(member, error)
        return
    for member, outcome in zip(members, pack.result(), strict=True):
        if isinstance(outcome, BaseException):
            _fail(member, outcome)
        elif not member.done():
            member.set_result(outcome)


def _group_of(task: UnitTask | None) -> GroupSpec:
    """``task.group`` of a rank task (checked by ``check_group``)."""
    assert task is not None and task.group is not None  # ok: check_group
    return task.group


def _regroup(task: UnitTask | None, **changes: Any) -> UnitTask:
    """A rank task with fields of its group changed (its rendezvous address, port, token)."""
    assert task is not None  # ok: a rank
    return dataclasses.replace(task, group=dataclasses.replace(_group_of(task), **changes))


def check_worker_count(
    count: int, num_partitions: int, uri: str, name: str = "num_workers"
) -> None:
    """Refuse more workers than partitions (``name``: the setting that asked for them)."""
    if count > num_partitions:
        raise ConfigError(
            f"{name}={count} exceeds num_partitions={num_partitions} of dataset {uri}: "
            "a worker without a partition could never run a unit"
        )


def _shares(
    placement: Sequence[Collection[int]] | None, count: int, num_partitions: int
) -> list[list[int]]:
    """Each initial worker's partitions: ``placement`` (completed), else ``i mod n``."""
    if placement is None:
        return initial_shares(count, num_partitions)
    shares = [sorted({int(p) for p in share}) for share in placement]
    bad = sorted({p for share in shares for p in share if not 0 <= p < num_partitions})
    if bad or any(not share for share in shares):
        raise ConfigError(
            f"placement {[list(s) for s in placement]} must give every worker at least one "
            f"partition in range(num_partitions={num_partitions}); bad: {bad}"
        )
    holdings = [(str(i), set(share)) for i, share in enumerate(shares)]
    for index, missing in rehome(range(num_partitions), holdings).items():
        shares[int(index)] = sorted(shares[int(index)] + missing)
    return shares


def _summarise(exc: BaseException) -> str:
    """The first informative line of a (usually very long) Py4J error."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in lines:
        if "Exception" in line or "Error" in line:
            return line[:400]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:400]
