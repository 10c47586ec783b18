"""Model specs for the backend contract suite, loaded by workers from their import path.

``tests.backends.failing_spec:FailingSpec`` raises in user code; ``...:PoisonSpec``'s
loss is NaN for a trial with ``poison`` set; ``...:GatedSpec`` is an
:class:`MLPSpec` that announces when a unit has started and can wait for other units, so
tests can kill a worker mid-unit or prove that two units overlap without timing anything.
The repository root is put on ``sys.path`` by ``tests/backends/conftest.py``; spawned
worker processes inherit it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cerebro_spark.data import DatasetInfo
from cerebro_spark.store import FileSystemStore
from cerebro_spark.training import MLPSpec

FAILURE_MESSAGE = "FailingSpec.build_model always raises"


class FailingSpec(MLPSpec):
    """A spec whose user code raises."""

    def build_model(self, params: Mapping[str, Any], info: DatasetInfo) -> nn.Module:
        raise RuntimeError(FAILURE_MESSAGE)


class GatedSpec(MLPSpec):
    """An MLP whose ``build_model`` writes ``params["marker"]``, then waits.

    Params besides MLPSpec's: ``marker`` (path written when the unit starts), ``wait_for``
    (paths that must all exist before it goes on; gives up after ``wait_timeout_s``, 60 s
    by default, by raising), ``sleep_s`` (seconds to sleep afterwards).

    Only units are gated (they run with torch's deterministic algorithms on): the
    driver's pre-flight, which builds every family's model once, goes straight through.
    """

    def build_model(self, params: Mapping[str, Any], info: DatasetInfo) -> nn.Module:
        if not torch.are_deterministic_algorithms_enabled():  # the driver's pre-flight
            return super().build_model(params, info)
        if "marker" in params:
            Path(params["marker"]).write_text("started")
        deadline = time.monotonic() + float(params.get("wait_timeout_s", 60.0))
        for path in params.get("wait_for", []):
            while not Path(path).exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"GatedSpec: {path} did not appear")
                time.sleep(0.02)
        time.sleep(float(params.get("sleep_s", 0.0)))
        return super().build_model(params, info)


class _Poison(nn.Module):
    """Multiplies the outputs by a buffer: NaN for a poisoned trial, 1 otherwise."""

    def __init__(self, poisoned: bool) -> None:
        super().__init__()
        self.register_buffer("factor", torch.tensor(float("nan") if poisoned else 1.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


class PoisonSpec(MLPSpec):
    """An MLP whose loss is NaN from the first batch when its trial's ``poison`` is set.

    Poisoned or not, its trials have one structure, so they can share a packed unit.
    """

    hyperparameters = MLPSpec.hyperparameters | {"poison"}

    def build_model(self, params: Mapping[str, Any], info: DatasetInfo) -> nn.Module:
        return nn.Sequential(
            super().build_model(params, info), _Poison(params.get("poison", False))
        )


def _exit_now() -> Any:
    os._exit(3)


class ExplodingStore(FileSystemStore):
    """A store whose unpickling ends the process: a worker that dies before it is ready."""

    def __reduce__(self) -> Any:
        return (_exit_now, ())
