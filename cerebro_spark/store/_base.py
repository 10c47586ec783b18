"""The Store seam: where datasets, checkpoints and experiment logs live.

Rules every implementation keeps (the contract tests in ``tests/store`` check them):

* Keys are ``/``-separated relative paths (``experiments/e1/events.jsonl``); a key never
  starts with ``/`` and never contains ``..``. Bad keys raise :class:`ValueError` naming
  the key.
* :meth:`Store.put` is atomic: a reader sees the old bytes or the new bytes, never a
  partial write (write to a temporary key, then rename/copy).
* :meth:`Store.get` of a missing key raises :class:`FileNotFoundError` naming the URI.
* :meth:`Store.list` returns the keys under a prefix, sorted, recursively.
* A store pickles to a small spec (its URI and options, never open connections), so it
  can be shipped to workers and rebuilt there.
"""

from __future__ import annotations

import abc


class Store(abc.ABC):
    """Bytes under string keys, below one root URI."""

    @property
    @abc.abstractmethod
    def uri(self) -> str:
        """The root URI of the store (``file:///...``, ``/abs/path`` or ``s3://bucket/prefix``)."""

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write ``data`` under ``key`` atomically, replacing what was there."""

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """Return the bytes under ``key``; raise :class:`FileNotFoundError` if absent."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """Whether ``key`` holds an object."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Return all keys below ``prefix`` (recursively), sorted."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; removing a missing key is not an error."""

    @abc.abstractmethod
    def append(self, key: str, data: bytes) -> None:
        """Append ``data`` to ``key``, creating it if absent.

        Local file systems append in place and flush; object stores, which cannot
        append, rewrite the object (atomically) with the new bytes at the end.
        """

    @abc.abstractmethod
    def url(self, key: str) -> str:
        """Return the full URI of ``key`` (for messages and for pyarrow readers)."""

    @abc.abstractmethod
    def child(self, prefix: str) -> Store:
        """Return a store rooted at ``prefix`` below this one."""
