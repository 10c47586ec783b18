"""A real Spark Connect server on 127.0.0.1, started as Databricks runs one: its own process.

``ConnectServer(root)`` starts ``org.apache.spark.sql.connect.service.SparkConnectServer``
(``sbin/spark-daemon.sh submit``, what ``start-connect-server.sh`` runs) with a ``local[N]``
master, its own pid and log directories and a free port, waits until the port accepts,
and stops it (its whole process tree) on ``close``. Its executors' Python is this one, with
the repository on ``PYTHONPATH`` (tests' specs are imported by workers). ``session()`` is a
Spark Connect session on it (``SparkSession.builder.remote``): no SparkContext.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cerebro_spark.cluster._daemons import alive, descendants, free_port

CONNECT_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
ROOT = Path(__file__).resolve().parents[1]


class ConnectServer:
    """A Spark Connect server process (see the module docstring).

    Args:
        root: Its pid, log and work directories.
        slots: The ``local[N]`` master's task slots.
        start_timeout_s: Seconds to wait for the port.
    """

    def __init__(self, root: Path, slots: int = 4, start_timeout_s: float = 180.0) -> None:
        import pyspark

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
        args = ["--name", "cerebro-spark connect tests", "--master", f"local[{slots}]"]
        for key, value in settings.items():
            args += ["--conf", f"{key}={value}"]
        self._daemon("submit", *args)
        self._wait_for_port(start_timeout_s)

    def session(self) -> Any:
        """A Spark Connect session on this server."""
        from pyspark.sql import SparkSession

        return SparkSession.builder.remote(self.url).getOrCreate()

    def pid(self) -> int | None:
        with contextlib.suppress(FileNotFoundError, ValueError):
            path = self.root / "pids" / f"spark-cerebro-connect-{CONNECT_CLASS}-1.pid"
            return int(path.read_text())
        return None

    def close(self) -> None:
        """Stop the server and everything it started (idempotent)."""
        pid = self.pid()
        tree = [] if pid is None else [pid, *descendants(pid)]
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._daemon("stop")
        deadline = time.monotonic() + 30
        while pid is not None and alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        for member in tree:
            if alive(member):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(member, signal.SIGKILL)

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
