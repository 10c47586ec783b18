"""The ModelSpec seam: the user's model, optimizer, loss and metrics.

This is Cerebro §4.1's ``model_fn``/``train_fn``, as one class.

A spec is instantiated on workers from its import path with no arguments; everything
that varies between trials comes in ``params``. Rules:

* ``build_model`` must be deterministic given torch's RNG state (the unit seeds it from
  the trial seed before calling), so a trial's initial weights depend only on its seed.
* ``metrics`` returns per-batch **means**; the unit turns them into row-weighted sums.
  The loss is always reported as ``"loss"``; do not return a metric of that name.
* ``transform`` runs on every batch (train and validation) before the model.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from cerebro_spark.data import DatasetInfo


class ModelSpec(abc.ABC):
    """What the user implements to put a model family under model selection."""

    @abc.abstractmethod
    def build_model(self, params: Mapping[str, Any], info: DatasetInfo) -> nn.Module:
        """Return a fresh model for ``params`` and data described by ``info``."""

    def build_optimizer(self, model: nn.Module, params: Mapping[str, Any]) -> torch.optim.Optimizer:
        """Return the optimizer (default: Adam with ``lr`` and ``weight_decay`` params)."""
        return torch.optim.Adam(
            model.parameters(),
            lr=float(params.get("lr", 1e-3)),
            weight_decay=float(params.get("weight_decay", 0.0)),
        )

    def build_lr_scheduler(
        self, optimizer: torch.optim.Optimizer, params: Mapping[str, Any]
    ) -> torch.optim.lr_scheduler.LRScheduler | None:
        """Return an LR scheduler stepped once per epoch, or ``None`` (default)."""
        return None

    def batch_size(self, params: Mapping[str, Any]) -> int:
        """Return the mini-batch size (default: the ``batch_size`` param, else 64)."""
        return int(params.get("batch_size", 64))

    def loss(self, outputs: torch.Tensor, labels: torch.Tensor, info: DatasetInfo) -> torch.Tensor:
        """Return the mean loss of a batch (default: cross-entropy or MSE by task)."""
        if info.task == "classification":
            return nn.functional.cross_entropy(outputs, labels)
        return nn.functional.mse_loss(outputs.reshape(labels.shape), labels)

    def metrics(
        self, outputs: torch.Tensor, labels: torch.Tensor, info: DatasetInfo
    ) -> dict[str, torch.Tensor]:
        """Return per-batch mean metrics (default: accuracy, or mean absolute error)."""
        if info.task == "classification":
            return {"accuracy": (outputs.argmax(dim=1) == labels).float().mean()}
        return {"mae": (outputs.reshape(labels.shape) - labels).abs().mean()}

    def transform(
        self, features: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Transform a batch before the model sees it (default: identity)."""
        return features, labels
