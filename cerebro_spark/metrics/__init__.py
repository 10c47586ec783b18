"""Exact, mergeable metrics: every reported value equals the metric over the whole split.

A :class:`Metric` accumulates batches on the device, turns its accumulator into a JSON
*state* at the end of a unit, and the driver merges the states of all validation units
before it computes the value (see :mod:`cerebro_spark.metrics._base` for the rules a
metric follows). ``ModelSpec.build_metrics`` returns the metrics of a model family; the
default is :func:`default_metrics` of the dataset's task.
"""

from cerebro_spark.metrics._base import (
    LOSS,
    Accumulator,
    Batch,
    BatchMean,
    Loss,
    Metric,
    Mode,
    State,
    check_metrics,
    merge_states,
)
from cerebro_spark.metrics._classification import (
    F1,
    Accuracy,
    LogLoss,
    Precision,
    Recall,
    RocAuc,
    TopKAccuracy,
    binary_auc,
)
from cerebro_spark.metrics._defaults import (
    AUC_CLASS_LIMIT,
    DEFAULT_METRIC,
    PER_CLASS_LIMIT,
    TOP_K,
    default_metric,
    default_metrics,
    metric_modes,
)
from cerebro_spark.metrics._names import did_you_mean
from cerebro_spark.metrics._regression import R2, MeanAbsoluteError, MeanSquaredError

__all__ = [
    "AUC_CLASS_LIMIT",
    "DEFAULT_METRIC",
    "F1",
    "LOSS",
    "PER_CLASS_LIMIT",
    "R2",
    "TOP_K",
    "Accumulator",
    "Accuracy",
    "Batch",
    "BatchMean",
    "LogLoss",
    "Loss",
    "MeanAbsoluteError",
    "MeanSquaredError",
    "Metric",
    "Mode",
    "Precision",
    "Recall",
    "RocAuc",
    "State",
    "TopKAccuracy",
    "binary_auc",
    "check_metrics",
    "default_metric",
    "default_metrics",
    "did_you_mean",
    "merge_states",
    "metric_modes",
]
