"""An exclusive lease on one experiment: one driver at a time.

``run``, ``resume`` and ``replay`` hold a lease on the experiment they drive: the object
``experiments/<id>/lease.json`` in the store, holding its owner (host, pid, a random
token), when it was taken (``started_at``) and when it was last renewed
(``heartbeat_at``), both in seconds since the epoch on the holder's clock.

* It is **taken with a conditional write**: on a local disk the lease file is created
  and replaced only under an exclusive ``flock`` of the experiment's directory; on S3 it is
  created with ``PutObject`` ``If-None-Match: "*"`` (exactly one of two concurrent
  creators wins) and replaced with ``If-Match: <the ETag read>``. pyarrow's S3 file system
  cannot send those headers, so S3 leases use boto3 with the store's endpoint, region and
  credentials (the standard AWS environment, as pyarrow uses). Other file systems (HDFS,
  GCS) get a best-effort lease (read, then write: not atomic), with a warning.
* A **heartbeat thread** renews it every ``heartbeat`` seconds (by default a sixth of the
  timeout), conditionally on the version it last wrote: if another driver took it over
  (this one was stalled past the timeout), the lease is marked lost and
  :meth:`ExperimentLease.check` raises from then on, so the stalled driver writes no
  further event and deletes no checkpoint.
* It is **stale** when its last heartbeat is more than ``timeout`` seconds old (default
  60 s; ``CEREBRO_LEASE_TIMEOUT_SECONDS`` or the ``lease_timeout`` argument), or at once
  when it names a process of this host that is no longer running (a driver killed with
  SIGKILL can be resumed immediately). A stale lease is taken over with a conditional
  replace; a live one refuses the new driver with :class:`~cerebro_spark.errors.LeaseError`
  naming who holds it and since when.
* It is **released** (deleted, if it is still ours) when the ``with`` block ends, also on
  an exception or ``KeyboardInterrupt``.

The seam is :class:`LeaseObject` (read, create, replace, delete with a version tag);
:func:`lease_object` picks the implementation for a store.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import datetime
import errno
import fcntl
import hashlib
import json
import logging
import os
import secrets
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

from cerebro_spark.errors import ConfigError, LeaseError, StoreError
from cerebro_spark.store._base import Store
from cerebro_spark.store._filesystem import FileSystemStore

logger = logging.getLogger(__name__)

LEASE_NAME = "lease.json"
"""Name of the lease object in an experiment's directory."""
DEFAULT_TIMEOUT = 60.0
"""Seconds after its last heartbeat a lease is stale (``CEREBRO_LEASE_TIMEOUT_SECONDS``)."""
TIMEOUT_ENV = "CEREBRO_LEASE_TIMEOUT_SECONDS"


class LeaseObject(abc.ABC):
    """The seam: one small object written only conditionally.

    A *tag* names one version of the object's bytes (an S3 ETag, a content hash).
    """

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """Where the object lives (for messages)."""

    @abc.abstractmethod
    def read(self) -> tuple[bytes, str] | None:
        """Return the bytes and their tag, or ``None`` when there is no object."""

    @abc.abstractmethod
    def create(self, data: bytes) -> str | None:
        """Write ``data`` if there is no object; return its tag, or ``None`` if there is one."""

    @abc.abstractmethod
    def replace(self, data: bytes, tag: str) -> str | None:
        """Write ``data`` if the object's tag is ``tag``; return the new tag, else ``None``."""

    @abc.abstractmethod
    def delete(self, tag: str) -> bool:
        """Delete the object if its tag is ``tag``; return whether it was deleted."""


def _hash_tag(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class LocalLeaseObject(LeaseObject):
    """A lease file on a local (or NFS) disk; every change under ``flock`` of its directory."""

    def __init__(self, path: str) -> None:
        self.path = path

    @property
    def url(self) -> str:
        return self.path

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        directory = os.path.dirname(self.path)
        try:
            os.makedirs(directory, exist_ok=True)
            fd = os.open(directory, os.O_RDONLY)
        except OSError as error:
            raise StoreError(
                f"cannot write the lease of {directory}: {error.strerror or error} "
                "(the store must be a writable directory)"
            ) from error
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _read_unlocked(self) -> tuple[bytes, str] | None:
        try:
            with open(self.path, "rb") as src:
                data = src.read()
        except FileNotFoundError:
            return None
        return data, _hash_tag(data)

    def _write_unlocked(self, data: bytes) -> str:
        tmp = f"{self.path}.cerebro-tmp-{secrets.token_hex(16)}"  # never listed
        try:
            with open(tmp, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return _hash_tag(data)

    def read(self) -> tuple[bytes, str] | None:
        return self._read_unlocked()

    def create(self, data: bytes) -> str | None:
        with self._locked():
            if os.path.exists(self.path):
                return None
            return self._write_unlocked(data)

    def replace(self, data: bytes, tag: str) -> str | None:
        with self._locked():
            current = self._read_unlocked()
            if current is None or current[1] != tag:
                return None
            return self._write_unlocked(data)

    def delete(self, tag: str) -> bool:
        with self._locked():
            current = self._read_unlocked()
            if current is None or current[1] != tag:
                return False
            os.unlink(self.path)
            return True


class S3LeaseObject(LeaseObject):
    """A lease object on S3, written with ``If-None-Match`` / ``If-Match`` (boto3)."""

    def __init__(self, client: Any, bucket: str, key: str, url: str) -> None:
        self._client = client
        self.bucket = bucket
        self.key = key
        self._url = url

    @property
    def url(self) -> str:
        return self._url

    def _failed(self, error: Exception) -> StoreError:
        return StoreError(f"cannot use the lease object {self._url}: {error}")

    @staticmethod
    def _code(error: Exception) -> str:
        response = getattr(error, "response", None) or {}
        return str(response.get("Error", {}).get("Code", ""))

    def read(self) -> tuple[bytes, str] | None:
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=self.key)
        except Exception as error:
            if self._code(error) in ("NoSuchKey", "404", "NotFound"):
                return None
            raise self._failed(error) from error
        return response["Body"].read(), str(response["ETag"])

    def _put(self, data: bytes, **condition: str) -> str | None:
        try:
            response = self._client.put_object(
                Bucket=self.bucket, Key=self.key, Body=data, **condition
            )
        except Exception as error:
            # 412: the condition failed; 409: a concurrent conditional write won the race
            if self._code(error) in ("PreconditionFailed", "ConditionalRequestConflict", "412"):
                return None
            raise self._failed(error) from error
        return str(response["ETag"])

    def create(self, data: bytes) -> str | None:
        return self._put(data, IfNoneMatch="*")

    def replace(self, data: bytes, tag: str) -> str | None:
        return self._put(data, IfMatch=tag)

    def delete(self, tag: str) -> bool:
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=tag)
        except Exception as error:
            if self._code(error) in ("PreconditionFailed", "NoSuchKey", "404", "412"):
                return False
            raise self._failed(error) from error
        return True


class StoreLeaseObject(LeaseObject):
    """Best effort on a store without conditional writes (HDFS, GCS): read, then write."""

    def __init__(self, store: Store, key: str) -> None:
        self.store = store
        self.key = key

    @property
    def url(self) -> str:
        return self.store.url(self.key)

    def read(self) -> tuple[bytes, str] | None:
        try:
            data = self.store.get(self.key)
        except FileNotFoundError:
            return None
        return data, _hash_tag(data)

    def create(self, data: bytes) -> str | None:
        if self.store.exists(self.key):
            return None
        self.store.put(self.key, data)
        return _hash_tag(data)

    def replace(self, data: bytes, tag: str) -> str | None:
        current = self.read()
        if current is None or current[1] != tag:
            return None
        self.store.put(self.key, data)
        return _hash_tag(data)

    def delete(self, tag: str) -> bool:
        current = self.read()
        if current is None or current[1] != tag:
            return False
        self.store.delete(self.key)
        return True


_S3_OPTIONS = {
    "region": "region_name",
    "access_key": "aws_access_key_id",
    "secret_key": "aws_secret_access_key",
    "session_token": "aws_session_token",
}


def s3_client(store_uri: str) -> Any:
    """Return a boto3 S3 client reaching the same endpoint as the store's ``s3://`` URI.

    The URI's pyarrow options ``endpoint_override``, ``scheme``, ``region``,
    ``access_key``, ``secret_key`` and ``session_token`` are honoured; anything else comes
    from the standard AWS environment, as for pyarrow.
    """
    try:
        import boto3
    except ImportError as error:  # pragma: no cover - boto3 is in the s3 extra
        raise ConfigError(
            f"leases on S3 stores ({store_uri}) need boto3: pip install 'cerebro-spark[s3]'"
        ) from error
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(store_uri).query))
    kwargs: dict[str, Any] = {
        boto: query[option] for option, boto in _S3_OPTIONS.items() if option in query
    }
    if "endpoint_override" in query:
        endpoint = query["endpoint_override"]
        if "://" not in endpoint:
            endpoint = f"{query.get('scheme', 'https')}://{endpoint}"
        kwargs["endpoint_url"] = endpoint
    return boto3.client("s3", **kwargs)


def lease_object(store: Store, key: str) -> LeaseObject:
    """Return the lease object for ``key`` in ``store`` (local, S3 or best effort)."""
    if isinstance(store, FileSystemStore):
        kind = store.filesystem.type_name
        if kind == "local":
            return LocalLeaseObject(store.path(key))
        if kind == "s3":
            bucket, _, prefix = store.path(key).partition("/")
            return S3LeaseObject(s3_client(store.uri), bucket, prefix, store.url(key))
    logger.warning(
        "%s cannot write conditionally: the lease on %s is best effort (two drivers "
        "started at the same moment may both take it)",
        store.uri,
        key,
    )
    return StoreLeaseObject(store, key)


@dataclasses.dataclass(frozen=True)
class LeaseHolder:
    """Who holds a lease (the contents of ``lease.json``)."""

    host: str
    pid: int
    token: str
    started_at: float
    heartbeat_at: float

    def to_bytes(self) -> bytes:
        """The JSON the lease object holds."""
        return (json.dumps(dataclasses.asdict(self), sort_keys=True) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> LeaseHolder | None:
        """Parse a lease object (``None``: unreadable, e.g. torn by a crash)."""
        try:
            raw = json.loads(data)
            return cls(
                host=str(raw["host"]),
                pid=int(raw["pid"]),
                token=str(raw["token"]),
                started_at=float(raw["started_at"]),
                heartbeat_at=float(raw["heartbeat_at"]),
            )
        except (ValueError, KeyError, TypeError):
            return None

    def describe(self, now: float) -> str:
        """``host H, pid P, since <UTC time> (last heartbeat N s ago)``."""
        since = datetime.datetime.fromtimestamp(self.started_at, datetime.timezone.utc)
        return (
            f"host {self.host}, pid {self.pid}, since {since:%Y-%m-%d %H:%M:%S} UTC "
            f"(last heartbeat {max(0.0, now - self.heartbeat_at):.0f} s ago)"
        )


def _process_gone(pid: int) -> bool:
    """Whether no process ``pid`` runs on this host (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    except OSError as error:  # pragma: no cover - other platforms
        return error.errno == errno.ESRCH
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
        return state in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def default_timeout() -> float:
    """The lease timeout: ``CEREBRO_LEASE_TIMEOUT_SECONDS`` seconds, else 60."""
    raw = os.environ.get(TIMEOUT_ENV)
    if raw is None or raw == "":
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"{TIMEOUT_ENV} must be a number of seconds > 0, got {raw!r}")
    return value


class ExperimentLease:
    """An exclusive, heart-beaten lease on one experiment (see the module docstring).

    Args:
        obj: Where the lease lives (:func:`lease_object`).
        what: What it guards, for messages (``experiment e1 in /runs``).
        timeout: Seconds after the last heartbeat the lease is stale (``None``:
            :func:`default_timeout`).
        heartbeat: Seconds between renewals (default: ``timeout / 6``).
        clock: Wall clock in seconds since the epoch (tests pass a fake).

    Example:
        >>> with ExperimentLease(obj, "experiment e1").acquire() as lease:  # doctest: +SKIP
        ...     lease.check()  # raises LeaseError once another driver took it over
    """

    def __init__(
        self,
        obj: LeaseObject,
        what: str,
        *,
        timeout: float | None = None,
        heartbeat: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.obj = obj
        self.what = what
        self.timeout = default_timeout() if timeout is None else float(timeout)
        if not self.timeout > 0:
            raise ConfigError(f"lease timeout must be > 0 seconds, got {timeout!r}")
        self.heartbeat = self.timeout / 6 if heartbeat is None else float(heartbeat)
        if not 0 < self.heartbeat < self.timeout:
            raise ConfigError(
                f"lease heartbeat must be > 0 and < the timeout ({self.timeout} s), "
                f"got {heartbeat!r}"
            )
        self._clock = clock
        self._holder: LeaseHolder | None = None
        self._tag: str | None = None
        self._lost: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- state ----------------------------------------------------------------------------

    @property
    def holder(self) -> LeaseHolder | None:
        """This driver's entry while it holds the lease, else ``None``."""
        return self._holder

    @property
    def held(self) -> bool:
        """Whether this driver holds the lease (taken, not released, not lost)."""
        return self._holder is not None and self._lost is None

    def check(self) -> None:
        """Raise unless this driver still holds the lease.

        Raises:
            LeaseError: It was never taken, was released, or another driver took it over.
        """
        if self._lost is not None:
            raise LeaseError(self._lost)
        if self._holder is None:
            raise LeaseError(f"this driver does not hold the lease on {self.what}")

    # -- taking and giving back -----------------------------------------------------------

    def acquire(self) -> ExperimentLease:
        """Take the lease (a stale one is taken over) and start the heartbeat.

        Raises:
            LeaseError: A live driver holds it (the message names host, pid and since when).
            StoreError: The store could not be written.
        """
        if self._holder is not None:
            raise LeaseError(f"the lease on {self.what} is already held by this driver")
        now = self._clock()
        mine = LeaseHolder(socket.gethostname(), os.getpid(), secrets.token_hex(16), now, now)
        for _ in range(5):  # a lost race against another taker: look again
            tag = self.obj.create(mine.to_bytes())
            if tag is not None:
                break
            current = self.obj.read()
            if current is None:
                continue  # released meanwhile
            data, old_tag = current
            other = LeaseHolder.from_bytes(data)
            reason = self._stale(other, now)
            if reason is None:
                assert other is not None  # ok: an unreadable lease is stale
                raise LeaseError(
                    f"{self.what} is driven by another driver: {other.describe(now)}; the "
                    f"lease {self.obj.url} goes stale {self.timeout:.0f} s after its last "
                    "heartbeat (wait for that driver to end, or stop it)"
                )
            tag = self.obj.replace(mine.to_bytes(), old_tag)
            if tag is not None:
                logger.warning("took over the lease on %s: %s", self.what, reason)
                break
        else:
            raise LeaseError(f"could not take the lease {self.obj.url}: other drivers kept racing")
        self._holder, self._tag, self._lost = mine, tag, None
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._beat, name=f"lease heartbeat {self.what}", daemon=True
        )
        self._thread.start()
        logger.debug("took the lease %s", self.obj.url)
        return self

    def _stale(self, other: LeaseHolder | None, now: float) -> str | None:
        """Why ``other``'s lease may be taken over, or ``None`` while it is live."""
        if other is None:
            return "its lease object was unreadable"
        here = other.host == socket.gethostname() and other.pid != os.getpid()
        if here and _process_gone(other.pid):
            return f"its driver (pid {other.pid} on this host) is no longer running"
        age = now - other.heartbeat_at
        if age > self.timeout:
            return (
                f"its driver (host {other.host}, pid {other.pid}) last renewed it {age:.0f} s "
                f"ago, more than the {self.timeout:.0f} s timeout"
            )
        return None

    def release(self) -> None:
        """Stop the heartbeat and delete the lease if it is still ours (idempotent)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        with self._lock:
            holder, tag = self._holder, self._tag
            self._holder, self._tag = None, None
        if holder is None or tag is None or self._lost is not None:
            return
        try:
            if not self.obj.delete(tag):
                logger.warning("the lease %s was no longer ours when released", self.obj.url)
        except StoreError as error:
            logger.warning("could not release the lease %s: %s", self.obj.url, error)

    def __enter__(self) -> ExperimentLease:
        if self._holder is None:
            self.acquire()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()

    # -- the heartbeat --------------------------------------------------------------------

    def renew(self) -> None:
        """Write a fresh ``heartbeat_at`` (conditionally on our last version).

        Marks the lease lost when another driver replaced it.
        """
        with self._lock:
            if self._holder is None or self._tag is None or self._lost is not None:
                return
            renewed = dataclasses.replace(self._holder, heartbeat_at=self._clock())
            tag = self.obj.replace(renewed.to_bytes(), self._tag)
            if tag is not None:
                self._holder, self._tag = renewed, tag
                return
            current = self.obj.read()
            other = LeaseHolder.from_bytes(current[0]) if current else None
            who = other.describe(self._clock()) if other else "nobody (it was deleted)"
            self._lost = (
                f"lost the lease on {self.what}: another driver took it over after this one "
                f"missed its heartbeats for over {self.timeout:.0f} s; it is now held by {who}"
            )
            logger.error("%s", self._lost)

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat):
            try:
                self.renew()
            except Exception as error:  # a store outage: try again at the next beat
                logger.warning("could not renew the lease %s: %s", self.obj.url, error)
            if self._lost is not None:
                return


def experiment_lease(
    store: Store,
    prefix: str,
    what: str,
    *,
    timeout: float | None = None,
    heartbeat: float | None = None,
    clock: Callable[[], float] = time.time,
) -> ExperimentLease:
    """Return the (not yet taken) lease of the experiment stored under ``prefix``."""
    return ExperimentLease(
        lease_object(store, f"{prefix}/{LEASE_NAME}"),
        what,
        timeout=timeout,
        heartbeat=heartbeat,
        clock=clock,
    )
