"""SparkExecutors: resize the running application's executors through Spark itself.

On standalone, YARN and Kubernetes, with dynamic allocation **off**
(``shared/design.md``, "Elastic layer"): ``requestTotalExecutors(n)`` sets the
application's target (Spark never kills a running executor to reach a lower one) and
``killExecutors(ids)`` releases the named executors and lowers the target, so they are not
replaced. ``local[N]`` runs everything in the driver: a fixed cluster that says so. With
dynamic allocation on, Spark's allocation manager owns the target and refuses
``killExecutors``: the manager refuses to start and names the settings to change.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cerebro_spark.cluster._base import Capabilities, ClusterManager, Executor
from cerebro_spark.errors import ConfigError
from cerebro_spark.spark_session import is_connect_session

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)


def is_local_master(master: str) -> bool:
    """Whether ``master`` runs tasks in the driver's JVM (``local``, ``local[N]`` ...)."""
    return master.startswith("local") and not master.startswith("local-cluster")


def check_static_allocation(sc: SparkContext) -> None:
    """Refuse dynamic allocation: it owns the executor target and cannot release victims.

    Raises:
        ConfigError: ``spark.dynamicAllocation.enabled`` is true (the message says what to set).
    """
    enabled = (sc.getConf().get("spark.dynamicAllocation.enabled") or "false").strip().lower()
    if enabled == "true":
        raise ConfigError(
            "elastic execution resizes executors itself and needs "
            "spark.dynamicAllocation.enabled=false (Spark's allocation manager would override "
            "its requests and refuses killExecutors); set it to false, and set "
            "spark.executor.cores (and spark.task.cpus to the same value for one worker per "
            "executor)"
        )


class SparkExecutors(ClusterManager):
    """The executors of the running Spark application (see the module docstring).

    Args:
        spark: The application's session.
        min_executors: Fewest executors a resize may ask for.
        max_executors: Most executors a resize may ask for (``None``: no limit).
        instance_type: The instance type the executors run on (for billing), if known.

    Raises:
        ConfigError: Dynamic allocation is on.
    """

    def __init__(
        self,
        spark: SparkSession,
        *,
        min_executors: int = 1,
        max_executors: int | None = None,
        instance_type: str | None = None,
    ) -> None:
        if is_connect_session(spark):
            raise ConfigError(
                "elastic manager 'spark' resizes through the SparkContext "
                "(requestTotalExecutors, killExecutors), which a Spark Connect session "
                "(Databricks Standard access mode, serverless, Databricks Connect) does not "
                "have: use a fixed cluster (leave elastic out), or a classic session"
            )
        sc = spark.sparkContext
        check_static_allocation(sc)
        self._sc = sc
        self._fixed = is_local_master(sc.master or "")
        self.capabilities = Capabilities(
            resizable=not self._fixed,
            choose_victims=not self._fixed,
            min_executors=min_executors,
            max_executors=max_executors,
            instance_type=instance_type,
        )
        self._lock = threading.Lock()
        self._released: set[str] = set()
        self._first_seen: dict[str, float] = {}

    @property
    def context(self) -> SparkContext:
        """The application's Spark context."""
        return self._sc

    def executors(self) -> list[Executor]:
        """Executors the scheduler has, not released by this manager (``driver`` in local)."""
        jsc = self._sc._jsc.sc()
        known = {i for i in str(jsc.getExecutorIds().mkString("\n")).split("\n") if i}
        summaries = jsc.statusStore().executorList(True)
        found = []
        now = time.time()
        for i in range(summaries.size()):
            summary = summaries.apply(i)
            executor_id = str(summary.id())
            if not summary.isActive():
                continue
            if self._fixed:
                if executor_id != "driver":
                    continue
            elif executor_id not in known or executor_id in self._released:
                continue
            gpu = summary.resources().get("gpu")
            gpus = len(gpu.get().addresses()) if gpu.isDefined() else 0
            added = summary.addTime()
            with self._lock:
                since = self._first_seen.setdefault(
                    executor_id, added.getTime() / 1000.0 if added is not None else now
                )
            found.append(
                Executor(
                    executor_id=executor_id,
                    host=str(summary.hostPort()).rsplit(":", 1)[0],
                    cores=int(summary.totalCores()),
                    gpus=gpus,
                    since=since,
                )
            )
        return sorted(found, key=lambda e: (len(e.executor_id), e.executor_id))

    def ended(self, executor_id: str) -> bool:
        """Whether Spark no longer has executor ``executor_id`` (released or lost).

        Spark keeps listing a killed executor for seconds: this is true only once both
        the scheduler and the status store let it go.
        """
        jsc = self._sc._jsc.sc()
        if executor_id in str(jsc.getExecutorIds().mkString("\n")).split("\n"):
            return False
        summaries = jsc.statusStore().executorList(True)
        return not any(str(summaries.apply(i).id()) == executor_id for i in range(summaries.size()))

    def resize(self, target: int, victims: Sequence[str] = ()) -> None:
        """Release ``victims`` (``killExecutors``), then set the target.

        The target is set with ``requestTotalExecutors``. A shrink without victims releases
        the newest executors.
        """
        self.check_resize(target, victims)
        if self._fixed:
            return
        live = [e.executor_id for e in self.executors()]
        chosen = [v for v in victims if v in live]
        unknown = sorted(set(victims) - set(live))
        if unknown:
            logger.warning("victims %s are not live executors; ignored", unknown)
        excess = len(live) - target - len(chosen)
        if excess > 0:  # newest first: they hold the fewest sole copies
            rest = [e for e in reversed(live) if e not in chosen]
            chosen += rest[:excess]
        jvm = self._sc._jvm
        assert jvm is not None  # ok: a live SparkContext has its gateway
        jsc = self._sc._jsc.sc()
        if chosen:
            with self._lock:
                self._released.update(chosen)
            accepted = jsc.killExecutors(jvm.PythonUtils.toSeq(list(chosen)))
            logger.info("released executors %s (accepted: %s)", chosen, accepted)
        ok = jsc.requestTotalExecutors(int(target), 0, jvm.PythonUtils.toScalaMap({}))
        logger.info("asked Spark for %d executors (accepted: %s)", target, ok)
        if not ok:
            logger.warning(
                "Spark refused requestTotalExecutors(%d) on master %s", target, self._sc.master
            )

    def failed_tasks(self) -> int:
        """Failed tasks of the application so far, on live and dead executors."""
        summaries = self._sc._jsc.sc().statusStore().executorList(False)
        return sum(int(summaries.apply(i).failedTasks()) for i in range(summaries.size()))
