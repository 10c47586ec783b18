"""The machines moto does not run: each launched EC2 instance becomes a worker daemon here.

moto's EC2 server launches instances that are "running" at once and runs no user data.
:class:`LoopbackMachines` plays the machines: its :meth:`~LoopbackMachines.bootstrap` (the
``Ec2Cluster`` bootstrap hook) waits a boot latency, gives the instance its own loopback
address (``127.0.0.N``) and directories, and runs the instance's **real user data** (read
back from moto) with bash, so the worker daemon it starts is the one the template starts on
EC2 (the template's ``host_command`` is ``printenv WORKER_HOST`` here instead of the
instance metadata service). A watcher thread stops a machine's daemon once moto says its
instance is shutting down or terminated, as a terminated machine would vanish: the daemon
is stopped only once its executor has ended, as ``LocalStandaloneCluster`` does.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import itertools
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cerebro_spark.cluster._daemons import WORKER_CLASS, SparkDaemons, alive, descendants

logger = logging.getLogger(__name__)

GONE = ("shutting-down", "terminated")


@dataclasses.dataclass
class Machine:
    instance_id: str
    host: str
    daemons: SparkDaemons
    booted_at: float
    stopped_at: float | None = None

    def pid(self) -> int | None:
        return self.daemons.pid_of(WORKER_CLASS, 1)

    def running(self) -> bool:
        pid = self.pid()
        return pid is not None and alive(pid)


class LoopbackMachines:
    """Worker daemons standing for EC2 instances (see the module docstring).

    Args:
        client: A boto3 EC2 client of the moto server the cluster launches on.
        root: Where each machine's pid, log and work directories go.
        boot_latency_s: Seconds an instance takes to boot before its user data runs.
        first_address: ``N`` of the first machine's ``127.0.0.N``.
    """

    def __init__(
        self, client: Any, root: Path, boot_latency_s: float = 1.0, first_address: int = 2
    ) -> None:
        self.client = client
        self.root = Path(root)
        self.boot_latency_s = boot_latency_s
        self.machines: dict[str, Machine] = {}
        self.refused: list[str] = []  # instances gone before they booted
        self._addresses = itertools.count(first_address)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="ec2-machines", daemon=True)
        self._watcher.start()

    def bootstrap(self, instance: Mapping[str, Any]) -> str:
        """Boot ``instance``: run its user data on a loopback address; return the address."""
        instance_id = str(instance["InstanceId"])
        time.sleep(self.boot_latency_s)
        if self.state(instance_id) != "running":
            self.refused.append(instance_id)
            raise RuntimeError(f"instance {instance_id} is {self.state(instance_id)}")
        raw = self.client.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
        script = base64.b64decode(raw["UserData"]["Value"]).decode()
        with self._lock:
            host = f"127.0.0.{next(self._addresses)}"
        machine_root = self.root / instance_id
        daemons = SparkDaemons(machine_root)
        env = {
            **os.environ,
            "WORKER_HOST": host,
            "SPARK_PID_DIR": str(machine_root / "pids"),
            "SPARK_LOG_DIR": str(machine_root / "logs"),
            "SPARK_WORKER_DIR": str(machine_root / "work"),
            "SPARK_IDENT_STRING": "cerebro",
            "PYSPARK_PYTHON": sys.executable,
        }
        (machine_root / "user-data.sh").parent.mkdir(parents=True, exist_ok=True)
        (machine_root / "user-data.sh").write_text(script)
        with self._lock:  # registered before it starts, so that close() finds it
            self.machines[instance_id] = Machine(instance_id, host, daemons, time.time())
        done = subprocess.run(
            ["bash", str(machine_root / "user-data.sh")],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"user data of {instance_id} failed: {done.stderr[-2000:]}")
        logger.info("instance %s booted as %s", instance_id, host)
        return host

    def state(self, instance_id: str) -> str:
        answer = self.client.describe_instances(InstanceIds=[instance_id])
        return str(answer["Reservations"][0]["Instances"][0]["State"]["Name"])

    def running(self) -> dict[str, str]:
        """Instance id -> host of the machines whose daemon runs."""
        with self._lock:
            machines = list(self.machines.values())
        return {m.instance_id: m.host for m in machines if m.running()}

    def close(self) -> None:
        """Stop watching; crash every daemon still running."""
        self._stop.set()
        self._watcher.join(timeout=30)
        for machine in self.machines.values():
            machine.daemons.crash_worker(1)

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                machines = list(self.machines.values())
            # A stopped machine whose user data was still starting its daemon is stopped again.
            machines = [m for m in machines if m.stopped_at is None or m.running()]
            for machine in machines:
                try:
                    gone = self.state(machine.instance_id) in GONE
                except Exception:
                    logger.exception("cannot describe %s", machine.instance_id)
                    continue
                if gone:
                    self._power_off(machine)

    def _power_off(self, machine: Machine) -> None:
        pid = machine.pid()
        deadline = time.monotonic() + 60
        while pid is not None and descendants(pid) and time.monotonic() < deadline:
            time.sleep(0.2)  # its executor ends first (it was released before termination)
        with contextlib.suppress(RuntimeError):
            machine.daemons.stop(WORKER_CLASS, 1)
        machine.stopped_at = time.time()
        logger.info(
            "instance %s terminated: daemon on %s stopped", machine.instance_id, machine.host
        )
