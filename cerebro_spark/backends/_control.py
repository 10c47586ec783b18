"""The authenticated control channel between the driver and its workers.

The pool's :class:`ControlServer` on the driver accepts one TCP connection per worker
(:func:`connect`). The channel carries **JSON only**, never pickle; every message in both
directions is authenticated with HMAC-SHA256 under a per-experiment secret
(:func:`new_secret`). It does not encrypt: it guarantees that every message it accepts
was sent by a holder of the secret, on this connection, in this order, exactly once.

Trust boundary: the secret reaches Spark tasks inside the task closure, as in Horovod's
Spark runner (local worker processes get it from their parent), so whoever can read
Spark's task serialisation can read it; on an untrusted network enable Spark's RPC
authentication and encryption (``spark.authenticate``, ``spark.network.crypto.enabled``).

Wire format (integers big-endian):

* Handshake: each side sends ``HELLO`` (``b"CRBCTL01"``) and 16 fresh random bytes (its
  nonce). The *session id* ``server_nonce || client_nonce`` is fresh on both sides, so a
  frame recorded on one connection fails authentication on any other.
* Frame: ``length:u32 | seq:u64 | mac:32 bytes | payload`` (a UTF-8 JSON object with a
  string ``"op"``), ``mac = HMAC-SHA256(secret, direction || session || length || seq ||
  payload)``; ``direction`` is ``b"D"`` to workers, ``b"W"`` to the driver (no frame can
  be reflected back to its sender); ``seq`` counts the sender's frames from 0.
* A receiver checks, in order: ``length <= MAX_PAYLOAD_BYTES`` (before reading the
  payload), the MAC (constant time), ``seq`` (a replayed, dropped or reordered frame is
  refused), then decodes the JSON. A failure is logged at WARNING with the peer's address,
  closes the connection and raises :class:`ProtocolError`; a payload that failed its MAC
  is never parsed.

The messages are described in :mod:`._serve` (the worker's side). Results travel as
:meth:`UnitResult.to_json <cerebro_spark.units.UnitResult.to_json>`, worker exceptions as
:func:`error_to_json` -- never as pickled objects.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import secrets
import socket
import socketserver
import struct
import threading
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from cerebro_spark.errors import (
    CheckpointCorruptError,
    ConfigError,
    DataError,
    StoreError,
    TrialError,
)
from cerebro_spark.units import GroupBrokenError, UnitTask

logger = logging.getLogger(__name__)

HELLO = b"CRBCTL01"  # protocol name and version
NONCE_BYTES = 16
SECRET_BYTES = 32
MIN_SECRET_BYTES = 16
MAC_BYTES = hashlib.sha256().digest_size
HEADER = struct.Struct("!IQ")  # payload length, sequence number
MAX_PAYLOAD_BYTES = 16 * 2**20  # control messages are a few kilobytes
TO_WORKER = b"D"
TO_DRIVER = b"W"


class ProtocolError(ConnectionError):
    """A peer broke the protocol: bad handshake, bad MAC, replay, oversize or non-JSON."""


class ChannelClosed(ConnectionError):
    """The peer closed the connection between two frames."""


def new_secret() -> bytes:
    """Return a fresh per-experiment secret (32 bytes from :mod:`secrets`)."""
    return secrets.token_bytes(SECRET_BYTES)


def _check_secret(secret: bytes) -> None:
    """Refuse a secret shorter than ``MIN_SECRET_BYTES``."""
    if not isinstance(secret, bytes) or len(secret) < MIN_SECRET_BYTES:
        raise ValueError(
            f"the control channel secret must be at least {MIN_SECRET_BYTES} bytes, got "
            f"{type(secret).__name__} of length {len(secret) if isinstance(secret, bytes) else '?'}"
        )


def frame_mac(
    secret: bytes, direction: bytes, session: bytes, header: bytes, payload: bytes
) -> bytes:
    """Return the HMAC-SHA256 of one frame (see the module docstring)."""
    return hmac.digest(secret, direction + session + header + payload, "sha256")


def encode_frame(
    secret: bytes, direction: bytes, session: bytes, seq: int, message: Mapping[str, Any]
) -> bytes:
    """Return the bytes of one authenticated frame carrying ``message`` as JSON."""
    payload = json.dumps(message, separators=(",", ":")).encode()
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise ValueError(
            f"control message {message.get('op')!r} is {len(payload)} bytes, over the "
            f"limit of {MAX_PAYLOAD_BYTES}"
        )
    header = HEADER.pack(len(payload), seq)
    return header + frame_mac(secret, direction, session, header, payload) + payload


def _read_exact(sock: socket.socket, size: int, *, frame_start: bool) -> bytes:
    """Read exactly ``size`` bytes; EOF before the first byte of a frame is a clean close."""
    chunks: list[bytes] = []
    remaining = size
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            if frame_start and remaining == size:
                raise ChannelClosed("the peer closed the connection")
            raise ProtocolError(
                f"connection closed inside a frame ({size - remaining}/{size} bytes)"
            )
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


class Channel:
    """One authenticated, ordered, replay-proof message stream over a connected socket.

    Built by :func:`connect` (worker side) and :class:`ControlServer` (driver side) after
    the handshake. :meth:`send` is thread-safe; :meth:`recv` is for one thread at a time.
    """

    def __init__(
        self, sock: socket.socket, secret: bytes, session: bytes, *, driver_side: bool, peer: str
    ) -> None:
        self._sock = sock
        self._secret = secret
        self._session = session
        self._send_direction = TO_WORKER if driver_side else TO_DRIVER
        self._recv_direction = TO_DRIVER if driver_side else TO_WORKER
        self._send_seq = 0
        self._recv_seq = 0
        self._send_lock = threading.Lock()
        self._closed = threading.Event()
        self.peer = peer

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (by anyone) or the channel failed."""
        return self._closed.is_set()

    def settimeout(self, seconds: float | None) -> None:
        """Set the socket timeout for later sends and receives (``None``: block)."""
        self._sock.settimeout(seconds)

    def send(self, message: Mapping[str, Any]) -> None:
        """Send one message (a JSON object with a string ``"op"``).

        Raises:
            OSError: The channel is closed (:class:`ChannelClosed`) or the connection
                failed (which closes it).
        """
        with self._send_lock:
            if self._closed.is_set():
                raise ChannelClosed(f"the channel to {self.peer} is closed")
            frame = encode_frame(
                self._secret, self._send_direction, self._session, self._send_seq, message
            )
            try:
                self._sock.sendall(frame)
            except OSError:
                self.close()
                raise
            self._send_seq += 1

    def recv(self) -> dict[str, Any]:
        """Receive, authenticate and decode the next message (a dict with a string ``"op"``).

        Raises:
            OSError: The channel is closed after any failure: the peer closed it between
                frames (:class:`ChannelClosed`), a frame failed a check
                (:class:`ProtocolError`), the socket timeout passed (a peer that silent
                is treated as dead), or the connection failed.
        """
        try:
            header = _read_exact(self._sock, HEADER.size, frame_start=True)
            length, seq = HEADER.unpack(header)
            if length > MAX_PAYLOAD_BYTES:
                raise ProtocolError(
                    f"frame announces {length} payload bytes, over the limit of {MAX_PAYLOAD_BYTES}"
                )
            mac = _read_exact(self._sock, MAC_BYTES, frame_start=False)
            payload = _read_exact(self._sock, length, frame_start=False)
            expected = frame_mac(self._secret, self._recv_direction, self._session, header, payload)
            if not hmac.compare_digest(mac, expected):
                raise ProtocolError("bad MAC (wrong secret, or a forged or tampered frame)")
            if seq != self._recv_seq:
                what = "replayed" if seq < self._recv_seq else "out-of-order"
                raise ProtocolError(f"{what} frame: sequence {seq}, expected {self._recv_seq}")
            self._recv_seq += 1
            try:
                message = json.loads(payload.decode())
            except (UnicodeDecodeError, ValueError) as exc:
                raise ProtocolError(f"authenticated payload is not UTF-8 JSON: {exc}") from None
            if not isinstance(message, dict) or not isinstance(message.get("op"), str):
                raise ProtocolError("authenticated payload is not a JSON object with an 'op'")
            return message
        except ProtocolError as exc:
            logger.warning(
                "rejected a control message from %s: %s; closing the connection", self.peer, exc
            )
            self.close()
            raise
        except OSError:  # ChannelClosed, a reset, a timeout: the stream is unusable
            self.close()
            raise

    def close(self) -> None:
        """Close the connection (idempotent); a blocked :meth:`recv` returns at once."""
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._sock.close()


def _handshake(
    sock: socket.socket, secret: bytes, *, driver_side: bool, peer: str, timeout_s: float
) -> Channel:
    """Exchange hellos and nonces on a fresh connection; return the channel."""
    sock.settimeout(timeout_s)
    nonce = secrets.token_bytes(NONCE_BYTES)
    try:
        sock.sendall(HELLO + nonce)
        hello = _read_exact(sock, len(HELLO) + NONCE_BYTES, frame_start=False)
        if not hmac.compare_digest(hello[: len(HELLO)], HELLO):
            raise ProtocolError("not a cerebro control peer (bad hello)")
    except OSError as exc:  # ProtocolError included
        logger.warning("control handshake with %s failed: %s", peer, exc)
        with contextlib.suppress(OSError):
            sock.close()
        raise ProtocolError(f"control handshake with {peer} failed: {exc}") from None
    theirs = hello[len(HELLO) :]
    session = nonce + theirs if driver_side else theirs + nonce
    sock.settimeout(None)
    return Channel(sock, secret, session, driver_side=driver_side, peer=peer)


def connect(host: str, port: int, secret: bytes, *, timeout_s: float = 30.0) -> Channel:
    """Connect to a :class:`ControlServer` at ``host:port`` (worker side); do the handshake.

    Raises:
        OSError: The connection or the handshake failed (:class:`ProtocolError`), each
            within ``timeout_s``.
    """
    _check_secret(secret)
    sock = socket.create_connection((host, port), timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return _handshake(sock, secret, driver_side=False, peer=f"{host}:{port}", timeout_s=timeout_s)


class ControlServer(socketserver.ThreadingTCPServer):
    """The driver's TCP server, bound to ``host:port`` (0: a free port, see :attr:`address`).

    Each accepted connection gets a daemon thread that does the handshake (within
    ``handshake_timeout_s``) and then calls ``on_connection(channel)``, which owns and
    serves the channel in that thread. At most ``max_handshakes`` connections handshake
    at once: more are closed as they arrive (a flood of unauthenticated connections costs
    the driver no more threads than that; workers that authenticated are not counted).
    """

    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 64

    def __init__(
        self,
        secret: bytes,
        on_connection: Callable[[Channel], None],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        handshake_timeout_s: float = 10.0,
        max_handshakes: int = 64,
    ) -> None:
        _check_secret(secret)
        self._secret = secret
        self._handshakes = threading.BoundedSemaphore(max_handshakes)
        self.refused = 0  # connections closed at once: too many handshaking
        self._on_connection = on_connection
        self._handshake_timeout_s = handshake_timeout_s
        self._closed = threading.Event()
        super().__init__((host, port), socketserver.BaseRequestHandler)
        threading.Thread(
            target=self.serve_forever, args=(0.25,), name="cerebro-control-accept", daemon=True
        ).start()
        logger.debug("control server listening on %s:%d", *self.address)

    @property
    def address(self) -> tuple[str, int]:
        """The bound ``(host, port)``."""
        return self.socket.getsockname()[:2]  # type: ignore[no-any-return]

    def process_request(self, request: Any, client_address: Any) -> None:
        """Start the connection's thread if a handshake slot is free, else close it."""
        if not self._handshakes.acquire(blocking=False):
            self.refused += 1
            if self.refused == 1 or self.refused % 1000 == 0:
                logger.warning(
                    "control server: too many connections handshaking at once; closed %d "
                    "(latest from %s:%s)",
                    self.refused,
                    *client_address[:2],
                )
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._handshakes.release()
            raise

    def finish_request(self, request: Any, client_address: Any) -> None:
        """Handshake, then hand the channel to ``on_connection`` (in the connection's thread)."""
        peer = f"{client_address[0]}:{client_address[1]}"
        try:
            request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            channel = _handshake(
                request,
                self._secret,
                driver_side=True,
                peer=peer,
                timeout_s=self._handshake_timeout_s,
            )
        except (ProtocolError, OSError):
            return
        finally:
            self._handshakes.release()
        if self._closed.is_set():
            channel.close()
            return
        try:
            self._on_connection(channel)
        except Exception:
            logger.exception("control connection from %s failed", peer)
            channel.close()

    def close(self) -> None:
        """Stop accepting connections (idempotent); open channels are the owner's to close."""
        if self._closed.is_set():
            return
        self._closed.set()
        self.shutdown()
        self.server_close()


# -- message codecs ---------------------------------------------------------------------------


def describe(task: UnitTask) -> str:
    """``"train unit of trial t (epoch e, partition p)"``, for messages."""
    return (
        f"{task.kind.value} unit of trial {task.trial_id} "
        f"(epoch {task.epoch}, partition {task.partition})"
    )


def error_to_json(exc: BaseException) -> dict[str, Any]:
    """Describe an exception raised in a worker (call inside the ``except`` block)."""
    out: dict[str, Any] = {
        "type_name": type(exc).__name__,
        "message": str(exc),
        "traceback": traceback.format_exc(),
        "group_broken": isinstance(exc, GroupBrokenError),
        "trial_error": isinstance(exc, TrialError),
        "transient": isinstance(exc, OSError),
    }
    if isinstance(exc, CheckpointCorruptError):
        out["checkpoint_corrupt"] = [exc.where, exc.expected, exc.actual, exc.size]
    return out


# Exceptions a failed load is re-raised as, by the remote type name (never unpickled).
_LOAD_ERRORS: dict[str, type[Exception]] = {
    e.__name__: e
    for e in (DataError, ConfigError, StoreError, FileNotFoundError, PermissionError, ValueError)
}


class RemoteTraceback(Exception):
    """Carries a worker's traceback text as the ``__cause__`` of a re-raised error."""

    def __str__(self) -> str:
        return str(self.args[0])


def error_from_json(
    error: Mapping[str, Any], worker: str, op: str, task: UnitTask | None, partitions: Any
) -> Exception:
    """The driver's exception for a worker's :func:`error_to_json` (its traceback as cause).

    A ``run`` (or a whole ``pack``) fails with
    :class:`~cerebro_spark.units.GroupBrokenError` (a peer was lost; the unit is queued again),
    :class:`~cerebro_spark.errors.CheckpointCorruptError` (bytes
    other than those the log recorded), :class:`~cerebro_spark.errors.StoreError` (an
    ``OSError``: retried) or :class:`~cerebro_spark.errors.TrialError` (anything else: the
    trial fails); a ``load`` is re-raised as its own type when it is a known one.
    """
    type_name = str(error.get("type_name", "Exception"))
    message = str(error.get("message", ""))
    text = str(error.get("traceback", ""))
    exc: Exception
    if op in ("run", "pack") and task is not None:  # a pack's: its first task's
        what = describe(task)
        if error.get("group_broken"):
            exc = GroupBrokenError(f"on worker {worker}: {message}")
        elif error.get("trial_error"):
            exc = TrialError(message)
        elif error.get("checkpoint_corrupt"):
            where, expected, actual, size = error["checkpoint_corrupt"]
            exc = CheckpointCorruptError(str(where), str(expected), str(actual), int(size))
        elif error.get("transient"):
            exc = StoreError(f"{what} hit an I/O error on worker {worker}: {type_name}: {message}")
        else:
            exc = TrialError(f"{what} failed on worker {worker}: {type_name}: {message}\n{text}")
    elif type_name in _LOAD_ERRORS:
        exc = _LOAD_ERRORS[type_name](message)
    else:
        exc = RuntimeError(
            f"worker {worker} failed to {op} partitions {list(partitions)}: {type_name}: {message}"
        )
    exc.__cause__ = RemoteTraceback(f"\nworker {worker} traceback:\n{text}")
    return exc
