"""The authenticated control channel between the driver and its workers.

The worker pool runs a :class:`ControlServer` on the driver; every worker (a Spark task,
a local process) connects back to it (:func:`connect`), registers, and then receives
commands and sends replies and heartbeats over one TCP connection. The channel carries
**JSON only**, never pickle, and every message in both directions is authenticated with
HMAC-SHA256 under a per-experiment secret (:func:`new_secret`, 32 random bytes).

Trust boundary: the secret reaches Spark worker tasks inside the Spark task closure, as in
Horovod's Spark runner (local worker processes get it from their parent). Whoever can read
Spark's closure transport (task serialisation between driver and executors) can read the
secret; on an untrusted network enable Spark's own RPC authentication and encryption
(``spark.authenticate``, ``spark.network.crypto.enabled``). The channel itself does not
encrypt: it guarantees that every message it accepts was sent by a holder of the secret,
on this connection, in this order, exactly once.

Wire format (all integers big-endian):

* Handshake: on connect each side first sends ``HELLO`` (8 bytes, ``b"CRBCTL01"``)
  followed by 16 fresh random bytes (its nonce), and reads the peer's. The connection's
  *session id* is ``server_nonce || client_nonce``: fresh on both sides, so a frame
  recorded on one connection fails authentication on any other.
* Frame: ``length:u32 | seq:u64 | mac:32 bytes | payload:length bytes``, where
  ``payload`` is a UTF-8 JSON object with a string ``"op"``,
  ``mac = HMAC-SHA256(secret, direction || session_id || length || seq || payload)``,
  ``direction`` is ``b"D"`` for driver → worker and ``b"W"`` for worker → driver (a frame
  cannot be reflected back to its sender), and ``seq`` counts the sender's frames on this
  connection from 0.
* A receiver checks, in this order: ``length <= MAX_PAYLOAD_BYTES`` (before reading the
  payload), the MAC (constant-time comparison), ``seq`` equal to the next expected number
  (a replayed, dropped or reordered frame is refused), and only then decodes the JSON. Any
  failure is logged at WARNING with the peer's address, the connection is closed and
  :class:`ProtocolError` is raised; the payload of a frame that failed its MAC is never
  parsed.

Messages (``op`` and fields; see ``_serve`` and ``_pool`` for their handling):

* worker → driver: ``register`` (``worker_id``, ``attempt``, ``task_attempt_id``,
  ``pid``, ``hostname``, ``device``, ``executor_hint``), ``reply`` (``id``, ``ok``,
  ``value`` or ``error``, ``state``), ``rendezvous`` (``id`` of a group unit's ``run``,
  ``port`` that rank 0 bound), ``heartbeat``.
* driver → worker: ``welcome``, ``refuse`` (``reason``), ``load`` / ``drop`` (``id``,
  ``partitions``), ``run`` (``id``, ``task``: :meth:`UnitTask.to_json`), ``ping``, ``stop``.

Results travel as :meth:`UnitResult.to_json <cerebro_spark.units.UnitResult.to_json>`,
worker exceptions as :func:`error_to_json` (type name, message, traceback text and how the
driver should classify it; :func:`error_from_json` rebuilds them) -- never as pickled
objects.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import secrets
import socket
import struct
import threading
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from cerebro_spark.errors import ConfigError, DataError, StoreError, TrialError
from cerebro_spark.units import GroupBrokenError, UnitTask

logger = logging.getLogger(__name__)

HELLO = b"CRBCTL01"
"""Protocol name and version, sent first by both sides."""
NONCE_BYTES = 16
SECRET_BYTES = 32
MIN_SECRET_BYTES = 16
MAC_BYTES = hashlib.sha256().digest_size
HEADER = struct.Struct("!IQ")
"""Frame header: payload length, sequence number."""
MAX_PAYLOAD_BYTES = 16 * 2**20
"""Largest payload accepted; control messages are a few kilobytes."""
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
    if not isinstance(secret, bytes) or len(secret) < MIN_SECRET_BYTES:
        raise ValueError(
            f"the control channel secret must be at least {MIN_SECRET_BYTES} bytes, got "
            f"{type(secret).__name__} of length {len(secret) if isinstance(secret, bytes) else '?'}"
        )


def frame_mac(
    secret: bytes, direction: bytes, session: bytes, header: bytes, payload: bytes
) -> bytes:
    """Return the HMAC-SHA256 of one frame (see the module docstring)."""
    mac = hmac.new(secret, direction, hashlib.sha256)
    mac.update(session)
    mac.update(header)
    mac.update(payload)
    return mac.digest()


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

    :meth:`send` is thread-safe; :meth:`recv` must be called from one thread at a time.
    Build one with :func:`connect` (worker side) or get one from :class:`ControlServer`
    (driver side).

    Args:
        sock: The connected socket, handshake done.
        secret: The shared secret.
        session: The session id agreed in the handshake.
        driver_side: Whether this end is the driver.
        peer: The peer's address, for log messages.
    """

    def __init__(
        self, sock: socket.socket, secret: bytes, session: bytes, *, driver_side: bool, peer: str
    ) -> None:
        _check_secret(secret)
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
            ChannelClosed: The channel is closed.
            OSError: The connection failed (the channel is closed too).
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
        """Receive, authenticate and decode the next message.

        Returns:
            The decoded JSON object; it has a string ``"op"``.

        Raises:
            ChannelClosed: The peer closed the connection between frames.
            ProtocolError: The frame failed a check (logged at WARNING, channel closed).
            TimeoutError: The socket timeout passed (the channel is closed: a peer that
                stays silent that long is treated as dead).
            OSError: The connection failed (the channel is closed).
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
    except (ProtocolError, OSError) as exc:
        logger.warning("control handshake with %s failed: %s", peer, exc)
        with contextlib.suppress(OSError):
            sock.close()
        raise ProtocolError(f"control handshake with {peer} failed: {exc}") from None
    if not hmac.compare_digest(hello[: len(HELLO)], HELLO):
        logger.warning("rejected a connection from %s: not a cerebro control peer", peer)
        with contextlib.suppress(OSError):
            sock.close()
        raise ProtocolError(f"{peer} is not a cerebro control peer (bad hello)")
    theirs = hello[len(HELLO) :]
    session = nonce + theirs if driver_side else theirs + nonce
    sock.settimeout(None)
    return Channel(sock, secret, session, driver_side=driver_side, peer=peer)


def connect(host: str, port: int, secret: bytes, *, timeout_s: float = 30.0) -> Channel:
    """Connect to a :class:`ControlServer` (worker side) and do the handshake.

    Args:
        host: The driver's address.
        port: The control server's port.
        secret: The shared secret.
        timeout_s: Seconds for the TCP connect and the handshake.

    Raises:
        OSError: The connection failed.
        ProtocolError: The peer is not a control server.
    """
    _check_secret(secret)
    sock = socket.create_connection((host, port), timeout=timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return _handshake(sock, secret, driver_side=False, peer=f"{host}:{port}", timeout_s=timeout_s)


class ControlServer:
    """The driver's TCP server: accepts worker connections and hands each to a callback.

    Every accepted connection gets its own daemon thread, which performs the handshake
    and then calls ``on_connection(channel)``; the callback owns the channel (it reads the
    ``register`` message and serves the connection) and runs in that thread.

    Args:
        secret: The shared secret.
        on_connection: Called with each handshaken :class:`Channel`.
        host: Address to bind (the driver's host; ``127.0.0.1`` on one machine).
        port: Port to bind; 0 picks a free one (see :attr:`address`).
        handshake_timeout_s: Seconds a new connection has to complete the handshake.
    """

    def __init__(
        self,
        secret: bytes,
        on_connection: Callable[[Channel], None],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        handshake_timeout_s: float = 10.0,
    ) -> None:
        _check_secret(secret)
        self._secret = secret
        self._on_connection = on_connection
        self._handshake_timeout_s = handshake_timeout_s
        self._closed = threading.Event()
        self._listener = socket.create_server((host, port), backlog=64)
        self._listener.settimeout(0.25)
        bound = self._listener.getsockname()
        self._address: tuple[str, int] = (str(bound[0]), int(bound[1]))
        self._thread = threading.Thread(
            target=self._accept_loop, name="cerebro-control-accept", daemon=True
        )
        self._thread.start()
        logger.debug("control server listening on %s:%d", *self._address)

    @property
    def address(self) -> tuple[str, int]:
        """The bound ``(host, port)``."""
        return self._address

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                sock, peer = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._closed.is_set():
                    return
                logger.exception("control server accept failed")
                continue
            threading.Thread(
                target=self._serve_connection,
                args=(sock, f"{peer[0]}:{peer[1]}"),
                name=f"cerebro-control-{peer[0]}:{peer[1]}",
                daemon=True,
            ).start()

    def _serve_connection(self, sock: socket.socket, peer: str) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            channel = _handshake(
                sock,
                self._secret,
                driver_side=True,
                peer=peer,
                timeout_s=self._handshake_timeout_s,
            )
        except ProtocolError:
            return
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
        with contextlib.suppress(OSError):
            self._listener.close()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)


# -- message codecs ---------------------------------------------------------------------------


def error_to_json(exc: BaseException) -> dict[str, Any]:
    """Describe an exception raised in a worker (call inside the ``except`` block).

    The driver classifies it by the flags: ``group_broken`` (a group unit's peer was
    lost; this worker lives on and the unit is queued again), ``trial_error`` (user code,
    the trial fails), ``transient`` (an :class:`OSError`, the unit is retried); anything
    else fails the trial with the worker's traceback.
    """
    return {
        "type_name": type(exc).__name__,
        "message": str(exc),
        "traceback": traceback.format_exc(),
        "group_broken": isinstance(exc, GroupBrokenError),
        "trial_error": isinstance(exc, TrialError),
        "transient": isinstance(exc, OSError),
    }


# Exceptions a failed load is re-raised as, by the remote type name (never unpickled).
_LOAD_ERRORS: dict[str, type[Exception]] = {
    "DataError": DataError,
    "ConfigError": ConfigError,
    "StoreError": StoreError,
    "FileNotFoundError": FileNotFoundError,
    "PermissionError": PermissionError,
    "ValueError": ValueError,
}


class RemoteTraceback(Exception):
    """Carries a worker's traceback text as the ``__cause__`` of a re-raised error."""

    def __str__(self) -> str:
        return str(self.args[0])


def error_from_json(
    error: Mapping[str, Any], worker: str, op: str, task: UnitTask | None, partitions: Any
) -> Exception:
    """The driver's exception for a worker's :func:`error_to_json` (its traceback as cause).

    A ``run`` fails with :class:`~cerebro_spark.units.GroupBrokenError`,
    :class:`~cerebro_spark.errors.TrialError` or (I/O) :class:`~cerebro_spark.errors.StoreError`
    by the flags; a ``load`` is re-raised as its own type when it is a known one.
    """
    type_name = str(error.get("type_name", "Exception"))
    message = str(error.get("message", ""))
    text = str(error.get("traceback", ""))
    exc: Exception
    if op == "run" and task is not None:
        what = (
            f"{task.kind.value} unit of trial {task.trial_id} "
            f"(epoch {task.epoch}, partition {task.partition})"
        )
        if error.get("group_broken"):
            exc = GroupBrokenError(f"on worker {worker}: {message}")
        elif error.get("trial_error"):
            exc = TrialError(message)
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
