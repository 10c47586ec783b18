"""The worker's side of the control channel: register, then serve the driver's commands.

Every transport runs the same :func:`serve` (a Spark task, a worker process, a test
thread), so every backend speaks the production wire format (:mod:`._control`). A worker:

1. chooses its torch device (:func:`resolve_device`) from its spec and its :class:`TaskInfo`;
2. connects to the driver and sends ``register`` (``worker_id``, ``attempt``,
   ``task_attempt_id``, ``pid``, ``hostname``, ``device``, ``executor_hint``);
3. waits for ``welcome``, or ``refuse`` (``reason``): the driver's answer to a worker id
   that registered before, so a task attempt Spark retried after its executor died ends
   at once instead of serving as a ghost of a lost worker;
4. serves commands in order with a :class:`~._worker.Worker`: ``load`` and ``drop``
   (``id``, ``partitions``), ``run`` (``id``, ``task``: :meth:`UnitTask.to_json`),
   ``pack`` (``id``, ``tasks``: a packed unit, issue 27), each answered by a ``reply``
   (``id``, ``ok``, ``value`` or ``error``, ``state``: partitions held, bytes read);
   ``ping`` gets no answer, nor does ``prefetch`` (``checkpoints``: ``[[key, sha256],
   ...]``, the checkpoints its next units will likely read: read ahead while it trains,
   issue 27; the commands are read on a thread of their own, so a hint sent while the
   worker trains is taken at once). The value of the first ``load`` that
   succeeds is ``{"startup": {phase: time.time()}}``: when the worker's process started
   (``process``, where the OS says), :func:`serve` began (``serve``), it was connected
   (``connected``) and welcomed (``welcomed``), torch was imported (``torch``), its
   partitions were read (``partitions``) and it answered (``ready``). A ``pack``'s
   value is ``{"members": [...]}``, one ``{"ok", "value" or "error"}`` per task in
   task order: a member fails alone (its loss turned NaN, its checkpoint write failed),
   while an error of the whole pack is the reply's own. Meanwhile it
   sends a ``heartbeat`` every ``heartbeat_s``. Rank 0 of a group unit whose port is 0
   binds the rendezvous port and sends ``rendezvous`` (``id`` of the ``run``, ``port``)
   before it waits for its peers;
5. ends on ``stop``, when the connection closes, or when the driver was silent (no
   ``ping``) for ``driver_timeout_s``.

This module imports neither torch nor pyspark.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import queue
import re
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from cerebro_spark.backends._base import WorkerJob
from cerebro_spark.backends._control import (
    Channel,
    ProtocolError,
    connect,
    error_to_json,
)
from cerebro_spark.backends._worker import Worker
from cerebro_spark.errors import ConfigError
from cerebro_spark.units import UnitResult, UnitTask

logger = logging.getLogger(__name__)

_STANDALONE_WORK_DIR = re.compile(
    r"/app-[0-9]+-[0-9]+/([0-9]+)(?:/[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12})?/?$"
)

# How a worker ended (what serve returns).
STOPPED = "stopped"
REFUSED = "refused"
DRIVER_GONE = "driver-gone"
DRIVER_SILENT = "driver-silent"
REJECTED = "rejected"


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to start; handed to it by its transport.

    Attributes:
        worker_id: The worker's id (``"w0"`` ...).
        driver_host: Address of the driver's control server.
        driver_port: Its port.
        secret: The per-experiment HMAC secret (not shown in ``repr``).
        job: Dataset and store of the experiment, torch thread count.
        device: Torch device to use (:func:`resolve_device`): ``None`` or ``"auto"``
            chooses from the task's resources, ``"cuda"`` too but requires a GPU,
            ``"cpu"`` and ``"cuda:N"`` are used as given.
        heartbeat_s: Seconds between heartbeats to the driver.
        driver_timeout_s: Seconds of driver silence after which the worker ends.
        connect_timeout_s: Seconds to keep trying to reach the driver.
    """

    worker_id: str
    driver_host: str
    driver_port: int
    secret: bytes = dataclasses.field(repr=False)
    job: WorkerJob
    device: str | None = None
    heartbeat_s: float = 5.0
    driver_timeout_s: float = 60.0
    connect_timeout_s: float = 60.0


@dataclasses.dataclass(frozen=True)
class TaskInfo:
    """What a worker knows about itself from where it runs.

    Attributes:
        attempt: Spark's attempt number of the task (0 first, higher when retried).
        task_attempt_id: Spark's unique task attempt id (locates the executor).
        resources: Resource name to addresses (``{"gpu": ["0"]}``).
    """

    attempt: int = 0
    task_attempt_id: int = -1
    resources: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


class _Served(Protocol):
    """What :func:`serve` needs of a worker (:class:`~._worker.Worker`, or a test fake)."""

    @property
    def partitions(self) -> frozenset[int]: ...
    @property
    def bytes_read(self) -> int: ...
    def load(self, partitions: Collection[int]) -> int: ...
    def drop(self, partitions: Collection[int]) -> None: ...
    def run(self, task: UnitTask, on_rendezvous: Callable[[int], None] | None) -> UnitResult: ...


def choose_device(resources: Mapping[str, Iterable[str]]) -> str:
    """Return ``cuda:<first gpu address>`` for a task given a ``gpu`` resource, else ``cpu``.

    Spark gives a task the GPUs of ``spark.task.resource.gpu.amount``;
    :class:`~._local.LocalTransport` gives each worker process one of the GPUs torch sees.

    Raises:
        ConfigError: A GPU address is not a non-negative integer.
    """
    addresses = [str(a) for a in resources.get("gpu", ())]
    if not addresses:
        return "cpu"
    first = addresses[0].strip()
    if not first.isdigit():
        raise ConfigError(
            f"Spark gave this task GPU addresses {addresses}; the first must be a CUDA "
            "device index (a non-negative integer, as the GPU discovery script reports)"
        )
    return f"cuda:{int(first)}"


def resolve_device(device: str | None, resources: Mapping[str, Iterable[str]]) -> str:
    """Return the torch device a worker trains on.

    Args:
        device: What the experiment asked for (``ExperimentConfig.device``): ``None`` or
            ``"auto"``: the task's GPU if it was given one, else the CPU; ``"cuda"``: the
            task's GPU, which it must have been given; ``"cpu"`` or ``"cuda:N"``: that.
        resources: The task's resources (:attr:`TaskInfo.resources`).

    Raises:
        ConfigError: ``"cuda"`` for a task given no GPU, or a GPU address that is not an
            index.
    """
    if device is None or device in ("auto", "cuda"):
        chosen = choose_device(resources)
        if device == "cuda" and chosen == "cpu":
            raise ConfigError(
                "device 'cuda': this worker was given no GPU (Spark: set "
                "spark.executor.resource.gpu.amount and spark.task.resource.gpu.amount; "
                "local: torch sees no GPU); use device 'auto' to train on the CPU then"
            )
        return chosen
    return device


def executor_hint(environ: Mapping[str, str], cwd: str) -> str | None:
    """Guess the executor id from inside the task (the driver asks Spark first).

    From ``SPARK_EXECUTOR_ID`` (Kubernetes), else the standalone work directory
    ``<work-dir>/app-<id>/<executor id>``, or under Spark Connect the session's directory
    inside it, ``<work-dir>/app-<id>/<executor id>/<session uuid>`` (Spark's artifact
    isolation runs each session's Python workers there).
    """
    if environ.get("SPARK_EXECUTOR_ID"):
        return environ["SPARK_EXECUTOR_ID"]
    match = _STANDALONE_WORK_DIR.search(cwd)
    return match.group(1) if match else None


def _connect(spec: WorkerSpec) -> Channel:
    """Connect to the driver, retrying until ``connect_timeout_s`` has passed."""
    deadline = time.monotonic() + spec.connect_timeout_s
    delay = 0.1
    while True:
        try:
            return connect(
                spec.driver_host,
                spec.driver_port,
                spec.secret,
                timeout_s=min(10.0, spec.connect_timeout_s),
            )
        except OSError as exc:
            if time.monotonic() + delay > deadline:
                raise ConnectionError(
                    f"worker {spec.worker_id} could not reach the driver's control server at "
                    f"{spec.driver_host}:{spec.driver_port} within {spec.connect_timeout_s} s: "
                    f"{exc}"
                ) from exc
            time.sleep(delay)
            delay = min(2.0, delay * 2)


def serve(
    spec: WorkerSpec,
    info: TaskInfo,
    make_worker: Callable[[str, WorkerJob, str], _Served] = Worker,
) -> str:
    """Register with the driver and serve its commands until told to stop.

    Args:
        spec: The worker's spec.
        info: What the host says about this worker (Spark's task context, or defaults).
        make_worker: Builds the worker from ``(worker id, job, device)``.

    Returns:
        Why the worker ended: ``"stopped"``, ``"refused"``, ``"driver-gone"``,
        ``"driver-silent"`` or ``"rejected"`` (the driver's message failed a check).

    Raises:
        ConnectionError: The driver could not be reached (Spark may retry the task).
    """
    startup = {"serve": time.time()}
    started = process_start_time()
    if started is not None:
        startup["process"] = started
    device = resolve_device(spec.device, info.resources)
    worker = make_worker(spec.worker_id, spec.job, device)
    warm_up = getattr(worker, "warm_up", None)
    if callable(warm_up):
        warm_up()  # torch is imported while we connect and read the partitions
    channel = _connect(spec)
    startup["connected"] = time.time()
    try:
        channel.settimeout(spec.driver_timeout_s)
        channel.send(
            {
                "op": "register",
                "worker_id": spec.worker_id,
                "attempt": info.attempt,
                "task_attempt_id": info.task_attempt_id,
                "pid": os.getpid(),
                "hostname": socket.gethostname(),
                "device": device,
                "executor_hint": executor_hint(os.environ, os.getcwd()),
            }
        )
        answer = channel.recv()
        if answer["op"] == "refuse":
            logger.warning(
                "worker %s (task attempt %d) was refused by the driver: %s",
                spec.worker_id,
                info.attempt,
                answer.get("reason"),
            )
            return REFUSED
        if answer["op"] != "welcome":
            logger.warning("worker %s: expected welcome, got %r", spec.worker_id, answer["op"])
            return REJECTED
        startup["welcomed"] = time.time()
        return _serve_commands(spec, channel, worker, startup)
    except ProtocolError:
        return REJECTED
    except TimeoutError:
        logger.warning(
            "worker %s: the driver was silent for %s s; exiting",
            spec.worker_id,
            spec.driver_timeout_s,
        )
        return DRIVER_SILENT
    except OSError:
        return DRIVER_GONE
    finally:
        channel.close()


def _serve_commands(
    spec: WorkerSpec, channel: Channel, worker: _Served, startup: dict[str, float] | None = None
) -> str:
    """Answer the driver's commands until ``stop``; send heartbeats meanwhile.

    ``startup`` (phase times so far) goes with the first ``load`` that succeeds.
    """
    stop = threading.Event()
    beat = threading.Thread(
        target=_heartbeat,
        args=(channel, spec.heartbeat_s, stop),
        name=f"cerebro-heartbeat-{spec.worker_id}",
        daemon=True,
    )
    beat.start()
    writer = _Writer(spec.worker_id, worker, channel)
    inbox = _Inbox(spec.worker_id, channel, getattr(worker, "prefetch", None))
    try:
        while True:
            message = inbox.next()
            op = message["op"]
            if op == "stop":
                writer.wait()  # the last checkpoint is durable and reported first
                logger.info("worker %s stops", spec.worker_id)
                return STOPPED
            if writer.takes(message):
                writer.train(message)
                continue
            reply = _execute(worker, message, channel)
            if startup is not None and op == "load" and reply["ok"]:
                reply["value"] = {"startup": _startup_phases(worker, startup)}
                startup = None
            writer.wait()  # replies go in the order of the commands
            channel.send(reply)
    finally:
        stop.set()
        writer.close()
        channel.close()
        beat.join(timeout=spec.heartbeat_s + 5.0)
        stop_prefetching = getattr(worker, "stop_prefetching", None)
        if callable(stop_prefetching):
            stop_prefetching()
        worker.drop(worker.partitions)  # a reused Python worker must not keep the data


class _Inbox:
    """The driver's commands, read on a thread of their own while the worker trains.

    A ``prefetch`` (``checkpoints``: ``[[store key, SHA-256], ...]``, no reply) is handed
    to the worker's ``prefetch`` as soon as it arrives, so that the checkpoints of its
    next units are read while it trains (issue 27); a ``ping`` is dropped; every other
    command waits in order for :meth:`next`. What ended the reading (the connection
    closed or failed, a frame failed a check, the driver was silent past the socket's
    timeout) is raised by :meth:`next` once the commands before it were taken.
    """

    def __init__(
        self,
        worker_id: str,
        channel: Channel,
        prefetch: Callable[[list[tuple[str, str]]], None] | None,
    ) -> None:
        self._channel = channel
        self._prefetch = prefetch
        self._queue: queue.SimpleQueue[dict[str, Any] | BaseException] = queue.SimpleQueue()
        threading.Thread(target=self._read, name=f"cerebro-inbox-{worker_id}", daemon=True).start()

    def next(self) -> dict[str, Any]:
        """The next command (``prefetch`` and ``ping`` are not given out).

        Raises:
            OSError: What ended the reading (``ProtocolError``, ``TimeoutError``, ...).
        """
        item = self._queue.get()
        if isinstance(item, BaseException):
            self._queue.put(item)  # every later call raises it too
            raise item
        return item

    def _read(self) -> None:
        while True:
            try:
                message = self._channel.recv()
            except BaseException as error:
                self._queue.put(error)
                return
            op = message["op"]
            if op == "ping":
                continue
            if op == "prefetch":
                self._hint(message)
                continue
            self._queue.put(message)

    def _hint(self, message: Mapping[str, Any]) -> None:
        if self._prefetch is None:
            return
        try:
            hints = [(str(key), str(sha)) for key, sha in message.get("checkpoints", ())]
            self._prefetch(hints)
        except Exception as error:  # a hint is never worth the worker
            logger.info("ignoring a prefetch hint %r: %s", message.get("checkpoints"), error)


class _Writer:
    """Writes a train unit's checkpoint while the worker trains the next unit.

    For a ``run`` of an ordinary train unit, the worker trains the pass (the checkpoint
    taken, not encoded, nothing written), then sends ``trained`` (``id``): it is free for
    its next command, while this writer's thread encodes and writes the checkpoint and
    only then sends the unit's ``reply``. One write is in flight at a time: a unit trained
    meanwhile waits for it before it is reported trained, and every other reply waits for
    it, so replies keep the order of their commands. A worker without ``train`` (a test
    fake) runs every unit whole.
    """

    def __init__(self, worker_id: str, worker: _Served, channel: Channel) -> None:
        self._worker = worker
        self._channel = channel
        self._train: Callable[[UnitTask], Any] | None = getattr(worker, "train", None)
        self._train_pack: Callable[[list[UnitTask]], list[Any]] | None = getattr(
            worker, "train_pack", None
        )
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"cerebro-write-{worker_id}")
        self._writing: Future[None] | None = None

    def takes(self, message: Mapping[str, Any]) -> bool:
        """Whether ``message`` is a ``run`` or ``pack`` to train and write in two steps."""
        if message["op"] == "pack":
            return True  # a worker that cannot pack says so in the reply
        if self._train is None or message["op"] != "run":
            return False
        task = message.get("task")
        return isinstance(task, Mapping) and task.get("kind") == "train" and not task.get("group")

    def train(self, message: Mapping[str, Any]) -> None:
        """Train the unit; report it ``trained``, then (once written) its ``reply``."""
        command_id = message.get("id")
        try:
            trained: Any
            if message["op"] == "pack":
                if self._train_pack is None:
                    raise ValueError(f"worker {type(self._worker).__name__} cannot run packs")
                trained = _Pack(self._train_pack([UnitTask.from_json(t) for t in message["tasks"]]))
            else:
                assert self._train is not None  # ok: takes() said so
                trained = self._train(UnitTask.from_json(message["task"]))
        except Exception as exc:
            self.wait()
            self._channel.send(self._reply(command_id, False, error_to_json(exc)))
            return
        self.wait()
        self._channel.send({"op": "trained", "id": command_id})
        self._writing = self._pool.submit(self._write, command_id, trained)

    def wait(self) -> None:
        """Wait until the write in flight, if any, is done and its reply sent."""
        writing, self._writing = self._writing, None
        if writing is not None:
            writing.result()  # a failed send: the connection is gone, as recv will say

    def close(self) -> None:
        """Finish the write in flight, if any (whatever the connection's state)."""
        with contextlib.suppress(Exception):
            self.wait()
        self._pool.shutdown(wait=True)

    def _write(self, command_id: Any, trained: Any) -> None:
        try:
            reply = self._reply(command_id, True, trained.write().to_json())
        except Exception as exc:
            reply = self._reply(command_id, False, error_to_json(exc))
        except BaseException:  # the worker cannot go on: the driver is to see it lost
            self._channel.close()
            raise
        self._channel.send(reply)

    def _reply(self, command_id: Any, ok: bool, value: Any) -> dict[str, Any]:
        reply: dict[str, Any] = {"op": "reply", "id": command_id, "ok": ok}
        reply["value" if ok else "error"] = value
        reply["state"] = _state(self._worker)
        return reply


class _Pack:
    """A trained pack: each member's trained unit, or the error that failed it alone."""

    def __init__(self, members: list[Any]) -> None:
        self._members = members

    def write(self) -> _Pack:
        """Write each member's checkpoint (a failed write fails that member alone)."""
        self._outcomes: list[dict[str, Any]] = []
        for member in self._members:
            try:
                if isinstance(member, BaseException):
                    raise member
                self._outcomes.append({"ok": True, "value": member.write().to_json()})
            except Exception as exc:
                self._outcomes.append({"ok": False, "error": error_to_json(exc)})
        return self

    def to_json(self) -> dict[str, Any]:
        """The reply's value: ``{"members": [...]}``."""
        return {"members": self._outcomes}


def _startup_phases(worker: _Served, startup: dict[str, float]) -> dict[str, float]:
    """The worker's start-up phases (its own and the worker's), in time order, and ``ready``."""
    phases = dict(startup)
    own = getattr(worker, "startup", None)
    if isinstance(own, dict):
        phases.update(own)
    phases["ready"] = time.time()
    return dict(sorted(phases.items(), key=lambda item: item[1]))


def process_start_time() -> float | None:
    """When this process started (``time.time()`` scale), from ``/proc``; ``None`` elsewhere.

    In a Spark task whose Python worker was reused (``spark.python.worker.reuse``) or
    forked from Spark's Python daemon, this is that process's start.
    """
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as uptime:
            boot = time.time() - float(uptime.read().split()[0])  # 10 ms, not btime's 1 s
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # starttime: field 22
    except (OSError, ValueError, IndexError):
        return None


def _heartbeat(channel: Channel, interval_s: float, stop: threading.Event) -> None:
    """Send a heartbeat every ``interval_s`` until ``stop``."""
    while not stop.wait(interval_s):
        try:
            channel.send({"op": "heartbeat"})
        except OSError:
            return


def _execute(worker: _Served, message: Mapping[str, Any], channel: Channel) -> dict[str, Any]:
    """Run one command on ``worker`` and return its ``reply`` message."""
    command_id = message.get("id")
    reply: dict[str, Any] = {"op": "reply", "id": command_id, "ok": True, "value": None}

    def announce(port: int) -> None:
        channel.send({"op": "rendezvous", "id": command_id, "port": port})

    try:
        op = message["op"]
        if op == "load":
            worker.load([int(p) for p in message["partitions"]])
        elif op == "drop":
            worker.drop([int(p) for p in message["partitions"]])
        elif op == "run":
            reply["value"] = worker.run(UnitTask.from_json(message["task"]), announce).to_json()
        else:
            raise ValueError(f"unknown control command {op!r}")
    except Exception as exc:
        reply = {"op": "reply", "id": command_id, "ok": False, "error": error_to_json(exc)}
    reply["state"] = _state(worker)
    return reply


def _state(worker: _Served) -> dict[str, Any]:
    """A reply's ``state``: the partitions the worker holds and the bytes it read."""
    return {"partitions": sorted(worker.partitions), "bytes_read": worker.bytes_read}
