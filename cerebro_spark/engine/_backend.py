"""The backend a config names, with the user's spec modules shipped to it."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

from cerebro_spark.backends import Backend, LocalBackend, SparkBackend
from cerebro_spark.backends._spark_task import check_spark_conf
from cerebro_spark.driver._config import ExperimentConfig
from cerebro_spark.driver._device import (
    check_spark_gpus,
    local_gpus,
    pool_device,
    spark_gpu_settings,
)
from cerebro_spark.driver._preflight import models_in
from cerebro_spark.errors import ConfigError
from cerebro_spark.spark_session import (
    active_connect_session,
    is_connect_session,
    spark_session,
    spark_setting,
)
from cerebro_spark.training import user_code_files

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)


def default_backend(config: ExperimentConfig) -> Backend:
    """Build the backend a config names."""
    if config.backend == "local":
        return LocalBackend(
            config.workers,
            gpus=local_gpus(config),
            workers_per_gpu=config.workers_per_device,
            device=pool_device(config),
        )
    if config.backend == "spark":
        session = spark_session(
            config.spark.master,
            f"cerebro-spark {config.name}",
            spark_gpu_settings(config),
            preload_torch=True,
        )
        return spark_backend(config, session, config.workers)
    raise ConfigError(f"backend must be 'local' or 'spark', got {config.backend!r}")


def check_backend_settings(config: ExperimentConfig) -> None:
    """Refuse, before anything is written, Spark settings the Spark backend would refuse.

    The settings are the config's ``spark.conf`` over those of a session that already runs
    in this process (``spark-submit --conf``, a notebook's); nothing is started.

    Raises:
        ConfigError: As :func:`~cerebro_spark.backends._spark.check_spark_conf`.
    """
    if config.backend != "spark":
        return
    active = active_connect_session()
    if active is None and "pyspark" in sys.modules:  # else no session can be running
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()

    def get(key: str) -> str | None:
        if key in config.spark.conf:
            return str(config.spark.conf[key])
        return None if active is None else spark_setting(active, key)

    check_spark_conf(get)


class SessionBackend:
    """A backend factory: the config's Spark backend on a given session.

    Classic or Connect: ``Tuner.fit`` runs on the session its data lives in. Equal for
    one session, so that warm workers (:mod:`~cerebro_spark.driver._warm`) serve the
    next search.
    """

    def __init__(self, session: Any) -> None:
        self.session = session

    def __call__(self, config: ExperimentConfig) -> Backend:
        return spark_backend(config, self.session, config.workers)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SessionBackend) and other.session is self.session

    def __hash__(self) -> int:
        return id(self.session)


def spark_backend(config: ExperimentConfig, session: SparkSession, workers: int) -> Backend:
    """A :class:`SparkBackend` of ``workers`` workers on ``session``'s executors.

    The config's GPUs are checked against the executors' and its spec modules are shipped
    to them (:func:`ship_user_code`) first.

    Args:
        config: The experiment.
        session: The Spark session whose executors the workers run on.
        workers: Workers to start.
    """
    check_spark_gpus(config, session)
    ship_user_code(session, config)
    return SparkBackend(workers, spark=session, device=pool_device(config))


def ship_user_code(session: Any, config: ExperimentConfig) -> None:
    """Ship the config's spec modules found beside it or in the working directory.

    Spark executors may run on other machines: ``SparkContext.addPyFile`` (on Spark
    Connect, ``addArtifacts(pyfile=True)``) puts each module (a package as a zip) on
    their Python path (:func:`~cerebro_spark.training.user_code_files`). Installed specs
    are not shipped.

    Args:
        session: The application's Spark session (classic or Connect).
        config: The experiment (its ``model`` and the space's ``model`` values).
    """
    specs = [*models_in(config.space), *([config.model] if config.model else [])]
    connect = is_connect_session(session)
    for file in user_code_files(specs):
        try:
            if connect:
                session.addArtifacts(str(file), pyfile=True)
            else:
                session.sparkContext.addPyFile(str(file))
            logger.info("shipped spec module %s to the Spark executors", file)
        except Exception as error:  # already added (a notebook re-run): keep the first
            logger.warning("could not ship %s to the executors: %s", file, error)
