"""HyperSched: deadline-aware ASHA with dynamic resource allocation (HyperSched §4, Alg. 3).

HyperSched (Liaw et al., SoCC 2019) extends ASHA (§3.3) to a fixed cluster of ``N`` atoms
(here: workers) and a deadline ``T``. On Cerebro's round template it decides as follows
(``now`` is experiment time since ``run``, start-up included -- since the procedure was
built for a clock other than the engine's, :mod:`~cerebro_spark.search._clock` --
and ``T_n = T - now``):

* **Rungs** at ``r, r*eta, r*eta**2, ... < R`` epochs (``r`` = ``min_epochs``, ``R`` =
  ``epochs``); a trial is stopped after ``R`` epochs (Alg. 3 lines 12-13).
* **Speculative evaluation** (§4.2, Alg. 3 lines 14-20): after *every* epoch the rungs
  are checked in ascending order: at the rung equal to its epoch the trial's score is
  recorded, and at every rung it has passed it is paused if its score there is no longer
  in the top ``1/eta`` of all scores recorded at that rung (a trial paused at a lower rung
  is not recorded at the higher one). The first trial to reach a rung is not paused.
  "Top ``1/eta``" of ``n`` scores keeps the ``1 + (n-1)//eta`` best, which is exactly
  Ray Tune's percentile cutoff ``percentile(scores, 100 * (1 - 1/eta))`` without
  interpolating between floats.
* **Entrance policy** (§4.2, Alg. 3 lines 5-9): at each round's :meth:`suggest` the
  cluster is filled while the live trials hold fewer than ``N`` workers *and*
  ``min(R * T_a, eta * t_f) < T_n``, where ``T_a`` is the time of one epoch on one worker
  and ``t_f`` the wall time trained by the furthest trial. Filling follows Alg. 1
  ``start_next_trial``: first a paused trial in the top ``floor(n/eta)`` of a rung, rungs
  in descending order, else a new trial. A new trial is only started when it can reach the
  first rung before the deadline (``T_o + r * T_a <= T_n``: no work is started that cannot
  finish), and at most ``max_trials`` are started.
* **Dynamic allocation** (§4.3, Alg. 3 lines 21-25): after a trial's epoch, the live
  trials are ranked by their latest score and the ``N`` workers dealt round-robin in that
  order (``uniformAllocation``: the best trials get the left-over workers first). The trial
  is resized to its share ``a'`` only if that pays for the start-up overhead ``T_o`` before
  the deadline, ``(T_n - T_o) * s(a') > T_n * s(a)`` (overhead-aware, scale-aware), and at
  least ``cooldown`` seconds passed since its last start or resize. Allocations only grow,
  and only into idle workers, so the live trials never hold more than ``N`` workers.
* **Deadline**: once ``now >= T`` every report is answered with ``STOP`` and the procedure
  is finished; a trial whose next epoch cannot end before ``T`` (``now + T_o + T_a /
  s(a) > T``, ``T_o`` only when just resized) is stopped, since that work cannot count.

Mapping onto the template: ``CONTINUE`` keeps training, ``PAUSE`` is ASHA's pause (the
trial may be resumed by :meth:`resumed` when it becomes promotable), ``STOP`` ends it;
:meth:`resources` is the trial's allocation ``a`` for its next epoch. ``T_a`` starts at
``epoch_seconds`` and becomes the mean of the positive ``EpochReport.seconds`` (the cost of
one epoch on one worker); ``T_o`` is ``startup_overhead``.

Reading note: §4.2's prose states the entrance condition with the inequality reversed
("if ``min{R*T_a, eta*T'} < T_n`` ... will not continue to launch new trials"); Alg. 3
line 8 (``should_enter = min(R*T_a, t_f*eta) < T_n``) is implemented, the only reading
under which trials enter at the start and stop entering near the deadline.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cerebro_spark.errors import ConfigError
from cerebro_spark.search._base import Clock, Decision, EpochReport, SearchProcedure, TrialSpec
from cerebro_spark.search._clock import deadline_start
from cerebro_spark.search._grid import check_space, positive_int
from cerebro_spark.search._stages import ExperimentSpec, one_stage
from cerebro_spark.search.space import SearchSpace

SCALINGS = ("linear", "sqrt", "none")
"""Scaling functions ``s(k)`` of HyperSched §6.0.1, by name."""

LIVE, PAUSED, STOPPED = "live", "paused", "stopped"


def check_scaling(scaling: Any) -> str:
    """Return ``scaling`` if it names a scaling function, else raise ``ConfigError``."""
    if scaling not in SCALINGS:
        raise ConfigError(f"scaling must be one of {', '.join(SCALINGS)}, got {scaling!r}")
    return str(scaling)


def speedup(scaling: str, workers: int) -> float:
    """Return how many times faster one epoch runs on ``workers`` workers than on one.

    HyperSched §6.0.1: *LINEAR* divides the step time by the number of atoms, *SQRT* by
    its square root, *NONE* leaves it unchanged.

    Raises:
        ConfigError: Unknown scaling or ``workers < 1``.
    """
    check_scaling(scaling)
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise ConfigError(f"workers must be an integer >= 1, got {workers!r}")
    if scaling == "linear":
        return float(workers)
    if scaling == "sqrt":
        return math.sqrt(workers)
    return 1.0


def uniform_allocation(ranked: Sequence[str], atoms: int) -> dict[str, int]:
    """Deal ``atoms`` workers round-robin over ``ranked`` trials, best first (§5, Alg. 3).

    Every trial gets at least one worker (a live trial always trains); with fewer trials
    than atoms the best ``atoms % n`` trials get one more than the others.
    """
    if not ranked:
        return {}
    base, extra = divmod(atoms, len(ranked))
    return {t: max(1, base + (1 if i < extra else 0)) for i, t in enumerate(ranked)}


def check_number(name: str, value: Any, *, minimum: float = 0.0, strict: bool = True) -> float:
    """Return ``value`` as a finite float above (or at, with ``strict=False``) ``minimum``."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    number = float(value) if ok else math.nan
    if not math.isfinite(number) or number < minimum or (strict and number == minimum):
        rule = ">" if strict else ">="
        raise ConfigError(f"{name} must be a finite number {rule} {minimum:g}, got {value!r}")
    return number


def clean_score(value: float) -> float:
    """Return a score with NaN (a diverged trial) mapped to ``-inf``, which ranks last."""
    return -math.inf if math.isnan(value) else value


@dataclasses.dataclass
class _Trial:
    status: str = LIVE
    epochs: int = 0
    atoms: int = 1
    resized_at: float = 0.0
    """Experiment seconds of the trial's last start or resize (the cooldown timer)."""
    seconds: float = 0.0
    """Wall seconds the trial has trained (Alg. 3 ``furthestTrial().time``)."""
    score: float | None = None
    rungs: dict[str, float] = dataclasses.field(default_factory=dict)
    """Score at each rung epoch reached, keyed by the epoch (a string, for JSON)."""
    recorded: list[str] = dataclasses.field(default_factory=list)
    """Rungs whose scores include this trial's (Alg. 3 ``rung.record``)."""


class HyperSched(SearchProcedure):
    """Deadline-aware ASHA with dynamic allocation (HyperSched §4.2-4.3, Alg. 3).

    The rules are in the module docstring.

    Args:
        space: The search space new trials are sampled from.
        epochs: ``R``, the most epochs a trial trains (§4.1).
        metric: Validation metric every report must carry.
        mode: ``"max"`` or ``"min"``.
        rng: Source of the samples.
        clock: Experiment clock in seconds; the deadline counts from its origin (the
            engine's: ``run``, start-up included), else from its value when the procedure
            is built.
        deadline: ``T``, seconds of experiment time (from ``run`` to the end).
        num_workers: ``N``, the workers (atoms) of the cluster.
        eta: Reduction factor, an integer ``>= 2``.
        min_epochs: ``r``, the epochs of the first rung.
        max_trials: Most trials ever started (``None``: limited by the deadline only).
        scaling: Assumed speed-up ``s(k)`` of one trial on ``k`` workers: ``"linear"``,
            ``"sqrt"`` or ``"none"`` (§6.0.1).
        startup_overhead: ``T_o``, seconds a trial loses when it starts or is resized.
        cooldown: Seconds that must pass between two resizes of one trial (§5).
        epoch_seconds: Initial ``T_a``, one epoch on one worker, refined from reports.

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
        deadline: float,
        num_workers: int,
        eta: int = 3,
        min_epochs: int = 1,
        max_trials: int | None = None,
        scaling: str = "linear",
        startup_overhead: float = 0.0,
        cooldown: float = 0.0,
        epoch_seconds: float = 1.0,
    ) -> None:
        super().__init__(metric, mode, rng, clock)
        self.space = check_space(space)
        self.epochs = positive_int("epochs", epochs)
        self.deadline = check_number("deadline", deadline)
        self.num_workers = positive_int("num_workers", num_workers)
        self.eta = positive_int("eta", eta)
        if self.eta < 2:
            raise ConfigError(f"eta must be an integer >= 2, got {eta!r}")
        self.min_epochs = positive_int("min_epochs", min_epochs)
        if self.min_epochs > self.epochs:
            raise ConfigError(
                f"min_epochs must be <= epochs, got min_epochs={min_epochs} > epochs={epochs}"
            )
        self.max_trials = None if max_trials is None else positive_int("max_trials", max_trials)
        self.scaling = check_scaling(scaling)
        self.startup_overhead = check_number("startup_overhead", startup_overhead, strict=False)
        self.cooldown = check_number("cooldown", cooldown, strict=False)
        self.epoch_seconds = check_number("epoch_seconds", epoch_seconds)
        self.rungs: list[int] = []
        rung = self.min_epochs
        while rung < self.epochs:
            self.rungs.append(rung)
            rung *= self.eta
        self._t0 = deadline_start(clock)
        self._round_start = 0.0
        self._trials: dict[str, _Trial] = {}
        self._pending: list[str] = []
        self._seconds_sum = 0.0
        self._seconds_count = 0

    # -- time and estimates ---------------------------------------------------------------

    def _now(self) -> float:
        """Experiment seconds since the deadline's start (``run``, or the construction)."""
        return float(self.clock()) - self._t0

    @property
    def epoch_time(self) -> float:
        """``T_a``: estimated seconds of one epoch on one worker."""
        if self._seconds_count:
            return self._seconds_sum / self._seconds_count
        return self.epoch_seconds

    def _speed(self, atoms: int) -> float:
        return speedup(self.scaling, max(1, min(atoms, self.num_workers)))

    # -- entrance policy (Alg. 3 lines 5-9, Alg. 1 start_next_trial) ----------------------

    def _live(self) -> list[str]:
        return [t for t, tr in self._trials.items() if tr.status == LIVE]

    def _allocated(self) -> int:
        return sum(tr.atoms for tr in self._trials.values() if tr.status == LIVE)

    def _furthest_seconds(self) -> float:
        if not self._trials:
            return 0.0
        furthest = max(self._trials.values(), key=lambda tr: (tr.epochs, tr.seconds))
        return furthest.seconds

    def entrance_open(self) -> bool:
        """Alg. 3 ``entrance_policy``: workers are free and entering is worth it."""
        left = self.deadline - self._now()
        should_enter = min(self.epochs * self.epoch_time, self._furthest_seconds() * self.eta)
        return self._allocated() < self.num_workers and should_enter < left

    def _can_start_new(self) -> bool:
        if self.max_trials is not None and len(self._trials) >= self.max_trials:
            return False
        first_rung = self.startup_overhead + self.min_epochs * self.epoch_time
        return first_rung <= self.deadline - self._now()

    def _rung_scores(self, rung: int) -> list[float]:
        key = str(rung)
        return [tr.rungs[key] for tr in self._trials.values() if key in tr.recorded]

    def _passes_rung(self, trial: _Trial, rung: int) -> bool:
        """Whether the trial's score at ``rung`` is in the top ``1/eta`` seen there."""
        mine = trial.rungs[str(rung)]
        scores = self._rung_scores(rung)
        if not scores:  # no cutoff yet (the trial itself was not recorded there)
            return True
        better = sum(1 for s in scores if s > mine)
        return better < 1 + (len(scores) - 1) // self.eta

    def _passes(self, trial: _Trial) -> bool:
        """Whether the trial is in the top ``1/eta`` at every rung it has reached."""
        return all(self._passes_rung(trial, r) for r in self.rungs if trial.epochs >= r)

    def _promotable(self) -> str | None:
        """Alg. 1 ``start_next_trial``: a paused trial in a rung's top ``floor(n/eta)``."""
        for rung in reversed(self.rungs):
            key = str(rung)
            ranked = sorted(
                (t for t, tr in self._trials.items() if key in tr.recorded),
                key=lambda t: (-self._trials[t].rungs[key], t),
            )
            for trial_id in ranked[: len(ranked) // self.eta]:
                trial = self._trials[trial_id]
                if trial.status == PAUSED and trial.epochs < self.epochs and self._passes(trial):
                    return trial_id
        return None

    def suggest(self) -> list[TrialSpec]:
        """Fill the free workers: promotable paused trials first, then new trials."""
        now = self._now()
        self._round_start = now
        specs: list[TrialSpec] = []
        while self.entrance_open():
            promoted = self._promotable()
            if promoted is not None:
                trial = self._trials[promoted]
                trial.status, trial.atoms, trial.resized_at = LIVE, 1, now
                self._pending.append(promoted)
            elif self._can_start_new():
                spec = self._new_trial(self.space.sample(self.rng))
                self._trials[spec.trial_id] = _Trial(resized_at=now)
                specs.append(spec)
            else:
                break
        return specs

    def resumed(self) -> list[str]:
        """Return the paused trials :meth:`suggest` promoted this round."""
        pending, self._pending = self._pending, []
        return pending

    def stage_spec(self) -> ExperimentSpec:
        """One asynchronous stage of fixed length on ``num_workers``.

        HyperSched fills its workers until its deadline (§4), whatever else happens.
        """
        return ExperimentSpec(
            "hypersched",
            one_stage(self.max_trials or self.num_workers, self.epochs),
            elastic=False,
            max_workers=self.num_workers,
            fixed_seconds=self.deadline,
            deadline=self.deadline,
        )

    def is_finished(self) -> bool:
        """Past the deadline, or nothing live and nothing the entrance policy would start."""
        if self._now() >= self.deadline:
            return True
        if self._pending or self._live():
            return False
        if not self.entrance_open():
            return True
        return self._promotable() is None and not self._can_start_new()

    # -- decisions (Alg. 3 schedule) ------------------------------------------------------

    def on_epoch_end(self, report: EpochReport) -> Decision:
        """Decide after an epoch: STOP, PAUSE (rung cutoff) or CONTINUE (maybe resized).

        Raises:
            ValueError: The trial is not live or ``report.epoch`` is out of sequence.
            ConfigError: The report lacks the metric.
        """
        trial = self._trials.get(report.trial_id)
        if trial is None or trial.status != LIVE:
            state = "unknown" if trial is None else trial.status
            raise ValueError(f"report for trial {report.trial_id!r}, which is {state}")
        if report.epoch != trial.epochs + 1:
            raise ValueError(
                f"trial {report.trial_id}: report.epoch must be {trial.epochs + 1} (its "
                f"completed epochs), got {report.epoch}"
            )
        value = clean_score(self.score({self.metric: self.metric_value(report)}))
        now = self._now()
        trial.epochs, trial.score = report.epoch, value
        trial.seconds += max(0.0, now - self._round_start)
        if report.seconds > 0:
            self._seconds_sum += float(report.seconds)
            self._seconds_count += 1
        if now >= self.deadline or trial.epochs >= self.epochs:
            return self._leave(trial, STOPPED)
        if trial.epochs in self.rungs:
            trial.rungs[str(trial.epochs)] = value  # trial.accuracy[rung.iter]
        for rung in self.rungs:  # Alg. 3 lines 14-20, rungs in ascending order
            if trial.epochs == rung:
                trial.recorded.append(str(rung))
            if trial.epochs >= rung and not self._passes_rung(trial, rung):
                return self._leave(trial, PAUSED)
        resized = self._maybe_resize(report.trial_id, now)
        overhead = self.startup_overhead if resized else 0.0
        if now + overhead + self.epoch_time / self._speed(trial.atoms) > self.deadline:
            return self._leave(trial, STOPPED)
        return Decision.CONTINUE

    def on_trial_failed(self, trial_id: str) -> None:
        """The failed trial stops: its workers go back to the others and new trials."""
        trial = self._trials.get(trial_id)
        if trial is not None and trial.status == LIVE:
            self._leave(trial, STOPPED)

    def _leave(self, trial: _Trial, status: str) -> Decision:
        trial.status, trial.atoms = status, 1
        return Decision.STOP if status == STOPPED else Decision.PAUSE

    def _maybe_resize(self, trial_id: str, now: float) -> bool:
        """Alg. 3 lines 21-25: grow to the uniform share if it pays for ``T_o``."""
        trial = self._trials[trial_id]
        live = self._live()
        ranked = sorted(live, key=lambda t: (-_rank_score(self._trials[t].score), t))
        share = uniform_allocation(ranked, self.num_workers)[trial_id]
        free = self.num_workers - self._allocated()
        target = min(share, trial.atoms + max(free, 0))
        if target <= trial.atoms or now - trial.resized_at < self.cooldown:
            return False
        left = self.deadline - now
        gain = (left - self.startup_overhead) * self._speed(target)
        if gain <= left * self._speed(trial.atoms):
            return False
        trial.atoms, trial.resized_at = target, now
        return True

    def resources(self, trial_id: str) -> int:
        """Return the workers the trial trains on in its next epoch (its allocation)."""
        trial = self._trials.get(trial_id)
        return trial.atoms if trial is not None and trial.status == LIVE else 1

    # -- state ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Return the state as JSON values."""
        state = super().state_dict()
        state.update(
            settings=self._settings(),
            t0=self._t0,
            round_start=self._round_start,
            pending=list(self._pending),
            seconds_sum=self._seconds_sum,
            seconds_count=self._seconds_count,
            trials={t: dataclasses.asdict(tr) for t, tr in self._trials.items()},
        )
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output saved by a procedure with the same arguments.

        Raises:
            ConfigError: The state was saved with other settings.
        """
        saved, mine = dict(state["settings"]), self._settings()
        for key, value in mine.items():
            if saved.get(key) != value:
                raise ConfigError(
                    f"cannot resume HyperSched: the state has {key}={saved.get(key)!r} but "
                    f"this procedure has {key}={value!r}"
                )
        super().load_state_dict(state)
        self._t0 = float(state["t0"])
        self._round_start = float(state["round_start"])
        self._pending = [str(t) for t in state["pending"]]
        self._seconds_sum = float(state["seconds_sum"])
        self._seconds_count = int(state["seconds_count"])
        self._trials = {
            str(t): _Trial(
                status=str(tr["status"]),
                epochs=int(tr["epochs"]),
                atoms=int(tr["atoms"]),
                resized_at=float(tr["resized_at"]),
                seconds=float(tr["seconds"]),
                score=None if tr["score"] is None else float(tr["score"]),
                rungs={str(k): float(v) for k, v in tr["rungs"].items()},
                recorded=[str(k) for k in tr["recorded"]],
            )
            for t, tr in state["trials"].items()
        }

    def _settings(self) -> dict[str, Any]:
        return {
            "epochs": self.epochs,
            "deadline": self.deadline,
            "num_workers": self.num_workers,
            "eta": self.eta,
            "min_epochs": self.min_epochs,
        }


def _rank_score(score: float | None) -> float:
    return -math.inf if score is None else score
