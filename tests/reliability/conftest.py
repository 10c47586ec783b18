"""Helpers of the reliability catalogue (``tests/reliability``).

Every case here is a bad input or a fault, the exact error it must end in, and a check
that nothing was lost. The helpers:

* :func:`tiny_config`: a config small enough that a whole run takes seconds (iris, two
  partitions, MLPs of a few units), so runs can be killed, resumed and compared; the
  ``tiny_reference`` fixture: its uninterrupted run, once a session, for every module that
  compares a faulted run with it;
* :func:`strict_events`: parses an ``events.jsonl`` as *standard* JSON (a bare ``NaN``
  fails) and folds it, i.e. "the log is readable";
* :func:`outcome`: what a finished run produced (final checkpoint digests, best trial,
  metrics), to compare a faulted run with an uninterrupted one;
* :class:`Driver`: the CLI driver as a child process that a test can kill with a signal
  once its log shows some event;
* :class:`TcpProxy`: a TCP proxy in front of the moto S3 server that a test can cut
  (connections refused, open ones reset) and restore on the same port: a real outage of
  the S3 endpoint, while moto keeps its in-memory objects;
* the ``tmpfs`` fixture: a real small file system (root only; skipped otherwise) for
  disk-full cases.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cerebro_spark.engine import ExperimentState, parse_config, read_events, run_experiment
from cerebro_spark.store import open_store

TINY_SPACE: dict[str, Any] = {
    "model": "cerebro_spark.training:MLPSpec",
    "hidden_units": {"grid": [[4], [8]]},
    "lr": {"grid": [0.01, 0.05]},
    "batch_size": 16,
}


def tiny_config(store: str | Path, **changes: Any) -> dict[str, Any]:
    """A config whose run takes seconds: 4 MLPs on iris, 2 partitions, 2 epochs, 2 workers."""
    raw: dict[str, Any] = {
        "name": "tiny",
        "seed": 11,
        "store": str(store),
        "data": {"source": "sklearn:iris", "partitions": 2},
        "procedure": "grid",
        "epochs": 2,
        "workers": 2,
        "space": TINY_SPACE,
    }
    raw.update(changes)
    return raw


@dataclasses.dataclass(frozen=True)
class Reference:
    """An uninterrupted run: its store, its experiment id and its :func:`outcome`."""

    store: Path
    experiment_id: str
    outcome: dict[str, Any]


@pytest.fixture(scope="session")
def tiny_reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """The uninterrupted run of ``tiny_config`` (local backend), experiment ``reference``.

    Run once a session: its outcome does not depend on the store or the backend (the
    faulted runs compared with it run on a local disk, on S3 and on Spark). Read-only: a
    module that adds to a store or damages a log copies ``store`` (or the experiment) first.
    """
    store = tmp_path_factory.mktemp("tiny-reference")
    result = run_experiment(parse_config(tiny_config(store)), experiment_id="reference")
    assert len(result.trials) == 4
    return Reference(store, "reference", outcome(strict_events(str(store), "reference")[1]))


def write_config(path: Path, raw: dict[str, Any]) -> Path:
    """Write ``raw`` as YAML to ``path`` and return it."""
    path.write_text(yaml.safe_dump(raw))
    return path


def _no_constants(token: str) -> float:
    raise AssertionError(f"the event log holds {token}, which standard JSON does not allow")


def strict_lines(data: bytes) -> list[dict[str, Any]]:
    """Every newline-ended line of a log, parsed as standard JSON (no NaN or Infinity)."""
    return [
        json.loads(line, parse_constant=_no_constants)
        for line in data.split(b"\n")[: data.count(b"\n")]
        if line.strip()
    ]


def strict_events(store: str, experiment_id: str) -> tuple[list[dict[str, Any]], ExperimentState]:
    """The experiment's events (standard JSON, whole lines only) and their fold."""
    child = open_store(store).child(f"experiments/{experiment_id}")
    data = child.get("events.jsonl")
    assert data.endswith(b"\n"), "the log does not end at a line boundary"
    strict_lines(data)
    events = read_events(child)
    return events, ExperimentState.from_events(events)


def outcome(state: ExperimentState) -> dict[str, Any]:
    """What a finished run produced: per trial its status, epochs, final checkpoint digest
    and metrics (NaN as a string, so that outcomes compare with ``==``)."""

    def plain(metrics: Any) -> dict[str, Any]:
        return {k: (v if math.isfinite(v) else repr(v)) for k, v in dict(metrics).items()}

    return {
        t: (s.status, s.epochs, s.checkpoint_sha256, plain(s.metrics), s.best_epoch)
        for t, s in sorted(state.trials.items())
    }


def unit_ends(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """``(trial, epoch, kind, partition)`` of every ``unit_end`` in order."""
    return [
        (e["trial"], e["epoch"], e["kind"], e["partition"])
        for e in events
        if e["event"] == "unit_end"
    ]


def whole_lines(path: Path) -> list[dict[str, Any]]:
    """The newline-ended events of a log file being written (a torn tail is left out)."""
    if not path.exists():
        return []
    return strict_lines(path.read_bytes())


class Driver:
    """A ``cerebro-spark`` CLI driver in a child process (its own process group).

    Args:
        args: The CLI arguments (``["run", "cfg.yaml", "--experiment-id", "x"]``).
        env: Extra environment variables.
        hold_at: Hold the driver still for up to ``hold_s`` seconds right after it logs a
            line holding this text (``tests.reliability.held_driver``), so that a signal
            sent when the line is seen lands at that step.
        hold_s: How long the driver is held.
    """

    def __init__(
        self,
        args: list[str],
        env: dict[str, str] | None = None,
        hold_at: str | None = None,
        hold_s: float = 120.0,
    ) -> None:
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        held = [] if hold_at is None else ["tests.reliability.held_driver", hold_at, str(hold_s)]
        self.process = subprocess.Popen(
            [sys.executable, "-m", *(held or ["cerebro_spark.cli"]), *args],
            env=full_env,
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )

    def wait_for(
        self, events_file: Path, ready: Callable[[list[dict[str, Any]]], bool], timeout: float = 240
    ) -> list[dict[str, Any]]:
        """Poll the log until ``ready(events)``; fail if the driver ends first.

        Only the lines appended since the last poll are parsed: the log of 200 trials is
        1.2 MB halfway, and parsing all of it at every poll kept most of a core busy beside
        the driver it waits for. A log that shrank (a torn tail cut off) is read again.
        """
        deadline = time.monotonic() + timeout
        events: list[dict[str, Any]] = []
        offset = 0
        while time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError), events_file.open("rb") as log:
                if os.fstat(log.fileno()).st_size < offset:
                    events, offset = [], 0
                log.seek(offset)
                data = log.read()
                whole = data.rfind(b"\n") + 1  # a torn last line waits for its end
                events.extend(strict_lines(data[:whole]))
                offset += whole
            if ready(events):
                return events
            if self.process.poll() is not None:
                out = self.output()
                pytest.fail(f"the driver ended (status {self.process.returncode}) first:\n{out}")
            time.sleep(0.02)
        self.kill(signal.SIGKILL)
        pytest.fail("the run never got far enough")

    def kill(self, sig: int) -> int:
        """Send ``sig`` (to the driver alone for SIGINT, else to its group); return its status."""
        with contextlib.suppress(ProcessLookupError):
            if sig == signal.SIGINT:
                os.kill(self.process.pid, sig)
            else:
                os.killpg(self.process.pid, sig)
        try:
            return self.process.wait(timeout=120)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)

    def output(self) -> str:
        """Everything it printed (call after it ended)."""
        assert self.process.stdout is not None
        return self.process.stdout.read().decode(errors="replace")

    def finish(self, timeout: float = 300) -> int:
        """Wait for it to end; return its exit status."""
        try:
            return self.process.wait(timeout=timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)


_RESET = b"\x01\x00\x00\x00\x00\x00\x00\x00"  # SO_LINGER on, 0 s: close() sends a reset


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target``; :meth:`cut` and :meth:`restore` it.

    While cut, connections are refused and the open ones are reset, as when an S3
    endpoint goes away; :meth:`restore` listens again on the same port.
    """

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port: int = probe.getsockname()[1]
        probe.close()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.connections = 0
        self.restore()

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:PORT`` (pyarrow's ``endpoint_override``)."""
        return f"127.0.0.1:{self.port}"

    def restore(self) -> None:
        """Listen (again) on the port."""
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        """Stop listening and reset every open connection."""
        with self._lock:
            listener, self._listener = self._listener, None
            sockets = list(self._open)
            self._open.clear()
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
                sock.close()

    def close(self) -> None:
        """Cut for good."""
        self.cut()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    return
                try:
                    upstream = socket.create_connection(self.target)
                except OSError:
                    client.close()
                    continue
                self._open.update((client, upstream))
                self.connections += 1
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        selector = selectors.DefaultSelector()
        selector.register(client, selectors.EVENT_READ, upstream)
        selector.register(upstream, selectors.EVENT_READ, client)
        try:
            while True:
                for key, _ in selector.select(timeout=1.0):
                    source: socket.socket = key.fileobj  # type: ignore[assignment]
                    data = source.recv(65536)
                    if not data:
                        return
                    key.data.sendall(data)
                if client.fileno() < 0 or upstream.fileno() < 0:
                    return
        except (OSError, ValueError):
            return
        finally:
            selector.close()
            with self._lock:
                self._open.discard(client)
                self._open.discard(upstream)
            client.close()
            upstream.close()


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """``mount(size, at=None)``: a fresh tmpfs of ``size`` (``"8m"``) at ``at`` (created;
    default: a new folder under ``tmp_path``): a real file system that fills up. Needs
    root; the test is skipped otherwise. Unmounted after the test, the last mounted first
    (one may be mounted inside another's store)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted: list[Path] = []

    def mount(size: str, at: Path | None = None) -> Path:
        where = tmp_path / f"tmpfs-{uuid.uuid4().hex[:8]}" if at is None else at
        where.mkdir(parents=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in reversed(mounted):
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill_disk(directory: Path, leave: int = 0) -> Path:
    """Fill the file system of ``directory`` until at most ``leave`` bytes are free."""
    filler = directory / f"filler-{uuid.uuid4().hex[:8]}"
    with open(filler, "wb") as out:
        chunk = b"\0" * 65536
        while True:
            free = os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize
            if free <= leave:
                break
            try:
                out.write(chunk[: max(1, min(len(chunk), free - leave))])
                out.flush()
            except OSError:
                break
    return filler
