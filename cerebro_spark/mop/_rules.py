"""Scheduling rules: the paper's randomized rule and a work-aware variant."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from cerebro_spark.errors import ConfigError
from cerebro_spark.mop._base import Unit
from cerebro_spark.units import UnitKind


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

    def trial_key(self, trial: str, train: int, validate: int) -> float:
        """Every trial ranks alike: the choice is uniform over all candidates (indexed path)."""
        del trial, train, validate
        return 0.0

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

    Where the estimate depends on the unit's trial and kind only (not its partition, nor
    the worker), build the rule with :meth:`per_trial`: the scheduler then keeps every
    idle trial's work left in an index and decides in ``O(log |S|)`` instead of pricing
    every candidate on every decision, with the same choices.
    """

    def __init__(self, estimate: Callable[[Unit, str], float]) -> None:
        self._estimate = estimate
        self._trial_estimate: Callable[[str, UnitKind], float] | None = None

    @classmethod
    def per_trial(cls, estimate: Callable[[str, UnitKind], float]) -> WorkAwareRule:
        """A work-aware rule whose estimate depends on the trial and unit kind only.

        Equal to ``WorkAwareRule(lambda unit, worker: estimate(unit.trial, unit.kind))``,
        but indexable (:meth:`trial_key`): a trial's work left is the same for every
        worker. The scheduler reads a trial's estimates again whenever its queue changed
        (a unit of it started, completed or failed), at its next
        :meth:`~cerebro_spark.mop.MopScheduler.assign`; an estimate that changes at any
        other time must be announced with
        :meth:`~cerebro_spark.mop.MopScheduler.refresh_estimates`.

        Args:
            estimate: Predicted seconds of one unit of a trial and kind (finite).
        """
        rule = cls(lambda unit, worker: estimate(unit.trial, unit.kind))
        rule._trial_estimate = estimate
        return rule

    @property
    def indexable(self) -> bool:
        """Whether :meth:`trial_key` is defined (built with :meth:`per_trial`)."""
        return self._trial_estimate is not None

    def trial_key(self, trial: str, train: int, validate: int) -> float:
        """A trial's work left with ``train`` and ``validate`` units in Q (indexed path).

        Exactly the float :meth:`choose` computes: the same estimates summed by
        :func:`sum` in the same order (train units first), so ties and maxima agree.

        Raises:
            ConfigError: The rule was not built with :meth:`per_trial`, or an estimate is
                NaN (no trial would have the most work left).
        """
        estimate = self._trial_estimate
        if estimate is None:
            raise ConfigError(f"{self!r} prices units per worker; it has no trial_key")
        parts = []
        if train:
            parts.append(itertools.repeat(estimate(trial, UnitKind.TRAIN), train))
        if validate:
            parts.append(itertools.repeat(estimate(trial, UnitKind.VALIDATE), validate))
        work = sum(itertools.chain.from_iterable(parts))
        if isinstance(work, float) and math.isnan(work):
            raise ConfigError(f"the work-aware estimate of trial {trial!r} is NaN")
        return work

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
