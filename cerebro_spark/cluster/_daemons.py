"""Spark standalone daemons on this machine, driven through ``spark-daemon.sh``.

A master and worker daemons on 127.0.0.1 (the master on another address of this machine
where workers elsewhere must reach it), each with its own ports, pid, log and work
directories under one root (the defaults collide between clusters), so that several
clusters and a user's own Spark can run side by side. Used by
:class:`~cerebro_spark.cluster.LocalStandaloneCluster` (the one-machine elastic cluster),
by :class:`~cerebro_spark.cluster.Ec2Cluster` (its master) and by the tests that need a
real standalone cluster.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
_IDENT = "cerebro"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
    return port


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from ``/proc``).

    Zombies are left out: a worker daemon keeps an unreaped child from its start for its
    whole life, and waiting for it to end would wait forever.
    """
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if fields[0] not in ("Z", "X"):
                children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: list[int] = []
    frontier = [pid]
    while frontier:
        below = children.get(frontier.pop(), [])
        found += below
        frontier += below
    return found


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float) -> float:
    """Wait for ``condition``; return the seconds it took.

    Raises:
        TimeoutError: It did not hold within ``timeout_s`` (``what`` is named).
    """
    begun = time.monotonic()
    while not condition():
        if time.monotonic() - begun > timeout_s:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.2)
    return time.monotonic() - begun


class SparkDaemons:
    """A standalone master and its worker daemons under ``root``.

    Args:
        root: Directory of the cluster's pid, log and work directories.
        master_port: The master's port (default: a free one).
        master_ui_port: The master's web UI port (default: a free one); its JSON view
            tells how many workers are alive.
        spark_home: Spark's home (default: the installed ``pyspark`` package).
        env: Extra environment of the daemons.
        host: The address the daemons bind to and announce (default: loopback).
    """

    def __init__(
        self,
        root: str | Path,
        master_port: int | None = None,
        master_ui_port: int | None = None,
        spark_home: str | None = None,
        env: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.root = Path(root)
        self.host = host
        self.master_port = master_port or free_port(host)
        self.master_ui_port = master_ui_port or free_port(host)
        self._spark_home = spark_home
        self._extra_env = dict(env or {})

    @property
    def url(self) -> str:
        """The master's URL (``spark://HOST:PORT``)."""
        return f"spark://{self.host}:{self.master_port}"

    @property
    def spark_home(self) -> str:
        """Where ``sbin/spark-daemon.sh`` is."""
        if self._spark_home is None:
            import pyspark

            self._spark_home = os.environ.get("SPARK_HOME") or str(Path(pyspark.__file__).parent)
        return self._spark_home

    @property
    def env(self) -> dict[str, str]:
        """The daemons' environment: own pid and log directories, their host, this Python."""
        return {
            **os.environ,
            "SPARK_HOME": self.spark_home,
            "SPARK_LOG_DIR": str(self.root / "logs"),
            "SPARK_PID_DIR": str(self.root / "pids"),
            "SPARK_LOCAL_IP": self.host,
            "SPARK_IDENT_STRING": _IDENT,
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
            **self._extra_env,
        }

    def to_json(self) -> dict[str, Any]:
        """What :meth:`from_json` needs to drive the same daemons from another process."""
        return {
            "root": str(self.root),
            "master_port": self.master_port,
            "master_ui_port": self.master_ui_port,
            "host": self.host,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> SparkDaemons:
        """The daemons :meth:`to_json` described."""
        return cls(
            raw["root"],
            int(raw["master_port"]),
            int(raw["master_ui_port"]),
            host=str(raw.get("host", "127.0.0.1")),
        )

    # -- daemons ---------------------------------------------------------------------------

    def _daemon(self, action: str, klass: str, instance: int, *args: str) -> None:
        script = Path(self.spark_home) / "sbin" / "spark-daemon.sh"
        if action == "start":
            self._clear_stale_pid(klass, instance)
        done = subprocess.run(
            ["bash", str(script), action, klass, str(instance), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"spark-daemon.sh {action} {klass} {instance} failed ({done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-2000:]}"
            )

    def _pid_file(self, klass: str, instance: int) -> Path:
        return self.root / "pids" / f"spark-{_IDENT}-{klass}-{instance}.pid"

    def _clear_stale_pid(self, klass: str, instance: int) -> None:
        """Delete the pid file of a daemon that no longer runs.

        ``spark-daemon.sh start`` refuses to start a daemon whose pid file names a
        process ``ps`` shows as ``java``, and a daemon killed by a watcher is a zombie
        (shown as ``java``) until its parent reaps it: where the machine's init does not
        reap, that is forever. A daemon :func:`alive` counts gone is gone.
        """
        pid = self.pid_of(klass, instance)
        if pid is not None and not alive(pid):
            logger.info("removing the stale pid file of %s %d (pid %d)", klass, instance, pid)
            self._pid_file(klass, instance).unlink(missing_ok=True)

    def pid_of(self, klass: str, instance: int) -> int | None:
        """The pid a daemon was started with, if it was."""
        with contextlib.suppress(FileNotFoundError, ValueError):
            return int(self._pid_file(klass, instance).read_text())
        return None

    def work_dir(self, instance: int) -> Path:
        """Worker daemon ``instance``'s work directory (its executors live below it)."""
        return self.root / f"work-{instance}"

    def start_master(self, timeout_s: float = 60.0) -> None:
        """Start the master and wait until its web UI answers."""
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        self._daemon(
            "start",
            MASTER_CLASS,
            1,
            "--host",
            self.host,
            "--port",
            str(self.master_port),
            "--webui-port",
            str(self.master_ui_port),
        )
        wait_until(lambda: self.alive_workers() >= 0, "the master's web UI", timeout_s)

    def start_worker(self, instance: int, cores: int = 1, memory: str = "1g") -> None:
        """Start worker daemon ``instance`` (returns before it registers)."""
        self.work_dir(instance).mkdir(parents=True, exist_ok=True)
        self._daemon(
            "start",
            WORKER_CLASS,
            instance,
            "--host",
            self.host,
            "--cores",
            str(cores),
            "--memory",
            memory,
            "--webui-port",
            str(free_port(self.host)),
            "--work-dir",
            str(self.work_dir(instance)),
            self.url,
        )

    def stop(self, klass: str, instance: int, timeout_s: float = 30.0) -> None:
        """Stop a daemon (SIGTERM, then SIGKILL) and wait until it and its children end.

        A worker daemon kills its executors when it stops; stop one only once the
        application no longer wants executors there (``killExecutors`` first): a daemon
        that is shutting down still obeys the master's order to replace the executor it
        just killed, and that executor outlives it.
        """
        pid = self.pid_of(klass, instance)
        if pid is None or not alive(pid):
            return
        tree = descendants(pid)
        with contextlib.suppress(RuntimeError):
            self._daemon("stop", klass, instance)
        deadline = time.monotonic() + timeout_s
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        for member in [pid, *tree]:
            if alive(member):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(member, signal.SIGKILL)

    def crash_worker(self, instance: int) -> None:
        """Kill worker daemon ``instance`` and everything it started, as a crashed machine would.

        The daemon is frozen first, so that it starts nothing while its process tree is
        collected.
        """
        pid = self.pid_of(WORKER_CLASS, instance)
        if pid is None or not alive(pid):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
        tree = [pid, *descendants(pid)]
        for member in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(member, signal.SIGKILL)
        wait_until(lambda: not any(alive(m) for m in tree), "the worker's processes to end", 30)

    def stop_all(self) -> None:
        """Stop every worker daemon, then the master (idempotent)."""
        for instance in self.worker_instances():
            self.stop(WORKER_CLASS, instance)
        self.stop(MASTER_CLASS, 1)

    # -- what runs -------------------------------------------------------------------------

    def worker_instances(self, running: bool = True) -> list[int]:
        """Worker daemons started under ``root`` (only the running ones by default)."""
        found = []
        for path in (self.root / "pids").glob(f"spark-{_IDENT}-{WORKER_CLASS}-*.pid"):
            instance = int(path.stem.rsplit("-", 1)[1])
            pid = self.pid_of(WORKER_CLASS, instance)
            if not running or (pid is not None and alive(pid)):
                found.append(instance)
        return sorted(found)

    def next_instance(self) -> int:
        """An instance number no worker daemon of this cluster used yet."""
        used = [int(p.name.split("-")[1]) for p in self.root.glob("work-*")]
        return max(used, default=0) + 1

    def master_state(self) -> dict[str, Any] | None:
        """The master's JSON view (workers, applications), ``None`` if it does not answer.

        A web UI that is still starting may answer with an empty or partial body; that
        counts as not answering (measured: an empty body once, under CI's load).
        """
        try:
            with urllib.request.urlopen(
                f"http://{self.host}:{self.master_ui_port}/json/", timeout=5
            ) as response:
                state = json.load(response)
        except (OSError, ValueError):
            return None
        return state if isinstance(state, dict) else None

    def alive_workers(self) -> int:
        """Worker daemons the master counts alive (``-1``: the master does not answer)."""
        state = self.master_state()
        return -1 if state is None else int(state.get("aliveworkers", 0))

    def instance_of(self, executor_id: str, app_id: str = "app-*") -> int | None:
        """The running worker daemon holding executor ``executor_id`` of ``app_id``.

        Found by the executor's work directory; ``app_id`` defaults to any application.
        """
        for path in sorted(self.root.glob(f"work-*/{app_id}/{executor_id}")):
            instance = int(path.parent.parent.name.split("-")[1])
            pid = self.pid_of(WORKER_CLASS, instance)
            if pid is not None and alive(pid):
                return instance
        return None
