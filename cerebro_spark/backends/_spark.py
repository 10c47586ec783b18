"""SparkBackend: every worker is a long-lived Spark task on an executor.

The transport beneath the :class:`~cerebro_spark.backends.WorkerPool` (``shared/design.md``,
"Runtime on Spark"):

* **One Spark job per worker**, its single task run from a driver thread under its own
  job group (``interruptOnCancel=True``), so it can be cancelled alone. Not a barrier
  stage: those refuse dynamic allocation and die whole when one executor dies. A worker
  told to stop ends its task normally and its job *succeeds*, so releasing its executor
  afterwards makes Spark re-run nothing.
* **Slots.** A worker holds one task slot (``spark.task.cpus`` cores) for its life; set
  ``spark.task.cpus`` to the executor's cores to give each worker a whole executor.
  Other Spark jobs of the application need free slots of their own.
* **Where.** Spark places the tasks (PySpark cannot set preferred locations); a worker's
  executor and host are read from Spark's status store (:meth:`SparkTransport.locate`).

A task attempt Spark retries after its executor died is refused when it registers. User
code (``ModelSpec`` modules) must be importable on the executors (installed,
``--py-files``, or ``spark.executorEnv.PYTHONPATH``).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Collection, Iterable, Iterator, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from cerebro_spark.backends._connect import ConnectTransport
from cerebro_spark.backends._pool import WorkerPool
from cerebro_spark.backends._serve import WorkerSpec, serve
from cerebro_spark.backends._spark_task import check_spark_conf, run_in_thread, spark_task_info
from cerebro_spark.backends._transport import Location, Transport
from cerebro_spark.errors import ConfigError
from cerebro_spark.spark_session import is_connect_session, spark_session

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)


def run_worker_task(spec: WorkerSpec, rows: Iterable[Any]) -> Iterator[str]:
    """The ``mapPartitions`` body of a worker's Spark job: serve, then yield the outcome."""
    for _ in rows:  # the job's single row carries nothing; the spec is in the closure
        pass
    yield serve(spec, spark_task_info())


class SparkTransport(Transport):
    """Workers as long-lived tasks in their own Spark jobs (see the module docstring).

    Args:
        spark: The Spark session; ``None`` uses the active one or creates one with
            :func:`cerebro_spark.spark_session.spark_session` when the pool starts.
        join_new_executors: Start workers on executors that appear after the start.
    """

    noun = "Spark task"

    def __init__(self, spark: SparkSession | None = None, join_new_executors: bool = True) -> None:
        self._spark = spark
        self._join_new_executors = join_new_executors
        self._sc: SparkContext | None = None
        self._tag = f"cerebro-{id(self):x}"
        self._groups: dict[str, str] = {}
        self._done: dict[str, Future[str]] = {}
        self._seen: set[str] = set()
        self._killed: set[str] = set()
        self._lock = threading.Lock()

    @property
    def context(self) -> SparkContext:
        """The Spark context (after :meth:`open`)."""
        if self._sc is None:
            raise RuntimeError("the Spark transport is not open")
        return self._sc

    def open(self, requested: int | None, timeout_s: float) -> int:
        """Check the Spark settings and count slots (waiting for executors if none requested).

        Raises:
            ConfigError: A refused setting, or (in ``local[N]``) more workers than slots.
            TimeoutError: ``requested`` is ``None`` and no executor came in ``timeout_s``.
        """
        if self._spark is None:
            self._spark = spark_session()
        sc = self._spark.sparkContext
        check_spark_conf(sc.getConf().get)
        slots = self._executor_slots(sc)
        if requested is None:
            slots = self._wait_for_executors(sc, slots, timeout_s)
        count = requested or sum(slots.values())
        if _is_local(sc.master or "") and count > sum(slots.values()):
            raise ConfigError(
                f"num_workers={count} exceeds the {sum(slots.values())} task slots of master "
                f"{sc.master} (spark.task.cpus={_task_cpus(sc)}): each worker holds a slot "
                "for its whole life"
            )
        self._sc = sc
        self._seen = set(slots)
        return count

    def control_address(self) -> tuple[str, str]:
        """Bind to ``spark.driver.bindAddress``; workers reach ``spark.driver.host``."""
        conf = self.context.getConf()
        advertised = conf.get("spark.driver.host") or "127.0.0.1"
        return (conf.get("spark.driver.bindAddress") or advertised, advertised)

    def launch(self, spec: WorkerSpec) -> Future[str]:
        """Run the worker's Spark job from a driver thread of its own."""
        sc = self.context
        group = f"{self._tag}-{spec.worker_id}"
        ended: Future[str] = Future()
        with self._lock:
            self._groups[spec.worker_id] = group
            self._done[spec.worker_id] = ended

        def run_job() -> str:
            sc.setJobGroup(group, f"cerebro-spark worker {spec.worker_id}", interruptOnCancel=True)
            body = functools.partial(run_worker_task, spec)
            return ", ".join(sc.parallelize([spec.worker_id], 1).mapPartitions(body).collect())

        run_in_thread(f"cerebro-spark-job-{spec.worker_id}", ended, run_job)
        return ended

    def kill(self, worker_id: str) -> None:
        """Cancel the worker's job group (Spark kills its task's Python process)."""
        with self._lock:
            group = self._groups.get(worker_id)
            done = self._done.get(worker_id)
        if group is None or self._sc is None or (done is not None and done.done()):
            return
        try:
            self._sc.cancelJobGroup(group)
        except Exception:
            logger.warning("could not cancel the Spark job of worker %s", worker_id, exc_info=True)

    def kill_executor(self, executor_id: str) -> bool:
        """Kill an executor as if it crashed; return whether the cluster manager agreed."""
        # killAndReplaceExecutor: killExecutor would lower the application's executor
        # target for good in standalone mode.
        self._killed.add(executor_id)  # its slots are no capacity while Spark removes it
        return bool(self.context._jsc.sc().killAndReplaceExecutor(executor_id))

    def locate(self, worker_id: str, registration: Mapping[str, Any], peer: str) -> Location | None:
        """The executor and host of the task attempt the worker registered from.

        ``None`` while Spark's listener does not list the task yet; in local mode the
        executor is the driver (``localhost``).
        """
        del peer
        sc = self._sc
        if sc is None:
            return None
        if _is_local(sc.master or ""):
            return Location("localhost", "driver")
        attempt = registration.get("task_attempt_id")
        group = self._groups.get(worker_id)
        if not isinstance(attempt, int) or group is None:
            return None
        for task in tasks_of_group(sc, group):
            if int(task.taskId()) == attempt:
                return Location(str(task.host()), str(task.executorId()))
        return None

    def arrivals(self, workers: int, draining: Collection[str]) -> int:
        """Task slots of executors that appeared since the last call, up to the free ones.

        Slots of ``draining`` executors are no capacity: they are about to be released.
        """
        sc = self._sc
        if sc is None or sc._jsc is None:  # not open, or the SparkContext was stopped
            return 0
        slots = self._executor_slots(sc)
        new = {e: n for e, n in slots.items() if e not in self._seen}
        self._seen.update(new)
        if not new or not self._join_new_executors:
            return 0
        # An executor that registered while the start filled its slots brings no spare ones.
        spare = sum(n for e, n in slots.items() if e not in draining) - workers
        count = max(0, min(spare, sum(new.values())))
        logger.info(
            "executors %s appeared (%d task slots, %d free): %d new workers",
            sorted(new),
            sum(new.values()),
            max(0, spare),
            count,
        )
        return count

    def _executor_slots(self, sc: SparkContext) -> dict[str, int]:
        """Return the live executors and their task slots (``{"driver": N}`` locally).

        The status store's listener lags (a killed executor may still be listed active),
        so only executors the scheduler still has (``getExecutorIds``) count.
        """
        cpus = _task_cpus(sc)
        jsc = sc._jsc.sc()
        summaries = jsc.statusStore().executorList(True)
        slots: dict[str, int] = {}
        for i in range(summaries.size()):
            summary = summaries.apply(i)
            if summary.isActive() and summary.totalCores() > 0:
                slots[str(summary.id())] = int(summary.totalCores()) // cpus
        if len(slots) > 1:
            slots.pop("driver", None)
            known = {i for i in str(jsc.getExecutorIds().mkString("\n")).split("\n") if i}
            slots = {e: n for e, n in slots.items() if e in known and e not in self._killed}
        return slots

    def _wait_for_executors(
        self, sc: SparkContext, slots: dict[str, int], timeout_s: float
    ) -> dict[str, int]:
        """Wait (up to ``timeout_s``) until some executor offers a slot."""
        deadline = time.monotonic() + timeout_s
        while sum(slots.values()) == 0:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no executor with a free task slot registered within start_timeout_s="
                    f"{timeout_s} (master {sc.master}); pass num_workers to start workers as "
                    "executors come"
                )
            time.sleep(0.5)
            slots = self._executor_slots(sc)
        return slots


class SparkBackend(WorkerPool):
    """Runs each worker as a long-lived task in its own Spark job (see the module docs).

    On a Spark Connect session the workers are started by a
    :class:`~cerebro_spark.backends._connect.ConnectTransport` instead (no SparkContext
    there): the same workers, wire format and pool.

    Args:
        num_workers: Workers :meth:`start` starts; ``None``: one per executor task slot
            (required on Spark Connect, which does not count slots). At most the number
            of partitions; in ``local[N]`` at most ``N``.
        spark: The Spark session, classic or Connect; ``None`` uses the active classic one
            or creates one.
        join_new_executors: Start workers on executors that appear after :meth:`start`
            (classic Spark only).
        **options: :class:`WorkerPool`'s other arguments.

    Raises:
        ConfigError: An argument breaks the rules above.
    """

    def __init__(
        self,
        num_workers: int | None = None,
        *,
        spark: SparkSession | None = None,
        join_new_executors: bool = True,
        **options: Any,
    ) -> None:
        transport: Transport
        if spark is not None and is_connect_session(spark):  # no SparkContext (issue 28)
            transport = ConnectTransport(spark)
        else:
            transport = self._spark_transport = SparkTransport(spark, join_new_executors)
        super().__init__(transport, num_workers, **options)


def _is_local(master: str) -> bool:
    """Whether ``master`` runs tasks in the driver's JVM (``local``, ``local[N]`` ...)."""
    return master.startswith("local") and not master.startswith("local-cluster")


def _task_cpus(sc: SparkContext) -> int:
    """``spark.task.cpus`` (1 when unset).

    Read from the running context's conf in one call: ``getConf()`` copies every entry
    over Py4J (20 ms), and the pool's monitor asks at every look for new executors.
    """
    return max(1, int(sc._jsc.sc().conf().get("spark.task.cpus", "1") or "1"))


def tasks_of_group(sc: Any, group: str) -> Iterator[Any]:
    """Spark's records (``TaskData``, from its status store) of the tasks of job group ``group``."""
    tracker = sc.statusTracker()
    store = sc._jsc.sc().statusStore()
    for job_id in tracker.getJobIdsForGroup(group):
        job = tracker.getJobInfo(job_id)
        for stage_id in job.stageIds if job is not None else ():
            stage = tracker.getStageInfo(stage_id)
            attempt = stage.currentAttemptId if stage is not None else 0
            tasks = store.taskList(stage_id, attempt, 1000)
            for i in range(tasks.size()):
                yield tasks.apply(i)
