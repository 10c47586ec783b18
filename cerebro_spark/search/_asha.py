"""Asynchronous successive halving (ASHA), HyperSched §3.3 and its Algorithm 2."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from cerebro_spark.errors import ConfigError
from cerebro_spark.search._base import Clock, Decision, EpochReport, SearchProcedure, TrialSpec
from cerebro_spark.search._clock import deadline_start
from cerebro_spark.search._grid import check_space, positive_int
from cerebro_spark.search._rungs import (
    Score,
    check_eta,
    check_report,
    check_rung_epochs,
    check_same_arguments,
    rank,
    to_score,
)
from cerebro_spark.search._stages import Cohort, ExperimentSpec, StageSpec, one_stage
from cerebro_spark.search.space import SearchSpace


def asha_rungs(min_epochs: int, eta: int, epochs: int) -> list[int]:
    """Return ASHA's rung epochs ``r·η^k`` below ``R`` (e.g. ``[1, 3]`` for 1, 3, 9)."""
    rungs = []
    epoch = min_epochs
    while epoch < epochs:
        rungs.append(epoch)
        epoch *= eta
    return rungs


def check_deadline(value: Any) -> float | None:
    """Return ``value`` as seconds if it is ``None`` or a finite number ``> 0``, else raise."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.integer, np.floating))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigError(f"deadline must be a number of seconds > 0, got {value!r}")
    return float(value)


class ASHA(SearchProcedure):
    """ASHA (HyperSched §3.3, Algorithm 2), emulated on MOP as in Cerebro §4.2 and §7.3.

    Rungs are at ``r·η^k`` epochs below ``R`` (``r = min_epochs``, ``R = epochs``). The
    paper's rules, mapped onto the epoch template:

    * ``schedule(trial)`` is :meth:`on_epoch_end`. A trial that has trained ``R`` epochs
      gets ``STOP``. A trial that reports at a rung is recorded there and gets
      ``CONTINUE`` (it is *promoted*) iff it is among the top ``⌊n/η⌋`` of the ``n``
      results recorded at that rung so far, itself included; otherwise ``PAUSE``. Other
      epochs get ``CONTINUE``.
    * The entrance policy ``len(liveTrials) < N`` and ``start_next_trial`` (the ``get_job``
      of the ASHA paper) run when the engine opens a round (:meth:`suggest`, then
      :meth:`resumed`): while fewer than ``num_workers`` trials are live, the rungs are
      checked in descending order for a paused trial among the top ``⌊n/η⌋`` of its rung
      that was not promoted from that rung yet; the first one found is promoted and
      returned by :meth:`resumed`; if there is none, a new config is sampled and returned
      by :meth:`suggest`, unless ``num_trials`` configs were started or the deadline has
      passed. On MOP this keeps at least ``num_workers`` trials in flight, Cerebro's way
      to emulate ASHA (§4.2).
    * Ties at a rung go to the older trial; a non-finite metric ranks last.
    * ``deadline`` counts seconds of ``clock()`` from ``run`` when the engine passes its
      experiment clock (start-up included, :mod:`~cerebro_spark.search._clock`), from
      the procedure's construction for any other clock. Once it has passed, no trial is
      started or promoted, every live trial gets ``STOP`` at its next report and
      :meth:`is_finished` is true.
    * Without a deadline the search is finished when ``num_trials`` configs were started,
      none is live and no paused trial can be promoted. Paused trials that were never
      promoted stay paused (the engine should show them as stopped). A rung needs ``η``
      results to promote one trial, so for any trial to reach ``R`` epochs
      ``num_trials`` should be at least ``η^(number of rungs)``.

    Args:
        space: The search space.
        epochs: ``R``: the most epochs a trial trains, ``>= 1``.
        metric: Validation metric that ranks the trials at a rung.
        mode: ``"max"`` or ``"min"``.
        rng: Source of the sampled configs.
        clock: Experiment clock in seconds (for ``deadline``).
        num_trials: Most configs to start, ``>= 1``; ``None``: no limit (needs a deadline).
        eta: Reduction factor ``η``, an integer ``>= 2``.
        min_epochs: ``r``: epochs of the first rung, ``1 <= r <= epochs``.
        num_workers: Trials kept in flight, ``>= 1`` (the engine fills in its worker
            count; ``None`` means 1).
        deadline: Seconds after which nothing starts and live trials stop, ``> 0``.

    Raises:
        ConfigError: An argument breaks its rule, or neither ``num_trials`` nor
            ``deadline`` is given.
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
        num_trials: int | None = None,
        eta: int = 3,
        min_epochs: int = 1,
        num_workers: int | None = None,
        deadline: float | None = None,
    ) -> None:
        super().__init__(metric, mode, rng, clock)
        self.space = check_space(space)
        self.num_trials = None if num_trials is None else positive_int("num_trials", num_trials)
        self.eta = check_eta(eta)
        self.min_epochs, self.epochs = check_rung_epochs(min_epochs, epochs)
        self.num_workers = 1 if num_workers is None else positive_int("num_workers", num_workers)
        self.deadline = check_deadline(deadline)
        if self.num_trials is None and self.deadline is None:
            raise ConfigError(
                "ASHA needs num_trials or deadline: without either it would start trials for ever"
            )
        self.rungs = asha_rungs(self.min_epochs, self.eta, self.epochs)
        self._rung_index = {epoch: k for k, epoch in enumerate(self.rungs)}
        self._start = deadline_start(clock)
        self._started = 0
        self._live: dict[str, int] = {}  # trial -> epochs reported so far
        self._results: list[dict[str, Score]] = [{} for _ in self.rungs]
        self._paused: dict[str, int] = {}  # trial -> rung it waits at
        self._to_resume: list[str] = []
        self._to_start: list[TrialSpec] = []

    # -- the entrance policy and get_job

    def suggest(self) -> list[TrialSpec]:
        """Fill the free worker slots (class docstring); return the new trials."""
        self._fill()
        specs, self._to_start = self._to_start, []
        return specs

    def resumed(self) -> list[str]:
        """Fill the free worker slots (class docstring); return the promoted paused trials."""
        self._fill()
        resumed, self._to_resume = self._to_resume, []
        return resumed

    def _fill(self) -> None:
        if self.is_finished():
            return
        while len(self._live) < self.num_workers:
            job = self._promotable()
            if job is not None:
                trial_id, k = job
                del self._paused[trial_id]
                self._live[trial_id] = self.rungs[k]
                self._to_resume.append(trial_id)
            elif self._may_start():
                spec = self._new_trial(self.space.sample(self.rng))
                self._started += 1
                self._live[spec.trial_id] = 0
                self._to_start.append(spec)
            else:
                return

    def _promotable(self) -> tuple[str, int] | None:
        for k in reversed(range(len(self.rungs))):
            for trial_id in self._top(k):
                if self._paused.get(trial_id) == k:
                    return trial_id, k
        return None

    def _top(self, k: int) -> list[str]:
        results = self._results[k]
        return rank(results)[: len(results) // self.eta]

    def _may_start(self) -> bool:
        budget_left = self.num_trials is None or self._started < self.num_trials
        return budget_left and not self._past_deadline()

    def _past_deadline(self) -> bool:
        return self.deadline is not None and self.clock() - self._start >= self.deadline

    # -- schedule

    def on_epoch_end(self, report: EpochReport) -> Decision:
        """Apply the paper's ``schedule`` (class docstring).

        Raises:
            ValueError: The trial is not live or ``report.epoch`` is out of sequence.
            ConfigError: The report lacks the metric.
        """
        trial_id, epoch = report.trial_id, report.epoch
        check_report(self._live, trial_id, epoch, "not live")
        score = to_score(self.metric_value(report), self.mode)
        if epoch >= self.epochs or self._past_deadline():
            del self._live[trial_id]
            return Decision.STOP
        k = self._rung_index.get(epoch)
        if k is None:
            self._live[trial_id] = epoch
            return Decision.CONTINUE
        self._results[k][trial_id] = score
        if trial_id in self._top(k):
            self._live[trial_id] = epoch
            return Decision.CONTINUE
        del self._live[trial_id]
        self._paused[trial_id] = k
        return Decision.PAUSE

    def on_trial_failed(self, trial_id: str) -> None:
        """The failed trial frees its worker slot (a new or promoted trial takes it)."""
        self._live.pop(trial_id, None)

    def stage_spec(self) -> ExperimentSpec:
        """ASHA's expected work as one asynchronous stage.

        Of ``num_trials``, about ``n / η^k`` reach rung ``k`` and the rest stop there; the
        best train to ``epochs`` (as in SHA). Without ``num_trials`` it runs until its
        deadline on ``num_workers``; with both, the deadline caps the run (``deadline``).
        """
        if self.num_trials is None:
            assert self.deadline is not None  # ok: checked in __init__
            return ExperimentSpec(
                "asha",
                one_stage(self.num_workers, self.epochs),
                elastic=False,
                max_workers=self.num_workers,
                fixed_seconds=self.deadline,
                deadline=self.deadline,
            )
        ladder = [*self.rungs, self.epochs]
        reach = [self.num_trials]
        for _ in ladder[1:]:
            reach.append(max(1, reach[-1] // self.eta))
        stop_at = [n - later for n, later in zip(reach, [*reach[1:], 0], strict=True)]
        cohorts = tuple(Cohort(n, e) for n, e in zip(stop_at, ladder, strict=True) if n > 0)
        return ExperimentSpec(
            "asha",
            (StageSpec(cohorts),),
            elastic=False,
            max_workers=self.num_trials,
            deadline=self.deadline,
        )

    def is_finished(self) -> bool:
        """Whether the deadline passed, or every config started and nothing can go on."""
        if self._past_deadline():
            return True
        return (
            not self._may_start()
            and not self._live
            and not self._to_resume
            and self._promotable() is None
        )

    # -- resume

    def state_dict(self) -> dict[str, Any]:
        """Return the state as JSON values."""
        state = super().state_dict()
        state.update(
            args=self._args(),
            start=self._start,
            started=self._started,
            live=dict(self._live),
            results=[dict(r) for r in self._results],
            paused=dict(self._paused),
            to_resume=list(self._to_resume),
            to_start=[{"trial_id": s.trial_id, "params": dict(s.params)} for s in self._to_start],
        )
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output saved by a procedure with the same arguments.

        Raises:
            ConfigError: The state was saved with other ``num_trials``, ``eta``,
                ``min_epochs``, ``epochs`` or ``deadline``.
        """
        check_same_arguments(self, state, **self._args())
        super().load_state_dict(state)
        self._start = float(state["start"])
        self._started = int(state["started"])
        self._live = {str(k): int(v) for k, v in state["live"].items()}
        self._results = [
            {str(t): None if s is None else float(s) for t, s in r.items()}
            for r in state["results"]
        ]
        self._paused = {str(k): int(v) for k, v in state["paused"].items()}
        self._to_resume = [str(t) for t in state["to_resume"]]
        self._to_start = [TrialSpec(s["trial_id"], s["params"]) for s in state["to_start"]]

    def _args(self) -> dict[str, Any]:
        return {
            "num_trials": self.num_trials,
            "eta": self.eta,
            "min_epochs": self.min_epochs,
            "epochs": self.epochs,
            "deadline": self.deadline,
        }
