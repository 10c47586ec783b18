"""A worker's bounded, digest-checked memory cache of checkpoint bytes (less hop traffic).

Cerebro hops a trial's checkpoint from worker to worker; when a trial comes back to a
worker that wrote (or read) its latest checkpoint, reading it back from the store moves
bytes the worker already has. Each worker process keeps the checkpoints it wrote and the
ones it read, keyed by ``(store key, SHA-256)``, in a least-recently-used cache bounded by
bytes.

A hit needs the digest the event log recorded (``UnitTask.checkpoint_in_sha256``): a task
without one always reads the store. The bytes of a hit are hashed again before they are
returned, so a hit never gives bytes other than those the log recorded (a memory fault
is a miss, and the entry is dropped). The store stays the durable copy: every checkpoint
is still written there before its unit is reported done.

The bound is :data:`DEFAULT_MAX_BYTES` (256 MiB), or the environment variable
``CEREBRO_CHECKPOINT_CACHE_BYTES`` of the worker process (``0`` disables the cache); a
single checkpoint larger than the bound is not kept.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import threading
from collections import OrderedDict

from cerebro_spark.errors import ConfigError

logger = logging.getLogger(__name__)

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
        corrupt: Entries whose bytes no longer matched their digest (dropped, a miss).
    """

    hits: int = 0
    misses: int = 0
    bytes_hit: int = 0
    evictions: int = 0
    corrupt: int = 0


class CheckpointCache:
    """An LRU map ``(key, sha256) -> bytes`` bounded by total bytes; thread-safe.

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
        self._entries: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, key: str, sha256: str, data: bytes) -> None:
        """Keep ``data`` as the bytes of ``key`` with digest ``sha256`` (already computed).

        Older entries of the same key are dropped (a key holds one checkpoint at a time);
        least recently used entries go until the total fits the bound.
        """
        with self._lock:
            for entry in [k for k in self._entries if k[0] == key]:
                self._bytes -= len(self._entries.pop(entry))
            if len(data) > self.max_bytes:
                return
            self._entries[(key, sha256)] = data
            self._bytes += len(data)
            while self._bytes > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= len(dropped)
                self.stats.evictions += 1

    def get(self, key: str, sha256: str | None) -> bytes | None:
        """Return the bytes of ``key`` if held with digest ``sha256`` (re-checked), else None.

        A ``None`` digest is always a miss: without the logged digest a hit could not be
        shown to be the right bytes.
        """
        if sha256 is None:
            with self._lock:
                self.stats.misses += 1
            return None
        with self._lock:
            data = self._entries.get((key, sha256))
            if data is None:
                self.stats.misses += 1
                return None
            self._entries.move_to_end((key, sha256))
        if hashlib.sha256(data).hexdigest() != sha256:  # outside the lock: hashing is slow
            with self._lock:
                if self._entries.pop((key, sha256), None) is not None:
                    self._bytes -= len(data)
                self.stats.corrupt += 1
                self.stats.misses += 1
            logger.warning("checkpoint cache entry %s no longer matches its SHA-256", key)
            return None
        with self._lock:
            self.stats.hits += 1
            self.stats.bytes_hit += len(data)
        return data

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
