"""Where a worker keeps its partitions: in RAM within a budget, the rest on local disk.

Issue 25, part 2. A worker holds each partition as stored (:class:`HeldColumn`: images
encoded, ``uint8`` as ``uint8``) and decodes per batch. ``worker_memory`` bounds the
bytes of partitions a worker keeps in RAM (:class:`Residence`): a partition read from the
store is kept in RAM while the held bytes fit; a partition beyond the budget is written
once to the executor's local disk as an Arrow IPC file (:func:`spill`) and mapped back as
a :class:`PartitionData` whose arrays are zero-copy views of the mapping. Batches gather
rows from those views, so a spilled partition is streamed batch by batch from the page
cache (or the disk).

**Bounded RSS.** Pages of a mapping that were read count in the process's RSS until
they are unmapped or released. While a unit reads a spilled partition
(:meth:`Residence.streaming`) a thread releases the mapping's pages every
``release_interval_s`` (``madvise(MADV_DONTNEED)``: a file-backed, read-only mapping
drops its pages from the process and re-reads them from the page cache on the next
touch), and once more when the unit ends. What the process holds of a spilled partition
at any time is therefore what a unit touched within one interval
(``benchmarks/out_of_core.py`` measures it).

**Local files** live in one directory per worker, ``cerebro-<worker>-<pid>-<random>``
under the first entry of ``SPARK_LOCAL_DIRS`` (a Spark executor's scratch space) or
:func:`tempfile.gettempdir`; a partition's file is removed when it is dropped, the
directory when the residence is closed (and, as a last resort, when the interpreter
exits).

**The budget's default** (:func:`default_worker_memory`): in a Spark executor with
``spark.executor.pyspark.memory`` set, the share Spark gives each Python worker
(``PYSPARK_EXECUTOR_MEMORY_MB``, that memory divided by the executor's cores); otherwise
half of the machine's available memory divided by the workers on this host (the local
backend knows its worker count; a Spark worker assumes one worker per CPU core, the most
a host runs).
"""

from __future__ import annotations

import contextlib
import logging
import math
import mmap
import os
import re
import shutil
import tempfile
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from cerebro_spark.data._format import ColumnInfo, HeldColumn, PartitionData
from cerebro_spark.errors import ConfigError

logger = logging.getLogger(__name__)

#: Seconds between releases of a spilled partition's pages while a unit reads it.
RELEASE_INTERVAL_S = 0.05

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tb": 1 << 40,
    "tib": 1 << 40,
}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*")


def parse_memory(value: Any, what: str = "worker_memory") -> int:
    """Bytes given as an int or a size string (``"4GiB"``, ``"512MiB"``, ``"2g"``).

    Units are binary (1 KiB = 1024 bytes) and case-insensitive: ``B``, ``KiB``/``K``/
    ``KB``, ``MiB``/``M``/``MB``, ``GiB``/``G``/``GB``, ``TiB``/``T``/``TB`` (Spark's
    memory strings read the same way); a fraction is allowed (``"1.5GiB"``).

    Args:
        value: The size.
        what: The setting's name, for the error.

    Raises:
        ConfigError: Not a positive int nor such a string (the message names the value
            and the rule).
    """
    rule = (
        f"{what} must be a number of bytes (an int ≥ 1) or a size such as '4GiB', "
        f"'512MiB' or '2g', got {value!r}"
    )
    if isinstance(value, bool):
        raise ConfigError(rule)
    if isinstance(value, int):
        if value < 1:
            raise ConfigError(rule)
        return value
    if not isinstance(value, str):
        raise ConfigError(rule)
    match = _SIZE.fullmatch(value)
    if match is None or match.group(2).lower() not in _UNITS:
        raise ConfigError(rule)
    size = math.floor(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if size < 1:
        raise ConfigError(rule)
    return size


def format_bytes(size: int) -> str:
    """``size`` in the largest binary unit that keeps it ≥ 1 (``"1.5 GiB"``)."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def available_memory() -> int:
    """Bytes of memory available to new allocations on this machine (``MemAvailable``)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # pragma: no cover - not Linux
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def default_worker_memory(workers_on_host: int | None = None) -> tuple[int, str]:
    """The budget a worker uses when ``worker_memory`` is not set, and the rule it came from.

    Args:
        workers_on_host: Workers sharing this machine (the local backend's worker count);
            ``None``: one per CPU core (the most a Spark host runs).

    Returns:
        ``(bytes, rule)``: ``PYSPARK_EXECUTOR_MEMORY_MB`` (Spark's
        ``spark.executor.pyspark.memory`` shared by the executor's cores) where Spark set
        it, else half of the available memory divided by ``workers_on_host``.
    """
    spark_mb = os.environ.get("PYSPARK_EXECUTOR_MEMORY_MB", "").strip()
    if spark_mb.isdigit() and int(spark_mb) > 0:
        return int(spark_mb) << 20, "spark.executor.pyspark.memory per Python worker"
    workers = workers_on_host if workers_on_host else os.cpu_count() or 1
    share = max(1, available_memory() // 2 // max(1, workers))
    return share, f"half of the available memory / {workers} workers on this host"


def local_dir() -> str:
    """Where spilled partitions go: ``SPARK_LOCAL_DIRS``' first entry, else the temp dir."""
    spark_dirs = os.environ.get("SPARK_LOCAL_DIRS", "")
    first = next((entry.strip() for entry in spark_dirs.split(",") if entry.strip()), "")
    return first or tempfile.gettempdir()


# -- one spilled partition --------------------------------------------------------------


def _flat(values: np.ndarray) -> pa.Array:
    """A primitive Arrow array over ``values``' memory, flattened (C order)."""
    flat = np.ascontiguousarray(values).reshape(-1)
    kind = pa.from_numpy_dtype(flat.dtype)
    return pa.Array.from_buffers(kind, len(flat), [None, pa.py_buffer(flat)])


def _to_arrow(column: HeldColumn) -> pa.Array:
    """One held column as an Arrow array of ``rows`` entries (its memory, not copied)."""
    offsets = column.offsets
    if offsets is None:
        values = _flat(column.values)
        size = column.info.size if column.values.ndim > 1 else 1
        if column.values.ndim > 1:
            return pa.FixedSizeListArray.from_arrays(values, size)
        return values
    start, end = int(offsets[0]), int(offsets[-1])
    rebased = pa.py_buffer(np.ascontiguousarray(offsets - start, dtype=np.int64))
    if column.info.feature_kind == "image":
        data = np.ascontiguousarray(column.values[start:end])
        return pa.Array.from_buffers(
            pa.large_binary(), column.rows, [None, rebased, pa.py_buffer(data)]
        )
    tokens = _flat(column.values[start:end])
    return pa.Array.from_buffers(
        pa.large_list(tokens.type), column.rows, [None, rebased], children=[tokens]
    )


def _view(array: pa.Array, dtype: np.dtype[Any], count: int, buffer: int = 1) -> np.ndarray:
    """``count`` elements of one of ``array``'s buffers as numpy (zero-copy, read-only)."""
    data = array.buffers()[buffer]
    assert data is not None  # every buffer read here holds values
    return np.frombuffer(data, dtype=dtype, count=count, offset=array.offset * dtype.itemsize)


def _from_arrow(array: pa.Array, info: ColumnInfo, held: HeldColumn) -> HeldColumn:
    """The held column back from its Arrow form (views of the array's buffers)."""
    dtype = held.values.dtype
    rows = len(array)
    if held.offsets is None:
        if held.values.ndim > 1:
            size = info.size
            values = _view(array.values, dtype, rows * size).reshape(held.values.shape)
        else:
            values = _view(array, dtype, rows)
        return HeldColumn(info, values)
    offsets = _view(array, np.dtype(np.int64), rows + 1)
    total = int(offsets[-1])
    if info.feature_kind == "image":
        return HeldColumn(info, _view(array, np.dtype(np.uint8), total, buffer=2), offsets)
    return HeldColumn(info, _view(array.values, dtype, total), offsets)


class SpilledPartition:
    """A partition written to a local Arrow IPC file and memory-mapped back.

    Attributes:
        path: The file.
        file_bytes: Its size.
        data: The partition, each array a read-only view of the mapping (``None`` once
            closed).
    """

    def __init__(self, path: str, data: PartitionData) -> None:
        self.path = path
        with open(path, "rb") as handle:
            self._map: mmap.mmap | None = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        self.file_bytes = len(self._map)
        reader = pa.ipc.open_file(pa.BufferReader(pa.py_buffer(self._map)))
        batch = reader.get_batch(0)
        labels = _view(batch.column("labels"), data.labels.dtype, data.rows)
        block: np.ndarray | None = None
        if data.dense_block is not None:  # the dense columns are views of one block
            shape = data.dense_block.shape
            array = batch.column("block").values
            block = _view(array, data.dense_block.dtype, shape[0] * shape[1]).reshape(shape)
        columns: list[HeldColumn] = []
        at = 0
        for i, held in enumerate(data.columns):
            if block is not None and held.info.dense:
                width = held.info.size
                view = block[:, at : at + width].reshape(held.values.shape)
                columns.append(HeldColumn(held.info, view))
                at += width
            else:
                columns.append(_from_arrow(batch.column(f"c{i}"), held.info, held))
        self.data: PartitionData | None = PartitionData(
            data.split, data.index, tuple(columns), labels, data.bytes_read, dense_block=block
        )
        self._lock = threading.Lock()

    def release(self) -> None:
        """Drop the mapping's pages from this process (they are read again when touched)."""
        with self._lock:
            if self._map is not None and not self._map.closed:
                self._map.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        """Unmap (once nothing uses the views any more) and remove the file."""
        with self._lock:
            self.data = None
            mapping, self._map = self._map, None
            if mapping is not None:
                with contextlib.suppress(BufferError):  # a view still alive: unmapped at GC
                    mapping.madvise(mmap.MADV_DONTNEED)
                    mapping.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


def spill(data: PartitionData, path: str) -> SpilledPartition:
    """Write ``data`` to ``path`` (Arrow IPC file format) and map it back.

    The file holds one record batch: a column per feature column (numbers and
    categories as primitive arrays, arrays as fixed-size lists, images as
    ``large_binary``, sequences as ``large_list<int32>``), the labels, and the partition's
    :attr:`~PartitionData.dense_block` as one fixed-size list column when it has one (its
    dense columns are then views of it, as they were).

    Returns:
        The spilled partition; its :attr:`SpilledPartition.data` has the same rows,
        values and ``bytes_read`` as ``data``.
    """
    block = data.dense_block
    arrays: list[pa.Array] = [_flat(data.labels)]
    names = ["labels"]
    if block is not None:
        arrays.append(pa.FixedSizeListArray.from_arrays(_flat(block), block.shape[1]))
        names.append("block")
    for i, column in enumerate(data.columns):
        if block is None or not column.info.dense:
            arrays.append(_to_arrow(column))
            names.append(f"c{i}")
    batch = pa.record_batch(arrays, names=names)
    try:
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, batch.schema) as writer:
            writer.write_batch(batch)
        return SpilledPartition(path, data)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise


# -- a worker's residence ----------------------------------------------------------------


class Residence:
    """A worker's partitions: in RAM up to a budget of held bytes, the rest spilled.

    Thread-safe: :meth:`admit` may be called by several read threads at once.

    Args:
        worker_id: The worker's id (names the local directory).
        budget: Bytes of held partitions kept in RAM at most.
        directory: Parent of the local directory (default :func:`local_dir`).
        release_interval_s: Seconds between releases of a streamed partition's pages.
    """

    def __init__(
        self,
        worker_id: str,
        budget: int,
        *,
        directory: str | None = None,
        release_interval_s: float = RELEASE_INTERVAL_S,
    ) -> None:
        self.worker_id = worker_id
        self.budget = budget
        self._parent = directory
        self._interval = release_interval_s
        self._lock = threading.Lock()
        self._held: dict[tuple[str, int], int] = {}
        self._spilled: dict[tuple[str, int], SpilledPartition] = {}
        self._streaming: dict[int, SpilledPartition] = {}  # id(data) -> its spill
        self._active = 0
        self._directory: str | None = None
        self._cleanup: weakref.finalize[Any, Any] | None = None
        self._wake = threading.Condition(self._lock)
        self._releaser: threading.Thread | None = None
        self._stop = False

    @property
    def directory(self) -> str | None:
        """The worker's local directory (``None`` until something was spilled)."""
        return self._directory

    @property
    def held_bytes(self) -> int:
        """Bytes of partitions held in RAM."""
        with self._lock:
            return sum(self._held.values())

    @property
    def spilled_bytes(self) -> int:
        """Bytes of partition files on local disk."""
        with self._lock:
            return sum(spill.file_bytes for spill in self._spilled.values())

    def spilled(self) -> list[tuple[str, int]]:
        """The ``(split, index)`` of every spilled partition, sorted."""
        with self._lock:
            return sorted(self._spilled)

    def admit(self, data: PartitionData) -> PartitionData:
        """Keep ``data`` in RAM if its bytes fit in what is left of the budget, else spill it.

        Returns:
            ``data`` itself, or its spilled form (the in-RAM arrays are then released by
            the caller dropping ``data``).
        """
        key = (data.split, data.index)
        size = data.nbytes
        with self._lock:
            self._discard_locked(key)
            if sum(self._held.values()) + size <= self.budget:
                self._held[key] = size
                return data
            directory = self._ensure_directory_locked()
        path = os.path.join(directory, f"{data.split}-{data.index:05d}.arrow")
        spilled = spill(data, path)
        with self._lock:
            self._spilled[key] = spilled
        logger.debug(
            "worker %s spilled %s partition %d (%d bytes held) to %s",
            self.worker_id,
            data.split,
            data.index,
            size,
            path,
        )
        assert spilled.data is not None
        return spilled.data

    def discard(self, split: str, index: int) -> None:
        """Forget a partition: its RAM share is freed, its local file removed."""
        with self._lock:
            self._discard_locked((split, index))

    def _discard_locked(self, key: tuple[str, int]) -> None:
        self._held.pop(key, None)
        spilled = self._spilled.pop(key, None)
        if spilled is not None:
            self._streaming = {k: s for k, s in self._streaming.items() if s is not spilled}
            spilled.close()
            if not self._spilled:  # nothing left on disk: the directory goes too
                self._remove_directory_locked()
                self._wake.notify_all()  # and the release thread ends

    def _remove_directory_locked(self) -> None:
        cleanup, self._cleanup = self._cleanup, None
        self._directory = None
        if cleanup is not None:
            cleanup()  # removes the directory (once)

    def is_spilled(self, data: PartitionData) -> bool:
        """Whether ``data`` is a spilled partition's mapped form."""
        with self._lock:
            return self._spill_of(data) is not None

    def _spill_of(self, data: PartitionData) -> SpilledPartition | None:
        spilled = self._spilled.get((data.split, data.index))
        return spilled if spilled is not None and spilled.data is data else None

    @contextlib.contextmanager
    def streaming(self, data: PartitionData) -> Iterator[None]:
        """While a unit reads ``data``: release its mapped pages periodically, and at the end.

        Does nothing for a partition held in RAM.
        """
        with self._lock:
            spilled = self._spill_of(data)
            if spilled is not None:
                self._streaming[id(data)] = spilled
                self._active += 1
                self._start_releaser_locked()
                self._wake.notify_all()
        try:
            yield
        finally:
            if spilled is not None:
                with self._lock:
                    self._active -= 1
                    if self._active == 0:
                        self._streaming.clear()
                spilled.release()

    def _start_releaser_locked(self) -> None:
        if self._releaser is None:
            self._releaser = threading.Thread(
                target=self._release_loop, name=f"cerebro-release-{self.worker_id}", daemon=True
            )
            self._releaser.start()

    def _release_loop(self) -> None:
        """Release the streamed partitions' pages every interval; end once nothing is spilled.

        (A reused Python worker, as Spark's, keeps no idle thread of a worker that ended.)
        """
        while True:
            with self._lock:
                while not self._stop and not self._streaming and self._spilled:
                    self._wake.wait()
                if self._stop or not self._spilled:
                    if self._releaser is threading.current_thread():
                        self._releaser = None
                    return
                self._wake.wait(self._interval)
                targets = list(self._streaming.values())
            for spilled in targets:
                spilled.release()

    def _ensure_directory_locked(self) -> str:
        if self._directory is None:
            parent = self._parent or local_dir()
            os.makedirs(parent, exist_ok=True)
            prefix = f"cerebro-{self.worker_id}-{os.getpid()}-"
            self._directory = tempfile.mkdtemp(prefix=prefix, dir=parent)  # + random
            self._cleanup = weakref.finalize(
                self, shutil.rmtree, self._directory, ignore_errors=True
            )
        return self._directory

    def close(self) -> None:
        """Forget every partition, remove the local directory, stop the release thread.

        The residence may be used again afterwards (it starts empty).
        """
        with self._lock:
            self._stop = True
            for key in list(self._spilled):
                self._discard_locked(key)
            self._held.clear()
            self._streaming.clear()
            self._remove_directory_locked()
            self._wake.notify_all()
            releaser, self._releaser = self._releaser, None
        if releaser is not None and releaser is not threading.current_thread():
            releaser.join(timeout=5.0)
        with self._lock:
            self._stop = False
