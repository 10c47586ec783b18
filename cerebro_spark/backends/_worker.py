"""The backend-agnostic worker: holds partitions in memory and runs units on them.

A :class:`Worker` runs inside a worker process or a long-lived Spark task, and knows
nothing about either: it reads the dataset's manifest once, loads the train **and**
validation split of every partition index it is given (Cerebro §3.1: the data stays, the
models hop), and runs each unit on the partition it names; a task with ``task.group`` is
one rank of a group unit (Cerebro §5.7, :func:`cerebro_spark.training.run_group_unit`).

**Memory.** ``job.worker_memory`` bounds the bytes of held partitions the worker keeps in
RAM (default: :func:`~cerebro_spark.data._residence.default_worker_memory`); a partition
read beyond it is written once to local disk and, while a unit reads it, streamed from a
memory mapping (:class:`~cerebro_spark.data._residence.Residence`). Either way each
partition is read from the store once; :attr:`Worker.bytes_read` counts only store bytes.
Dropping a partition removes its local file; :meth:`Worker.close` (or dropping everything,
as ``serve`` does when a worker ends) removes the worker's local directory. A new worker
removes the local directories that dead workers (killed by ``SIGKILL``, say) left beside
its own (:func:`~cerebro_spark.data._residence.sweep_stale`).

**An address-space limit** (``RLIMIT_AS``: PySpark sets it from
``spark.executor.pyspark.memory``): the worker imports PyTorch before it reads any
partition and, without ``job.worker_memory``, then takes at most half of the address space left
as its budget; what does not fit the limit (PyTorch, a partition read or mapped) fails
with a :class:`~cerebro_spark.errors.ConfigError` that names the limit and the setting.

**Start-up.** Importing torch and ``torch._dynamo`` takes seconds: more than connecting
to the driver and reading a few partitions. A worker starts both imports in a thread as
soon as it is made (:meth:`Worker.warm_up`) and reads its partitions meanwhile; its
first ``load`` is answered once both are done, so its first unit has no import delay.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import pyarrow as pa

from cerebro_spark.backends._base import WorkerJob
from cerebro_spark.data import read_manifest, read_partition
from cerebro_spark.data._residence import (
    TORCH_ADDRESS_SPACE,
    Residence,
    address_space_error,
    address_space_limit,
    check_address_space,
    default_worker_memory,
    format_bytes,
    is_out_of_address_space,
)
from cerebro_spark.errors import TrialError
from cerebro_spark.units import UnitKind, UnitResult, UnitTask

if TYPE_CHECKING:
    from cerebro_spark.data import Manifest, PartitionData
    from cerebro_spark.training import TrainedUnit

logger = logging.getLogger(__name__)

_SPLITS = ("train", "validation")
_READ_THREADS = 4  # files read at once: pyarrow fetches and decodes without the GIL
_SPLIT_OF_KIND = {UnitKind.TRAIN: "train", UnitKind.VALIDATE: "validation"}


class Worker:
    """Holds partitions of one prepared dataset and runs units on them, one at a time.

    Args:
        worker_id: The worker's id, reported in every :class:`UnitResult`.
        job: Where the dataset and the checkpoint store are, the torch thread count and
            the memory budget (``job.worker_memory``).
        device: Torch device units train on.
        spill_dir: Parent of the worker's local directory for spilled partitions
            (default: ``SPARK_LOCAL_DIRS``' first entry, else the temp dir).
    """

    def __init__(
        self, worker_id: str, job: WorkerJob, device: str = "cpu", *, spill_dir: str | None = None
    ) -> None:
        self._worker_id = worker_id
        self._job = job
        self._device = device
        self._manifest: Manifest | None = None
        # Under an address-space limit PyTorch is imported before any partition is read,
        # and the default budget is what is left then: set by the first load.
        self._limited = address_space_limit() is not None
        self._budget_pending = job.worker_memory is None and self._limited
        if job.worker_memory is not None:
            budget, rule = job.worker_memory, "worker_memory of its job"
        else:
            budget, rule = default_worker_memory()
        self._residence = Residence(worker_id, budget, directory=spill_dir)
        for stale in self._residence.sweep():
            logger.warning(
                "worker %s removed %s, the local directory a dead worker left behind",
                worker_id,
                stale,
            )
        if not self._budget_pending:
            self._log_budget(budget, rule)
        self._bytes_read = 0
        self._torch_ready = False
        self._warming: Future[None] | None = None  # the warm-up, until a unit waited for it
        self._prefetching: ThreadPoolExecutor | None = None  # reads checkpoints ahead
        self.startup: dict[str, float] = {}
        """When each start-up phase ended (``time.time()``): ``torch`` (imported and
        warmed up), ``partitions`` (the first load's partitions read)."""

    @property
    def manifest(self) -> Manifest:
        """The dataset's manifest, read from storage on first use only."""
        if self._manifest is None:
            self._manifest = read_manifest(self._job.dataset_uri)
        return self._manifest

    def _log_budget(self, budget: int, rule: str) -> None:
        logger.info(
            "worker %s keeps up to %s of partitions in memory (%s); the rest is spilled to %s",
            self._worker_id,
            format_bytes(budget),
            rule,
            self._residence.parent,
        )

    @property
    def partitions(self) -> frozenset[int]:
        """Indices of the partitions held (in memory or on local disk)."""
        return frozenset(index for _, index in self._residence.partitions())

    @property
    def bytes_read(self) -> int:
        """Bytes of partition data read from storage so far (dropping does not reduce it).

        Only the store's bytes: reading a spilled partition's local file does not count.
        """
        return self._bytes_read

    @property
    def memory_budget(self) -> int:
        """Bytes of held partitions kept in RAM at most."""
        return self._residence.budget

    @property
    def held_bytes(self) -> int:
        """Bytes of partitions held in RAM."""
        return self._residence.held_bytes

    @property
    def spilled_bytes(self) -> int:
        """Bytes of spilled partitions' local files."""
        return self._residence.spilled_bytes

    @property
    def spill_directory(self) -> str | None:
        """The worker's local directory of spilled partitions (``None`` when none is)."""
        return self._residence.directory

    def spilled(self) -> list[tuple[str, int]]:
        """``(split, index)`` of every partition held on local disk, sorted."""
        return self._residence.spilled()

    def load(self, partitions: Collection[int]) -> int:
        """Read both splits of every partition not yet held; return the bytes read.

        The files are read by up to four threads at once (an object store's latency, the
        Parquet decoding and the hash check overlap; fewer when the partitions do not fit
        the memory budget, so that partitions in flight stay small beside it). Each is
        kept in RAM while the held bytes fit ``job.worker_memory``, else written to local
        disk as it is read. Either every requested partition ends up held or, when a read
        fails, none of this call's partitions do (the bytes read still count in
        :attr:`bytes_read`, local files are removed) and the first failure, in partition
        order, is raised. Under an address-space limit PyTorch is imported first (and the
        default budget then set).

        Raises:
            ValueError: An index is outside ``range(num_partitions)``.
            ConfigError: PyTorch or a partition does not fit the address-space limit.
        """
        manifest = self.manifest
        wanted = sorted(set(partitions))
        for index in wanted:
            if not 0 <= index < manifest.num_partitions:
                raise ValueError(
                    f"worker {self._worker_id}: partition {index} is outside "
                    f"range(num_partitions={manifest.num_partitions}) of dataset "
                    f"{manifest.dataset_id}"
                )
        if self._limited:
            self._prepare_torch()  # PyTorch's share of the address space is taken first
        if self._budget_pending:
            budget, rule = default_worker_memory()
            self._residence.budget = budget
            self._budget_pending = False
            self._log_budget(budget, rule)
        residence = self._residence
        keys = [(s, i) for i in wanted if not residence.holds("train", i) for s in _SPLITS]
        loaded: list[tuple[str, int]] = []
        before = self._bytes_read
        if keys:
            uri = self._job.dataset_uri
            read_bytes: dict[tuple[str, int], int] = {}

            def read_one(split: str, index: int) -> None:
                data = read_partition(uri, split, index, manifest=manifest)
                read_bytes[split, index] = data.bytes_read
                residence.admit(data)
                del data
                # Decoding Parquet lists takes many times the file's bytes for a moment;
                # Arrow's allocator keeps what was freed unless told to give it back.
                pa.default_memory_pool().release_unused()

            with ThreadPoolExecutor(self._read_threads(keys)) as pool:
                reads = {key: pool.submit(read_one, *key) for key in keys}
            for key, future in reads.items():  # every read has ended: count what was read
                self._bytes_read += read_bytes.get(key, 0)
                if future.exception() is None:
                    loaded.append(key)
            if len(loaded) < len(reads):
                for key in loaded:
                    residence.discard(*key)
            for key, future in reads.items():  # the first failure, in partition order
                self._raise_read_error(key, future.exception())
        self.startup.setdefault("partitions", time.time())
        try:
            self._prepare_torch()  # the warm-up ran while the partitions were read
        except BaseException:
            for key in loaded:  # a worker without torch holds none of this load's partitions
                residence.discard(*key)
            raise
        read = self._bytes_read - before
        if loaded:
            indices = sorted({index for _, index in loaded})
            logger.info(
                "worker %s loaded partitions %s (%d bytes read; %d bytes held in memory, "
                "%d bytes on local disk)",
                self._worker_id,
                indices,
                read,
                self.held_bytes,
                self.spilled_bytes,
            )
        return read

    def _raise_read_error(self, key: tuple[str, int], error: BaseException | None) -> None:
        """Raise a read's error; one of running out of address space names the limit."""
        if error is None:
            return
        limit = address_space_limit()
        if limit is not None and is_out_of_address_space(error):
            raise address_space_error(
                f"worker {self._worker_id} cannot read its {key[0]} partition {key[1]}",
                limit,
                error,
                context=(
                    f" ({format_bytes(self.held_bytes)} of partitions kept in RAM, "
                    f"worker_memory {format_bytes(self.memory_budget)})"
                ),
                also="lower worker_memory so that fewer partitions stay in RAM",
            ) from error
        raise error

    def _read_threads(self, keys: Collection[tuple[str, int]]) -> int:
        """Read threads: up to four, fewer when partitions in flight would crowd the budget.

        A partition being read takes about twice its file's bytes (the file and its
        arrays); when the partitions do not all fit the budget, at most a third of the
        budget is spent on reads in flight.
        """
        manifest = self.manifest
        sizes = [manifest.partition(split, index).bytes for split, index in keys]
        threads = min(_READ_THREADS, len(sizes))
        budget = self._residence.budget - self._residence.held_bytes
        if 2 * sum(sizes) > budget:
            threads = min(threads, max(1, budget // (6 * max(sizes, default=1))))
        return max(1, threads)

    def drop(self, partitions: Collection[int]) -> None:
        """Release the given partitions (indices not held are ignored); remove local files."""
        for index in partitions:
            for split in _SPLITS:
                self._residence.discard(split, index)

    def close(self) -> None:
        """Drop every partition and remove the worker's local directory."""
        self.stop_prefetching()
        self._residence.close()

    def stop_prefetching(self) -> None:
        """Drop the hints not started; wait for the read ahead in flight, if any."""
        if self._prefetching is not None:
            self._prefetching.shutdown(wait=True, cancel_futures=True)
            self._prefetching = None

    def prefetch(self, checkpoints: Collection[tuple[str, str]]) -> None:
        """Read these checkpoints (store key, SHA-256) ahead, on a thread of their own.

        The driver's hint of what the worker's next units will likely restore (issue 27
        part 3): each is read, verified and decoded into the worker's checkpoint cache
        (:func:`~cerebro_spark.training.prefetch_checkpoint`) while the worker trains, in
        the order given, one at a time. Returns at once; a read that fails is only
        logged (the unit that needs it reads the store itself). Nothing is read before
        PyTorch is imported (a worker still starting takes no hint).
        """
        if not self._torch_ready or not checkpoints:
            return
        if self._prefetching is None:
            self._prefetching = ThreadPoolExecutor(
                1, thread_name_prefix=f"cerebro-prefetch-{self._worker_id}"
            )
        for key, sha256 in checkpoints:
            self._prefetching.submit(self._prefetch_one, key, sha256)

    def _prefetch_one(self, key: str, sha256: str) -> None:
        from cerebro_spark.training import prefetch_checkpoint  # torch: imported already

        try:
            prefetch_checkpoint(self._job.store, key, sha256)
        except Exception as error:  # the unit reads it itself and reports a failure
            logger.info("worker %s could not read %s ahead: %s", self._worker_id, key, error)

    def run(self, task: UnitTask, on_rendezvous: Callable[[int], None] | None = None) -> UnitResult:
        """Run one unit on the held partition of the split its kind reads.

        Args:
            task: The unit; ``task.partition`` must be held. With ``task.group`` it is one
                rank of a group unit and blocks until the other ranks join.
            on_rendezvous: For rank 0 of a group unit whose port is 0: told the port it
                bound on this host, for the backend to pass on to the peers.

        Raises:
            ValueError: The partition is not held by this worker.
            cerebro_spark.errors.TrialError: The trial's user code raised.
            cerebro_spark.units.GroupBrokenError: A group unit's peer was lost.
        """
        # torch: the training room imports it; the pool (and its fast tests) stay without
        from cerebro_spark.training import run_group_unit, run_unit

        with self._held(task) as data:
            args = (task, data, self._job.store, self.manifest.info)
            if task.group is not None:
                return run_group_unit(
                    *args,
                    worker_id=self._worker_id,
                    device=self._device,
                    on_rendezvous=on_rendezvous,
                )
            return run_unit(*args, worker_id=self._worker_id, device=self._device)

    def train(self, task: UnitTask) -> TrainedUnit:
        """Train one ordinary train unit; its checkpoint is written by ``.write()`` later.

        Raises:
            ValueError: The task is not an ordinary train unit, or its partition is not
                held by this worker.
            cerebro_spark.errors.TrialError: The trial's user code raised.
        """
        if task.kind is not UnitKind.TRAIN or task.group is not None:
            raise ValueError(f"worker {self._worker_id}: only an ordinary train unit trains alone")
        from cerebro_spark.training import train_unit  # torch: as in run()

        with self._held(task) as data:
            return train_unit(
                task,
                data,
                self._job.store,
                self.manifest.info,
                worker_id=self._worker_id,
                device=self._device,
            )

    def train_pack(self, tasks: list[UnitTask]) -> list[TrainedUnit | TrialError]:
        """Train a packed unit (issue 27); each checkpoint is written by ``.write()`` later.

        Returns:
            Per task, in order: its trained unit, or the error that failed its trial alone.

        Raises:
            ConfigError: The tasks cannot form a pack.
            ValueError: Their partition is not held by this worker.
            cerebro_spark.errors.TrialError: Code the pack shares raised (every trial).
        """
        from cerebro_spark.training import train_pack  # torch: as in run()

        with self._held(tasks[0]) as data:
            return train_pack(
                tasks,
                data,
                self._job.store,
                self.manifest.info,
                worker_id=self._worker_id,
                device=self._device,
            )

    @contextlib.contextmanager
    def _held(self, task: UnitTask) -> Iterator[PartitionData]:
        """The held partition ``task`` reads, with torch ready (a spilled one mapped)."""
        split = _SPLIT_OF_KIND[task.kind]
        if not self._residence.holds(split, task.partition):
            raise ValueError(
                f"worker {self._worker_id} does not hold partition {task.partition} "
                f"(holds {sorted(self.partitions)})"
            )
        self._prepare_torch()
        with self._residence.partition(split, task.partition) as data:
            yield data

    def warm_up(self) -> None:
        """Start importing torch and the unit code in a background thread (once).

        :meth:`load` and :meth:`run` wait for it; an import error is raised there.
        """
        if self._warming is None and not self._torch_ready:
            self._warming = Future()
            name = f"cerebro-warm-up-{self._worker_id}"
            threading.Thread(
                target=self._warm, args=(self._warming,), name=name, daemon=True
            ).start()

    def _warm(self, done: Future[None]) -> None:
        try:
            self._import_torch()
        except BaseException as error:  # re-raised by _prepare_torch in the serving thread
            done.set_exception(error)
        else:
            done.set_result(None)

    def _prepare_torch(self) -> None:
        """Import torch and the unit code once (not in a unit's time); pin torch's threads.

        The thread count is pinned in the calling thread, the one units run in: torch's
        intra-op count is per thread (OpenMP's), so the count the warm-up thread set
        does not hold here.
        """
        warming, self._warming = self._warming, None
        if not self._torch_ready:
            try:
                if warming is None:
                    self._import_torch()
                else:
                    warming.result()  # an import error is raised here
            except Exception as error:
                limit = address_space_limit()
                if limit is None or not is_out_of_address_space(error):
                    raise
                raise address_space_error(
                    f"worker {self._worker_id} could not import PyTorch", limit, error
                ) from error
        import torch

        if torch.get_num_threads() != self._job.torch_threads:
            torch.set_num_threads(self._job.torch_threads)

    def _import_torch(self) -> None:
        # The first optimizer (any torch._disable_dynamo function) imports torch._dynamo,
        # and use_deterministic_algorithms (every unit) torch._inductor.config: seconds,
        # which belong to the start-up, not to the first unit.
        if "torch" not in sys.modules:  # under an address-space limit, only if it fits
            check_address_space(
                f"worker {self._worker_id} cannot import PyTorch", TORCH_ADDRESS_SPACE
            )
        import torch
        import torch._dynamo

        import cerebro_spark.training  # noqa: F401  (warm-up import)

        torch.use_deterministic_algorithms(
            torch.are_deterministic_algorithms_enabled(),
            warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
        )
        self._torch_ready = True
        self.startup.setdefault("torch", time.time())
