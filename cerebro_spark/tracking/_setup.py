"""Which trackers a config asks for, and following a run with them."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from cerebro_spark.driver import ExperimentConfig, read_events
from cerebro_spark.errors import ConfigError
from cerebro_spark.tracking._base import Tracker, TrackingContext, TrackingThread
from cerebro_spark.tracking._mlflow import MlflowTracker
from cerebro_spark.tracking._tensorboard import TensorBoardTracker

if TYPE_CHECKING:
    from cerebro_spark.driver import Experiment

logger = logging.getLogger(__name__)

URI_VARIABLE = "MLFLOW_TRACKING_URI"
EXPERIMENT_VARIABLE = "MLFLOW_EXPERIMENT_NAME"
INTERRUPT_FLUSH_SECONDS = 3.0
"""Seconds an interrupted run waits for tracking in flight (not the flush timeout)."""


def mlflow_settings(
    config: ExperimentConfig, environ: Mapping[str, str] | None = None
) -> tuple[str, str, str | None] | None:
    """``(uri, experiment name, registered model name)`` of MLflow tracking, or ``None``.

    ``tracking.mlflow`` given: its ``uri`` (else ``MLFLOW_TRACKING_URI``) and its
    ``experiment`` (else ``MLFLOW_EXPERIMENT_NAME``, else the config's name). Not given: on
    exactly when ``MLFLOW_TRACKING_URI`` is set. ``mlflow: false``: off. (On Databricks an
    experiment name is a workspace path such as ``/Users/me@example.com/digits``.)

    Raises:
        ConfigError: ``tracking.mlflow`` is given without a ``uri`` and
            ``MLFLOW_TRACKING_URI`` is not set.
    """
    environ = os.environ if environ is None else environ
    section = config.tracking.mlflow
    if section is not None and not section.enabled:
        return None
    uri = (section.uri if section is not None else None) or environ.get(URI_VARIABLE) or None
    if uri is None:
        if section is None:
            return None
        raise ConfigError(
            f"tracking.mlflow has no uri and {URI_VARIABLE} is not set: give "
            "tracking.mlflow.uri (e.g. http://127.0.0.1:5000) or set the variable"
        )
    experiment = (
        (section.experiment if section is not None else None)
        or environ.get(EXPERIMENT_VARIABLE)
        or config.name
    )
    return uri, experiment, section.register_model if section is not None else None


def make_trackers(context: TrackingContext) -> list[Tracker]:
    """The trackers ``context.config`` asks for (none when tracking is off).

    Raises:
        ConfigError: The config asks for a tracker whose package is not installed
            (``pip install 'cerebro-spark[tracking]'``; MLflow turned on by
            ``MLFLOW_TRACKING_URI`` alone is skipped with a warning instead), or for
            MLflow without a URI.
    """
    trackers: list[Tracker] = []
    config = context.config
    mlflow = mlflow_settings(config)
    if mlflow is not None:
        tracker = _mlflow_tracker(context, mlflow)
        if tracker is not None:
            trackers.append(tracker)
    if config.tracking.tensorboard is not None:
        try:
            trackers.append(TensorBoardTracker(context, config.tracking.tensorboard))
        except ImportError as error:
            raise ConfigError(
                f"tracking.tensorboard is set but tensorboard is not installed ({error}): "
                "pip install 'cerebro-spark[tracking]'"
            ) from None
    return trackers


def _mlflow_tracker(
    context: TrackingContext, settings: tuple[str, str, str | None]
) -> Tracker | None:
    """The MLflow tracker, or ``None`` (with a warning) where it cannot start.

    A tracking failure never ends a run: a client that cannot start (a store MLflow
    refuses, a URI it cannot parse) leaves the run untracked, said in one WARNING.

    Raises:
        ConfigError: ``tracking.mlflow`` is set but mlflow is not installed.
    """
    try:
        return MlflowTracker(context, *settings)  # imports mlflow
    except ImportError as error:
        if context.config.tracking.mlflow is not None:
            raise ConfigError(
                f"tracking.mlflow is set but mlflow is not installed ({error}): "
                "pip install 'cerebro-spark[tracking]'"
            ) from None
        logger.warning(  # only the environment asked: not an error
            "%s is set but mlflow is not installed (%s): the run is not tracked in MLflow "
            "(pip install 'cerebro-spark[tracking]')",
            URI_VARIABLE,
            error,
        )
    except Exception as error:
        first = str(error).splitlines()[0] if str(error) else ""
        logger.warning(
            "MLflow tracking at %s could not start (%s: %s): this run is not tracked in MLflow",
            settings[0],
            type(error).__name__,
            first,
        )
    return None


@contextlib.contextmanager
def track_experiment(experiment: Experiment) -> Iterator[TrackingThread | None]:
    """Follow ``experiment``'s event log with the trackers its config asks for.

    Trackers start with the events earlier sessions logged (a resumed run continues its
    MLflow runs), then see each new event on a background thread; leaving the block
    waits for them up to ``tracking.flush_timeout``. Tracking errors are warnings.

    Raises:
        ConfigError: As :func:`make_trackers` (before anything runs).
    """
    config = experiment.config
    holder: dict[str, TrackingThread] = {}

    def record(**fields: Any) -> None:
        holder["thread"].record(**fields)

    context = TrackingContext(
        experiment.experiment_id, config, experiment.root, experiment.prefix, record
    )
    trackers = make_trackers(context)
    if not trackers or experiment.state.finished:
        yield None
        return
    thread = holder["thread"] = TrackingThread(
        trackers,
        experiment.log,
        queue_size=config.tracking.queue_size,
        flush_timeout=config.tracking.flush_timeout,
    )
    thread.start(read_events(experiment.store))
    logger.info(
        "tracking experiment %s with %s",
        experiment.experiment_id,
        ", ".join(t.name for t in trackers),
    )
    try:
        yield thread
    except BaseException as error:
        # Interrupted (Ctrl-C): the user wants out, do not make them wait long.
        interrupted = isinstance(error, KeyboardInterrupt)
        thread.close(
            error,
            min(INTERRUPT_FLUSH_SECONDS, thread.flush_timeout) if interrupted else None,
        )
        raise
    thread.close()
