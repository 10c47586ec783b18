"""An in-memory fake transport for the WorkerPool, and a fake worker that needs no torch.

Each worker is a thread running the real worker loop (``serve``) over the real
authenticated control channel; :class:`FakeWorker` reads its partitions' files for real
(so ``bytes_read`` and the dataset URI are checked) but "trains" by hashing: a train
unit's checkpoint is the SHA-256 of its input checkpoint and the partitions it covers, so
digests show whether every trial trained on the right partitions in the right order. A
unit's params script what else it does (the keys of :meth:`FakeWorker.run`), and so may a
test's :attr:`Script.hook` (what a unit cannot say in its params: a failure for some
attempt of a group, a death while writing).

Tests reset the module's :data:`SCRIPT` (the ``script`` fixture of the test modules).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import Future, InvalidStateError
from typing import Any

from cerebro_spark.backends import TaskInfo, Transport, WorkerJob, WorkerSpec, serve
from cerebro_spark.errors import DataError, TrialError
from cerebro_spark.units import GroupBrokenError, UnitKind, UnitResult, UnitTask

RENDEZVOUS_PORT = 45678
"""The port every fake rank 0 announces."""


class Died(BaseException):
    """Raised in a fake worker to end its thread as a crash would."""


Hook = Callable[[str, UnitTask, str], None]
"""``hook(worker id, task, stage)``: see :attr:`Script.hook`."""


class Script:
    """What the fake workers do and saw; one per test."""

    def __init__(self) -> None:
        self.gates: dict[str, threading.Event] = {}
        self.started: list[tuple[str, UnitTask]] = []
        self.jobs: dict[str, WorkerJob] = {}
        self.killed: set[str] = set()
        self.failing_loads: set[str] = set()
        self.slow_loads: dict[str, float] = {}  # worker id: seconds its first load sleeps
        self.load_gates: dict[str, threading.Event] = {}  # worker id: its first load waits
        self.no_register: set[str] = set()  # worker ids that never start serving
        self.write_s = 0.0  # seconds every checkpoint write takes
        self.written: list[tuple[str, str]] = []  # (worker id, checkpoint key) as written
        self.prefetched: list[tuple[str, list[tuple[str, str]]]] = []  # (worker id, hints)
        self.hook: Hook | None = None
        """Called in the worker as a unit's pass starts (stage ``"pass"``: after rank 0
        announced its port and the unit's gate opened) and as its checkpoint write starts
        (``"write"``); it may sleep, raise an exception (the unit fails with it) or raise
        :class:`Died` (the worker dies)."""
        self.lock = threading.Lock()

    def gate(self, name: str) -> threading.Event:
        with self.lock:
            return self.gates.setdefault(name, threading.Event())

    def ran(self, worker: str) -> list[UnitTask]:
        with self.lock:
            return [task for who, task in self.started if who == worker]

    def release_all(self) -> None:
        for gate in list(self.gates.values()):
            gate.set()


SCRIPT = Script()


def reset() -> Script:
    """Start a fresh script (and release the gates of the last one)."""
    global SCRIPT
    SCRIPT.release_all()
    SCRIPT = Script()
    return SCRIPT


class FakeWorker:
    """Holds partitions (read for real) and runs scripted units."""

    def __init__(self, worker_id: str, job: WorkerJob, device: str) -> None:
        del device
        self.worker_id = worker_id
        self.job = job
        self.held: set[int] = set()
        self.bytes_read = 0
        with SCRIPT.lock:
            SCRIPT.jobs[worker_id] = job

    @property
    def partitions(self) -> frozenset[int]:
        return frozenset(self.held)

    def load(self, partitions: Collection[int]) -> int:
        from cerebro_spark.data import read_partition

        gate = SCRIPT.load_gates.pop(self.worker_id, None)
        while gate is not None and not gate.wait(0.05):
            if self.worker_id in SCRIPT.killed:
                raise Died(self.worker_id)
        time.sleep(SCRIPT.slow_loads.pop(self.worker_id, 0.0))
        if self.worker_id in SCRIPT.failing_loads:
            raise DataError(f"worker {self.worker_id} cannot read partitions {sorted(partitions)}")
        before = self.bytes_read
        for index in sorted(set(partitions) - self.held):
            for split in ("train", "validation"):
                self.bytes_read += read_partition(self.job.dataset_uri, split, index).bytes_read
            self.held.add(index)
        return self.bytes_read - before

    def drop(self, partitions: Collection[int]) -> None:
        self.held -= set(partitions)

    def prefetch(self, checkpoints: list[tuple[str, str]]) -> None:
        """Record a read-ahead hint (the real worker reads the checkpoints on a thread)."""
        with SCRIPT.lock:
            SCRIPT.prefetched.append((self.worker_id, list(checkpoints)))

    def run(self, task: UnitTask, on_rendezvous: Callable[[int], None] | None = None) -> UnitResult:
        """Run a unit; ``task.params`` may hold ``gate`` (wait for it), ``silent_rank0``
        (rank 0 never announces), ``die`` (this worker id dies), ``fail`` ({worker id:
        "trial" | "io" | "broken"})."""
        self._pass(task, on_rendezvous)
        blob = self._checkpoint(task)
        if blob is not None:
            self._write(task, blob)
        return self._result(task, blob)

    def train(self, task: UnitTask) -> FakeTrained:
        """An ordinary train unit in two steps, as the real worker's: the pass now, the
        checkpoint write in :meth:`FakeTrained.write` (``task.params`` as for :meth:`run`,
        and ``write_gate``: the write waits for it, ``write_fail``: {worker id: "io"})."""
        self._pass(task, None)
        blob = self._checkpoint(task)
        assert blob is not None  # ok: an ordinary train unit
        return FakeTrained(self, task, blob)

    def _pass(self, task: UnitTask, on_rendezvous: Callable[[int], None] | None) -> None:
        if task.partition not in self.held:
            raise ValueError(f"worker {self.worker_id} does not hold partition {task.partition}")
        with SCRIPT.lock:
            SCRIPT.started.append((self.worker_id, task))
        script = task.params
        group = task.group
        if group is not None and group.port == 0 and not script.get("silent_rank0"):
            assert on_rendezvous is not None and group.rank == 0
            on_rendezvous(RENDEZVOUS_PORT)
        gate = script.get("gate")
        if gate is not None:
            while not SCRIPT.gate(str(gate)).wait(0.05):
                if self.worker_id in SCRIPT.killed:
                    raise Died(self.worker_id)
        if SCRIPT.hook is not None:
            SCRIPT.hook(self.worker_id, task, "pass")
        if script.get("die") == self.worker_id or self.worker_id in SCRIPT.killed:
            raise Died(self.worker_id)
        failure = dict(script.get("fail", {})).get(self.worker_id)
        if failure == "trial":
            raise TrialError(f"user code failed on {self.worker_id}")
        if failure == "io":
            raise FileNotFoundError("no such checkpoint")
        if failure == "broken":
            raise GroupBrokenError("lost its peers")

    def _checkpoint(self, task: UnitTask) -> bytes | None:
        """The checkpoint a train unit writes (rank 0's for a group); ``None`` for others."""
        store = self.job.store
        if task.kind is UnitKind.TRAIN and (task.group is None or task.group.rank == 0):
            before = store.get(task.checkpoint_in) if task.checkpoint_in else b"init"
            covered = task.group.partitions if task.group else (task.partition,)
            return hashlib.sha256(before + repr((task.epoch, covered)).encode()).digest()
        if task.kind is UnitKind.VALIDATE and task.checkpoint_in is not None:
            store.get(task.checkpoint_in)  # it must exist
        return None

    def _write(self, task: UnitTask, blob: bytes) -> None:
        if SCRIPT.hook is not None:
            SCRIPT.hook(self.worker_id, task, "write")
        gate = task.params.get("write_gate")
        if gate is not None:
            while not SCRIPT.gate(str(gate)).wait(0.05):
                if self.worker_id in SCRIPT.killed:
                    raise Died(self.worker_id)
        time.sleep(SCRIPT.write_s)
        if self.worker_id in SCRIPT.killed:
            raise Died(self.worker_id)
        if dict(task.params.get("write_fail", {})).get(self.worker_id) == "io":
            raise OSError(f"no space left on the store, writing {task.checkpoint_out}")
        assert task.checkpoint_out is not None
        self.job.store.put(task.checkpoint_out, blob)
        with SCRIPT.lock:
            SCRIPT.written.append((self.worker_id, task.checkpoint_out))

    def metric_sums(self, task: UnitTask) -> dict[str, float]:
        """The row-weighted metric sums a unit reports (of its 10 rows); override to script."""
        del task
        return {"loss": 5.0, "accuracy": 9.0}

    def _result(self, task: UnitTask, blob: bytes | None) -> UnitResult:
        return UnitResult(
            task=task,
            worker_id=self.worker_id,
            rows=10,
            seconds=0.001,
            metric_sums=self.metric_sums(task),
            checkpoint_bytes=32 if blob else 0,
            checkpoint_sha256=hashlib.sha256(blob).hexdigest() if blob else None,
        )


class FakeTrained:
    """A fake train unit whose pass is done: :meth:`write` writes its checkpoint."""

    def __init__(self, worker: FakeWorker, task: UnitTask, blob: bytes) -> None:
        self.worker, self.task, self.blob = worker, task, blob

    def write(self) -> UnitResult:
        self.worker._write(self.task, self.blob)
        return self.worker._result(self.task, self.blob)


class ThreadTransport(Transport):
    """The in-memory fake transport: each worker is a thread running ``serve``.

    Args:
        make_worker: What each thread serves with (the real ``Worker`` too: then units
            train with torch, in this process).
    """

    def __init__(self, make_worker: Callable[[str, WorkerJob, str], Any] | None = None) -> None:
        self.make_worker = make_worker or FakeWorker
        self.ended: dict[str, Future[str]] = {}

    def launch(self, spec: WorkerSpec) -> Future[str]:
        ended: Future[str] = Future()
        self.ended[spec.worker_id] = ended

        def body() -> None:
            while spec.worker_id in SCRIPT.no_register:  # as a task that never gets a slot
                if spec.worker_id in SCRIPT.killed:
                    with contextlib.suppress(InvalidStateError):
                        ended.set_result("killed before it served")
                    return
                time.sleep(0.05)
            try:
                outcome = serve(spec, TaskInfo(), self.make_worker)
            except BaseException as exc:
                with contextlib.suppress(InvalidStateError):  # killed: it ended then
                    ended.set_exception(exc)
            else:
                with contextlib.suppress(InvalidStateError):
                    ended.set_result(outcome)

        threading.Thread(target=body, name=f"fake-{spec.worker_id}", daemon=True).start()
        return ended

    def kill(self, worker_id: str) -> None:
        """End the worker at once, as SIGKILL ends a process: its end is reported now (an
        idle worker too); a busy fake worker's thread stops at its next look."""
        SCRIPT.killed.add(worker_id)
        ended = self.ended.get(worker_id)
        if ended is not None:
            with contextlib.suppress(InvalidStateError):
                ended.set_result("killed")
