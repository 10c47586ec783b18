"""A worker's bounded, digest-checked memory cache of checkpoint bytes (less hop traffic).

Cerebro hops a trial's checkpoint from worker to worker; when a trial comes back to a
worker that wrote (or read) its latest checkpoint, reading it back from the store moves
bytes the worker already has. Each worker process keeps the checkpoints it wrote and the
ones it read, keyed by ``(store key, SHA-256)``, in a least-recently-used cache bounded by
bytes.

A hit needs the digest the event log recorded (``UnitTask.checkpoint_in_sha256``): a task
without one always reads the store. An entry's digest is the one computed from its bytes
when they were written or read (and checked against the log's); a hit is not hashed
again (issue 27: a checkpoint's digest is computed once, off the next unit's critical
path). The store stays the durable copy: every checkpoint is still written there before
its unit is reported done.

**Read ahead** (:func:`~cerebro_spark.training.prefetch_checkpoint`): the driver tells a
busy worker which checkpoints its next units will likely read, and the worker reads,
verifies and decodes them into this cache while it trains. An entry read ahead remembers
its store bytes until a unit takes it, so the unit reports the traffic it caused
(:meth:`CheckpointCache.take_prefetched`); a unit that needs an entry still being read
ahead waits for that read instead of reading the store again
(:meth:`CheckpointCache.wait_prefetch`).

An entry the worker wrote also keeps the checkpoint decoded
(:class:`~cerebro_spark.training._checkpoint.PackedCheckpoint`: a copy of its tensors and
a pickle of the rest): a unit restoring from a hit copies those tensors instead of
decoding the bytes with ``torch.load(weights_only=True)`` (3.6 ms for a 126 kB
checkpoint, the largest fixed cost of a unit on small models), and writes the same
bytes as it would after decoding them. The bytes are still checked against the digest
on every hit, and the decoded form goes with them; it counts toward the bound.

The bound is :data:`DEFAULT_MAX_BYTES` (256 MiB), or the environment variable
``CEREBRO_CHECKPOINT_CACHE_BYTES`` of the worker process (``0`` disables the cache); a
single checkpoint larger than the bound is not kept.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections import OrderedDict

from cerebro_spark.errors import ConfigError
from cerebro_spark.training._checkpoint import Checkpoint, PackedCheckpoint

#: The cache's default bound in bytes.
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
#: The environment variable that sets a worker's bound in bytes (0 disables the cache).
CACHE_BYTES_ENV = "CEREBRO_CHECKPOINT_CACHE_BYTES"


@dataclasses.dataclass
class CacheStats:
    """What a cache did since it was made or last cleared.

    Attributes:
        hits: Reads answered from memory.
        misses: Reads that went to the store (no entry, or no digest to check against).
        bytes_hit: Bytes answered from memory (store reads saved).
        evictions: Entries dropped to stay within the bound.
        prefetched: Entries read ahead (:meth:`CheckpointCache.put` with ``prefetched``).
    """

    hits: int = 0
    misses: int = 0
    bytes_hit: int = 0
    evictions: int = 0
    prefetched: int = 0


@dataclasses.dataclass
class _Entry:
    data: bytes
    decoded: PackedCheckpoint | None
    nbytes: int
    prefetched: int = 0  # store bytes read ahead, not yet reported by a unit


class CheckpointCache:
    """An LRU map ``(key, sha256) -> bytes`` (and decoded form) bounded by bytes; thread-safe.

    Args:
        max_bytes: The bound (``0`` keeps nothing).

    Raises:
        ConfigError: ``max_bytes`` is not a non-negative int.
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ConfigError(f"checkpoint cache max_bytes must be an int >= 0, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.stats = CacheStats()
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._reading: dict[tuple[str, str], threading.Event] = {}  # read ahead, in flight

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def put(
        self,
        key: str,
        sha256: str,
        data: bytes,
        decoded: Checkpoint | None = None,
        *,
        prefetched: bool = False,
    ) -> None:
        """Keep ``data`` as the bytes of ``key`` with digest ``sha256`` (already computed).

        Older entries of the same key are dropped (a key holds one checkpoint at a time);
        least recently used entries go until the total fits the bound.

        Args:
            key: The store key.
            sha256: The digest of ``data``.
            data: The checkpoint's bytes.
            decoded: What decoding ``data`` gives (the payload that was encoded): kept
                packed (:class:`~cerebro_spark.training._checkpoint.PackedCheckpoint`,
                a copy of its tensors), counted in the bound.
            prefetched: ``data`` was read ahead from the store: the first unit that takes
                it reports its bytes (:meth:`take_prefetched`).
        """
        packed = None
        if decoded is not None and 2 * len(data) <= self.max_bytes:
            packed = PackedCheckpoint.pack(decoded)
        size = len(data) + (packed.nbytes if packed is not None else 0)
        if packed is not None and size > self.max_bytes:  # the bytes alone, then
            packed, size = None, len(data)
        with self._lock:
            for entry in [k for k in self._entries if k[0] == key]:
                self._bytes -= self._entries.pop(entry).nbytes
            if size > self.max_bytes:
                return
            self._entries[(key, sha256)] = _Entry(
                data, packed, size, len(data) if prefetched else 0
            )
            self._bytes += size
            self.stats.prefetched += int(prefetched)
            while self._bytes > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= dropped.nbytes
                self.stats.evictions += 1

    def get(self, key: str, sha256: str | None) -> bytes | None:
        """Return the bytes of ``key`` if held with digest ``sha256``, else None.

        A ``None`` digest is always a miss: without the logged digest a hit could not be
        shown to be the right bytes.
        """
        entry = self._lookup(key, sha256)
        return None if entry is None else entry.data

    def get_checkpoint(
        self, key: str, sha256: str | None
    ) -> tuple[bytes, Checkpoint | None] | None:
        """Like :meth:`get`, with a fresh copy of the decoded checkpoint in host memory.

        Returns:
            ``None`` on a miss; else the bytes and a copy of the decoded checkpoint (the
            caller's to change), or ``None`` in its place when the entry has none.
        """
        entry = self._lookup(key, sha256)
        if entry is None:
            return None
        decoded = None if entry.decoded is None else entry.decoded.unpack()
        return entry.data, decoded

    def _lookup(self, key: str, sha256: str | None) -> _Entry | None:
        if sha256 is None:
            with self._lock:
                self.stats.misses += 1
            return None
        with self._lock:
            entry = self._entries.get((key, sha256))
            if entry is None:
                self.stats.misses += 1
                return None
            self._entries.move_to_end((key, sha256))
            self.stats.hits += 1
            self.stats.bytes_hit += len(entry.data)
        return entry

    def holds(self, key: str, sha256: str) -> bool:
        """Whether ``key`` is held with digest ``sha256`` (counted neither hit nor miss)."""
        with self._lock:
            return (key, sha256) in self._entries

    def take_prefetched(self, key: str, sha256: str | None) -> int:
        """The store bytes of ``key``'s entry read ahead and not yet reported; then 0."""
        with self._lock:
            entry = None if sha256 is None else self._entries.get((key, sha256))
            if entry is None:
                return 0
            taken, entry.prefetched = entry.prefetched, 0
            return taken

    def begin_prefetch(self, key: str, sha256: str) -> bool:
        """Claim the read ahead of ``key``; ``False`` if it is held or being read already."""
        with self._lock:
            if (key, sha256) in self._entries or (key, sha256) in self._reading:
                return False
            self._reading[(key, sha256)] = threading.Event()
            return True

    def end_prefetch(self, key: str, sha256: str) -> None:
        """End the read ahead of ``key`` (put or not); wake the units waiting for it."""
        with self._lock:
            done = self._reading.pop((key, sha256), None)
        if done is not None:
            done.set()

    def wait_prefetch(self, key: str, sha256: str | None, timeout_s: float = 600.0) -> bool:
        """Wait for a read ahead of ``key`` in flight; whether there was one."""
        with self._lock:
            done = None if sha256 is None else self._reading.get((key, sha256))
        if done is None:
            return False
        done.wait(timeout_s)
        return True

    def clear(self) -> None:
        """Drop every entry and reset the statistics."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0
            self.stats = CacheStats()


def _bound_from_environment() -> int:
    raw = os.environ.get(CACHE_BYTES_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_MAX_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(f"{CACHE_BYTES_ENV} must be an int >= 0 (bytes), got {raw!r}")
    return value


_CACHE: CheckpointCache | None = None
_CACHE_LOCK = threading.Lock()


def worker_cache() -> CheckpointCache:
    """The process's checkpoint cache (made on first use, bounded as the module says)."""
    global _CACHE
    with _CACHE_LOCK:
        if _CACHE is None:
            _CACHE = CheckpointCache(_bound_from_environment())
        return _CACHE


def set_worker_cache_bytes(max_bytes: int) -> CheckpointCache:
    """Replace the process's cache by an empty one bounded by ``max_bytes`` (0 disables it).

    Returns:
        The new cache.

    Raises:
        ConfigError: ``max_bytes`` is not a non-negative int.
    """
    global _CACHE
    cache = CheckpointCache(max_bytes)
    with _CACHE_LOCK:
        _CACHE = cache
    return cache
