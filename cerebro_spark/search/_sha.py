"""Synchronous successive halving (SHA), as described in RubberBand §3.1."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from cerebro_spark.search._base import Clock, Decision, EpochReport, SearchProcedure, TrialSpec
from cerebro_spark.search._grid import check_space, positive_int
from cerebro_spark.search._rungs import (
    Bracket,
    check_eta,
    check_rung_epochs,
    check_same_arguments,
    sha_ladder,
    to_score,
)
from cerebro_spark.search._stages import ExperimentSpec, ladder_stages
from cerebro_spark.search.space import SearchSpace


class SuccessiveHalving(SearchProcedure):
    """Successive halving (RubberBand §3.1, "Early-stopping Algorithms").

    "The best 1/η trials are retained after each stage, while the per-trial work
    assignment is simultaneously increased by a factor of η." With ``n = num_trials``,
    ``r = min_epochs`` and ``R = epochs``:

    * ``n`` configs are sampled from ``space`` and all suggested at the first
      :meth:`suggest`.
    * Rung ``k`` trains its trials to ``min(r·η^k, R)`` epochs (see
      :func:`~cerebro_spark.search._rungs.sha_ladder`); the last rung is the first that
      reaches ``R``.
    * When every trial of rung ``k`` has reported at the rung's epochs, the best
      ``max(1, ⌊n_k/η⌋)`` of its ``n_k`` trials go on to rung ``k+1`` and the rest stop.
      Trials at the last rung have finished and stop.

    Mapping onto the epoch template (the bracket rules of
    :class:`~cerebro_spark.search._rungs.Bracket`): below its rung a trial gets
    ``CONTINUE``; at its rung it gets ``PAUSE``, except the rung's last reporter, whose
    report decides the rung (``CONTINUE`` if it survives, ``STOP`` if not). Paused
    survivors come back through :meth:`resumed` at the next round, so all survivors start
    the next rung together and no trial trains past its rung before the rung is decided.
    Paused losers are never resumed (the engine should show them as stopped once the
    procedure is finished). The trials of one rung reach it in the same round, so the only
    wait is the end of that round; no worker idles because of a pause.

    Args:
        space: The search space.
        epochs: ``R``: epochs of a trial that survives every rung, ``>= 1``.
        metric: Validation metric that ranks the trials at a rung.
        mode: ``"max"`` or ``"min"``.
        rng: Source of the sampled configs.
        clock: Monotonic clock in seconds (unused by the decisions).
        num_trials: ``n``: configs in rung 0, ``>= 1``.
        eta: Reduction factor ``η``, an integer ``>= 2``.
        min_epochs: ``r``: epochs of rung 0, ``1 <= r <= epochs``.

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
        num_trials: int,
        eta: int = 3,
        min_epochs: int = 1,
    ) -> None:
        super().__init__(metric, mode, rng, clock)
        self.space = check_space(space)
        self.num_trials = positive_int("num_trials", num_trials)
        self.eta = check_eta(eta)
        self.min_epochs, self.epochs = check_rung_epochs(min_epochs, epochs)
        self.rungs = sha_ladder(self.min_epochs, self.eta, self.epochs)
        self._bracket = Bracket(self.rungs, self.eta)
        self._started = False

    def suggest(self) -> list[TrialSpec]:
        """Return all ``num_trials`` configs at the first call, then nothing."""
        if self._started:
            return []
        self._started = True
        specs = [self._new_trial(self.space.sample(self.rng)) for _ in range(self.num_trials)]
        self._bracket.add(s.trial_id for s in specs)
        return specs

    def on_epoch_end(self, report: EpochReport) -> Decision:
        """Apply the rung rules (class docstring).

        Raises:
            ValueError: The trial is not training or ``report.epoch`` is out of sequence.
            ConfigError: The report lacks the metric.
        """
        score = to_score(self.metric_value(report), self.mode)
        return self._bracket.on_epoch_end(report.trial_id, report.epoch, score)

    def on_trial_failed(self, trial_id: str) -> None:
        """The failed trial leaves the bracket; its rung is decided without it."""
        self._bracket.drop(trial_id)

    def resumed(self) -> list[str]:
        """Return the paused survivors of a rung decided since the last call."""
        return self._bracket.take_resumed()

    def stage_spec(self) -> ExperimentSpec:
        """One stage per rung: ``n_k`` trials train from the previous rung to rung ``k``."""
        stages = ladder_stages(self.num_trials, self.rungs, self.eta)
        return ExperimentSpec("sha", tuple(stages))

    def is_finished(self) -> bool:
        """Whether the configs were suggested and every trial stopped or was eliminated."""
        return self._started and self._bracket.done

    def state_dict(self) -> dict[str, Any]:
        """Return the state as JSON values."""
        state = super().state_dict()
        state.update(args=self._args(), started=self._started, bracket=self._bracket.state_dict())
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output saved by a procedure with the same arguments.

        Raises:
            ConfigError: The state was saved with other ``num_trials``, ``eta``,
                ``min_epochs`` or ``epochs``.
        """
        check_same_arguments(self, state, **self._args())
        super().load_state_dict(state)
        self._started = bool(state["started"])
        self._bracket = Bracket.from_state(state["bracket"], self.eta)

    def _args(self) -> dict[str, int]:
        return {
            "num_trials": self.num_trials,
            "eta": self.eta,
            "min_epochs": self.min_epochs,
            "epochs": self.epochs,
        }
