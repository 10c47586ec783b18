"""A real Spark Connect server on 127.0.0.1, started as Databricks runs one: its own process.

``ConnectServer(root)`` starts ``org.apache.spark.sql.connect.service.SparkConnectServer``
(``sbin/spark-daemon.sh submit``, what ``start-connect-server.sh`` runs) with a ``local[N]``
master (or another one: ``master="local-cluster[2,1,1024]"`` runs two executor JVMs of one
core and 1 GiB each, which a test can kill from the OS), its own pid and log directories
and a free port, waits until the port accepts, and stops it (its whole process tree) on
``close``. Its executors' Python is this one, with the repository on ``PYTHONPATH`` (tests'
specs are imported by workers): in the server's environment, which ``local[N]`` tasks and
``local-cluster`` executors inherit, and in ``spark.executorEnv``. ``session()`` is a Spark
Connect session on it (``SparkSession.builder.remote``): no SparkContext.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cerebro_spark.cluster._daemons import alive, descendants, free_port

CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
_LOCAL_CLUSTER = re.compile(r"local-cluster\[(\d+),(\d+),(\d+)\]")
ROOT = Path(__file__).resolve().parents[1]


class ConnectServer:
    """A Spark Connect server process (see the module docstring).

    Args:
        root: Its pid, log and work directories.
        slots: The ``local[N]`` master's task slots (when ``master`` is not given).
        start_timeout_s: Seconds to wait for the port.
        master: The server's master (default ``local[slots]``); a ``local-cluster`` one's
            executors get at most 1 GiB each and run this Python.

    Raises:
        ValueError: A ``local-cluster`` master asks for more than 1024 MiB per executor.
    """

    def __init__(
        self,
        root: Path,
        slots: int = 4,
        start_timeout_s: float = 180.0,
        master: str | None = None,
    ) -> None:
        import pyspark

        self.master = master or f"local[{slots}]"
        cluster = _LOCAL_CLUSTER.fullmatch(self.master.replace(" ", ""))
        if cluster is not None and int(cluster.group(3)) > 1024:
            raise ValueError(f"{self.master}: executors of the tests get at most 1024 MiB")
        self.root = Path(root)
        self.port = free_port("127.0.0.1")
        self.url = f"sc://127.0.0.1:{self.port}"
        home = os.environ.get("SPARK_HOME") or str(Path(pyspark.__file__).parent)
        self._script = Path(home) / "sbin" / "spark-daemon.sh"
        self._env = {
            **os.environ,
            "SPARK_HOME": home,
            "SPARK_PID_DIR": str(self.root / "pids"),
            "SPARK_LOG_DIR": str(self.root / "logs"),
            "SPARK_IDENT_STRING": "cerebro-connect",
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        self._env.pop("SPARK_REMOTE", None)
        settings = {
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "4",
            "spark.driver.host": "127.0.0.1",
            "spark.local.dir": str(self.root / "tmp"),
        }
        if cluster is not None:  # executor JVMs of their own: this Python, the repository
            settings.update(
                {
                    "spark.executor.memory": f"{cluster.group(3)}m",
                    "spark.executor.cores": cluster.group(2),
                    "spark.task.cpus": "1",
                    "spark.dynamicAllocation.enabled": "false",
                    "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
                    "spark.executorEnv.PYTHONPATH": self._env["PYTHONPATH"],
                    "spark.executorEnv.SPARK_LOCAL_IP": "127.0.0.1",
                }
            )
        args = ["--name", "cerebro-spark connect tests", "--master", self.master]
        for key, value in settings.items():
            args += ["--conf", f"{key}={value}"]
        self._daemon("submit", *args)
        self._wait_for_port(start_timeout_s)

    def session(self) -> Any:
        """A Spark Connect session on this server."""
        from pyspark.sql import SparkSession

        return SparkSession.builder.remote(self.url).getOrCreate()

    def pid(self) -> int | None:
        """The server's process id, from its pid file (``None`` before it wrote one)."""
        with contextlib.suppress(FileNotFoundError, ValueError):
            path = self.root / "pids" / f"spark-cerebro-connect-{CONNECT_CLASS}-1.pid"
            return int(path.read_text())
        return None

    def executor_pids(self) -> dict[str, int]:
        """The executor JVMs the server runs (``local-cluster``), by executor id.

        Each is a ``CoarseGrainedExecutorBackend`` process below the server's, with
        ``--executor-id <id>`` on its command line; ``local[N]`` has none (the driver runs
        the tasks).
        """
        pid = self.pid()
        found: dict[str, int] = {}
        for member in [] if pid is None else descendants(pid):
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{member}/cmdline").read_bytes().decode().split("\0")
                if EXECUTOR_CLASS in argv and "--executor-id" in argv:
                    found[argv[argv.index("--executor-id") + 1]] = member
        return found

    def close(self) -> None:
        """Stop the server and everything it started (idempotent)."""
        pid = self.pid()
        tree = [] if pid is None else [pid, *descendants(pid)]
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._daemon("stop")
        deadline = time.monotonic() + 30
        while pid is not None and alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        for member in [*tree, *self._strays()]:
            if alive(member):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(member, signal.SIGKILL)

    def _strays(self) -> list[int]:
        """Processes of this server that outlived it: ``local-cluster`` executors that its
        in-process workers relaunched while it stopped (their command line names its port).
        """
        mark = f"-Dspark.connect.grpc.binding.port={self.port}"
        found: list[int] = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            with contextlib.suppress(OSError, ValueError):
                if mark in cmdline.read_bytes().decode(errors="replace").split("\0"):
                    pid = int(cmdline.parent.name)
                    found += [pid, *descendants(pid)]
        return found

    def _daemon(self, action: str, *args: str) -> None:
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["bash", str(self._script), action, CONNECT_CLASS, "1", *args],
            env=self._env,
            check=True,
            capture_output=True,
            timeout=120,
        )

    def _wait_for_port(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), 1),
            ):
                return
            pid = self.pid()
            if pid is not None and not alive(pid):
                break
            time.sleep(0.5)
        logs = "\n".join(
            p.read_text(errors="replace")[-3000:] for p in (self.root / "logs").glob("*")
        )
        self.close()
        raise TimeoutError(f"the Spark Connect server did not listen on {self.url}:\n{logs}")
