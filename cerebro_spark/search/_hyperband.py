"""Hyperband: brackets of successive halving (RubberBand §3.1; Li et al., Hyperband)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np

from cerebro_spark.errors import ConfigError
from cerebro_spark.search._base import Clock, Decision, EpochReport, SearchProcedure, TrialSpec
from cerebro_spark.search._grid import check_space
from cerebro_spark.search._rungs import (
    Bracket,
    check_eta,
    check_rung_epochs,
    check_same_arguments,
    to_score,
)
from cerebro_spark.search._stages import ExperimentSpec, ladder_stages, merge_side_by_side
from cerebro_spark.search.space import SearchSpace


def hyperband_brackets(epochs: int, eta: int, min_epochs: int = 1) -> list[tuple[int, list[int]]]:
    """Return Hyperband's brackets ``s = s_max, ..., 0`` as ``(n, rung epochs)`` pairs.

    With ``R = epochs``: ``s_max`` is the largest ``s`` with ``min_epochs·η^s <= R``;
    bracket ``s`` starts ``n = ⌈(s_max+1)/(s+1)·η^s⌉`` trials and its rung ``i``
    (``i = 0..s``) trains to ``r_i = R·η^(i-s)`` epochs, rounded to the nearest integer
    (halves up); its last rung is ``R``. Within the bracket, rung ``i`` keeps
    ``⌊n·η^-i⌋`` trials, which is what :class:`~cerebro_spark.search._rungs.Bracket`'s
    ``max(1, ⌊n_k/η⌋)`` per rung gives.

    Example: ``R = 27, η = 3`` gives ``[(27, [1, 3, 9, 27]), (12, [3, 9, 27]), (6, [9, 27]),
    (4, [27])]``.
    """
    s_max = 0
    while min_epochs * eta ** (s_max + 1) <= epochs:
        s_max += 1
    brackets = []
    for s in range(s_max, -1, -1):
        n = -(-((s_max + 1) * eta**s) // (s + 1))
        rungs = [_round_half_up(Fraction(epochs * eta**i, eta**s)) for i in range(s + 1)]
        brackets.append((n, rungs))
    return brackets


def _round_half_up(value: Fraction) -> int:
    return int((value + Fraction(1, 2)).__floor__())


class Hyperband(SearchProcedure):
    """Hyperband (RubberBand §3.1; brackets as defined by Li et al., Hyperband).

    RubberBand §3.1: a single SHA specification "can express a successive halving job,
    whereas a collection of them can specify Hyperband-based methods". The brackets are
    those of :func:`hyperband_brackets`: bracket ``s`` samples ``n`` configs and runs
    synchronous successive halving on them with rung epochs ``R·η^(i-s)``, ``i = 0..s``,
    keeping the best ``max(1, ⌊n_i/η⌋)`` at each rung. Each bracket follows the rules of
    :class:`~cerebro_spark.search._rungs.Bracket` (the same ``CONTINUE``/``PAUSE``/``STOP``
    mapping as :class:`~cerebro_spark.search._sha.SuccessiveHalving`): ``PAUSE`` at a rung
    until the rung's last trial reports, survivors through :meth:`resumed`, losers left
    paused.

    With ``concurrent=True`` (default) every bracket's trials are suggested at the first
    :meth:`suggest`, most exploratory bracket (``s_max``) first, and the brackets run side
    by side: more trials in flight keeps MOP's workers busy (Cerebro §4.2) and a bracket
    never waits for another. With ``concurrent=False`` the brackets run one after another,
    ``s_max`` first, as in the Hyperband paper's loop; a bracket's trials are suggested at
    the round after the previous bracket finished.

    Args:
        space: The search space.
        epochs: ``R``: the most epochs any trial trains, ``>= 1``.
        metric: Validation metric that ranks the trials at a rung.
        mode: ``"max"`` or ``"min"``.
        rng: Source of the sampled configs.
        clock: Monotonic clock in seconds (unused by the decisions).
        eta: Reduction factor ``η``, an integer ``>= 2``.
        min_epochs: Fewest epochs of a rung; bounds ``s_max``. ``1 <= min_epochs <= epochs``.
        concurrent: Run the brackets side by side (``True``) or one after another.

    Raises:
        ConfigError: An argument breaks its rule.
    """

    def __init__(
        self,
        space: SearchSpace,
        *,
        epochs: int,
        metric: str,
        mode: str,
        rng: np.random.Generator,
        clock: Clock = time.monotonic,
        eta: int = 3,
        min_epochs: int = 1,
        concurrent: bool = True,
    ) -> None:
        super().__init__(metric, mode, rng, clock)
        self.space = check_space(space)
        self.eta = check_eta(eta)
        self.min_epochs, self.epochs = check_rung_epochs(min_epochs, epochs)
        if not isinstance(concurrent, bool):
            raise ConfigError(f"concurrent must be true or false, got {concurrent!r}")
        self.concurrent = concurrent
        self.plan = hyperband_brackets(self.epochs, self.eta, self.min_epochs)
        self._brackets: list[Bracket] = []  # the started ones, in plan order
        self._bracket_of: dict[str, int] = {}

    def suggest(self) -> list[TrialSpec]:
        """Start brackets: all at once if concurrent, else the next when the last is done."""
        specs: list[TrialSpec] = []
        while len(self._brackets) < len(self.plan) and (
            self.concurrent or all(b.done for b in self._brackets)
        ):
            n, rungs = self.plan[len(self._brackets)]
            bracket = Bracket(rungs, self.eta)
            new = [self._new_trial(self.space.sample(self.rng)) for _ in range(n)]
            for spec in new:
                self._bracket_of[spec.trial_id] = len(self._brackets)
            bracket.add(s.trial_id for s in new)
            self._brackets.append(bracket)
            specs += new
        return specs

    def on_epoch_end(self, report: EpochReport) -> Decision:
        """Apply the rung rules of the trial's bracket.

        Raises:
            ValueError: The trial is unknown or not training, or ``report.epoch`` is out of
                sequence.
            ConfigError: The report lacks the metric.
        """
        score = to_score(self.metric_value(report), self.mode)
        index = self._bracket_of.get(report.trial_id)
        if index is None:
            raise ValueError(f"report for trial {report.trial_id!r}, which is unknown")
        return self._brackets[index].on_epoch_end(report.trial_id, report.epoch, score)

    def on_trial_failed(self, trial_id: str) -> None:
        """The failed trial leaves its bracket; its rung is decided without it."""
        index = self._bracket_of.get(trial_id)
        if index is not None:
            self._brackets[index].drop(trial_id)

    def resumed(self) -> list[str]:
        """Return the paused survivors of rungs decided since the last call, in id order."""
        return sorted(t for b in self._brackets for t in b.take_resumed())

    def stage_spec(self) -> ExperimentSpec:
        """A multi-job (RubberBand §3.1): one successive-halving spec per bracket.

        Side by side (stage ``i`` holds every bracket's ``i``-th rung) when
        ``concurrent``, else one bracket after another.
        """
        brackets = [ladder_stages(n, rungs, self.eta) for n, rungs in self.plan]
        stages = (
            merge_side_by_side(brackets)
            if self.concurrent
            else [stage for bracket in brackets for stage in bracket]
        )
        return ExperimentSpec("hyperband", tuple(stages))

    def is_finished(self) -> bool:
        """Whether every bracket was started and is done."""
        return len(self._brackets) == len(self.plan) and all(b.done for b in self._brackets)

    def state_dict(self) -> dict[str, Any]:
        """Return the state as JSON values."""
        state = super().state_dict()
        state.update(
            args=self._args(),
            brackets=[b.state_dict() for b in self._brackets],
            bracket_of=dict(self._bracket_of),
        )
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output saved by a procedure with the same arguments.

        Raises:
            ConfigError: The state was saved with other ``eta``, ``min_epochs``,
                ``epochs`` or ``concurrent``.
        """
        check_same_arguments(self, state, **self._args())
        super().load_state_dict(state)
        self._brackets = [Bracket.from_state(b, self.eta) for b in state["brackets"]]
        self._bracket_of = {str(k): int(v) for k, v in state["bracket_of"].items()}

    def _args(self) -> dict[str, Any]:
        return {
            "eta": self.eta,
            "min_epochs": self.min_epochs,
            "epochs": self.epochs,
            "concurrent": self.concurrent,
        }
