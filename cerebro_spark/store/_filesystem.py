"""A :class:`~cerebro_spark.store.Store` over any pyarrow file system (local disk, S3, HDFS).

URIs:

* local: ``/abs/path``, ``relative/path`` (made absolute when the store is built, so the
  store means the same directory on every machine it is shipped to) or ``file:///abs/path``;
* S3: ``s3://bucket/prefix`` with optional pyarrow S3 options in the query string, e.g.
  ``s3://bucket/prefix?endpoint_override=127.0.0.1:9000&scheme=http&region=us-east-1``.
  Credentials come from the standard AWS environment (``AWS_ACCESS_KEY_ID`` ...);
* anything else pyarrow's :meth:`pyarrow.fs.FileSystem.from_uri` understands
  (``hdfs://host:port/path``, ``gs://bucket/prefix``).

How each operation keeps the :class:`~cerebro_spark.store.Store` rules:

* ``put`` on a local disk writes a temporary file in the destination directory, flushes
  and fsyncs it, then ``os.replace``-s it over the key (atomic rename). On an object store
  (S3, GCS) the object is written directly: S3 makes an object visible only when its
  ``PutObject`` / ``CompleteMultipartUpload`` succeeds, so readers see the old or the new
  bytes, never a prefix; a temporary key plus a server-side copy would double the
  requests and the time without adding atomicity. Other file systems (HDFS) write a
  temporary file and rename it.
* ``append`` appends in place on a local disk (``O_APPEND``, one write); elsewhere it
  rewrites the whole object (get + put), which is atomic but not safe against two
  concurrent appenders.
* ``get`` reads an object as a random-access file, whose size is known: one request for
  the whole object (on S3 a HEAD and one GET). A pyarrow stream's ``read()`` would ask for
  256 KiB at a time, one GET each (a 30 MB partition: 120 GETs, ~10x slower on S3).
* Temporary files are named ``<name>.cerebro-tmp-<32 hex>``; ``list`` never shows them and
  such names are not valid keys.

What goes wrong, and what each operation does about it:

* A full disk (``ENOSPC``, ``EDQUOT``) raises :class:`~cerebro_spark.errors.StoreFullError`
  naming the URI. A failed local ``append`` first truncates the file back to its size
  before the append (truncating needs no space), so an append is all or nothing.
* On a remote store (S3, GCS, HDFS) a connection-level failure (connection refused or
  reset, time-outs, ``NETWORK_CONNECTION``, throttling, ``SERVICE_UNAVAILABLE``) is retried
  with exponential backoff, each retry logged as a warning, for up to
  :func:`retry_seconds` in all (``CEREBRO_STORE_RETRY_SECONDS``, default 300); then
  :class:`~cerebro_spark.errors.StoreUnavailableError` is raised. Errors that retrying
  cannot fix (a missing key, access denied, a missing bucket) are raised at once.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import re
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import pyarrow.fs as pafs

from cerebro_spark.errors import ConfigError, StoreFullError, StoreUnavailableError
from cerebro_spark.store._base import Store

logger = logging.getLogger(__name__)

_TMP_MARK = ".cerebro-tmp-"
_TMP_PATTERN = re.compile(r"\.cerebro-tmp-[0-9a-f]{32}$")
_OBJECT_STORES = frozenset({"s3", "gcs"})

_cache_lock = threading.Lock()
_fs_cache: dict[tuple[str, str, str], pafs.FileSystem] = {}
_LOCAL = pafs.LocalFileSystem()

_T = TypeVar("_T")

RETRY_SECONDS_ENV = "CEREBRO_STORE_RETRY_SECONDS"
"""Environment variable: how long in all a remote store operation is retried (seconds)."""

DEFAULT_RETRY_SECONDS = 300.0
_FIRST_PAUSE = 0.5
_LONGEST_PAUSE = 15.0
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})

# How pyarrow (the AWS SDK, curl) words failures that a retry can fix: the server or the
# network did not answer, or asked to slow down. Anything else (ACCESS_DENIED,
# NO_SUCH_BUCKET, a missing key) is a real error and is raised at once.
_TRANSIENT_MARKERS = (
    "NETWORK_CONNECTION",
    "curlCode",
    "Could not connect",
    "Couldn't connect",
    "Connection refused",
    "Connection reset",
    "Broken pipe",
    "timed out",
    "Timeout",
    "SERVICE_UNAVAILABLE",
    "SLOW_DOWN",
    "THROTTLING",
    "REQUEST_TIMEOUT",
    "INTERNAL_FAILURE",
    "Service Unavailable",
)
_NEVER_TRANSIENT = (
    FileNotFoundError,
    FileExistsError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
)


def retry_seconds() -> float:
    """How long in all a remote store operation is retried while the store is unreachable.

    Read from ``CEREBRO_STORE_RETRY_SECONDS`` at each operation (so a driver and the
    workers it starts agree when the variable is in their environment); 300 when unset,
    0 to fail at once.

    Raises:
        ConfigError: The variable is not a finite number of seconds ``>= 0``.
    """
    raw = os.environ.get(RETRY_SECONDS_ENV, "").strip()
    if not raw:
        return DEFAULT_RETRY_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ConfigError(
            f"{RETRY_SECONDS_ENV}={raw!r} must be a number of seconds >= 0 (0: never retry)"
        )
    return value


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` is a connection-level store failure that a retry can fix."""
    if isinstance(error, (StoreFullError, *_NEVER_TRANSIENT)):
        return False
    if isinstance(error, (ConnectionError, TimeoutError)):
        return True
    if not isinstance(error, OSError) or isinstance(error, StoreUnavailableError):
        return False
    text = str(error)
    return any(marker in text for marker in _TRANSIENT_MARKERS)


def with_retries(what: str, url: str, operation: Callable[[], _T]) -> _T:
    """Run ``operation``, retrying connection-level failures for up to :func:`retry_seconds`.

    Args:
        what: The operation, for messages (``"get"``, ``"put"`` ...).
        url: The URI it works on, for messages.
        operation: The call to make (again).

    Raises:
        StoreUnavailableError: The store stayed unreachable for the whole budget.
        OSError: Any failure that is not connection-level, at once.
    """
    budget = retry_seconds()
    started = time.monotonic()
    pause = _FIRST_PAUSE
    attempt = 0
    while True:
        try:
            result = operation()
        except OSError as error:
            if not is_transient(error):
                raise
            waited = time.monotonic() - started
            if waited >= budget:
                raise StoreUnavailableError(
                    f"{what} of {url} failed: the store was unreachable for {waited:.1f} s "
                    f"({attempt + 1} attempts; {RETRY_SECONDS_ENV}={budget:g}); last error: "
                    f"{error}"
                ) from error
            attempt += 1
            sleep = min(pause, budget - waited)
            logger.warning(
                "%s of %s failed, the store looks unreachable (%s); retry %d in %.1f s "
                "(%.1f s of %g s waited)",
                what,
                url,
                _first_line(error),
                attempt,
                sleep,
                waited,
                budget,
            )
            time.sleep(sleep)
            pause = min(pause * 2, _LONGEST_PAUSE)
            continue
        if attempt:
            logger.warning(
                "%s of %s succeeded after %d retries (%.1f s)",
                what,
                url,
                attempt,
                time.monotonic() - started,
            )
        return result


def _first_line(error: BaseException) -> str:
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def _store_full(error: OSError, url: str, what: str) -> OSError:
    """A :class:`StoreFullError` for a disk-full ``error``, else ``error`` itself."""
    if error.errno not in _NO_SPACE:
        return error
    full = StoreFullError(
        f"no space left on the disk of {url} while writing it ({what}: "
        f"{os.strerror(error.errno)}); free space there and try again (a run that stopped "
        "here continues with 'cerebro-spark resume')"
    )
    full.errno = error.errno
    return full


def _split_local(uri: str) -> str | None:
    """Return the absolute local path ``uri`` names, or ``None`` if it is not local."""
    if "://" not in uri:
        return os.path.abspath(uri)
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme != "file":
        return None
    if parts.netloc not in ("", "localhost") or parts.query:
        raise ConfigError(
            f"file URI {uri!r} must look like file:///absolute/path (no host, no options)"
        )
    return os.path.abspath(urllib.parse.unquote(parts.path))


def resolve_filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """Return the pyarrow file system that holds ``uri`` and the path of ``uri`` in it.

    File systems are cached per (scheme, bucket or host, options) within a process, so
    resolving many keys of one store builds one S3 client.

    Args:
        uri: A local path (absolute or relative), a ``file://`` URI, an ``s3://`` URI with
            optional pyarrow S3 options as query parameters, or any URI pyarrow
            understands.

    Returns:
        ``(filesystem, path)``; local paths are absolute, S3 paths are ``bucket/key``.

    Raises:
        ConfigError: ``uri`` is empty or pyarrow cannot build a file system from it.
    """
    if not isinstance(uri, str) or not uri:
        raise ConfigError(f"store URI must be a non-empty string, got {uri!r}")
    if uri.lower().startswith("dbfs:"):  # Spark's scheme: Python reads DBFS through FUSE
        fuse = "/dbfs/" + uri[5:].lstrip("/")
        raise ConfigError(
            f"store {uri!r}: a dbfs: URI is Spark's, and the driver and its workers read "
            f"and write the store from Python: use its FUSE path {fuse!r}, or a Unity "
            "Catalog volume path /Volumes/<catalog>/<schema>/<volume>/..."
        )
    local = _split_local(uri)
    if local is not None:
        return _LOCAL, local
    parts = urllib.parse.urlsplit(uri)
    scheme = parts.scheme.lower()
    if not parts.netloc and scheme in ("s3", "gs", "gcs"):
        raise ConfigError(f"URI {uri!r} names no bucket; expected {scheme}://bucket/prefix")
    query = "&".join(sorted(parts.query.split("&"))) if parts.query else ""
    key = (scheme, parts.netloc, query)
    with _cache_lock:
        filesystem = _fs_cache.get(key)
        if filesystem is None:
            root = urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/", parts.query, ""))
            try:
                filesystem, _ = pafs.FileSystem.from_uri(root)
            except Exception as exc:  # pyarrow raises ArrowInvalid / OSError subclasses
                raise ConfigError(f"cannot open a file system for URI {uri!r}: {exc}") from exc
            _fs_cache[key] = filesystem
            logger.debug("created %s file system for %s", filesystem.type_name, root)
    path = urllib.parse.unquote(parts.path).rstrip("/")
    if filesystem.type_name in _OBJECT_STORES:
        path = parts.netloc + path
    return filesystem, path or "/"


def check_key(key: str, *, allow_empty: bool = False) -> str:
    """Validate a store key and return it.

    A key is a non-empty ``/``-separated relative path: no leading ``/``, no ``..``, no
    empty or ``.`` segments, no NUL and no segment reserved for temporary files.

    Args:
        key: The key to check.
        allow_empty: Accept ``""`` (the root, for :meth:`Store.list`).

    Raises:
        ValueError: The key breaks a rule; the message names the key and the rule.
    """
    if not isinstance(key, str):
        raise ValueError(f"store key must be a string, got {key!r}")
    if not key:
        if allow_empty:
            return key
        raise ValueError("store key must not be empty")
    rules = (
        (key.startswith("/"), "must not start with '/'"),
        (".." in key, "must not contain '..'"),
        ("\x00" in key or "\\" in key, "must not contain NUL or backslash"),
        (any(seg in ("", ".") for seg in key.split("/")), "must not have empty or '.' parts"),
        (_TMP_MARK in key, f"must not contain the reserved marker {_TMP_MARK!r}"),
    )
    for broken, rule in rules:
        if broken:
            raise ValueError(f"bad store key {key!r}: a key {rule}")
    return key


class FileSystemStore(Store):
    """A store rooted at a URI on a pyarrow file system.

    Args:
        uri: Root of the store; see the module docstring for the accepted forms.

    Example:
        >>> store = FileSystemStore("/tmp/cerebro-doc-store")
        >>> store.put("a/b.txt", b"hello")
        >>> store.get("a/b.txt")
        b'hello'
    """

    def __init__(self, uri: str) -> None:
        filesystem, path = resolve_filesystem(uri)
        self._filesystem = filesystem
        self._root = path.rstrip("/") or "/"
        self._local = isinstance(filesystem, pafs.LocalFileSystem)
        self._object_store = filesystem.type_name in _OBJECT_STORES
        if self._local:
            self._uri = self._root
            self._query = ""
        else:
            parts = urllib.parse.urlsplit(uri)
            self._query = parts.query
            base = urllib.parse.urlunsplit((parts.scheme, parts.netloc, "", "", ""))
            self._uri = base + parts.path.rstrip("/") + (f"?{self._query}" if self._query else "")

    # -- identity ---------------------------------------------------------------------------

    @property
    def uri(self) -> str:
        """Root URI: an absolute path for local stores, else the URI with its options."""
        return self._uri

    @property
    def appends_in_place(self) -> bool:
        """Whether :meth:`append` writes only the new bytes (a local disk).

        Elsewhere an append rewrites the whole object: fine for a small file, quadratic
        for a growing log (the event log writes segments there instead).
        """
        return self._local

    @property
    def filesystem(self) -> pafs.FileSystem:
        """The pyarrow file system (for pyarrow readers and writers)."""
        return self._filesystem

    @property
    def root(self) -> str:
        """Path of the store's root inside :attr:`filesystem`."""
        return self._root

    def path(self, key: str) -> str:
        """Return the path of ``key`` inside :attr:`filesystem`."""
        check_key(key)
        return f"{self._root.rstrip('/')}/{key}"

    def url(self, key: str) -> str:
        """Return the full URI of ``key`` (query options kept), e.g. for messages."""
        check_key(key)
        if self._local:
            return self.path(key)
        base, _, _ = self._uri.partition("?")
        quoted = urllib.parse.quote(key)
        return f"{base}/{quoted}" + (f"?{self._query}" if self._query else "")

    def child(self, prefix: str) -> FileSystemStore:
        """Return a store rooted at ``prefix`` below this one."""
        return FileSystemStore(self.url(check_key(prefix.rstrip("/"))))

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (FileSystemStore, (self._uri,))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FileSystemStore) and other.uri == self.uri

    def __hash__(self) -> int:
        return hash(self._uri)

    def __repr__(self) -> str:
        return f"FileSystemStore({self._uri!r})"

    # -- operations -------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        """Write ``data`` under ``key`` atomically (see the module docstring for how)."""
        path = self.path(key)
        # Fail on a non-bytes argument before anything is opened: closing an S3 stream
        # (which a failed ``with`` block does) would publish whatever it holds.
        payload = memoryview(data)
        if self._local:
            try:
                self._put_local(path, payload)
            except OSError as error:
                raise _store_full(error, path, "put") from error
        elif self._object_store:
            with_retries("put", self.url(key), lambda: self._put_object(path, payload))
        else:
            with_retries("put", self.url(key), lambda: self._put_renamed(path, payload))

    def _put_object(self, path: str, payload: memoryview) -> None:
        with self._filesystem.open_output_stream(path) as out:
            out.write(payload)

    def _put_renamed(self, path: str, payload: memoryview) -> None:
        parent = path.rsplit("/", 1)[0]
        self._filesystem.create_dir(parent, recursive=True)
        tmp = _tmp_name(path)
        try:
            with self._filesystem.open_output_stream(tmp) as out:
                out.write(payload)
            self._filesystem.move(tmp, path)
        except BaseException:
            _remove_quietly(self._filesystem, tmp)
            raise

    @staticmethod
    def _put_local(path: str, data: memoryview) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = _tmp_name(path)
        try:
            with open(tmp, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except BaseException:
            _remove_quietly(_LOCAL, tmp)
            raise

    def get(self, key: str) -> bytes:
        """Return the bytes under ``key``.

        Raises:
            FileNotFoundError: No object under ``key`` (the message names the full URI).
        """
        path = self.path(key)

        def read() -> bytes:
            # A random-access file: one request for the whole object (module docstring).
            with self._filesystem.open_input_file(path) as src:
                data: bytes = src.read()
            return data

        try:
            return self._call("get", key, read)
        except (FileNotFoundError, IsADirectoryError) as exc:
            raise FileNotFoundError(
                errno.ENOENT, f"no object in store at {self.url(key)}", self.url(key)
            ) from exc

    def _call(self, what: str, key: str, operation: Callable[[], _T]) -> _T:
        """``operation()``; on a remote store, retried while the store is unreachable."""
        if self._local:
            return operation()
        return with_retries(what, self.url(key) if key else self.uri, operation)

    def exists(self, key: str) -> bool:
        """Whether ``key`` holds an object (a directory is not an object)."""
        path = self.path(key)
        info = self._call("exists", key, lambda: self._filesystem.get_file_info(path))
        return bool(info.type == pafs.FileType.File)

    def list(self, prefix: str = "") -> list[str]:
        """Return the keys below the directory ``prefix`` (recursively), sorted.

        ``prefix`` is a directory: ``list("a")`` returns ``a/x`` and ``a/b/y`` but not
        ``ab``; ``""`` lists the whole store. Temporary files of in-flight puts are never
        listed.
        """
        prefix = check_key(prefix.rstrip("/"), allow_empty=True)
        base = self.path(prefix) if prefix else self._root
        selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
        try:
            infos = self._call("list", prefix, lambda: self._filesystem.get_file_info(selector))
        except (FileNotFoundError, NotADirectoryError):
            return []
        strip = len(self._root.rstrip("/")) + 1
        keys = [
            info.path[strip:]
            for info in infos
            if info.type == pafs.FileType.File and not _TMP_PATTERN.search(info.path)
        ]
        return sorted(keys)

    def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is not an error."""
        path = self.path(key)
        self._call("delete", key, lambda: _remove_quietly(self._filesystem, path))

    def append(self, key: str, data: bytes) -> None:
        """Append ``data`` to ``key`` (local: in place and flushed; else: rewrite).

        All or nothing: a local append that fails (a full disk) truncates the file back to
        its size before the append; a rewrite replaces the object atomically.

        Raises:
            StoreFullError: The disk is full.
        """
        path = self.path(key)
        if self._local:
            try:
                _append_local(path, data)
            except OSError as error:
                raise _store_full(error, path, "append") from error
            return
        try:
            old = self.get(key)
        except FileNotFoundError:
            old = b""
        self.put(key, old + data)

    def truncate(self, key: str, size: int) -> None:
        """Cut ``key`` to its first ``size`` bytes.

        On a local disk the file is truncated in place, which needs no free space (so a
        log can be repaired on a full disk); elsewhere the object is rewritten.

        Raises:
            FileNotFoundError: No object under ``key``.
            ValueError: ``size`` is negative.
        """
        if size < 0:
            raise ValueError(f"cannot truncate {self.url(key)} to {size} bytes: size must be >= 0")
        path = self.path(key)
        if self._local:
            try:
                os.truncate(path, size)
            except FileNotFoundError as exc:
                raise FileNotFoundError(
                    errno.ENOENT, f"no object in store at {path}", path
                ) from exc
            return
        self.put(key, self.get(key)[:size])


def _append_local(path: str, data: bytes) -> None:
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    try:  # the folder exists but for the first append: no makedirs per event
        fd = os.open(path, flags, 0o666)
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, flags, 0o666)
    try:
        size = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            with contextlib.suppress(OSError):  # undo a partial write: all or nothing
                os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def _tmp_name(path: str) -> str:
    return f"{path}{_TMP_MARK}{uuid.uuid4().hex}"


def _remove_quietly(filesystem: pafs.FileSystem, path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        filesystem.delete_file(path)


def open_store(uri: str | Store) -> Store:
    """Return the store for ``uri`` (a :class:`Store` is returned as it is).

    Args:
        uri: A local path, ``file://``, ``s3://`` or other pyarrow file system URI.

    Raises:
        ConfigError: pyarrow cannot open a file system for ``uri``.
    """
    if isinstance(uri, Store):
        return uri
    return FileSystemStore(uri)
