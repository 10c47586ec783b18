"""Slow set-up that the session starts in a thread as soon as collection is done.

Building a virtual environment (the MLflow server's, Airflow's: :func:`build_venv`) and
starting a server from it take a minute or more on a 2-core CI machine, mostly waiting on
the package index, the disk and imports. A conftest's ``pytest_collection_finish`` starts
such a step when a collected test needs it (:func:`needed`); the fixture that needs it
waits for it with :meth:`Background.result`, by when the tests that ran before have hidden
most of it. A step that nothing started runs in the fixture, as before. A step that failed
fails the fixture that waits for it, with the error.

The thread only waits on subprocesses (no logging, no imports): the tests that fork
meanwhile copy no lock it could hold.
"""

from __future__ import annotations

import fcntl
import importlib.util
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

import pytest

T = TypeVar("T")

BUILT = "cerebro-built.txt"
"""The file a finished :func:`build_venv` leaves in the venv: what was installed."""


HAS_UV = importlib.util.find_spec("uv") is not None
"""Whether ``uv`` is installed beside the tests (the ``dev`` extra has it)."""


class BuildError(RuntimeError):
    """A virtual environment could not be built (the installer's output is the message)."""


def needed(session: pytest.Session, fixture: str) -> bool:
    """Whether a collected test uses ``fixture`` (directly or through another fixture).

    False under ``--collect-only`` (no test will run) and in a pytest-xdist worker: every
    worker collects every test but runs only its share, so there the fixture sets up when
    its test runs, while the other workers go on with theirs.
    """
    if session.config.option.collectonly or hasattr(session.config, "workerinput"):
        return False
    return any(fixture in getattr(item, "fixturenames", ()) for item in session.items)


def run_step(
    command: list[str], what: str, timeout: float, env: dict[str, str] | None = None
) -> None:
    """Run ``command`` (one step of a set-up, ``what``) to its end.

    Raises:
        BuildError: It failed (its output is in the message) or ran past ``timeout`` s.
    """
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as error:
        raise BuildError(f"{what}: no end after {timeout:.0f} s: {command}") from error
    if done.returncode != 0:
        raise BuildError(
            f"{what} failed (exit status {done.returncode}): {command}\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
        )


def build_venv(venv: Path, requirement: str, check: str, timeout: float = 900) -> Path:
    """Python of the virtual environment ``venv`` with ``requirement``; built unless it is.

    The venv is built from scratch (``--clear``) unless a build of the same
    ``requirement`` finished there (it left :data:`BUILT`), with the same Python as the
    tests. ``uv`` (the ``dev`` extra) installs from the package index: with a cold cache,
    Airflow in about 25 s where pip takes about two minutes, downloading in parallel and
    compiling no bytecode. Without ``uv``, pip does. Then ``check`` (Python code) runs in
    the venv, e.g. that the package imports at its version.

    Raises:
        BuildError: A step failed or ran past ``timeout`` seconds; the installer's output
            is in the message.
    """
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{venv}.lock", "w") as lock:  # one build at a time (several pytest processes)
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build_venv(venv, requirement, check, timeout)


def _build_venv(venv: Path, requirement: str, check: str, timeout: float) -> Path:
    python = venv / "bin" / "python"
    built = venv / BUILT
    if python.exists() and built.is_file() and built.read_text() == requirement:
        return python
    deadline = time.monotonic() + timeout

    def left() -> float:
        return max(1.0, deadline - time.monotonic())

    if HAS_UV:
        uv = [sys.executable, "-m", "uv"]
        venv_command = [*uv, "venv", "--quiet", "--clear", "--python", sys.executable]
        run_step([*venv_command, str(venv)], "uv venv", left())
        install = [*uv, "pip", "install", "--quiet", "--python", str(python), requirement]
        run_step(install, f"uv pip install {requirement}", left())
    else:
        shutil.rmtree(venv, ignore_errors=True)
        run_step([sys.executable, "-m", "venv", str(venv)], "python -m venv", left())
        install = [str(python), "-m", "pip", "install", "--quiet", requirement]
        run_step(install, f"pip install {requirement}", left())
    run_step([str(python), "-c", check], f"the check that {requirement} installed", left())
    built.write_text(requirement)
    return python


class Background(Generic[T]):
    """One set-up step, run at most once, in a daemon thread from :meth:`start` on.

    Args:
        what: What it makes, for messages ("the MLflow server").
        work: Makes it; its arguments are those of the first :meth:`start` or
            :meth:`result`.
    """

    def __init__(self, what: str, work: Callable[..., T]) -> None:
        self.what = what
        self._work = work
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._value: T | None = None
        self._error: BaseException | None = None
        self.seconds: float | None = None
        """How long the step took (once done)."""

    def start(self, *args: Any) -> None:
        """Start the step in a thread unless it started already."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._run, args=args, name=f"background: {self.what}", daemon=True
            )
            self._thread.start()

    def _run(self, *args: Any) -> None:
        started = time.monotonic()
        try:
            self._value = self._work(*args)
        except BaseException as error:  # handed to whoever waits: result() raises it
            self._error = error
        finally:
            self.seconds = time.monotonic() - started

    @property
    def started(self) -> bool:
        """Whether :meth:`start` (or :meth:`result`) was called."""
        return self._thread is not None

    def result(self, *args: Any) -> T:
        """Wait for the step (started now with ``args`` if nothing started it); its value.

        Raises:
            Whatever the step raised.
        """
        self.start(*args)
        assert self._thread is not None
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    def done_value(self) -> T | None:
        """The value, after waiting for a step that started; None if none or it failed."""
        if self._thread is None:
            return None
        self._thread.join()
        return None if self._error is not None else self._value
