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
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from cerebro_spark.backends import Backend
from cerebro_spark.cluster import (
    ClusterManager,
    Ec2Cluster,
    LocalStandaloneCluster,
    SparkExecutors,
    StandaloneCluster,
)
from cerebro_spark.driver._config import ElasticConfig, ExperimentConfig
from cerebro_spark.engine._backend import spark_backend
from cerebro_spark.errors import ConfigError
from cerebro_spark.spark_session import spark_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

BackendFactory = Callable[[ExperimentConfig], Backend]
Opened = tuple[ClusterManager, BackendFactory]
Opener = Callable[[ExperimentConfig, ElasticConfig, int, str], AbstractContextManager[Opened]]
"""Opens a cluster: ``(config, elastic, workers, instance_type)`` -> ``(manager, factory)``."""


@dataclasses.dataclass(frozen=True)
class ManagerEntry:
    """One cluster manager an elastic config may name.

    Attributes:
        name: Its ``elastic.manager`` value, also the name of its options' section.
        open: Opens the cluster at ``workers`` executors of ``instance_type`` for a config
            and its ``elastic:`` section; a context that yields ``(manager, backend
            factory)`` and releases what it started when it exits.
        cap_option: The option of ``elastic.<name>`` that caps its executors.
    """

    name: str
    open: Opener
    cap_option: str


_REGISTRY: dict[str, ManagerEntry] = {}


def register(name: str, *, cap_option: str) -> Callable[[Opener], Opener]:
    """Register the decorated opener as the manager ``name``.

    Raises:
        ValueError: ``name`` is registered already.
    """

    def decorate(opener: Opener) -> Opener:
        if name in _REGISTRY:
            raise ValueError(f"cluster manager {name!r} is registered already")
        _REGISTRY[name] = ManagerEntry(name, opener, cap_option)
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
        conf = {**config.spark.conf, **cluster.spark_conf()}
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
        config.spark.master, _session_name(config), config.spark.conf, preload_torch=True
    )


@register("spark", cap_option="max_executors")
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


@register("databricks", cap_option="max_workers")
@contextlib.contextmanager
def open_databricks(
    config: ExperimentConfig, elastic: ElasticConfig, workers: int, instance_type: str
) -> Iterator[Opened]:
    """The Databricks cluster the run is on, resized (``DatabricksCluster``).

    Options (``elastic.databricks``): see ``DatabricksCluster.from_options``.
    """
    # here: the module imports databricks-sdk, an optional dependency
    from cerebro_spark.cluster import DatabricksCluster

    session = _application_session(config)
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
