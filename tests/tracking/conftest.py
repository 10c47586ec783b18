"""A real MLflow tracking server for the tracking tests.

The server (full ``mlflow``) runs from its own virtual environment, built once into
pytest's cache (``.pytest_cache/d/mlflow-server``, :func:`tests.background.build_venv`:
installed with uv), because full ``mlflow`` pins versions (pyarrow) that the package's
environment must not take; the package itself only needs ``mlflow-skinny``, the client.
``CEREBRO_MLFLOW_SERVER_VENV`` names a ready venv instead. The server listens on 127.0.0.1
on a free port, keeps runs in SQLite and artifacts in a temporary folder, and is stopped
at the end of the session.

Building the venv and starting the server (half a minute or more until ``/health``
answers on a 2-core machine) begin in the background as soon as collection is done, when a
collected test uses the server (:mod:`tests.background`): the tests that run before the
tracking tests hide them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.background import Background, BuildError, build_venv, needed

MLFLOW_VERSION = "3.17.2"
logger = logging.getLogger(__name__)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_venv(config: pytest.Config) -> Path:
    given = os.environ.get("CEREBRO_MLFLOW_SERVER_VENV")
    if given:
        return Path(given)
    venv = Path(config.cache.mkdir("mlflow-server"))
    check = f"import mlflow; assert mlflow.__version__ == {MLFLOW_VERSION!r}"
    return build_venv(venv, f"mlflow=={MLFLOW_VERSION}", check).parent.parent


def _healthy(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


@dataclasses.dataclass
class _Server:
    """A started ``mlflow server``: its URI, its process (a session of its own), its files."""

    uri: str
    process: subprocess.Popen[bytes]
    root: Path

    def log(self) -> str:
        return (self.root / "server.log").read_text(errors="replace")

    def stop(self) -> None:
        """End the server's process group (once) and remove its files."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def _start_server(config: pytest.Config) -> _Server:
    """Build the venv if needed, start the server and wait until it answers."""
    venv = _server_venv(config)
    root = Path(tempfile.mkdtemp(prefix="cerebro-mlflow-server-"))
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    with (root / "server.log").open("wb") as log:
        process = subprocess.Popen(
            [
                str(venv / "bin" / "mlflow"),
                "server",
                "--backend-store-uri",
                f"sqlite:///{root / 'mlflow.db'}",
                "--artifacts-destination",
                str(root / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # no job runner: its eight processes took 45 CPU-seconds to start and a
            # quarter of a core while idle, and the tests run no MLflow job
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        )
    server = _Server(uri, process, root)
    try:
        deadline = time.monotonic() + 300
        while not _healthy(uri):
            if process.poll() is not None:
                raise BuildError(f"the MLflow server ended: {server.log()}")
            if time.monotonic() > deadline:
                raise BuildError(f"the MLflow server did not answer in 300 s: {server.log()}")
            time.sleep(0.2)
    except BaseException:
        server.stop()
        raise
    return server


_SERVER: Background[_Server] = Background("the MLflow server", _start_server)


def pytest_collection_finish(session: pytest.Session) -> None:
    if needed(session, "mlflow_server"):
        _SERVER.start(session.config)


def pytest_sessionfinish(session: pytest.Session) -> None:
    server = _SERVER.done_value()  # also one started for tests that did not run (-x, -k, ^C)
    if server is not None:
        server.stop()


@pytest.fixture(scope="session")
def mlflow_server(request: pytest.FixtureRequest) -> Iterator[str]:
    """The URI of a running MLflow tracking server (SQLite store, local artifacts)."""
    try:
        server = _SERVER.result(request.config)
    except BuildError as error:
        pytest.fail(f"no MLflow server: {error}", pytrace=False)
    if not _healthy(server.uri):  # it started long before: still there?
        pytest.fail(f"the MLflow server stopped answering: {server.log()}", pytrace=False)
    logger.warning("the MLflow server was up after %.0f s (in the background)", _SERVER.seconds)
    try:
        yield server.uri
    finally:
        server.stop()
