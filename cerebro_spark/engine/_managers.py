"""The cluster managers an elastic run may name (``elastic.manager``): a registry.

Each entry opens its cluster for an experiment at a number of executors: it starts (or
attaches to) them, yields the :class:`~cerebro_spark.cluster.ClusterManager` that resizes
them and a backend factory whose workers run there, and releases what it started at the
end. An entry is registered with :func:`register` beside the function that opens it; the
names an elastic run accepts, :data:`MANAGERS`, are the registry's.

The registry lives on the engine's floor: an entry composes a cluster manager
(:mod:`cerebro_spark.cluster`) with a Spark session and the run's backend, which the
cluster room does not know. The config parser (``driver/_config.py``, a floor below)
keeps its own tuple of the names to read ``elastic:`` sections;
``tests/engine/test_elastic_managers.py`` holds the two equal.

Before anything is planned, an entry says whether its run will have anything to resize
(:attr:`ManagerEntry.given_capacity`): where it will not, the run is planned and followed
at the capacity the session gives (:class:`GivenCapacity`, :class:`FixedWorkers`), and
where the manager cannot run at all it refuses, naming what to use instead. Under Spark
Connect (Databricks Standard access mode, serverless, Databricks Connect; no
``SparkContext``):

* ``spark`` is refused (it resizes through the JVM);
* ``databricks`` resizes the cluster through the REST API only when the session (or
  ``elastic.databricks.cluster_id``) names a cluster, and the controller starts the
  workers of a grow (the pool does not see executors arrive);
* ``databricks`` with no cluster id (serverless: no cluster to resize) runs at the
  capacity the session gives: the config's ``workers``, billed as ``instance_type`` at
  the catalog's price.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from cerebro_spark.backends import Backend
from cerebro_spark.cluster import (
    Capabilities,
    ClusterManager,
    Ec2Cluster,
    Executor,
    LocalStandaloneCluster,
    SparkExecutors,
    StandaloneCluster,
)
from cerebro_spark.driver._config import ElasticConfig, ExperimentConfig
from cerebro_spark.driver._device import spark_gpu_settings
from cerebro_spark.engine._backend import spark_backend
from cerebro_spark.errors import ConfigError
from cerebro_spark.spark_session import active_connect_session, is_connect_session, spark_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

BackendFactory = Callable[[ExperimentConfig], Backend]
Opened = tuple[ClusterManager, BackendFactory]
Opener = Callable[[ExperimentConfig, ElasticConfig, int, str], AbstractContextManager[Opened]]
"""Opens a cluster: ``(config, elastic, workers, instance_type)`` -> ``(manager, factory)``."""

#: The Spark setting that holds a Databricks notebook's cluster id (the same as
#: ``cluster._databricks.CLUSTER_ID_CONF``, whose module imports databricks-sdk, which
#: serverless compute at the given capacity does not need).
CLUSTER_ID_CONF = "spark.databricks.clusterUsageTags.clusterId"

#: The options of ``elastic.databricks`` (``cluster._databricks._OPTIONS``, likewise).
DATABRICKS_OPTIONS = (
    "cluster_id",
    "host",
    "token_env",
    "resize_retry_s",
    "min_workers",
    "max_workers",
)


@dataclasses.dataclass(frozen=True)
class GivenCapacity:
    """The capacity a run takes as given: there is nothing to resize.

    Attributes:
        workers: The workers (one executor's worth each) every stage runs on.
        reason: Why nothing is resized (for the log line and the ``elastic_plan`` event).
    """

    workers: int
    reason: str


CapacityCheck = Callable[[ExperimentConfig, ElasticConfig], GivenCapacity | None]
"""Before planning: the capacity as given (``None``: the manager resizes); may refuse."""


def _resizes(config: ExperimentConfig, elastic: ElasticConfig) -> GivenCapacity | None:
    """The default capacity check: the manager resizes whatever the session."""
    del config, elastic
    return None


@dataclasses.dataclass(frozen=True)
class ManagerEntry:
    """One cluster manager an elastic config may name.

    Attributes:
        name: Its ``elastic.manager`` value, also the name of its options' section.
        open: Opens the cluster at ``workers`` executors of ``instance_type`` for a config
            and its ``elastic:`` section; a context that yields ``(manager, backend
            factory)`` and releases what it started when it exits.
        cap_option: The option of ``elastic.<name>`` that caps its executors.
        given_capacity: Called before anything is planned: the capacity the run takes as
            given where the manager will have nothing to resize (the plan keeps it for
            every stage; ``open`` is then called with it), ``None`` where it resizes.
            Raises :class:`ConfigError` where the manager cannot run on the config's
            session at all, naming what to use instead.
    """

    name: str
    open: Opener
    cap_option: str
    given_capacity: CapacityCheck = _resizes


_REGISTRY: dict[str, ManagerEntry] = {}


def register(
    name: str, *, cap_option: str, given_capacity: CapacityCheck = _resizes
) -> Callable[[Opener], Opener]:
    """Register the decorated opener as the manager ``name``.

    Raises:
        ValueError: ``name`` is registered already.
    """

    def decorate(opener: Opener) -> Opener:
        if name in _REGISTRY:
            raise ValueError(f"cluster manager {name!r} is registered already")
        _REGISTRY[name] = ManagerEntry(name, opener, cap_option, given_capacity)
        return opener

    return decorate


def manager_entry(name: str) -> ManagerEntry:
    """The registered manager ``name``.

    Raises:
        ConfigError: No manager of that name is registered (the registered ones are named).
    """
    entry = _REGISTRY.get(name)
    if entry is None:
        raise ConfigError(f"elastic.manager must be one of {list(_REGISTRY)}, got {name!r}")
    return entry


def check_options(options: Mapping[str, Any], manager: str, known: set[str]) -> None:
    """Refuse keys of ``elastic.<manager>`` that the manager does not read.

    Raises:
        ConfigError: An unknown key (the unknown and the known ones are named).
    """
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(
            f"unknown field(s) {unknown} in elastic.{manager}; known: {sorted(known)}"
        )


def _session_name(config: ExperimentConfig) -> str:
    return f"cerebro-spark {config.name}"


def runs_on_connect(config: ExperimentConfig) -> bool:
    """Whether the config's application session will be Spark Connect (nothing started).

    As :func:`~cerebro_spark.spark_session.spark_session` decides: an ``sc://`` master, or
    no master and a Connect session active (or ``SPARK_REMOTE`` set) with no classic one.
    """
    master = config.spark.master
    if master is not None:
        return master.startswith("sc://")
    if active_connect_session() is None and not os.environ.get("SPARK_REMOTE"):
        return False
    context = sys.modules.get("pyspark.context")  # else no classic session can run
    return context is None or context.SparkContext._active_spark_context is None


class FixedWorkers(ClusterManager):
    """The capacity a session gives, taken as given: nothing to resize (serverless).

    Its executors are ``workers`` slots of ``instance_type``, each billed as itself from
    when the manager was made, as the plan priced them.

    Args:
        workers: The workers the session gives.
        instance_type: What each is billed as (a type of the price catalog).
        reason: Why nothing is resized (for messages).
    """

    def __init__(self, workers: int, instance_type: str, reason: str) -> None:
        self.workers = workers
        self.reason = reason
        self.capabilities = Capabilities(
            resizable=False,
            choose_victims=False,
            min_executors=workers,
            max_executors=workers,
            instance_type=instance_type,
        )
        self._since = time.time()

    def executors(self) -> list[Executor]:
        """The ``workers`` slots, each billed as itself."""
        return [
            Executor(f"given-{i}", "given", 1, since=self._since, instance=f"given-{i}")
            for i in range(self.workers)
        ]

    def resize(self, target: int, victims: Sequence[str] = ()) -> None:
        """Accept only the capacity as given.

        Raises:
            ConfigError: Any other ``target`` (the reason nothing is resized is named).
        """
        if target != self.workers or victims:
            raise ConfigError(
                f"cannot resize to {target} workers: the run takes its {self.workers} "
                f"workers as given ({self.reason})"
            )


def _factory(session: SparkSession, workers: int) -> BackendFactory:
    """Builds the run's SparkBackend: ``workers`` workers on ``session``'s executors."""

    def factory(config: ExperimentConfig) -> Backend:
        return spark_backend(config, session, workers)

    return factory


# -- a standalone master cerebro-spark starts, one worker per instance -----------------------


@contextlib.contextmanager
def _on_standalone(
    config: ExperimentConfig, elastic: ElasticConfig, cluster: StandaloneCluster, workers: int
) -> Iterator[Opened]:
    """Run the application on a started standalone cluster; close both at the end."""
    try:
        conf = {**spark_gpu_settings(config), **cluster.spark_conf()}
        session = spark_session(cluster.master_url, _session_name(config), conf)
        try:
            cluster.attach(session)
            cluster.wait(workers, elastic.resize_timeout)
            yield cluster, _factory(session, workers)
        finally:
            session.stop()
    finally:
        cluster.close()


@register("standalone", cap_option="max_executors")
@contextlib.contextmanager
def open_local_standalone(
    config: ExperimentConfig, elastic: ElasticConfig, workers: int, instance_type: str
) -> Iterator[Opened]:
    """Worker daemons on this machine (:class:`~cerebro_spark.cluster.LocalStandaloneCluster`).

    Options (``elastic.standalone``): ``root``, ``cores``, ``memory``, ``max_executors``.
    """
    options = dict(elastic.options)
    check_options(options, "standalone", {"root", "cores", "memory", "max_executors"})
    cluster = LocalStandaloneCluster(
        workers,
        root=options.get("root"),
        cores=int(options.get("cores", 1)),
        memory=str(options.get("memory", "1g")),
        max_executors=options.get("max_executors"),
        instance_type=instance_type,
    )
    with _on_standalone(config, elastic, cluster, workers) as opened:
        yield opened


# -- the executors of the running Spark application ----------------------------------------


@contextlib.contextmanager
def _on_application(
    manager: ClusterManager, session: SparkSession, elastic: ElasticConfig, workers: int
) -> Iterator[Opened]:
    """Bring the application to ``workers`` executors; give the manager back at the end."""
    try:
        manager.resize(workers)
        manager.wait(workers, elastic.resize_timeout)
        yield manager, _factory(session, workers)
    finally:
        manager.close()  # Databricks: back to the size it found; the session stays


def _application_session(config: ExperimentConfig) -> SparkSession:
    """The session of the config's own master (``spark.master``)."""
    return spark_session(
        config.spark.master, _session_name(config), spark_gpu_settings(config), preload_torch=True
    )


def _spark_capacity(config: ExperimentConfig, elastic: ElasticConfig) -> GivenCapacity | None:
    """``spark`` resizes (or is a fixed ``local[N]``); it cannot run under Spark Connect.

    Raises:
        ConfigError: The run's session will be Spark Connect (the alternatives are named).
    """
    del elastic
    if runs_on_connect(config):
        raise ConfigError(
            "elastic manager 'spark' resizes executors through the SparkContext "
            "(requestTotalExecutors, killExecutors), which a Spark Connect session "
            "(Databricks Standard access mode, serverless, Databricks Connect) does not "
            "have: set elastic.manager to databricks (on a Databricks cluster it resizes the "
            "cluster through the REST API; on serverless, or with no cluster id, the run is "
            "planned at the capacity the session gives, its workers), leave elastic out, or "
            "run on a classic session"
        )
    return None


@register("spark", cap_option="max_executors", given_capacity=_spark_capacity)
@contextlib.contextmanager
def open_spark_executors(
    config: ExperimentConfig, elastic: ElasticConfig, workers: int, instance_type: str
) -> Iterator[Opened]:
    """The application's executors, resized through Spark (:class:`SparkExecutors`).

    Options (``elastic.spark``): ``min_executors``, ``max_executors``.
    """
    options = dict(elastic.options)
    session = _application_session(config)
    check_options(options, "spark", {"min_executors", "max_executors"})
    manager = SparkExecutors(
        session,
        min_executors=int(options.get("min_executors", 1)),
        max_executors=options.get("max_executors"),
        instance_type=instance_type,
    )
    with _on_application(manager, session, elastic, workers) as opened:
        yield opened


def connect_cluster_id(session: Any) -> str | None:
    """The Databricks cluster id a Connect session's ``spark.conf`` names, if readable."""
    try:
        value = session.conf.get(CLUSTER_ID_CONF, None)
    except Exception as error:  # serverless may answer CONFIG_NOT_AVAILABLE
        logger.warning(
            "cannot read %s from the Spark Connect session (%s): taken as no cluster "
            "(serverless); on a cluster, set elastic.databricks.cluster_id",
            CLUSTER_ID_CONF,
            error,
        )
        return None
    return str(value) if value else None


def _serverless(
    config: ExperimentConfig, elastic: ElasticConfig, session: Any | None = None
) -> GivenCapacity | None:
    """The capacity as given where a Connect session has no cluster to resize.

    Raises:
        ConfigError: An option ``elastic.databricks`` does not have (checked here too: the
            manager that checks them is not made there).
    """
    if elastic.options.get("cluster_id") or not runs_on_connect(config):
        return None
    session = session if session is not None else _application_session(config)
    if not is_connect_session(session) or connect_cluster_id(session) is not None:
        return None
    check_options(elastic.options, "databricks", set(DATABRICKS_OPTIONS))
    return GivenCapacity(
        config.workers,
        f"the Spark Connect session names no Databricks cluster ({CLUSTER_ID_CONF} is "
        "unset: serverless compute) and elastic.databricks.cluster_id is not set: nothing "
        "to resize",
    )


@register("databricks", cap_option="max_workers", given_capacity=_serverless)
@contextlib.contextmanager
def open_databricks(
    config: ExperimentConfig, elastic: ElasticConfig, workers: int, instance_type: str
) -> Iterator[Opened]:
    """The Databricks cluster the run is on, resized (``DatabricksCluster``).

    Under Spark Connect through the REST API only; with no cluster to resize
    (serverless) at the capacity the session gives (:class:`FixedWorkers`).

    Options (``elastic.databricks``): see ``DatabricksCluster.from_options``.
    """
    session = _application_session(config)
    given = _serverless(config, elastic, session)
    if given is not None:  # the plan was made at it (elastic_run)
        logger.info(
            "no cluster to resize: running at the capacity the session gives, %d workers "
            "of %s (%s)",
            workers,
            instance_type,
            given.reason,
        )
        yield FixedWorkers(workers, instance_type, given.reason), _factory(session, workers)
        return
    # here: the module imports databricks-sdk, an optional dependency
    from cerebro_spark.cluster import DatabricksCluster

    manager = DatabricksCluster.from_options(
        session, dict(elastic.options), instance_type=instance_type
    )
    with _on_application(manager, session, elastic, workers) as opened:
        yield opened


@register("ec2", cap_option="max_instances")
@contextlib.contextmanager
def open_ec2(
    config: ExperimentConfig, elastic: ElasticConfig, workers: int, instance_type: str
) -> Iterator[Opened]:
    """EC2 instances, each a standalone worker (:class:`Ec2Cluster`).

    Options (``elastic.ec2``): see :meth:`Ec2Cluster.from_options`.
    """
    cluster = Ec2Cluster.from_options(
        dict(elastic.options),
        workers=workers,
        instance_type=instance_type,
        experiment=config.name,
    )
    with _on_standalone(config, elastic, cluster, workers) as opened:
        yield opened


MANAGERS: tuple[str, ...] = tuple(_REGISTRY)
"""The names ``elastic.manager`` accepts: the registry's, in registration order."""
