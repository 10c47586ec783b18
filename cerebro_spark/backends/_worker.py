"""The backend-agnostic worker: holds partitions in memory and runs units on them.

A :class:`Worker` runs inside a worker process or a long-lived Spark task, and knows
nothing about either: it reads the dataset's manifest once, loads the train **and**
validation split of every partition index it is given (Cerebro §3.1: the data stays, the
models hop), and runs each unit on the partition it names; a task with ``task.group`` is
one rank of a group unit (Cerebro §5.7, :func:`cerebro_spark.training.run_group_unit`).

**Start-up.** Importing torch and ``torch._dynamo`` takes seconds: more than connecting
to the driver and reading a few partitions. A worker starts both imports in a thread as
soon as it is made (:meth:`Worker.warm_up`) and reads its partitions meanwhile; its
first ``load`` is answered once both are done, so its first unit has no import delay.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

from cerebro_spark.backends._base import WorkerJob
from cerebro_spark.units import UnitKind, UnitResult, UnitTask

if TYPE_CHECKING:
    from cerebro_spark.data import Manifest, PartitionData
    from cerebro_spark.training import TrainedUnit

logger = logging.getLogger(__name__)

_SPLITS = ("train", "validation")
_READ_THREADS = 4  # files read at once: pyarrow fetches and decodes without the GIL
_SPLIT_OF_KIND = {UnitKind.TRAIN: "train", UnitKind.VALIDATE: "validation"}


class Worker:
    """Holds partitions of one prepared dataset in memory and runs units on them, one at a time.

    Args:
        worker_id: The worker's id, reported in every :class:`UnitResult`.
        job: Where the dataset and the checkpoint store are, and the torch thread count.
        device: Torch device units train on.
    """

    def __init__(self, worker_id: str, job: WorkerJob, device: str = "cpu") -> None:
        self._worker_id = worker_id
        self._job = job
        self._device = device
        self._manifest: Manifest | None = None
        self._data: dict[tuple[str, int], PartitionData] = {}
        self._bytes_read = 0
        self._torch_ready = False
        self._warming: Future[None] | None = None  # the warm-up, until a unit waited for it
        self.startup: dict[str, float] = {}
        """When each start-up phase ended (``time.time()``): ``torch`` (imported and
        warmed up), ``partitions`` (the first load's partitions read)."""

    @property
    def manifest(self) -> Manifest:
        """The dataset's manifest, read from storage on first use only."""
        if self._manifest is None:
            from cerebro_spark.data import read_manifest

            self._manifest = read_manifest(self._job.dataset_uri)
        return self._manifest

    @property
    def partitions(self) -> frozenset[int]:
        """Indices of the partitions held in memory."""
        return frozenset(index for _, index in self._data)

    @property
    def bytes_read(self) -> int:
        """Bytes of partition data read from storage so far (dropping does not reduce it)."""
        return self._bytes_read

    def load(self, partitions: Collection[int]) -> int:
        """Read both splits of every partition not yet held; return the bytes read.

        The files are read by up to four threads at once (an object store's latency, the
        Parquet decoding and the hash check overlap). Either every requested partition ends
        up held or, when a read fails, none of this call's partitions do (the bytes read
        still count in :attr:`bytes_read`) and the first failure, in partition order, is
        raised.

        Raises:
            ValueError: An index is outside ``range(num_partitions)``.
        """
        from cerebro_spark.data import read_partition

        manifest = self.manifest
        wanted = sorted(set(partitions))
        for index in wanted:
            if not 0 <= index < manifest.num_partitions:
                raise ValueError(
                    f"worker {self._worker_id}: partition {index} is outside "
                    f"range(num_partitions={manifest.num_partitions}) of dataset "
                    f"{manifest.dataset_id}"
                )
        keys = [(s, i) for i in wanted if ("train", i) not in self._data for s in _SPLITS]
        loaded: dict[tuple[str, int], PartitionData] = {}
        before = self._bytes_read
        if keys:
            uri = self._job.dataset_uri
            with ThreadPoolExecutor(min(_READ_THREADS, len(keys))) as pool:
                reads = {
                    key: pool.submit(read_partition, uri, *key, manifest=manifest) for key in keys
                }
            for key, future in reads.items():  # every read has ended: count what was read
                if future.exception() is None:
                    loaded[key] = future.result()
                    self._bytes_read += loaded[key].bytes_read
            for future in reads.values():  # the first failure, in partition order
                future.result()
        self.startup.setdefault("partitions", time.time())
        self._prepare_torch()  # the warm-up ran while the partitions were read
        self._data.update(loaded)
        read = self._bytes_read - before
        if loaded:
            indices = sorted({index for _, index in loaded})
            logger.info("worker %s loaded partitions %s (%d bytes)", self._worker_id, indices, read)
        return read

    def drop(self, partitions: Collection[int]) -> None:
        """Release the given partitions from memory (indices not held are ignored)."""
        for index in partitions:
            for split in _SPLITS:
                self._data.pop((split, index), None)

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
        data = self._held(task)
        from cerebro_spark.training import run_group_unit, run_unit

        args = (task, data, self._job.store, self.manifest.info)
        if task.group is not None:
            return run_group_unit(
                *args, worker_id=self._worker_id, device=self._device, on_rendezvous=on_rendezvous
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
        data = self._held(task)
        from cerebro_spark.training import train_unit

        return train_unit(
            task,
            data,
            self._job.store,
            self.manifest.info,
            worker_id=self._worker_id,
            device=self._device,
        )

    def _held(self, task: UnitTask) -> PartitionData:
        """The held partition ``task`` reads, with torch ready."""
        data = self._data.get((_SPLIT_OF_KIND[task.kind], task.partition))
        if data is None:
            raise ValueError(
                f"worker {self._worker_id} does not hold partition {task.partition} "
                f"(holds {sorted(self.partitions)})"
            )
        self._prepare_torch()
        return data

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
            if warming is None:
                self._import_torch()
            else:
                warming.result()  # an import error is raised here
        import torch

        if torch.get_num_threads() != self._job.torch_threads:
            torch.set_num_threads(self._job.torch_threads)

    def _import_torch(self) -> None:
        # The first optimizer (any torch._disable_dynamo function) imports torch._dynamo,
        # and use_deterministic_algorithms (every unit) torch._inductor.config: seconds,
        # which belong to the start-up, not to the first unit.
        import torch
        import torch._dynamo

        import cerebro_spark.training  # noqa: F401  (warm-up import)

        torch.use_deterministic_algorithms(
            torch.are_deterministic_algorithms_enabled(),
            warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
        )
        self._torch_ready = True
        self.startup.setdefault("torch", time.time())
