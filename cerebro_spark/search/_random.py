"""Random search (Cerebro §4.2: with grid search, the one-shot instance of the template)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from cerebro_spark.search._base import Clock
from cerebro_spark.search._grid import OneShotSearch, check_space, positive_int
from cerebro_spark.search.space import SearchSpace


class RandomSearch(OneShotSearch):
    """Train ``num_trials`` configs sampled from ``space`` for ``epochs`` epochs each.

    Configs are drawn from ``rng`` when they are suggested, in trial order, so trial ``i``
    gets the ``i``-th sample whatever ``max_concurrent`` is. The decision rules are those
    of grid search (module ``_grid``): ``CONTINUE`` until the ``epochs``-th report, then
    ``STOP``; finished when all ``num_trials`` have stopped.

    Args:
        space: The search space (continuous distributions allowed).
        num_trials: Configs to sample and train, ``>= 1``.
        epochs: Epochs each trial is trained, ``>= 1``.
        metric: Validation metric every report must carry.
        mode: ``"max"`` or ``"min"`` (unused by the decisions; kept for the leaderboard).
        rng: Source of the samples (its state is part of :meth:`state_dict`).
        clock: Monotonic clock in seconds.
        max_concurrent: Most trials live at once; ``None`` suggests all at once.

    Raises:
        ConfigError: An argument breaks its rule.
    """

    name = "random"

    def __init__(
        self,
        space: SearchSpace,
        *,
        num_trials: int,
        epochs: int,
        metric: str,
        mode: str,
        rng: np.random.Generator,
        clock: Clock = time.monotonic,
        max_concurrent: int | None = None,
    ) -> None:
        self.space = check_space(space)
        self.num_trials = positive_int("num_trials", num_trials)
        super().__init__(
            total=self.num_trials,
            epochs=epochs,
            max_concurrent=max_concurrent,
            metric=metric,
            mode=mode,
            rng=rng,
            clock=clock,
        )

    def _params(self, index: int) -> dict[str, Any]:
        return self.space.sample(self.rng)
