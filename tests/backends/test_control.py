"""The authenticated control channel and the worker task's side of it (no Spark, no torch)."""

from __future__ import annotations

import json
import logging
import math
import os
import pickle
import queue
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.backends import WorkerJob
from cerebro_spark.backends._control import (
    HEADER,
    HELLO,
    MAX_PAYLOAD_BYTES,
    NONCE_BYTES,
    TO_DRIVER,
    TO_WORKER,
    Channel,
    ChannelClosed,
    ControlServer,
    ProtocolError,
    connect,
    encode_frame,
    error_from_json,
    error_to_json,
    new_secret,
)
from cerebro_spark.backends._serve import (
    DRIVER_GONE,
    DRIVER_SILENT,
    REFUSED,
    REJECTED,
    STOPPED,
    TaskInfo,
    WorkerSpec,
    choose_device,
    executor_hint,
    resolve_device,
    serve,
)
from cerebro_spark.errors import (
    CheckpointCorruptError,
    ConfigError,
    DataError,
    StoreError,
    TrialError,
)
from cerebro_spark.store import open_store
from cerebro_spark.units import UnitKind, UnitResult, UnitTask

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 10.0


class Driver:
    """A ControlServer whose connections are queued for the test to serve."""

    def __init__(self, secret: bytes) -> None:
        self.secret = secret
        self.channels: queue.Queue[Channel] = queue.Queue()
        self.done: dict[str, threading.Event] = {}
        self.server = ControlServer(secret, self._on_connection, handshake_timeout_s=5.0)

    def _on_connection(self, channel: Channel) -> None:
        finished = threading.Event()
        self.done[channel.peer] = finished
        self.channels.put(channel)
        finished.wait(WAIT_S * 3)  # the test serves the channel from its own thread

    def accept(self) -> Channel:
        return self.channels.get(timeout=WAIT_S)

    @property
    def port(self) -> int:
        return self.server.address[1]

    def close(self) -> None:
        for event in self.done.values():
            event.set()
        self.server.close()


@pytest.fixture
def secret() -> bytes:
    return new_secret()


@pytest.fixture
def driver(secret: bytes) -> Iterator[Driver]:
    server = Driver(secret)
    yield server
    server.close()


class Raw:
    """A hand-driven client: does the handshake itself and sends raw bytes."""

    def __init__(self, port: int, *, hello: bytes | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
        server_hello = _recv_exact(self.sock, len(HELLO) + NONCE_BYTES)
        assert server_hello.startswith(HELLO)
        self.nonce = os.urandom(NONCE_BYTES)
        self.sock.sendall(hello if hello is not None else HELLO + self.nonce)
        self.session = server_hello[len(HELLO) :] + self.nonce

    def frame(self, secret: bytes, seq: int, message: dict[str, Any]) -> bytes:
        return encode_frame(secret, TO_DRIVER, self.session, seq, message)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def closed_by_peer(self) -> bool:
        """Whether the server closed the connection (EOF or reset) within WAIT_S."""
        try:
            while self.sock.recv(4096):
                pass
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        self.sock.close()


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def rejected(driver: Driver, caplog: pytest.LogCaptureFixture, raw: Raw, match: str) -> None:
    """The server's next recv refuses the frame, logs the peer, and closes the connection."""
    channel = driver.accept()
    with pytest.raises(ProtocolError, match=match):
        channel.recv()
    assert channel.closed
    assert raw.closed_by_peer()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any(channel.peer in r.getMessage() and "closing" in r.getMessage() for r in warnings)


# -- the channel -------------------------------------------------------------------------------


def test_messages_round_trip_in_both_directions(driver: Driver, secret: bytes) -> None:
    client = connect("127.0.0.1", driver.port, secret)
    server = driver.accept()
    client.send({"op": "register", "worker_id": "w0", "n": [1, 2.5, None]})
    client.send({"op": "heartbeat"})
    assert server.recv() == {"op": "register", "worker_id": "w0", "n": [1, 2.5, None]}
    assert server.recv() == {"op": "heartbeat"}
    server.send({"op": "welcome"})
    assert client.recv() == {"op": "welcome"}
    client.close()
    with pytest.raises(ChannelClosed):
        server.recv()
    with pytest.raises(ChannelClosed):
        client.send({"op": "heartbeat"})


def test_concurrent_sends_keep_frames_whole_and_in_sequence(driver: Driver, secret: bytes) -> None:
    client = connect("127.0.0.1", driver.port, secret)
    server = driver.accept()

    def burst(name: str) -> None:
        for i in range(200):
            client.send({"op": name, "i": i, "pad": "x" * (i * 37 % 3000)})

    threads = [threading.Thread(target=burst, args=(f"t{k}",)) for k in range(4)]
    for thread in threads:
        thread.start()
    got: dict[str, list[int]] = {}
    for _ in range(800):
        message = server.recv()
        got.setdefault(message["op"], []).append(message["i"])
    for thread in threads:
        thread.join()
    assert got == {f"t{k}": list(range(200)) for k in range(4)}
    client.close()


def test_a_forged_message_is_rejected(
    driver: Driver, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    raw = Raw(driver.port)
    raw.send(raw.frame(new_secret(), 0, {"op": "register", "worker_id": "w0"}))  # wrong key
    rejected(driver, caplog, raw, "bad MAC")


def test_a_tampered_payload_is_rejected(
    driver: Driver, secret: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    raw = Raw(driver.port)
    frame = bytearray(raw.frame(secret, 0, {"op": "register", "worker_id": "w0"}))
    frame[-3] ^= 0x01
    raw.send(bytes(frame))
    rejected(driver, caplog, raw, "bad MAC")


def test_a_tampered_sequence_number_is_rejected(
    driver: Driver, secret: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    raw = Raw(driver.port)
    frame = bytearray(raw.frame(secret, 0, {"op": "heartbeat"}))
    frame[HEADER.size - 1] = 7  # seq 0 -> 7, MAC unchanged
    raw.send(bytes(frame))
    rejected(driver, caplog, raw, "bad MAC")


def test_a_replayed_message_is_rejected(
    driver: Driver, secret: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    raw = Raw(driver.port)
    frame = raw.frame(secret, 0, {"op": "run", "id": 0})
    raw.send(frame)
    channel = driver.accept()
    assert channel.recv() == {"op": "run", "id": 0}
    raw.send(frame)
    with pytest.raises(ProtocolError, match="replayed frame: sequence 0, expected 1"):
        channel.recv()
    assert raw.closed_by_peer()


def test_a_frame_from_another_connection_or_direction_is_rejected(
    driver: Driver, secret: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    first = Raw(driver.port)
    recorded = first.frame(secret, 0, {"op": "register", "worker_id": "w0"})
    first.send(recorded)
    assert driver.accept().recv()["worker_id"] == "w0"
    second = Raw(driver.port)
    second.send(recorded)  # same secret, same seq, other session
    rejected(driver, caplog, second, "bad MAC")
    third = Raw(driver.port)  # a driver-to-worker frame reflected back at the driver
    third.send(encode_frame(secret, TO_WORKER, third.session, 0, {"op": "stop"}))
    rejected(driver, caplog, third, "bad MAC")


def test_garbage_is_rejected(
    driver: Driver, secret: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    noise = bytes(range(256)) * 4
    raw = Raw(driver.port)
    raw.send(HEADER.pack(100, 0) + noise[: 32 + 100])  # a plausible header, then noise
    rejected(driver, caplog, raw, "bad MAC")
    raw = Raw(driver.port)
    raw.send(b"\xff" * 64)  # announces 4 GiB: refused before reading it
    rejected(driver, caplog, raw, "4294967295 payload bytes, over the limit")
    raw = Raw(driver.port)
    raw.send(HEADER.pack(MAX_PAYLOAD_BYTES + 1, 0) + noise)
    rejected(driver, caplog, raw, "over the limit")
    raw = Raw(driver.port)
    raw.send(HEADER.pack(10, 0) + b"\0" * 20)  # truncated, then the peer goes away
    raw.sock.shutdown(socket.SHUT_WR)
    rejected(driver, caplog, raw, "closed inside a frame")


def test_a_bad_hello_is_refused_before_any_frame(
    driver: Driver, caplog: pytest.LogCaptureFixture
) -> None:
    raw = Raw(driver.port, hello=b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert raw.closed_by_peer()
    assert driver.channels.empty()
    assert any("not a cerebro control peer" in r.getMessage() for r in caplog.records)


def test_a_flood_of_silent_connections_costs_at_most_the_handshake_slots(
    secret: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """Connections that never say hello hold a handshake slot each until they time out;
    past ``max_handshakes`` the server closes new ones at once (no thread), and a worker
    with the secret gets in as soon as a slot is free."""
    accepted: list[Channel] = []
    server = ControlServer(secret, accepted.append, handshake_timeout_s=3.0, max_handshakes=4)
    silent = []
    try:
        threads_before = threading.active_count()
        with caplog.at_level(logging.WARNING):
            for _ in range(40):
                silent.append(socket.create_connection(server.address, timeout=WAIT_S))
            deadline = time.monotonic() + WAIT_S
            while server.refused < 36 and time.monotonic() < deadline:
                time.sleep(0.05)
        assert server.refused == 36
        assert threading.active_count() - threads_before <= 4
        assert "too many connections handshaking at once" in caplog.text
        for sock in silent:
            sock.close()
        client = connect(*server.address, secret, timeout_s=WAIT_S)  # slots free again
        deadline = time.monotonic() + WAIT_S
        while not accepted and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(accepted) == 1
        client.close()
    finally:
        for sock in silent:
            sock.close()
        server.close()


@pytest.mark.parametrize("authentic", [False, True])
def test_a_pickle_payload_is_never_unpickled(
    driver: Driver,
    secret: bytes,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    authentic: bool,
) -> None:
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Exploit(str(marker)))
    key = secret if authentic else new_secret()
    raw = Raw(driver.port)
    header = HEADER.pack(len(payload), 0)
    from cerebro_spark.backends._control import frame_mac

    raw.send(header + frame_mac(key, TO_DRIVER, raw.session, header, payload) + payload)
    rejected(driver, caplog, raw, "not UTF-8 JSON" if authentic else "bad MAC")
    assert not marker.exists()


class _Exploit:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (Path.touch, (Path(self.path),))


def test_json_must_be_an_object_with_an_op(
    driver: Driver, secret: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    raw = Raw(driver.port)
    payload = json.dumps([1, 2]).encode()
    header = HEADER.pack(len(payload), 0)
    from cerebro_spark.backends._control import frame_mac

    raw.send(header + frame_mac(secret, TO_DRIVER, raw.session, header, payload) + payload)
    rejected(driver, caplog, raw, "not a JSON object with an 'op'")


def test_short_secrets_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 16 bytes"):
        ControlServer(b"short", lambda channel: None)
    with pytest.raises(ValueError, match="at least 16 bytes"):
        connect("127.0.0.1", 1, b"")
    assert len(new_secret()) == 32 and new_secret() != new_secret()


# -- codecs ------------------------------------------------------------------------------------


def test_results_and_errors_travel_as_json() -> None:
    task = UnitTask(
        kind=UnitKind.TRAIN,
        trial_id="t",
        spec="m:S",
        params={"lr": 0.1, "hidden": [8]},
        trial_seed=3,
        epoch=1,
        partition=2,
        step=1,
        epoch_units=4,
        checkpoint_in="a.pt",
        checkpoint_out="b.pt",
    )
    original = UnitResult(
        task=task,
        worker_id="w1",
        rows=40,
        seconds=0.125,
        metric_sums={"loss": math.nan, "accuracy": 31.0, "big": math.inf},
        checkpoint_bytes=1234,
        checkpoint_sha256="ab" * 32,
        io_seconds=0.01,
    )
    wire = json.loads(json.dumps(original.to_json(), allow_nan=False))
    back = UnitResult.from_json(wire)
    assert back.task == task and back.worker_id == "w1" and back.rows == 40
    assert math.isnan(back.metric_sums["loss"]) and back.metric_sums["big"] == math.inf
    assert back == UnitResult(**{**vars(original), "metric_sums": back.metric_sums})
    with pytest.raises(ValueError, match="malformed unit result"):
        UnitResult.from_json({"task": task.to_json()})
    with pytest.raises(ValueError, match="expected a number"):
        UnitResult.from_json({**wire, "seconds": [1]})
    for exc, trial, transient in (
        (TrialError("user code"), True, False),
        (StoreError("disk"), False, True),
        (FileNotFoundError("gone"), False, True),
        (ValueError("bad"), False, False),
    ):
        try:
            raise exc
        except Exception as caught:
            described = error_to_json(caught)
        assert described["type_name"] == type(exc).__name__
        assert (described["trial_error"], described["transient"]) == (trial, transient)
        assert "Traceback" in described["traceback"]
        json.dumps(described)
        back_exc = error_from_json(described, "w4", "run", task, ())
        assert type(back_exc) is (StoreError if transient else TrialError)
        assert "worker w4 traceback" in str(back_exc.__cause__)
    try:
        raise CheckpointCorruptError("s3://b/t/e1.pt", "a" * 64, "b" * 64, 7)
    except CheckpointCorruptError as caught:
        corrupt = error_from_json(
            json.loads(json.dumps(error_to_json(caught))), "w4", "run", task, ()
        )
    assert isinstance(corrupt, CheckpointCorruptError)
    assert (corrupt.where, corrupt.expected, corrupt.actual, corrupt.size) == (
        "s3://b/t/e1.pt",
        "a" * 64,
        "b" * 64,
        7,
    )
    assert str(corrupt).startswith("checkpoint corrupt: s3://b/t/e1.pt has SHA-256 " + "b" * 64)
    loaded = error_from_json({"type_name": "DataError", "message": "bad"}, "w4", "load", None, [1])
    assert isinstance(loaded, DataError) and str(loaded) == "bad"
    other = error_from_json({"type_name": "KeyError", "message": "x"}, "w4", "load", None, [1])
    assert str(other) == "worker w4 failed to load partitions [1]: KeyError: x"


# -- the worker task's side (serve() without Spark) ------------------------------------------


@pytest.fixture
def spec_for(tmp_path: Path) -> Callable[..., WorkerSpec]:
    def make(port: int, secret: bytes, **changes: Any) -> WorkerSpec:
        fields: dict[str, Any] = {
            "worker_id": "w3",
            "driver_host": "127.0.0.1",
            "driver_port": port,
            "secret": secret,
            "job": WorkerJob(str(tmp_path / "no-dataset"), open_store(str(tmp_path / "s"))),
            "heartbeat_s": 0.1,
            "driver_timeout_s": 5.0,
            "connect_timeout_s": 5.0,
            **changes,
        }
        return WorkerSpec(**fields)

    return make


def serve_in_thread(spec: WorkerSpec, info: TaskInfo | None = None) -> queue.Queue[str]:
    outcome: queue.Queue[str] = queue.Queue()
    threading.Thread(
        target=lambda: outcome.put(serve(spec, info or TaskInfo(attempt=1, task_attempt_id=9))),
        daemon=True,
    ).start()
    return outcome


def test_the_worker_registers_and_ends_when_refused(
    driver: Driver, secret: bytes, spec_for: Callable[..., WorkerSpec]
) -> None:
    spec = spec_for(driver.port, secret)
    assert "secret" not in repr(spec) and repr(secret) not in repr(spec)
    info = TaskInfo(attempt=2, task_attempt_id=41, resources={"gpu": ("2",)})
    outcome = serve_in_thread(spec, info)
    channel = driver.accept()
    register = channel.recv()
    assert register["op"] == "register"
    assert (register["worker_id"], register["attempt"], register["task_attempt_id"]) == (
        "w3",
        2,
        41,
    )
    assert register["pid"] == os.getpid()
    assert register["device"] == "cuda:2"  # the task was given GPU 2
    channel.send({"op": "refuse", "reason": "lost"})
    assert outcome.get(timeout=WAIT_S) == REFUSED


def test_the_worker_heartbeats_serves_and_stops(
    driver: Driver, secret: bytes, spec_for: Callable[..., WorkerSpec]
) -> None:
    outcome = serve_in_thread(spec_for(driver.port, secret, device="cuda:5"))
    channel = driver.accept()
    assert channel.recv()["device"] == "cuda:5"
    channel.send({"op": "welcome"})
    assert channel.recv() == {"op": "heartbeat"}
    channel.send({"op": "ping"})
    channel.send({"op": "drop", "id": 0, "partitions": [1]})
    channel.send({"op": "load", "id": 1, "partitions": [0]})  # no such dataset: an error reply
    replies = []
    while len(replies) < 2:
        message = channel.recv()
        if message["op"] == "reply":
            replies.append(message)
    assert replies[0] == {
        "op": "reply",
        "id": 0,
        "ok": True,
        "value": None,
        "state": {"partitions": [], "bytes_read": 0},
    }
    assert replies[1]["id"] == 1 and replies[1]["ok"] is False
    assert replies[1]["error"]["type_name"] == "DataError"
    assert "no manifest.json" in replies[1]["error"]["message"]
    channel.send({"op": "stop"})
    assert outcome.get(timeout=WAIT_S) == STOPPED


def test_the_worker_ends_when_the_driver_goes_or_falls_silent(
    driver: Driver, secret: bytes, spec_for: Callable[..., WorkerSpec]
) -> None:
    outcome = serve_in_thread(spec_for(driver.port, secret))
    channel = driver.accept()
    channel.recv()
    channel.send({"op": "welcome"})
    channel.close()
    assert outcome.get(timeout=WAIT_S) == DRIVER_GONE
    outcome = serve_in_thread(spec_for(driver.port, secret, driver_timeout_s=0.5))
    channel = driver.accept()
    channel.recv()
    channel.send({"op": "welcome"})
    begun = time.monotonic()
    assert outcome.get(timeout=WAIT_S) == DRIVER_SILENT
    assert time.monotonic() - begun >= 0.4
    channel.close()


def test_the_worker_rejects_a_driver_without_the_secret(
    driver: Driver, secret: bytes, spec_for: Callable[..., WorkerSpec]
) -> None:
    outcome = serve_in_thread(spec_for(driver.port, new_secret()))  # worker has another key
    channel = driver.accept()
    with pytest.raises(ProtocolError):
        channel.recv()  # the driver refuses the worker's register ...
    assert outcome.get(timeout=WAIT_S) in (REJECTED, DRIVER_GONE)
    impostor = Driver(new_secret())  # ... and the worker refuses an impostor's welcome
    try:
        outcome = serve_in_thread(spec_for(impostor.port, secret))
        fake = impostor.accept()
        fake.send({"op": "welcome"})
        assert outcome.get(timeout=WAIT_S) == REJECTED
        with pytest.raises(ProtocolError):
            fake.recv()
    finally:
        impostor.close()


def test_an_unreachable_driver_fails_the_task(
    secret: bytes, spec_for: Callable[..., WorkerSpec]
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ConnectionError, match=f"could not reach .*127.0.0.1:{port}"):
        serve(spec_for(port, secret, connect_timeout_s=0.3), TaskInfo())


# -- devices and executors ---------------------------------------------------------------------


def test_the_device_follows_the_gpu_resource() -> None:
    assert choose_device({}) == "cpu"
    assert choose_device({"fpga": ["0"]}) == "cpu"
    assert choose_device({"gpu": []}) == "cpu"
    assert choose_device({"gpu": ["1"]}) == "cuda:1"
    assert choose_device({"gpu": ("3", "2")}) == "cuda:3"
    with pytest.raises(ConfigError, match=r"GPU addresses \['GPU-1a2b'\]"):
        choose_device({"gpu": ["GPU-1a2b"]})


def test_the_executor_hint() -> None:
    assert executor_hint({"SPARK_EXECUTOR_ID": "7"}, "/") == "7"
    assert executor_hint({}, "/work/app-20261121205354-0000/12") == "12"
    assert executor_hint({}, "/tmp/exp") is None


def test_a_connect_worker_finds_its_executor_under_its_session_directory() -> None:
    """Under Spark Connect a task's Python runs in its session's directory inside the
    executor's work directory (artifact isolation): the executor id is read there."""
    session = "/work/app-20261129213921-0000/3/e26cb92b-7271-48e2-8c94-dbfb27c22e88"
    assert executor_hint({}, session) == "3"
    assert executor_hint({}, session + "/") == "3"
    assert executor_hint({}, "/work/app-20261121205354-0000/12") == "12"
    assert executor_hint({"SPARK_EXECUTOR_ID": "7"}, session) == "7"
    assert executor_hint({}, "/tmp/exp/e26cb92b-7271-48e2-8c94-dbfb27c22e88") is None
    assert executor_hint({}, "/work/app-20261121205354-0000/12/not-a-session") is None


def test_speculative_execution_is_refused() -> None:
    from cerebro_spark.backends._spark_task import check_spark_conf

    check_spark_conf({}.get)
    check_spark_conf({"spark.speculation": "false"}.get)
    with pytest.raises(ConfigError, match=r"spark\.speculation=true is not supported"):
        check_spark_conf({"spark.speculation": "True"}.get)


def test_importing_the_backends_imports_neither_pyspark_nor_torch() -> None:
    code = (
        "import sys\n"
        "import cerebro_spark.backends as b\n"
        "assert 'pyspark' not in sys.modules, 'pyspark'\n"
        "b.SparkBackend\n"
        "import cerebro_spark.backends._serve\n"
        "bad = [m for m in ('pyspark', 'torch') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def test_a_frame_header_is_twelve_bytes() -> None:
    # The documented wire format: length:u32, seq:u64, then a 32-byte MAC.
    assert HEADER.size == 12
    frame = encode_frame(b"k" * 32, TO_DRIVER, b"s" * 32, 5, {"op": "x"})
    length, seq = struct.unpack("!IQ", frame[:12])
    assert (length, seq) == (len(frame) - 12 - 32, 5)
    assert json.loads(frame[44:]) == {"op": "x"}


def test_resolve_device_follows_the_config_and_the_tasks_resources():
    gpu = {"gpu": ("2",)}
    assert resolve_device(None, {}) == "cpu"
    assert resolve_device("auto", {}) == "cpu"
    assert resolve_device("auto", gpu) == "cuda:2"
    assert resolve_device("cuda", gpu) == "cuda:2"
    assert resolve_device("cpu", gpu) == "cpu"
    assert resolve_device("cuda:1", {}) == "cuda:1"
    with pytest.raises(ConfigError, match="device 'cuda': this worker was given no GPU"):
        resolve_device("cuda", {})
