"""The simulated training workload: HyperSched's parametric score model (HyperSched §6).

HyperSched §6 evaluates its ablations on "a simulated model training function ranging from
0 to 1"::

    Score(k) = (2 - (1 / (0.01 * b0 * k + 0.1 * b1 + 0.5) + 0.01 * b2)) / 2

where ``k`` is the number of training steps taken, ``b1, b2 ~ U(0, 1)`` and ``b0`` is
exponential with scale 0.1 (the paper's Fig. 6 plots 50 such curves). Here a trial's
``(b0, b1, b2)`` are a deterministic function of its params and the workload seed (a
generator seeded with the seed and a hash of the params), so equal params train
identically, different seeds give different landscapes, and a procedure that samples more
or better configs sees different curves. One epoch is ``steps_per_epoch`` steps; the time
of an epoch is the cluster model's business (:mod:`cerebro_spark.simulate._cluster`).

The simulated space is the data-parallel vision space of HyperSched Table 2 (also SEER
Table 1): learning rate, weight decay and momentum, each a grid of listed values.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from cerebro_spark.search.space import SearchSpace

SIMULATED_SPACE = SearchSpace.from_config(
    {
        "lr": {"grid": [1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0]},
        "weight_decay": {"grid": [1e-4, 5e-4, 1e-3, 5e-3]},
        "momentum": {"grid": [0.9, 0.95, 0.99, 0.997]},
    }
)
"""HyperSched Table 2's space (144 configs): every trial samples one value of each."""


def parametric_score(steps: float, b0: float, b1: float, b2: float) -> float:
    """Return HyperSched §6's ``Score(k)`` after ``steps`` training steps."""
    return (2.0 - (1.0 / (0.01 * b0 * steps + 0.1 * b1 + 0.5) + 0.01 * b2)) / 2.0


@dataclasses.dataclass(frozen=True)
class Curve:
    """One trial's learning curve: the coefficients of :func:`parametric_score`."""

    b0: float
    b1: float
    b2: float

    def score(self, steps: float) -> float:
        """Return the score after ``steps`` steps."""
        return parametric_score(steps, self.b0, self.b1, self.b2)

    @property
    def limit(self) -> float:
        """The score as ``steps`` grows without bound: ``1 - b2 / 200``."""
        return 1.0 - self.b2 / 200.0


@dataclasses.dataclass(frozen=True)
class ParametricWorkload:
    """Maps a trial's params to its :class:`Curve`, for one seed.

    Attributes:
        seed: Seed of the landscape (all procedures compared on one seed share it).
        steps_per_epoch: Training steps in one epoch (``k`` grows by this per epoch).
    """

    seed: int
    steps_per_epoch: int = 10

    def curve(self, params: Mapping[str, Any]) -> Curve:
        """Return the curve of a config: ``b0 ~ Exp(0.1)``, ``b1, b2 ~ U(0, 1)``."""
        digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).digest()
        rng = np.random.default_rng([self.seed, int.from_bytes(digest[:8], "little")])
        return Curve(
            b0=float(rng.exponential(0.1)), b1=float(rng.uniform()), b2=float(rng.uniform())
        )

    def score(self, params: Mapping[str, Any], epochs: int) -> float:
        """Return the score of a config after ``epochs`` epochs."""
        return self.curve(params).score(epochs * self.steps_per_epoch)
