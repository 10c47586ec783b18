"""Where a worker keeps its partitions: in RAM within a budget, the rest on local disk.

Issue 25, part 2. A worker holds each partition as stored (:class:`HeldColumn`: images
encoded, ``uint8`` as ``uint8``) and decodes per batch. ``worker_memory`` bounds the
bytes of partitions a worker keeps in RAM (:class:`Residence`): a partition read from the
store is kept in RAM while the held bytes fit; a partition beyond the budget is written
once to the executor's local disk as an Arrow IPC file (:func:`spill`).

**Mapped while read.** A spilled partition is memory-mapped only while a unit reads it
(:meth:`Residence.partition`): its arrays are then zero-copy views of the mapping, batches
gather rows from them (streamed from the page cache or the disk), and the file is unmapped
when the unit ends. The process's address space therefore holds the partitions kept in
RAM and the one being read, never every spilled file at once: PySpark caps a Python
worker's address space (``RLIMIT_AS``) at its share of ``spark.executor.pyspark.memory``
where that is set, and mappings count against it.

**Bounded RSS.** Pages of a mapping that were read count in the process's RSS until
they are unmapped or released. While a unit reads a spilled partition a thread releases
the mapping's pages every ``release_interval_s`` (``madvise(MADV_DONTNEED)``: a
file-backed, read-only mapping drops its pages from the process and re-reads them from
the page cache on the next touch); the mapping goes when the unit ends. What the process
holds of a spilled partition at any time is therefore what a unit touched within one
interval (``benchmarks/out_of_core.py`` measures it).

**An address-space limit** (``RLIMIT_AS``: ``spark.executor.pyspark.memory``, or
``ulimit -v``): the default budget (:func:`default_worker_memory`) is at most half of the
address space left (the worker computes it once PyTorch is imported); PyTorch that cannot
be imported within it (:func:`check_address_space`, :data:`TORCH_ADDRESS_SPACE`) and a
spilled partition that cannot be mapped are refused with a
:class:`~cerebro_spark.errors.ConfigError` naming the limit and the setting
(:func:`address_space_error`), not a ``MemoryError`` from deep inside a library.

**Local files** live in one directory per worker, ``cerebro-<worker>-<pid>-<random>``
under the first entry of ``SPARK_LOCAL_DIRS`` (a Spark executor's scratch space) or
:func:`tempfile.gettempdir`; a partition's file is removed when it is dropped, the
directory when the residence is closed (and, as a last resort, when the interpreter
exits). The worker keeps the directory itself locked (``flock`` on the directory) for its
life; the directory is made under a hidden staging name (``.cerebro-...``), locked, and
only then given its name.

**Stale directories.** A worker killed without cleaning up (``SIGKILL``, the OOM killer)
leaves its directory behind. :func:`sweep_stale` (:meth:`Residence.sweep`, which every
worker calls when it starts) removes such directories under the same parent: only those
whose pid is not a live process (a zombie counts as gone) **and** whose lock it takes. A
live worker holds its directory's lock, whatever pid namespace it runs in, so its
directory is never removed, nor is one of this process or one that cannot be locked.

**The budget's default** (:func:`default_worker_memory`): in a Spark executor with
``spark.executor.pyspark.memory`` set, the share Spark gives each Python worker
(``PYSPARK_EXECUTOR_MEMORY_MB``, that memory divided by the executor's cores); otherwise
half of the machine's available memory divided by the workers on this host (the local
backend knows its worker count; a Spark worker assumes one worker per CPU core, the most
a host runs). Under an address-space limit, half of the address space left when that is
smaller (it is whenever Spark set the limit).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import gc
import logging
import math
import mmap
import os
import re
import shutil
import tempfile
import threading
import time
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

#: Address space that importing PyTorch and the unit code takes, with some room: measured
#: 570 MiB (``VmSize`` 341 -> 911 MiB, torch 2.13's CPU wheel, 2 cores). A worker under an
#: address-space limit with less than this left refuses to import it (a ``dlopen`` or an
#: allocation that fails inside torch's import can abort the process).
TORCH_ADDRESS_SPACE = 640 << 20

#: Seconds a staging directory (``.cerebro-...``) of a dead process is left alone by
#: :func:`sweep_stale` (it exists for microseconds while a directory is made).
STAGING_GRACE_S = 60.0

_DIRECTORY = re.compile(r"(?P<staging>\.?)cerebro-(?P<worker>.+)-(?P<pid>[0-9]+)-[a-z0-9_]+")

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
        if abs(value) < 1024:
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


# -- the address-space limit ----------------------------------------------------------------


def address_space_limit() -> int | None:
    """This process's address-space limit in bytes (``RLIMIT_AS``, soft); ``None``: none.

    PySpark sets it in a Python worker from ``spark.executor.pyspark.memory`` (its share
    per worker); ``ulimit -v`` sets it in a shell.
    """
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY or soft < 0 else int(soft)


def address_space_in_use() -> int:
    """Bytes of address space this process has mapped (``VmSize``); 0 where unknown."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # pragma: no cover - not Linux
        pass
    return 0


def _spark_share_mb() -> str:
    value = os.environ.get("PYSPARK_EXECUTOR_MEMORY_MB", "").strip()
    return value if value.isdigit() and int(value) > 0 else ""


def _limit_origin() -> str:
    """Who set the limit: Spark (``spark.executor.pyspark.memory``) or ``ulimit -v``."""
    spark_mb = _spark_share_mb()
    if spark_mb:
        return (
            f"RLIMIT_AS, set by PySpark from spark.executor.pyspark.memory: {spark_mb} MiB "
            "per Python worker"
        )
    return "RLIMIT_AS, ulimit -v"


def _limit_remedy() -> str:
    if _spark_share_mb():
        return "raise spark.executor.pyspark.memory or unset it"
    return "raise or lift the limit (ulimit -v)"


def address_space_error(
    what: str, limit: int, cause: BaseException | None = None, *, context: str = "", also: str = ""
) -> ConfigError:
    """The error for something that does not fit a worker's address-space limit.

    Args:
        what: What failed (``"worker w0 cannot map ..."``).
        limit: The limit (:func:`address_space_limit`).
        cause: The error the failure raised, quoted at the end.
        context: Said after the bytes in use (``" (2.0 MiB of partitions in RAM)"``).
        also: Another remedy, said before the limit's (``"lower worker_memory"``).

    Returns:
        A :class:`ConfigError` naming the limit, who set it, what is in use and the
        remedy: ``"<what>: this Python worker's address space is limited to 1.0 GiB
        (RLIMIT_AS, set by PySpark from spark.executor.pyspark.memory: 1024 MiB per Python
        worker) and 990.0 MiB of it is in use; raise spark.executor.pyspark.memory or
        unset it (OSError: [Errno 12] Cannot allocate memory)"``.
    """
    remedy = f"{also}, or {_limit_remedy()}" if also else _limit_remedy()
    text = (
        f"{what}: this Python worker's address space is limited to {format_bytes(limit)} "
        f"({_limit_origin()}) and {format_bytes(address_space_in_use())} of it is in use"
        f"{context}; {remedy}"
    )
    if cause is not None:
        text += f" ({type(cause).__name__}: {cause})"
    return ConfigError(text)


def check_address_space(what: str, need: int) -> None:
    """Refuse, before trying, what needs more address space than the limit leaves.

    Args:
        what: What would be done (``"worker w0 cannot import PyTorch"``).
        need: The bytes of address space it takes.

    Raises:
        ConfigError: Under a limit, fewer than ``need`` bytes are left
            (:func:`address_space_error`).
    """
    limit = address_space_limit()
    if limit is not None and limit - address_space_in_use() < need:
        raise address_space_error(f"{what} (it takes about {format_bytes(need)})", limit)


def is_out_of_address_space(error: BaseException) -> bool:
    """Whether ``error`` is what running out of address space raises.

    ``MemoryError`` (and pyarrow's ``ArrowMemoryError``), ``OSError`` ``ENOMEM`` (``mmap``),
    and a shared library that could not be mapped (``ImportError: ... failed to map
    segment from shared object``).
    """
    if isinstance(error, MemoryError):
        return True
    if isinstance(error, OSError) and error.errno == errno.ENOMEM:
        return True
    text = str(error)
    return isinstance(error, (ImportError, OSError)) and (
        "failed to map segment" in text or "Cannot allocate memory" in text
    )


def default_worker_memory(workers_on_host: int | None = None) -> tuple[int, str]:
    """The budget a worker uses when ``worker_memory`` is not set, and the rule it came from.

    Args:
        workers_on_host: Workers sharing this machine (the local backend's worker count);
            ``None``: one per CPU core (the most a Spark host runs).

    Returns:
        ``(bytes, rule)``: ``PYSPARK_EXECUTOR_MEMORY_MB`` (Spark's
        ``spark.executor.pyspark.memory`` shared by the executor's cores) where Spark set
        it, else half of the available memory divided by ``workers_on_host``; under an
        address-space limit (:func:`address_space_limit`), half of the address space
        left when that is smaller (partitions read, the one mapped while a unit reads it,
        the model and the batches share the rest).
    """
    spark_mb = _spark_share_mb()
    if spark_mb:
        budget, rule = int(spark_mb) << 20, "spark.executor.pyspark.memory per Python worker"
    else:
        workers = workers_on_host if workers_on_host else os.cpu_count() or 1
        budget = max(1, available_memory() // 2 // max(1, workers))
        rule = f"half of the available memory / {workers} workers on this host"
    limit = address_space_limit()
    if limit is not None:
        in_use = address_space_in_use()
        left = max(1, (limit - in_use) // 2)
        if left < budget:
            return left, (
                f"half of the address space left: ({format_bytes(limit)} limit - "
                f"{format_bytes(in_use)} in use) / 2 ({_limit_origin()})"
            )
    return budget, rule


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


@dataclasses.dataclass(frozen=True)
class _ColumnLayout:
    """What a held column's arrays look like (to rebuild them as views of a mapping)."""

    info: ColumnInfo
    dtype: np.dtype[Any]
    shape: tuple[int, ...]  # the values' shape
    ragged: bool  # image or sequence: values end to end, with offsets


@dataclasses.dataclass(frozen=True)
class _Layout:
    """A spilled partition's shape: everything but its arrays' bytes."""

    split: str
    index: int
    rows: int
    bytes_read: int
    labels: np.dtype[Any]
    block: tuple[tuple[int, ...], np.dtype[Any]] | None
    columns: tuple[_ColumnLayout, ...]

    @classmethod
    def of(cls, data: PartitionData) -> _Layout:
        block = data.dense_block
        return cls(
            data.split,
            data.index,
            data.rows,
            data.bytes_read,
            data.labels.dtype,
            None if block is None else (tuple(block.shape), block.dtype),
            tuple(
                _ColumnLayout(
                    held.info, held.values.dtype, tuple(held.values.shape), held.offsets is not None
                )
                for held in data.columns
            ),
        )

    def build(self, batch: pa.RecordBatch) -> PartitionData:
        """The partition from its record batch, each array a view of the batch's buffers."""
        labels = _view(batch.column("labels"), self.labels, self.rows)
        block: np.ndarray | None = None
        if self.block is not None:  # the dense columns are views of one block
            shape, dtype = self.block
            array = batch.column("block").values
            block = _view(array, dtype, math.prod(shape)).reshape(shape)
        columns: list[HeldColumn] = []
        at = 0
        for i, column in enumerate(self.columns):
            if block is not None and column.info.dense:
                width = column.info.size
                view = block[:, at : at + width].reshape(column.shape)
                columns.append(HeldColumn(column.info, view))
                at += width
            else:
                columns.append(_from_arrow(batch.column(f"c{i}"), column))
        return PartitionData(
            self.split, self.index, tuple(columns), labels, self.bytes_read, dense_block=block
        )


def _from_arrow(array: pa.Array, column: _ColumnLayout) -> HeldColumn:
    """The held column back from its Arrow form (views of the array's buffers)."""
    dtype, rows, info = column.dtype, len(array), column.info
    if not column.ragged:
        if len(column.shape) > 1:
            count = rows * math.prod(column.shape[1:])
            return HeldColumn(info, _view(array.values, dtype, count).reshape(column.shape))
        return HeldColumn(info, _view(array, dtype, rows))
    offsets = _view(array, np.dtype(np.int64), rows + 1)
    total = int(offsets[-1])
    if info.feature_kind == "image":
        return HeldColumn(info, _view(array, np.dtype(np.uint8), total, buffer=2), offsets)
    return HeldColumn(info, _view(array.values, dtype, total), offsets)


class SpilledPartition:
    """A partition written to a local Arrow IPC file, memory-mapped while it is read.

    :meth:`open` maps the file (once, however many readers) and returns the partition,
    each array a read-only view of the mapping; each :meth:`open` is ended by one
    :meth:`done`, and the last unmaps the file (:meth:`reading` does both).

    Attributes:
        path: The file.
        file_bytes: Its size.
        split: The partition's split.
        index: The partition's index.
    """

    def __init__(self, path: str, data: PartitionData) -> None:
        self.path = path
        self.file_bytes = os.path.getsize(path)
        self._layout = _Layout.of(data)
        self.split, self.index = data.split, data.index
        self._lock = threading.Lock()
        self._map: mmap.mmap | None = None
        self._data: PartitionData | None = None
        self._readers = 0
        self._closed = False

    @property
    def mapped(self) -> bool:
        """Whether the file is mapped (a reader holds it)."""
        with self._lock:
            return self._map is not None

    def open(self) -> PartitionData:
        """Map the file unless it is mapped, and return the partition; end with :meth:`done`.

        Raises:
            FileNotFoundError: The partition was closed (its file removed).
            OSError: The file cannot be mapped (``ENOMEM``: no address space left).
        """
        with self._lock:
            if self._closed:
                raise FileNotFoundError(f"spilled partition {self.path} was removed")
            if self._data is None:
                self._data = self._map_locked()
            self._readers += 1
            return self._data

    def done(self) -> None:
        """One reader is done; the last unmaps the file (once its views are gone)."""
        with self._lock:
            self._readers = max(0, self._readers - 1)
            if self._readers == 0:
                self._unmap_locked()

    @contextlib.contextmanager
    def reading(self) -> Iterator[PartitionData]:
        """The partition, mapped while the block runs (:meth:`open`, then :meth:`done`)."""
        data = self.open()
        try:
            yield data
        finally:
            del data
            self.done()

    def _map_locked(self) -> PartitionData:
        with open(self.path, "rb") as handle:
            mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            reader = pa.ipc.open_file(pa.BufferReader(pa.py_buffer(mapping)))
            data = self._layout.build(reader.get_batch(0))
        except BaseException:
            with contextlib.suppress(BufferError):  # else unmapped with the traceback
                mapping.close()
            raise
        self._map = mapping
        return data

    def _unmap_locked(self) -> None:
        self._data = None
        mapping, self._map = self._map, None
        if mapping is not None:
            with contextlib.suppress(BufferError, ValueError):
                mapping.madvise(mmap.MADV_DONTNEED)  # the pages leave now, views or not
                # With a view still alive (a reader's variable) the mapping cannot be closed:
                # it is unmapped when the last view goes (the mapping is referenced by the
                # views only).
                mapping.close()

    def release(self) -> None:
        """Drop the mapping's pages from this process (they are read again when touched)."""
        with self._lock:
            if self._map is not None:
                with contextlib.suppress(ValueError):  # closed meanwhile
                    self._map.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        """Unmap (once nothing uses the views any more) and remove the file."""
        with self._lock:
            self._closed = True
            self._readers = 0
            self._unmap_locked()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


def spill(data: PartitionData, path: str) -> SpilledPartition:
    """Write ``data`` to ``path`` (Arrow IPC file format), not mapped until it is read.

    The file holds one record batch: a column per feature column (numbers and
    categories as primitive arrays, arrays as fixed-size lists, images as
    ``large_binary``, sequences as ``large_list<int32>``), the labels, and the partition's
    :attr:`~PartitionData.dense_block` as one fixed-size list column when it has one (its
    dense columns are then views of it, as they were).

    Returns:
        The spilled partition; what its :meth:`SpilledPartition.open` returns has the
        same rows, values and ``bytes_read`` as ``data``.
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


# -- a worker's local directory, and stale ones ---------------------------------------------


def _lock_directory(path: str) -> int | None:
    """An open descriptor of directory ``path`` with an exclusive ``flock`` taken on it.

    ``None`` when the lock is held by another process (or the file system has no locks,
    or ``path`` cannot be opened).
    """
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held by another process (or no locks on this file system)
        os.close(fd)
        return None
    return fd


def _make_directory(parent: str, worker_id: str) -> tuple[str, int | None]:
    """A new local directory for a worker, and the descriptor that holds its lock.

    Made under a hidden staging name, locked, then renamed (the lock stays with the
    directory): a sweeper never sees the directory of a live worker unlocked.
    """
    name = f"cerebro-{worker_id}-{os.getpid()}-"
    for _ in range(10):
        staging = tempfile.mkdtemp(prefix=f".{name}", dir=parent)  # + random
        fd = _lock_directory(staging)
        if fd is None:  # a file system without locks: nobody can take it either
            logger.debug("could not lock %s: no flock on this file system", staging)
        final = os.path.join(parent, os.path.basename(staging)[1:])
        try:
            if os.path.lexists(final):
                raise FileExistsError(final)
            os.rename(staging, final)
        except OSError:  # taken meanwhile (a stale directory with the same name): again
            _remove_owned(staging, fd)
            continue
        return final, fd
    raise FileExistsError(f"could not make a local directory {name}* under {parent}")


def _remove_owned(directory: str, fd: int | None) -> None:
    """Remove a worker's own directory, then let its lock go (in that order)."""
    shutil.rmtree(directory, ignore_errors=True)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process here (a zombie is not; unknown counts as alive)."""
    if pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: another user's live process
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")  # a zombie holds no lock, no mapping, no file


def _remove_if_unlocked(path: str) -> bool:
    """Remove directory ``path`` if its lock can be taken; whether it was removed."""
    fd = _lock_directory(path)
    if fd is None:  # its owner lives (maybe in another pid namespace), or no locks here
        return False
    try:
        shutil.rmtree(path, ignore_errors=True)
        return not os.path.lexists(path)
    finally:
        os.close(fd)


def sweep_stale(parent: str, *, staging_grace_s: float = STAGING_GRACE_S) -> list[str]:
    """Remove the local directories of dead workers under ``parent``.

    A directory ``cerebro-<worker>-<pid>-<random>`` (or its staging name,
    ``.cerebro-...``, once it is ``staging_grace_s`` old) is removed when its pid is not
    a live process here and its lock can be taken; every other entry is left alone: this
    process's directories, those of live pids, those whose lock is held (a live owner in
    another pid namespace), files, links and anything else.

    Returns:
        The removed directories' paths, sorted.
    """
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return []
    removed: list[str] = []
    now = time.time()
    for name in names:
        match = _DIRECTORY.fullmatch(name)
        if match is None:
            continue
        pid = int(match.group("pid"))
        if pid == os.getpid() or _alive(pid):
            continue
        path = os.path.join(parent, name)
        if match.group("staging"):
            with contextlib.suppress(OSError):
                if now - os.lstat(path).st_mtime < staging_grace_s:
                    continue
        if os.path.isdir(path) and not os.path.islink(path) and _remove_if_unlocked(path):
            removed.append(path)
    return removed


# -- a worker's residence ----------------------------------------------------------------


class Residence:
    """A worker's partitions: in RAM up to a budget of held bytes, the rest spilled.

    Thread-safe: :meth:`admit` may be called by several read threads at once.

    Args:
        worker_id: The worker's id (names the local directory).
        budget: Bytes of held partitions kept in RAM at most (:attr:`budget` may be set
            before the first :meth:`admit`).
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
        self._ram: dict[tuple[str, int], PartitionData] = {}
        self._spilled: dict[tuple[str, int], SpilledPartition] = {}
        self._reading: dict[SpilledPartition, int] = {}  # mapped for units: how many
        self._directory: str | None = None
        self._cleanup: weakref.finalize[Any, Any] | None = None
        self._wake = threading.Condition(self._lock)
        self._releaser: threading.Thread | None = None
        self._stop = False

    @property
    def parent(self) -> str:
        """Where the worker's local directory is (or would be) made."""
        return self._parent or local_dir()

    @property
    def directory(self) -> str | None:
        """The worker's local directory (``None`` until something was spilled)."""
        return self._directory

    @property
    def held_bytes(self) -> int:
        """Bytes of partitions held in RAM."""
        with self._lock:
            return self._held_locked()

    def _held_locked(self) -> int:
        return sum(data.nbytes for data in self._ram.values())

    @property
    def spilled_bytes(self) -> int:
        """Bytes of partition files on local disk."""
        with self._lock:
            return sum(spill.file_bytes for spill in self._spilled.values())

    def spilled(self) -> list[tuple[str, int]]:
        """The ``(split, index)`` of every spilled partition, sorted."""
        with self._lock:
            return sorted(self._spilled)

    def partitions(self) -> list[tuple[str, int]]:
        """The ``(split, index)`` of every partition held (in RAM or spilled), sorted."""
        with self._lock:
            return sorted([*self._ram, *self._spilled])

    def holds(self, split: str, index: int) -> bool:
        """Whether the partition is held (in RAM or spilled)."""
        with self._lock:
            return (split, index) in self._ram or (split, index) in self._spilled

    def is_spilled(self, split: str, index: int) -> bool:
        """Whether the partition is held on local disk."""
        with self._lock:
            return (split, index) in self._spilled

    def admit(self, data: PartitionData) -> bool:
        """Keep ``data`` in RAM if its bytes fit in what is left of the budget, else spill it.

        A partition already held under the same ``(split, index)`` is replaced.

        Returns:
            Whether ``data`` is kept in RAM (else its arrays are released when the caller
            drops it: :meth:`partition` maps the file while it is read).
        """
        key = (data.split, data.index)
        size = data.nbytes
        with self._lock:
            self._discard_locked(key)
            if self._held_locked() + size <= self.budget:
                self._ram[key] = data
                return True
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
        return False

    @contextlib.contextmanager
    def partition(self, split: str, index: int) -> Iterator[PartitionData]:
        """A held partition, for a unit to read while the block runs.

        A partition in RAM is given as it is. A spilled one is mapped for the block (its
        pages released every ``release_interval_s`` meanwhile) and unmapped after it.

        Raises:
            KeyError: The partition is not held.
            ConfigError: A spilled partition cannot be mapped within the process's
                address-space limit (:func:`address_space_error`).
        """
        key = (split, index)
        with self._lock:
            data = self._ram.get(key)
            spilled = self._spilled.get(key)
        if data is not None:
            yield data
            return
        if spilled is None:
            raise KeyError(f"worker {self.worker_id} holds no {split} partition {index}")
        mapped = self._open(spilled)
        with self._lock:
            self._reading[spilled] = self._reading.get(spilled, 0) + 1
            self._start_releaser_locked()
            self._wake.notify_all()
        try:
            yield mapped
        finally:
            del mapped
            with self._lock:
                count = self._reading.pop(spilled, 0) - 1
                if count > 0:
                    self._reading[spilled] = count
            spilled.done()

    def _open(self, spilled: SpilledPartition) -> PartitionData:
        """Map a spilled partition; no address space left is a clear error, not ``ENOMEM``."""
        try:
            return spilled.open()
        except Exception as error:
            if not is_out_of_address_space(error):
                raise
        gc.collect()  # a mapping whose views sat in a reference cycle goes now
        try:
            return spilled.open()
        except Exception as error:
            limit = address_space_limit()
            if limit is None or not is_out_of_address_space(error):
                raise
            raise address_space_error(
                f"worker {self.worker_id} cannot map its spilled {spilled.split} partition "
                f"{spilled.index} ({format_bytes(spilled.file_bytes)})",
                limit,
                error,
                context=(
                    f" ({format_bytes(self.held_bytes)} of partitions kept in RAM, "
                    f"worker_memory {format_bytes(self.budget)})"
                ),
                also="lower worker_memory so that fewer partitions stay in RAM",
            ) from error

    def discard(self, split: str, index: int) -> None:
        """Forget a partition: its RAM share is freed, its local file removed."""
        with self._lock:
            self._discard_locked((split, index))

    def _discard_locked(self, key: tuple[str, int]) -> None:
        self._ram.pop(key, None)
        spilled = self._spilled.pop(key, None)
        if spilled is not None:
            self._reading.pop(spilled, None)
            spilled.close()
            if not self._spilled:  # nothing left on disk: the directory goes too
                self._remove_directory_locked()
                self._wake.notify_all()  # and the release thread ends

    def _remove_directory_locked(self) -> None:
        cleanup, self._cleanup = self._cleanup, None
        self._directory = None
        if cleanup is not None:
            cleanup()  # removes the directory (once), then lets its lock go

    def _start_releaser_locked(self) -> None:
        if self._releaser is None:
            self._releaser = threading.Thread(
                target=self._release_loop, name=f"cerebro-release-{self.worker_id}", daemon=True
            )
            self._releaser.start()

    def _release_loop(self) -> None:
        """Release the read partitions' pages every interval; end once nothing is spilled.

        (A reused Python worker, as Spark's, keeps no idle thread of a worker that ended.)
        """
        while True:
            with self._lock:
                while not self._stop and not self._reading and self._spilled:
                    self._wake.wait()
                if self._stop or not self._spilled:
                    if self._releaser is threading.current_thread():
                        self._releaser = None
                    return
                self._wake.wait(self._interval)
                targets = list(self._reading)
            for spilled in targets:
                spilled.release()

    def _ensure_directory_locked(self) -> str:
        if self._directory is None:
            parent = self.parent
            os.makedirs(parent, exist_ok=True)
            directory, fd = _make_directory(parent, self.worker_id)
            self._directory = directory
            self._cleanup = weakref.finalize(self, _remove_owned, directory, fd)
        return self._directory

    def sweep(self) -> list[str]:
        """Remove stale local directories of dead workers beside this one's (:func:`sweep_stale`).

        Returns:
            The removed directories' paths.
        """
        return sweep_stale(self.parent)

    def close(self) -> None:
        """Forget every partition, remove the local directory, stop the release thread.

        The residence may be used again afterwards (it starts empty).
        """
        with self._lock:
            self._stop = True
            for key in list(self._spilled):
                self._discard_locked(key)
            self._ram.clear()
            self._reading.clear()
            self._remove_directory_locked()
            self._wake.notify_all()
            releaser, self._releaser = self._releaser, None
        if releaser is not None and releaser is not threading.current_thread():
            releaser.join(timeout=5.0)
        with self._lock:
            self._stop = False
