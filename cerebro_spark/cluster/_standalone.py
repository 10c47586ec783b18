"""LocalStandaloneCluster: a Spark standalone cluster on this machine that grows and shrinks.

cerebro-spark starts a master and worker daemons on 127.0.0.1 itself (own ports, pid, log
and work directories: :class:`~._daemons.SparkDaemons`), one executor per worker daemon.
It grows by starting worker daemons (the master gives the application an executor on each
in about 6 s) and shrinks by releasing executors through Spark (``killExecutors``, which
also lowers the application's target so the master does not replace them) and then
stopping their daemons. Each daemon is one billed *instance*, from its start to its stop.
The one-machine default for elastic runs, and the test bed of the elastic layer.

Use: create it (it starts the master and the first daemons), create the Spark session
against :attr:`~LocalStandaloneCluster.master_url` with :meth:`spark_conf`, then
:meth:`~LocalStandaloneCluster.attach` the session.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cerebro_spark.cluster._base import Capabilities, ClusterManager, Executor
from cerebro_spark.cluster._daemons import WORKER_CLASS, SparkDaemons, descendants, wait_until
from cerebro_spark.cluster._spark import SparkExecutors
from cerebro_spark.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)


class LocalStandaloneCluster(ClusterManager):
    """Master and worker daemons on 127.0.0.1 (see the module docstring).

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
        for name, value in (("workers", workers), ("cores", cores)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(
                    f"LocalStandaloneCluster: {name} must be an integer >= 1, got {value!r}"
                )
        self.capabilities = Capabilities(
            resizable=True,
            choose_victims=True,
            min_executors=1,
            max_executors=max_executors,
            instance_type=instance_type,
        )
        self._own_root = root is None
        self.daemons = SparkDaemons(root or tempfile.mkdtemp(prefix="cerebro-standalone-"))
        self._cores = cores
        self._memory = memory
        self._lock = threading.Lock()
        self._started_at: dict[int, float] = {}
        self._stopping: set[int] = set()
        self._spark: SparkExecutors | None = None
        self._app_id = "app-*"
        self._closed = False
        try:
            self.daemons.start_master()
            for _ in range(workers):
                self._start_daemon()
            wait_until(
                lambda: self.daemons.alive_workers() >= workers,
                f"{workers} worker daemons to register with {self.master_url}",
                register_timeout_s,
            )
        except BaseException:
            self.close()
            raise
        logger.info("local standalone cluster %s with %d workers", self.master_url, workers)

    @property
    def master_url(self) -> str:
        """``spark://127.0.0.1:PORT``: the master a Spark session connects to."""
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
        # Standalone without dynamic allocation grabs every daemon, later ones included:
        # cap it at what runs now (design.md, "Elastic layer").
        self._spark.resize(len(self.daemons.worker_instances()))

    def executors(self) -> list[Executor]:
        """The application's executors, each billed as its worker daemon."""
        if self._spark is None:
            return []
        found = []
        for executor in self._spark.executors():
            instance = self.daemons.instance_of(executor.executor_id, self._app_id)
            if instance is None or instance in self._stopping:
                continue
            found.append(
                Executor(
                    executor_id=executor.executor_id,
                    host=executor.host,
                    cores=executor.cores,
                    gpus=executor.gpus,
                    since=self._started_at.get(instance, executor.since),
                    instance=f"worker-{instance}",
                )
            )
        return found

    def resize(self, target: int, victims: Sequence[str] = ()) -> None:
        """Start daemons to grow; release executors and stop their daemons to shrink."""
        self.check_resize(target, victims)
        if self._spark is None:
            raise RuntimeError("attach the Spark session before resizing")
        live = self.executors()
        if target > len(live):
            starting = len(self.daemons.worker_instances()) - len(self._stopping) - len(live)
            for _ in range(max(0, target - len(live) - max(0, starting))):
                self._start_daemon()
            self._spark.resize(target)
            return
        ids = [e.executor_id for e in live]
        chosen = [v for v in victims if v in ids]
        chosen += [e for e in reversed(ids) if e not in chosen][: len(ids) - target - len(chosen)]
        instances = {v: self.daemons.instance_of(v, self._app_id) for v in chosen}
        with self._lock:
            self._stopping.update(i for i in instances.values() if i is not None)
        self._spark.resize(target, chosen)
        for executor_id, instance in instances.items():
            if instance is not None:
                threading.Thread(
                    target=self._stop_daemon,
                    args=(executor_id, instance),
                    name=f"cerebro-stop-worker-{instance}",
                    daemon=True,
                ).start()

    def close(self) -> None:
        """Stop every daemon this cluster started, and its master (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.daemons.stop_all()
        logger.info("local standalone cluster %s stopped", self.master_url)

    # -- daemons ---------------------------------------------------------------------------

    def _start_daemon(self) -> int:
        with self._lock:
            instance = self.daemons.next_instance()
            self.daemons.work_dir(instance).mkdir(parents=True, exist_ok=True)
            self._started_at[instance] = time.time()
        self.daemons.start_worker(instance, cores=self._cores, memory=self._memory)
        logger.info("started worker daemon %d", instance)
        return instance

    def _stop_daemon(self, executor_id: str, instance: int) -> None:
        """Stop a daemon once its executor's process has ended.

        Never the other way round: a daemon that is shutting down may start a replacement
        executor that outlives it.
        """
        pid = self.daemons.pid_of(WORKER_CLASS, instance)
        try:
            wait_until(
                lambda: pid is None or not descendants(pid), f"executor {executor_id} to end", 60
            )
        except TimeoutError:
            logger.warning("executor %s did not end in 60 s; stopping its daemon", executor_id)
        self.daemons.stop(WORKER_CLASS, instance)
        logger.info("stopped worker daemon %d (executor %s)", instance, executor_id)
