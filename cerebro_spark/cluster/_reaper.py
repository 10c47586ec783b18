"""Stops a local standalone cluster's daemons once the driver that started them is gone.

Spark's daemons run detached (``nohup``): a driver killed with SIGKILL (or by the
out-of-memory killer) cannot stop them, and its master and worker daemons would run on
for good. :func:`start_reaper` starts a small watcher process, in its own session so that
a signal to the driver's group does not reach it, that polls the driver's pid and, once
it has ended, stops the daemons it saw running under the cluster's root (and deletes the
root when the cluster made it).
:meth:`~cerebro_spark.cluster.LocalStandaloneCluster.close` stops the watcher after
stopping the daemons itself.

Run as ``python -m cerebro_spark.cluster._reaper PID DAEMONS_JSON [--delete-root]``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time

from cerebro_spark.cluster._daemons import (
    MASTER_CLASS,
    WORKER_CLASS,
    SparkDaemons,
    alive,
    descendants,
)

logger = logging.getLogger(__name__)

_POLL_S = 0.5
_GRACE_S = 10.0  # seconds a daemon has to stop on SIGTERM before SIGKILL


def start_reaper(
    daemons: SparkDaemons, owner_pid: int, delete_root: bool
) -> subprocess.Popen[bytes]:
    """Start the watcher of ``owner_pid`` for ``daemons`` (see the module docstring)."""
    command = [
        sys.executable,
        "-m",
        "cerebro_spark.cluster._reaper",
        str(owner_pid),
        json.dumps(daemons.to_json()),
    ]
    if delete_root:
        command.append("--delete-root")
    return subprocess.Popen(
        command,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def reap(owner_pid: int, daemons: SparkDaemons, delete_root: bool) -> None:
    """Wait until ``owner_pid`` has ended, then stop ``daemons`` (and delete their root).

    Only the daemon processes seen while the owner lived are stopped: a driver that
    resumes the run at once may already start its own daemons under the same root.
    """
    seen: set[int] = set()
    while alive(owner_pid):
        seen |= _daemon_pids(daemons)
        time.sleep(_POLL_S)
    running = [pid for pid in sorted(seen) if alive(pid)]
    if running:
        logger.warning("the driver %d is gone: stopping its daemons %s", owner_pid, running)
    tree = [member for pid in running for member in (pid, *descendants(pid))]
    for pid in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + _GRACE_S
    while any(alive(pid) for pid in running) and time.monotonic() < deadline:
        time.sleep(0.1)
    for member in tree:
        if alive(member):
            with contextlib.suppress(ProcessLookupError):
                os.kill(member, signal.SIGKILL)
    if delete_root:
        shutil.rmtree(daemons.root, ignore_errors=True)


def _daemon_pids(daemons: SparkDaemons) -> set[int]:
    """The pids of the master and worker daemons running under ``daemons.root`` now."""
    pids = {daemons.pid_of(MASTER_CLASS, 1)}
    pids |= {daemons.pid_of(WORKER_CLASS, i) for i in daemons.worker_instances()}
    return {pid for pid in pids if pid is not None and alive(pid)}


def main(argv: list[str]) -> int:
    """The watcher's entry point (``PID DAEMONS_JSON [--delete-root]``)."""
    logging.basicConfig(level=logging.INFO)
    reap(int(argv[0]), SparkDaemons.from_json(json.loads(argv[1])), "--delete-root" in argv[2:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
