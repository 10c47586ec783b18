"""Workers as long-lived tasks on a Spark Connect session (issue 28, part 1).

Databricks' Standard access mode, serverless compute and Databricks Connect run Spark
Connect only: no ``SparkContext``, no RDDs, no job groups, no status store. The
:class:`ConnectTransport` starts the same workers as :class:`~._spark.SparkTransport`,
through what Connect has (``shared/design.md``, "Spark Connect"):

* **One operation per worker**: a one-row DataFrame whose ``mapInArrow`` body runs
  :func:`~._serve.serve` and yields its outcome, collected from a driver thread of its
  own. The thread tags its operations (``spark.addTag``: tags are the thread's own), so
  :meth:`ConnectTransport.kill` cancels one worker alone with ``spark.interruptTag``.
  A worker told to stop ends its task normally and the operation succeeds.
* **Where**: each worker says where it runs when it registers (its host, and its
  executor id where the executor's environment or work directory tells it,
  :func:`~._serve.executor_hint`: a Connect session's Python workers run in a directory of
  the session's own inside the executor's work directory); in ``local[N]`` it is the
  driver, as on classic Spark.
  Its host is the address its control connection came from (the node's private IP, which
  the Databricks REST API lists: the ``databricks`` manager matches workers to nodes by
  it), its hostname where that address is a loopback one.
* **Settings** come from ``spark.conf`` (``spark.speculation`` is refused as on classic
  Spark). The session does not say how many task slots its executors have: the number of
  workers must be given, and with a ``local[N]`` master it may not exceed ``N``. Executors
  that appear later are not seen, so no worker joins on them; killing an executor is not
  possible through Connect (the tests kill a worker's process, or its executor's JVM from
  the OS). When an executor dies, Spark retries its worker's task elsewhere: the pool
  refuses the retry's registration (a worker id registers once) and the retried task ends
  at once, if the pool's interrupt of the lost worker's operation did not cancel it first.

The workers connect back to this process's control server at ``spark.driver.host``:
this process must run where the executors can reach it (a notebook on the cluster's
driver; not a laptop running Databricks Connect).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future
from typing import Any

from cerebro_spark.backends._serve import WorkerSpec, serve
from cerebro_spark.backends._spark_task import check_spark_conf, run_in_thread, spark_task_info
from cerebro_spark.backends._transport import Location, Transport
from cerebro_spark.errors import ConfigError

logger = logging.getLogger(__name__)

_LOCAL = re.compile(r"local(\[(\d+|\*)(,\s*\d+)?\])?$")


def run_worker_batches(spec: WorkerSpec, batches: Iterable[Any]) -> Iterator[Any]:
    """The ``mapInArrow`` body of a worker's operation: serve, then yield the outcome."""
    import pyarrow as pa

    for _ in batches:  # the operation's single row carries nothing; the spec is bound
        pass
    yield pa.RecordBatch.from_pydict({"outcome": [serve(spec, spark_task_info())]})


class ConnectTransport(Transport):
    """Workers as long-lived tasks of a Spark Connect session (see the module docstring).

    Args:
        spark: The Spark Connect session.
    """

    noun = "Spark task"

    def __init__(self, spark: Any) -> None:
        self._spark = spark
        self._tag = f"cerebro-{id(self):x}"
        self._tags: dict[str, str] = {}
        self._done: dict[str, Future[str]] = {}
        self._master = ""
        self._lock = threading.Lock()

    def _conf(self, key: str) -> str | None:
        """A setting of the session; ``None`` when unset or not readable (serverless)."""
        try:
            value = self._spark.conf.get(key, None)
        except Exception as error:  # e.g. CONFIG_NOT_AVAILABLE
            logger.debug("cannot read %s from the Spark Connect session: %s", key, error)
            return None
        return None if value is None else str(value)

    def open(self, requested: int | None, timeout_s: float) -> int:
        """Check the settings; return ``requested`` (the session does not count slots).

        Raises:
            ConfigError: A refused setting, no number of workers, or more workers than
                a ``local[N]`` master's slots.
        """
        del timeout_s
        check_spark_conf(self._conf)
        self._master = self._conf("spark.master") or ""
        if requested is None:
            raise ConfigError(
                "a Spark Connect session does not say how many task slots its executors "
                "have: give the number of workers (workers: N)"
            )
        slots = local_slots(self._master)
        logger.info(
            "starting %d workers on a Spark Connect session (master %s)",
            requested,
            self._master or "unknown",
        )
        if slots is not None and requested > slots:
            raise ConfigError(
                f"num_workers={requested} exceeds the {slots} task slots of master "
                f"{self._master}: each worker holds a slot for its whole life"
            )
        return requested

    def control_address(self) -> tuple[str, str]:
        """Bind to ``spark.driver.bindAddress``; workers reach ``spark.driver.host``."""
        advertised = self._conf("spark.driver.host") or "127.0.0.1"
        return (self._conf("spark.driver.bindAddress") or advertised, advertised)

    def launch(self, spec: WorkerSpec) -> Future[str]:
        """Run the worker's operation from a driver thread of its own, under its own tag."""
        tag = f"{self._tag}-{spec.worker_id}"
        ended: Future[str] = Future()
        with self._lock:
            self._tags[spec.worker_id] = tag
            self._done[spec.worker_id] = ended

        def run_operation() -> str:
            self._spark.addTag(tag)  # this thread's operations only
            try:
                body = functools.partial(run_worker_batches, spec)
                frame = self._spark.range(1, numPartitions=1).mapInArrow(body, "outcome string")
                return ", ".join(str(row[0]) for row in frame.collect())
            finally:
                self._spark.removeTag(tag)

        run_in_thread(f"cerebro-spark-connect-{spec.worker_id}", ended, run_operation)
        return ended

    def kill(self, worker_id: str) -> None:
        """Interrupt the worker's operation (Spark kills its task's Python process)."""
        with self._lock:
            tag = self._tags.get(worker_id)
            done = self._done.get(worker_id)
        if tag is None or (done is not None and done.done()):
            return
        try:
            self._spark.interruptTag(tag)
        except Exception:
            logger.warning(
                "could not interrupt the Spark task of worker %s", worker_id, exc_info=True
            )

    def locate(self, worker_id: str, registration: Mapping[str, Any], peer: str) -> Location | None:
        """Where the worker runs (the driver, in ``local[N]``).

        The address it connected from, unless that is a loopback one (then the hostname it
        reported): the module docstring.
        """
        del worker_id
        if local_slots(self._master) is not None:
            return Location("localhost", "driver")
        hint = registration.get("executor_hint")
        host = peer if peer and not _loopback(peer) else registration.get("hostname") or peer
        return Location(str(host), hint if isinstance(hint, str) else None)


def _loopback(address: str) -> bool:
    """Whether ``address`` names this machine only (``127.x``, ``::1``, ``localhost``)."""
    text = address.strip().strip("[]").lower()
    return text in ("localhost", "::1") or text.startswith("127.")


def local_slots(master: str) -> int | None:
    """The task slots of a ``local``/``local[N]``/``local[*]`` master; ``None`` for others."""
    match = _LOCAL.match(master.strip())
    if match is None:
        return None
    count = match.group(2)
    if count is None:
        return 1
    return os.cpu_count() or 1 if count == "*" else int(count)
