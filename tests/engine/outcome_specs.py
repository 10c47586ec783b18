"""Model specs whose runs end in a known way, loaded by workers from their import path.

``tests.engine.outcome_specs:DivergingSpec`` learns for one epoch, then its learning rate
jumps (``lr_jump``, default x1000) and it diverges: its best epoch is its first.
``...:FailsInTrainingSpec`` builds its model fine (on the driver too) but raises at its
first optimizer step, inside the workers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from cerebro_spark.training import MLPSpec

TRAINING_FAILURE = "FailsInTrainingSpec refuses to take an optimizer step"


class DivergingSpec(MLPSpec):
    """An MLP whose learning rate is multiplied by ``lr_jump`` after its first epoch."""

    def build_lr_scheduler(
        self, optimizer: torch.optim.Optimizer, params: Mapping[str, Any]
    ) -> torch.optim.lr_scheduler.LRScheduler | None:
        jump = float(params.get("lr_jump", 1000.0))
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda epoch: 1.0 if epoch < 1 else jump
        )


class _RefusingSGD(torch.optim.SGD):
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        raise RuntimeError(TRAINING_FAILURE)


class FailsInTrainingSpec(MLPSpec):
    """An MLP whose optimizer raises when training takes its first step."""

    def build_optimizer(self, model: nn.Module, params: Mapping[str, Any]) -> torch.optim.Optimizer:
        return _RefusingSGD(model.parameters(), lr=0.01)
