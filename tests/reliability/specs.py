"""Model specs that misbehave in a known way, loaded by workers from their import path.

``tests.reliability.specs:NanAfterFirstEpochSpec`` trains one sane epoch, then its
learning rate becomes NaN: its weights, outputs and loss are NaN from the second epoch
on (a model whose loss "went NaN"); ``...:NanInValidationSpec`` trains normally but
validates to NaN (its validation metrics are NaN, its training is not); ``...:FailsOneTrialSpec``
fails the units of one trial (the one whose ``lr`` the environment names).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import torch

from cerebro_spark.training import MLPSpec


class NanAfterFirstEpochSpec(MLPSpec):
    """An MLP whose learning rate is NaN after its first epoch."""

    def build_lr_scheduler(
        self, optimizer: torch.optim.Optimizer, params: Mapping[str, Any]
    ) -> torch.optim.lr_scheduler.LRScheduler | None:
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda epoch: 1.0 if epoch < 1 else math.nan
        )


class _NanWhenEvaluating(torch.nn.Module):
    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.inner(features)
        return out if self.training else out * math.nan


class NanInValidationSpec(MLPSpec):
    """An MLP that trains normally but whose every validation output is NaN."""

    def build_model(self, params: Mapping[str, Any], info: Any) -> torch.nn.Module:
        return _NanWhenEvaluating(super().build_model(params, info))


FAIL_LR_ENV = "CEREBRO_TEST_FAIL_LR"


class FailsOneTrialSpec(MLPSpec):
    """An MLP whose units raise for the trial whose ``lr`` is ``$CEREBRO_TEST_FAIL_LR``.

    Set in the environment, not in a param, so that the other trials' checkpoints (which
    hold their params) are those of a search without the fault. Only units fail (they run
    with torch's deterministic algorithms on): the driver's pre-flight goes through.
    """

    def build_model(self, params: Mapping[str, Any], info: Any) -> torch.nn.Module:
        failing = os.environ.get(FAIL_LR_ENV)
        if torch.are_deterministic_algorithms_enabled() and str(params["lr"]) == failing:
            raise RuntimeError(f"FailsOneTrialSpec: the trial with lr {params['lr']} fails")
        return super().build_model(params, info)
