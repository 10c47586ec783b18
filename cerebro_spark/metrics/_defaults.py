"""The built-in metric sets, the default metric of a task, and metric modes by name."""

from __future__ import annotations

from cerebro_spark.metrics._base import LOSS, Metric, Mode
from cerebro_spark.metrics._classification import (
    F1,
    Accuracy,
    LogLoss,
    Precision,
    Recall,
    RocAuc,
    TopKAccuracy,
)
from cerebro_spark.metrics._regression import R2, MeanAbsoluteError, MeanSquaredError

PER_CLASS_LIMIT = 10
"""Per-class precision, recall and F1 are in the default set up to this many classes."""
TOP_K = 5
"""The default set has ``top5_accuracy`` when there are more than this many classes."""
AUC_CLASS_LIMIT = 100
"""``roc_auc`` is in the default set up to this many classes: its state is ``2 x 1,024``
counts per class and its update touches every row's score of every class (with 1,000
classes, 0.4 MB of event log and 0.4 s of CPU per 10,000 validation rows). Add
``RocAuc(num_classes)`` to a spec's ``build_metrics`` to have it with more."""
DEFAULT_METRIC = {"classification": "accuracy", "regression": "rmse"}
"""The metric an experiment optimises when its config names none, by the dataset's task."""


def default_metrics(task: str, num_classes: int | None) -> list[Metric]:
    """Return the built-in metrics of a task (besides ``loss``, which is always reported).

    Classification: ``accuracy``, ``top5_accuracy`` (more than 5 classes),
    ``precision_macro``, ``recall_macro``, ``f1_macro``, per class
    ``precision_class_<i>``, ``recall_class_<i>``, ``f1_class_<i>`` (up to
    :data:`PER_CLASS_LIMIT` classes), ``roc_auc`` (up to :data:`AUC_CLASS_LIMIT` classes)
    and ``log_loss``. Regression: ``mae``,
    ``mse``, ``rmse`` and ``r2``.

    Raises:
        ValueError: The task is unknown, or classification has fewer than 2 classes.
    """
    if task == "regression":
        return [MeanAbsoluteError(), MeanSquaredError(), MeanSquaredError(root=True), R2()]
    if task != "classification":
        raise ValueError(f"task must be 'classification' or 'regression', got {task!r}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise ValueError(f"classification needs num_classes >= 2, got {num_classes!r}")
    metrics: list[Metric] = [Accuracy()]
    if num_classes > TOP_K:
        metrics.append(TopKAccuracy(TOP_K))
    metrics += [kind(num_classes) for kind in (Precision, Recall, F1)]
    if num_classes <= PER_CLASS_LIMIT:
        metrics += [
            kind(num_classes, c) for c in range(num_classes) for kind in (Precision, Recall, F1)
        ]
    if num_classes <= AUC_CLASS_LIMIT:
        metrics.append(RocAuc(num_classes))
    metrics.append(LogLoss())
    return metrics


def default_metric(task: str) -> str:
    """Return the metric optimised by default for a task (accuracy or rmse).

    Raises:
        ValueError: The task is unknown.
    """
    if task not in DEFAULT_METRIC:
        raise ValueError(f"task must be one of {sorted(DEFAULT_METRIC)}, got {task!r}")
    return DEFAULT_METRIC[task]


def metric_modes(metrics: list[Metric] | None = None) -> dict[str, Mode]:
    """Return ``{name: mode}`` of ``metrics`` and the loss."""
    return {LOSS: "min", **{m.name: m.mode for m in metrics or []}}
