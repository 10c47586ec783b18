"""Regression metrics: MAE, MSE, RMSE and R², exact over a split.

Outputs are reshaped to the labels' shape; errors are taken in float64. Definitions
follow scikit-learn (``mean_absolute_error``, ``mean_squared_error``, its square root,
``r2_score`` with ``force_finite=True``: 1.0 for a perfect fit of constant labels, 0.0
for an imperfect one).

R² needs the labels' variance over the whole split: its state is the row count, the
labels' mean and sum of squared deviations (merged with Chan et al.'s parallel formula,
stable where ``sum(y^2) - n * mean^2`` would cancel) and the sum of squared errors.
"""

from __future__ import annotations

import math

import torch

from cerebro_spark.metrics._base import Accumulator, Metric, Mode, State, count, ratio, scalar


def _errors(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return outputs.reshape(labels.shape).to(torch.float64) - labels.to(torch.float64)


class MeanAbsoluteError(Metric):
    """Mean of ``|prediction - label|``."""

    name = "mae"
    mode: Mode = "min"

    def init(self, device: torch.device) -> Accumulator:
        """Return a zero sum and count."""
        return {"sum": scalar(device), "count": count(device)}

    def update(self, acc: Accumulator, outputs: torch.Tensor, labels: torch.Tensor) -> None:
        """Add the batch's absolute errors."""
        acc["sum"] += _errors(outputs, labels).abs().sum()
        acc["count"] += labels.numel()

    def value(self, state: State) -> float:
        """Return the mean."""
        return ratio(state["sum"], state["count"])


class MeanSquaredError(Metric):
    """Mean of ``(prediction - label)^2``; its root with ``root=True`` (``rmse``)."""

    mode: Mode = "min"

    def __init__(self, root: bool = False) -> None:
        self.root = root
        self.name = "rmse" if root else "mse"

    def init(self, device: torch.device) -> Accumulator:
        """Return a zero sum and count."""
        return {"sum": scalar(device), "count": count(device)}

    def update(self, acc: Accumulator, outputs: torch.Tensor, labels: torch.Tensor) -> None:
        """Add the batch's squared errors."""
        acc["sum"] += _errors(outputs, labels).square().sum()
        acc["count"] += labels.numel()

    def value(self, state: State) -> float:
        """Return the mean (its square root for RMSE)."""
        mse = ratio(state["sum"], state["count"])
        return math.sqrt(mse) if self.root else mse


class R2(Metric):
    """Coefficient of determination ``1 - SSE / SST`` over the split."""

    name = "r2"
    mode: Mode = "max"

    def init(self, device: torch.device) -> Accumulator:
        """Return an empty state."""
        return {
            "count": count(device),
            "mean": scalar(device),
            "m2": scalar(device),
            "sse": scalar(device),
        }

    def update(self, acc: Accumulator, outputs: torch.Tensor, labels: torch.Tensor) -> None:
        """Merge the batch's label mean and squared deviations; add its squared errors."""
        y = labels.reshape(-1).to(torch.float64)
        n = y.numel()
        if n == 0:
            return
        mean = y.mean()
        m2 = (y - mean).square().sum()
        total = acc["count"] + n
        delta = mean - acc["mean"]
        acc["m2"] += m2 + delta.square() * acc["count"] * n / total
        acc["mean"] += delta * n / total
        acc["count"] += n
        acc["sse"] += _errors(outputs, labels).square().sum()

    def merge(self, a: State, b: State) -> State:
        """Chan's parallel merge of the label moments; squared errors add."""
        n_a, n_b = a["count"], b["count"]
        if n_a == 0 or n_b == 0:
            return dict(b if n_a == 0 else a)
        total = n_a + n_b
        delta = b["mean"] - a["mean"]
        return {
            "count": total,
            "mean": a["mean"] + delta * n_b / total,
            "m2": a["m2"] + b["m2"] + delta * delta * n_a * n_b / total,
            "sse": a["sse"] + b["sse"],
        }

    def value(self, state: State) -> float:
        """Return R² (``nan`` without rows; sklearn's finite values for constant labels)."""
        if not state["count"]:
            return math.nan
        if state["m2"] == 0:
            return 1.0 if state["sse"] == 0 else 0.0
        return 1.0 - float(state["sse"]) / float(state["m2"])
