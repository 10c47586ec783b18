"""Tracking: follow a run in MLflow and TensorBoard (``tracking:`` in the config).

The event log is the source of truth; trackers follow it from a background thread
(:class:`TrackingThread`) so that tracking never fails or slows the search:

* :class:`MlflowTracker`: a parent run per experiment, a nested run per trial, the best
  trial's model logged as a pyfunc model (:class:`CheckpointModel`) ready to register;
* :class:`TensorBoardTracker`: an event-file directory per trial, scalars per epoch and
  HParams.

``run_experiment`` and ``resume_experiment`` use :func:`track_experiment`. MLflow and
TensorBoard come with ``pip install 'cerebro-spark[tracking]'``.
"""

from cerebro_spark.tracking._base import (
    Tracker,
    TrackerUnavailable,
    TrackingContext,
    TrackingThread,
)
from cerebro_spark.tracking._mlflow import MlflowTracker
from cerebro_spark.tracking._setup import make_trackers, mlflow_settings, track_experiment
from cerebro_spark.tracking._tensorboard import TensorBoardTracker

__all__ = [
    "CheckpointModel",
    "MlflowTracker",
    "TensorBoardTracker",
    "Tracker",
    "TrackerUnavailable",
    "TrackingContext",
    "TrackingThread",
    "make_trackers",
    "mlflow_settings",
    "save_pyfunc",
    "track_experiment",
]


def __getattr__(name: str) -> object:
    """The pyfunc names import MLflow (``_pyfunc`` subclasses its model): on first use."""
    if name in ("CheckpointModel", "save_pyfunc"):
        from cerebro_spark.tracking import _pyfunc

        return getattr(_pyfunc, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
