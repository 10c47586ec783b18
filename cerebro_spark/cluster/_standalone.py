"""Standalone clusters cerebro-spark starts itself and resizes by adding and removing workers.

:class:`StandaloneCluster` holds what every such cluster shares: a Spark standalone master
cerebro-spark starts on the driver's machine (:class:`~._daemons.SparkDaemons`), one worker
(hence one executor) per *instance*, growth by starting instances, and shrinking by
releasing executors through Spark (``killExecutors``, which also lowers the application's
target so the master does not replace them) and only then stopping their instances. Each
instance is billed from its start to its stop. Subclasses say what an instance is:

* :class:`LocalStandaloneCluster`: a worker daemon on 127.0.0.1. The one-machine default
  for elastic runs, and the test bed of the elastic layer.
* :class:`~._ec2.Ec2Cluster`: an EC2 instance whose user data starts a worker.

Use: create it (it starts the master and the first instances, and waits for their workers
to register), create the Spark session against :attr:`~StandaloneCluster.master_url` with
:meth:`~StandaloneCluster.spark_conf`, then :meth:`~StandaloneCluster.attach` the session.
"""

from __future__ import annotations

import abc
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cerebro_spark.cluster._base import Capabilities, ClusterManager, Executor
from cerebro_spark.cluster._daemons import WORKER_CLASS, SparkDaemons, descendants, wait_until
from cerebro_spark.cluster._reaper import start_reaper
from cerebro_spark.cluster._spark import SparkExecutors
from cerebro_spark.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)


def check_positive_int(owner: str, name: str, value: object) -> int:
    """Return ``value`` if it is an integer >= 1.

    Raises:
        ConfigError: It is not (``owner`` and ``name`` are named).
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{owner}: {name} must be an integer >= 1, got {value!r}")
    return value


class StandaloneCluster(ClusterManager):
    """A standalone master here and one worker per instance (see the module docstring).

    Subclasses start the master and their first instances with :meth:`_start` at the end
    of their constructor, and implement the instance hooks (``_start_workers``,
    ``_instance_of``, ``_instances``, ``_stop_instance``, optionally ``_stop_instances``
    and ``_registered``).

    Args:
        daemons: The master's daemons (and the local workers', if any).
        cores: Cores of each worker (its executor's cores).
        memory: Memory of each worker's executor (``"1g"``).
        max_executors: Most instances a resize may ask for (``None``: no limit).
        instance_type: What an instance is in the price catalog.

    Raises:
        ConfigError: A bad argument.
    """

    def __init__(
        self,
        daemons: SparkDaemons,
        *,
        cores: int,
        memory: str,
        max_executors: int | None,
        instance_type: str | None,
    ) -> None:
        name = type(self).__name__
        check_positive_int(name, "cores", cores)
        if max_executors is not None:
            check_positive_int(name, "max_executors", max_executors)
        self.capabilities = Capabilities(
            resizable=True,
            choose_victims=True,
            min_executors=1,
            max_executors=max_executors,
            instance_type=instance_type,
        )
        self.daemons = daemons
        self._cores = cores
        self._memory = memory
        self._lock = threading.Lock()
        self._started_at: dict[str, float] = {}
        self._stopping: set[str] = set()
        self._spark: SparkExecutors | None = None
        self._app_id = "app-*"
        self._closed = False

    def _start(self, workers: int, register_timeout_s: float) -> None:
        """Start the master and ``workers`` instances; wait until their workers register.

        Closes the cluster if anything fails.
        """
        try:
            self.daemons.start_master()
            self._start_workers(workers)
            wait_until(
                lambda: self._registered() >= workers,
                f"{workers} workers to register with {self.master_url}",
                register_timeout_s,
            )
        except BaseException:
            self.close()
            raise

    @property
    def master_url(self) -> str:
        """``spark://HOST:PORT``: the master a Spark session connects to."""
        return self.daemons.url

    def spark_conf(self) -> dict[str, str]:
        """Settings the application needs: one worker per executor, static allocation."""
        return {
            "spark.executor.cores": str(self._cores),
            "spark.task.cpus": str(self._cores),
            "spark.executor.memory": self._memory,
            "spark.dynamicAllocation.enabled": "false",
        }

    def attach(self, spark: SparkSession) -> None:
        """Manage the executors of ``spark``'s application (created on :attr:`master_url`)."""
        if spark.sparkContext.master != self.master_url:
            raise ConfigError(
                f"the Spark session runs on master {spark.sparkContext.master}, not on this "
                f"cluster's {self.master_url}"
            )
        self._spark = SparkExecutors(spark, min_executors=1)
        self._app_id = spark.sparkContext.applicationId
        # Standalone without dynamic allocation grabs every worker, later ones included:
        # cap it at what runs now (design.md, "Elastic layer").
        self._spark.resize(len(self._instances()))

    def executors(self) -> list[Executor]:
        """The application's executors, each billed as its instance since it started."""
        if self._spark is None:
            return []
        found = []
        for executor in self._spark.executors():
            instance = self._instance_of(executor.executor_id, executor.host)
            if instance is None or instance in self._stopping:
                continue
            found.append(
                Executor(
                    executor_id=executor.executor_id,
                    host=executor.host,
                    cores=executor.cores,
                    gpus=executor.gpus,
                    since=self._started_at.get(instance, executor.since),
                    instance=instance,
                )
            )
        return found

    def resize(self, target: int, victims: Sequence[str] = ()) -> None:
        """Start instances to grow; release executors and stop their instances to shrink."""
        self.check_resize(target, victims)
        if self._spark is None:
            raise RuntimeError("attach the Spark session before resizing")
        live = self.executors()
        if target > len(live):
            serving = {e.instance for e in live}
            starting = [
                i for i in self._instances() if i not in self._stopping and i not in serving
            ]
            missing = target - len(live) - len(starting)
            if missing > 0:
                self._start_workers(missing)
            self._spark.resize(target)
            return
        ids = [e.executor_id for e in live]
        chosen = [v for v in victims if v in ids]
        chosen += [e for e in reversed(ids) if e not in chosen][: len(ids) - target - len(chosen)]
        instances = {e.executor_id: e.instance for e in live if e.executor_id in chosen}
        with self._lock:
            self._stopping.update(i for i in instances.values() if i is not None)
        self._spark.resize(target, chosen)
        for executor_id, instance in instances.items():
            if instance is not None:
                threading.Thread(
                    target=self._stop_instance,
                    args=(executor_id, instance),
                    name=f"cerebro-stop-{instance}",
                    daemon=True,
                ).start()

    def close(self) -> None:
        """Stop every instance this cluster started, and its master (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._stop_instances()
        except BaseException:
            with self._lock:
                self._closed = False  # a later close tries again
            raise
        finally:
            self.daemons.stop_all()
        logger.info("%s %s stopped", type(self).__name__, self.master_url)

    def failed_tasks(self) -> int | None:
        """Failed tasks of the attached application so far (``None`` before attach)."""
        return None if self._spark is None else self._spark.failed_tasks()

    # -- instances (subclasses) ------------------------------------------------------------

    def _mark_started(self, instance: str, at: float | None = None) -> None:
        """Record when ``instance`` was requested (its executors' ``since``)."""
        with self._lock:
            self._started_at[instance] = time.time() if at is None else at

    @abc.abstractmethod
    def _start_workers(self, count: int) -> None:
        """Start ``count`` instances (returns before their workers register)."""

    @abc.abstractmethod
    def _instance_of(self, executor_id: str, host: str) -> str | None:
        """The running instance that holds executor ``executor_id`` on ``host``."""

    @abc.abstractmethod
    def _instances(self) -> list[str]:
        """Instances started and not stopped (booting ones included)."""

    @abc.abstractmethod
    def _stop_instance(self, executor_id: str, instance: str) -> None:
        """Stop ``instance`` once its (released) executor has ended; runs in a thread."""

    def _stop_instances(self) -> None:
        """Stop every instance at :meth:`close`, before the master's daemons stop."""

    def _registered(self) -> int:
        """Workers the master counts alive."""
        return self.daemons.alive_workers()


class LocalStandaloneCluster(StandaloneCluster):
    """Master and worker daemons on 127.0.0.1, one daemon per instance.

    It grows by starting worker daemons (the master gives the application an executor on
    each in about 6 s) and shrinks by releasing executors, then stopping their daemons.
    Each daemon is billed as ``worker-N``.

    Args:
        workers: Worker daemons to start with.
        root: Directory of the daemons' pid, log and work directories (default: a new
            temporary directory).
        cores: Cores of each daemon (its executor's cores).
        memory: Memory of each daemon's executor (``"1g"``).
        max_executors: Most daemons a resize may ask for (``None``: no limit).
        instance_type: What a daemon stands for in the price catalog.
        register_timeout_s: Seconds to wait for the first daemons to register.

    Raises:
        ConfigError: A bad argument.
        RuntimeError: A daemon failed to start (the script's message).
        TimeoutError: The first daemons did not register in time.
    """

    def __init__(
        self,
        workers: int,
        *,
        root: str | Path | None = None,
        cores: int = 1,
        memory: str = "1g",
        max_executors: int | None = None,
        instance_type: str | None = None,
        register_timeout_s: float = 120.0,
    ) -> None:
        check_positive_int(type(self).__name__, "workers", workers)
        check_positive_int(type(self).__name__, "cores", cores)
        self._own_root = root is None
        super().__init__(
            SparkDaemons(root or tempfile.mkdtemp(prefix="cerebro-standalone-")),
            cores=cores,
            memory=memory,
            max_executors=max_executors,
            instance_type=instance_type,
        )
        # Stops the daemons if this process dies without closing the cluster (SIGKILL).
        self._reaper = start_reaper(self.daemons, os.getpid(), self._own_root)
        self._start(workers, register_timeout_s)
        logger.info("local standalone cluster %s with %d workers", self.master_url, workers)

    def close(self) -> None:
        """Stop the daemons; delete the root directory if the cluster made it (idempotent)."""
        super().close()
        if self._own_root:
            shutil.rmtree(self.daemons.root, ignore_errors=True)
        self._reaper.terminate()
        self._reaper.wait()

    def _start_workers(self, count: int) -> None:
        for _ in range(count):
            with self._lock:
                number = self.daemons.next_instance()
                self.daemons.work_dir(number).mkdir(parents=True, exist_ok=True)
            self._mark_started(f"worker-{number}")
            self.daemons.start_worker(number, cores=self._cores, memory=self._memory)
            logger.info("started worker daemon %d", number)

    def _instance_of(self, executor_id: str, host: str) -> str | None:
        number = self.daemons.instance_of(executor_id, self._app_id)
        return None if number is None else f"worker-{number}"

    def _instances(self) -> list[str]:
        return [f"worker-{number}" for number in self.daemons.worker_instances()]

    def _stop_instance(self, executor_id: str, instance: str) -> None:
        """Stop a daemon once its executor's process has ended.

        Never the other way round: a daemon that is shutting down may start a replacement
        executor that outlives it.
        """
        number = int(instance.rsplit("-", 1)[1])
        pid = self.daemons.pid_of(WORKER_CLASS, number)
        try:
            wait_until(
                lambda: pid is None or not descendants(pid), f"executor {executor_id} to end", 60
            )
        except TimeoutError:
            logger.warning("executor %s did not end in 60 s; stopping its daemon", executor_id)
        self.daemons.stop(WORKER_CLASS, number)
        logger.info("stopped worker daemon %d (executor %s)", number, executor_id)
