"""Scheduling rules: the paper's randomized rule and a work-aware variant."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from cerebro_spark.mop._base import Unit


class RandomizedRule:
    """Cerebro's randomized scheduler (Alg. 1, §5.3; replica-aware as in §5.5).

    Alg. 1 shuffles Q and runs the first unit whose trial is idle and whose partition the
    worker holds (§5.5: per the availability map). That is a uniformly random element of
    the candidates, which is what this rule draws.
    """

    def choose(
        self,
        worker: str,
        candidates: Sequence[Unit],
        remaining: Mapping[str, Sequence[Unit]],
        rng: np.random.Generator,
    ) -> Unit:
        """Return a uniformly random candidate."""
        return candidates[int(rng.integers(len(candidates)))]

    def __repr__(self) -> str:
        return "RandomizedRule()"


class WorkAwareRule:
    """Prefers the candidate whose trial has the most estimated work left.

    The open-shop analogue of "longest remaining processing time first": a trial's units
    run one at a time, so the trial with the most work left is the one most likely to end
    the epoch late (the trial-total term of the makespan lower bound). Its work left is
    the sum of ``estimate(unit, worker)`` over its units still in Q (train and validate;
    the estimate sees the kind), priced on the idle ``worker`` that is choosing. Ties are
    broken uniformly at random with ``rng``.

    Args:
        estimate: Predicted time of a unit on a worker, e.g. from a pilot profile
            (Cerebro §5.1: unit times from a short pilot run).
    """

    def __init__(self, estimate: Callable[[Unit, str], float]) -> None:
        self._estimate = estimate

    def choose(
        self,
        worker: str,
        candidates: Sequence[Unit],
        remaining: Mapping[str, Sequence[Unit]],
        rng: np.random.Generator,
    ) -> Unit:
        """Return a candidate of a trial with the most estimated work left."""
        work: dict[str, float] = {}
        for unit in candidates:
            if unit.trial not in work:
                work[unit.trial] = sum(self._estimate(u, worker) for u in remaining[unit.trial])
        most = max(work.values())
        best = [unit for unit in candidates if work[unit.trial] == most]
        return best[int(rng.integers(len(best)))]

    def __repr__(self) -> str:
        return f"WorkAwareRule({self._estimate!r})"
