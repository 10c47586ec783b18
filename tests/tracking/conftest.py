"""A real MLflow tracking server for the tracking tests.

The server (full ``mlflow``) runs from its own virtual environment, built once into
pytest's cache (``.pytest_cache/d/mlflow-server``), because full ``mlflow`` pins versions
(pyarrow) that the package's environment must not take; the package itself only needs
``mlflow-skinny``, the client. ``CEREBRO_MLFLOW_SERVER_VENV`` names a ready venv instead.
The server listens on 127.0.0.1 on a free port, keeps runs in SQLite and artifacts in a
local folder, and is stopped at the end of the session.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

MLFLOW_VERSION = "3.17.2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_venv(request: pytest.FixtureRequest) -> Path:
    given = os.environ.get("CEREBRO_MLFLOW_SERVER_VENV")
    if given:
        return Path(given)
    venv = Path(request.config.cache.mkdir("mlflow-server"))
    mlflow = venv / "bin" / "mlflow"
    if not mlflow.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", f"mlflow=={MLFLOW_VERSION}"],
            check=True,
            timeout=600,
        )
    return venv


def _healthy(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


@pytest.fixture(scope="session")
def mlflow_server(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[str]:
    """The URI of a running MLflow tracking server (SQLite store, local artifacts)."""
    venv = _server_venv(request)
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    log = (root / "server.log").open("w")
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
    )
    try:
        deadline = time.monotonic() + 180
        while not _healthy(uri):
            if process.poll() is not None:
                pytest.fail(f"the MLflow server ended: {(root / 'server.log').read_text()}")
            if time.monotonic() > deadline:
                pytest.fail(f"the MLflow server did not start: {(root / 'server.log').read_text()}")
            time.sleep(0.5)
        yield uri
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()
