"""SEER: sequential elimination with elastic resources (SEER §3, Alg. 1-3).

SEER (Misra et al., SoCC 2021) runs brackets of successive halving side by side under a
deadline ``T`` and a resource budget ``B`` (the option ``worker_seconds``): bracket ``i``
starts ``N[i]`` trials that each train on ``P[i]`` workers; all brackets share the stage
boundaries; stage ``k`` lasts ``t1 * eta**(k-1)``. :func:`seer_plan` computes the plan
(Alg. 2 and 3, pure, also used by the ``plan`` command); :class:`SEER` executes it (Alg. 1)
on Cerebro's round template.

Units: the plan is unit-free as long as ``deadline`` and ``t_min`` share a time unit and
``worker_seconds`` is in workers times that unit (the paper uses minutes and GPU-minutes).
The procedure uses seconds of experiment time and **worker-seconds**. The option was
called ``budget`` before; a config's ``budget`` now means dollars only (``elastic.budget``),
so the old name is read as ``worker_seconds`` with a warning (:data:`SEER.renamed_options`).

Execution on the round template (:class:`SEER`):

* The first :meth:`SEER.suggest` samples all ``sum(N)`` trials (Alg. 1 line 2); the first
  ``N[1]`` form bracket 1, the next ``N[2]`` bracket 2, and so on.
* Stage ``k`` ends at ``t1 * (eta**k - 1) / (eta - 1)`` seconds of experiment time from
  ``run`` (the plan's wall-clock boundaries, SEER §5). In it, a trial of bracket ``i``
  trains at most ``E = max(1, floor(t1 * eta**(k-1) * P[i] / epoch_seconds))`` epochs: the
  stage's resource-time in epochs of one worker (SEER's accounting: time ``t`` on ``p``
  workers costs ``p * t``; with sublinear scaling the stage's end cuts it short). Every trial
  trains at least one epoch per stage (the reason for ``t_min``, §5).
* Pacing: a round trains each live trial one epoch, so a trial on more workers would
  idle while one-worker trials finish theirs. Within a stage the members therefore
  progress in proportion to their ``E``: by the end of the stage's round ``r`` a member
  should have ``ceil(r * E / M)`` of its ``E`` epochs (``M`` the stage's largest ``E``);
  one that is ahead waits (``PAUSE``) and is resumed in the round it is due, so rounds
  with only high-parallelism trials are short, like their epochs.
* A member is done with the stage when it has its ``E`` epochs or when the stage's time
  is up: the next round, predicted to last as long as this one so far, would end after
  the stage's end (then every waiting member is done too).
* When the last trial of a stage is done, the stage closes (Alg. 1 lines 9-11): in each
  bracket the ``floor(N[i] / eta**k)`` worst are eliminated; the survivors are ranked and
  the best fill the brackets of stage ``k+1`` from the highest parallelism down (``floor(
  N[i] / eta**k)`` each): promotion of better trials to more workers. Survivors beyond those
  places (possible when floors do not divide evenly) are eliminated too. Survivors are
  resumed at the next round; the trial that closed the stage gets ``CONTINUE``, or ``STOP``
  when eliminated. Eliminated trials that had paused at the end of their stage stay
  paused: the template has no decision for a paused trial.
* After stage ``K`` (or at the deadline) every trial stops and the procedure is finished.
  ``epochs`` caps any trial's total epochs.
* :meth:`SEER.resources` is ``P[i]`` of the trial's current bracket, at most
  ``num_workers``.

Reading notes on the paper: Alg. 1 line 7 (``s <- floor(N[i]/eta**(k-1))``) is read as
``s <- s + ...`` and line 11's order is applied best-first from the highest bracket down,
which is the paper's intent ("trials that yield a lower loss value are assigned to brackets
with higher parallelism"); brackets to which Alg. 2 line 8 gives no trial are dropped
(``design.md``: in the §3.4 example Alg. 3 gives ``P = [1, 2, 4]`` and ``N = [8, 4, 0]``,
so ``N = [8, 4]``, ``P = [1, 2]``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from cerebro_spark.errors import ConfigError
from cerebro_spark.search._base import Clock, Decision, EpochReport, SearchProcedure, TrialSpec
from cerebro_spark.search._clock import deadline_start
from cerebro_spark.search._grid import check_space, positive_int
from cerebro_spark.search._hypersched import check_number, clean_score
from cerebro_spark.search._stages import Cohort, ExperimentSpec, StageClock, StageSpec
from cerebro_spark.search.space import SearchSpace

_EPS = 1e-9
"""Tolerance of the floors and comparisons of plan arithmetic (``80/17.14...`` is 4.666..)."""


@dataclasses.dataclass(frozen=True)
class SeerStage:
    """One stage (elimination round) of a SEER plan.

    Attributes:
        stage: 1-based index ``k``.
        start: Time the stage starts, ``t1 * (eta**(k-1) - 1) / (eta - 1)``.
        duration: ``t1 * eta**(k-1)``.
        trials: Trials per bracket, ``floor(N[i] / eta**(k-1))``.
        resources: Workers per trial per bracket, ``P[i]``.
        epochs: Epochs per trial per bracket when ``epoch_seconds`` was given, else empty.
    """

    stage: int
    start: float
    duration: float
    trials: tuple[int, ...]
    resources: tuple[int, ...]
    epochs: tuple[int, ...] = ()

    @property
    def end(self) -> float:
        """Time the stage ends."""
        return self.start + self.duration

    @property
    def workers(self) -> int:
        """Workers the stage keeps busy: ``sum(trials[i] * resources[i])``."""
        return sum(n * p for n, p in zip(self.trials, self.resources, strict=True))

    @property
    def cost(self) -> float:
        """Resource-time of the stage: ``workers * duration``."""
        return self.workers * self.duration

    def to_dict(self) -> dict[str, Any]:
        """Return the stage as JSON values."""
        brackets = [
            {"trials": n, "resources": p} for n, p in zip(self.trials, self.resources, strict=True)
        ]
        for bracket, epochs in zip(brackets, self.epochs, strict=False):
            bracket["epochs"] = epochs
        return {
            "stage": self.stage,
            "start": self.start,
            "end": self.end,
            "duration": self.duration,
            "brackets": brackets,
            "workers": self.workers,
            "cost": self.cost,
        }


@dataclasses.dataclass(frozen=True)
class SeerPlan:
    """The output of SEER Alg. 2 and 3 for one ``(T, B)``.

    Attributes:
        deadline: ``T``.
        worker_seconds: ``B`` (resource-time: worker-seconds for the procedure).
        eta: Elimination factor.
        v: Parallelism growth factor.
        p_min: Fewest resources per trial.
        p_max: Most resources per trial (``None``: unbounded).
        t_min: Shortest first stage.
        R_star: ``R*`` of Alg. 2 line 2.
        K: Number of stages, ``ceil(log_eta R*)``.
        t1: Duration of the first stage, ``t_min * R* * eta**-(K-1)``.
        B0: Budget of one bracket at ``p_min``, ``p_min * t_min * R* * K``.
        q_star: ``q*`` of Alg. 3 line 2.
        N: Trials started per kept bracket (Alg. 2 line 8).
        P: Resources per trial per kept bracket (Alg. 3).
        B: Budget of each kept bracket (Alg. 3).
        dropped: ``(P, B)`` of brackets to which Alg. 2 gives no trial.
        stages: The ``K`` stages.
    """

    deadline: float
    worker_seconds: float
    eta: float
    v: float
    p_min: int
    p_max: int | None
    t_min: float
    R_star: float
    K: int
    t1: float
    B0: float
    q_star: int
    N: tuple[int, ...]
    P: tuple[int, ...]
    B: tuple[float, ...]
    dropped: tuple[tuple[int, float], ...]
    stages: tuple[SeerStage, ...]

    @property
    def total_trials(self) -> int:
        """Trials sampled at the start, ``sum(N)``."""
        return sum(self.N)

    @property
    def cost(self) -> float:
        """Resource-time the plan spends (at most ``worker_seconds``, SEER Fact 1)."""
        return sum(stage.cost for stage in self.stages)

    @property
    def time(self) -> float:
        """Time the plan takes (at most ``deadline``, SEER Fact 1)."""
        return self.stages[-1].end

    def to_dict(self) -> dict[str, Any]:
        """Return the plan as JSON values (the ``plan --format json`` output)."""
        return {
            "procedure": "seer",
            "deadline": self.deadline,
            "worker_seconds": self.worker_seconds,
            "eta": self.eta,
            "v": self.v,
            "p_min": self.p_min,
            "p_max": self.p_max,
            "t_min": self.t_min,
            "R_star": self.R_star,
            "K": self.K,
            "t1": self.t1,
            "B0": self.B0,
            "q_star": self.q_star,
            "N": list(self.N),
            "P": list(self.P),
            "B": list(self.B),
            "dropped_brackets": [{"P": p, "B": b, "N": 0} for p, b in self.dropped],
            "total_trials": self.total_trials,
            "cost": self.cost,
            "time": self.time,
            "stages": [stage.to_dict() for stage in self.stages],
        }


def _r_star(
    deadline: float, budget: float, eta: float, p_min: int, t_min: float
) -> tuple[float, int]:
    """Alg. 2 lines 2-4: the largest ``R`` meeting both conditions and ``ceil(log_eta R)``.

    Returns ``(0, 0)`` when no ``R > 1`` qualifies.

    On ``(eta**(j-1), eta**j]`` the ceiling is ``j``, so the conditions read
    ``R * c_j <= T/t_min`` with ``c_j = eta/(eta-1) * (1 - eta**-j)`` and
    ``p_min * R * j <= B/t_min``; both sides grow with ``R``, so the feasible ``R`` form
    an interval and each segment's largest feasible ``R`` is a closed form (exact, where
    the paper suggests binary search).
    """
    best = (0.0, 0)
    j = 1
    while True:
        low, high = eta ** (j - 1), eta**j
        c_j = eta / (eta - 1) * (1 - eta**-j)
        r = min(high, deadline / t_min / c_j, budget / t_min / (p_min * j))
        if r <= low * (1 + _EPS):
            return best
        best = (r, j)
        j += 1


def _brackets(
    budget: float, b0: float, v: float, p_min: int, p_max: int | None
) -> tuple[int, list[int], list[float]]:
    """Alg. 3: ``q*``, bracket parallelism ``P`` and bracket budgets ``B``."""
    ratio = budget / b0
    q = 1
    while (q + 1) * v**q <= ratio * (1 + _EPS):
        q += 1
    if p_max is None or p_min * v ** (q - 1) < p_max:
        top = p_min * v**q if p_max is None else min(p_max, p_min * v**q)
        resources = [p_min * v**i for i in range(q)] + [top]
        budgets = [b0 * v ** (q - 1)] * q + [max(budget - b0 * q * v ** (q - 1), 0.0)]
        return q, [_whole(r) for r in resources], budgets
    if p_max == p_min:  # Alg. 3 leaves q'* undefined here: one bracket of p_min
        return q, [p_min], [budget]
    q_prime = 0
    while p_min * v ** (q_prime + 1) < p_max and v > 1:
        q_prime += 1
    resources = [p_min * v**i for i in range(q_prime + 1)] + [p_max]
    return q, [_whole(r) for r in resources], [budget / len(resources)] * len(resources)


def _whole(value: float) -> int:
    """Resources are integral (SEER §3.1): round ``p_min * v**i`` down."""
    return max(1, math.floor(value + _EPS))


def seer_plan(
    deadline: float,
    worker_seconds: float,
    *,
    eta: float = 2,
    v: float = 2,
    p_min: int = 1,
    p_max: int | None = None,
    t_min: float = 1.0,
    epoch_seconds: float | None = None,
) -> SeerPlan:
    """Compute SEER's plan: Alg. 2 (``K``, ``t1``, ``N``) with Alg. 3 (``B``, ``P``).

    Example (SEER §3.4): ``seer_plan(10, 80)`` gives ``R* = 40/7``, ``K = 3``,
    ``t1 = 10/7 = 1.43``, ``B0 = 120/7``, ``q* = 2``, ``P = [1, 2]``, ``N = [8, 4]``.

    Args:
        deadline: ``T``, in any time unit.
        worker_seconds: ``B``, in resources times that unit.
        eta: Elimination factor, ``> 1`` (the paper's default is 4; ours is 2).
        v: Parallelism growth factor, ``>= 1``.
        p_min: Fewest resources per trial, an integer ``>= 1``.
        p_max: Most resources per trial, ``>= p_min`` (``None``: unbounded).
        t_min: Shortest first stage, in the unit of ``deadline``.
        epoch_seconds: Time of one epoch on one resource, in that unit; when given each
            stage lists the epochs a trial of each bracket trains (stage time times ``P``
            over ``epoch_seconds``, at least 1).

    Raises:
        ConfigError: A bad argument, or a deadline or ``worker_seconds`` too small for one
            stage (the message gives the numbers).
    """
    deadline = check_number("deadline", deadline)
    budget = check_number("worker_seconds", worker_seconds)
    eta = check_number("eta", eta, minimum=1.0)
    v = check_number("v", v, minimum=1.0, strict=False)
    p_min = positive_int("p_min", p_min)
    if p_max is not None:
        p_max = positive_int("p_max", p_max)
        if p_max < p_min:
            raise ConfigError(f"p_max must be >= p_min, got p_max={p_max} < p_min={p_min}")
    t_min = check_number("t_min", t_min)
    if epoch_seconds is not None:
        epoch_seconds = check_number("epoch_seconds", epoch_seconds)
    r_star, k = _r_star(deadline, budget, eta, p_min, t_min)
    if k == 0:
        raise ConfigError(
            f"SEER plan infeasible: deadline T={deadline:g} and worker_seconds B={budget:g} "
            f"leave no stage; Alg. 2 needs R* > 1, i.e. T > t_min = {t_min:g} and "
            f"B > p_min * t_min = {p_min * t_min:g}"
        )
    t1 = t_min * r_star * eta ** -(k - 1)
    b0 = p_min * t_min * r_star * k
    q_star, resources, budgets = _brackets(budget, b0, v, p_min, p_max)
    trials = [math.floor(b / (k * t1 * p) + _EPS) for b, p in zip(budgets, resources, strict=True)]
    kept = [i for i, n in enumerate(trials) if n > 0]
    n_kept = tuple(trials[i] for i in kept)
    p_kept = tuple(resources[i] for i in kept)
    stages = []
    for stage in range(1, k + 1):
        duration = t1 * eta ** (stage - 1)
        epochs: tuple[int, ...] = ()
        if epoch_seconds is not None:
            epochs = tuple(max(1, math.floor(duration * p / epoch_seconds + _EPS)) for p in p_kept)
        stages.append(
            SeerStage(
                stage=stage,
                start=t1 * (eta ** (stage - 1) - 1) / (eta - 1),
                duration=duration,
                trials=tuple(math.floor(n / eta ** (stage - 1) + _EPS) for n in n_kept),
                resources=p_kept,
                epochs=epochs,
            )
        )
    return SeerPlan(
        deadline=deadline,
        worker_seconds=budget,
        eta=eta,
        v=v,
        p_min=p_min,
        p_max=p_max,
        t_min=t_min,
        R_star=r_star,
        K=k,
        t1=t1,
        B0=b0,
        q_star=q_star,
        N=n_kept,
        P=p_kept,
        B=tuple(budgets[i] for i in kept),
        dropped=tuple((resources[i], budgets[i]) for i in range(len(trials)) if trials[i] == 0),
        stages=tuple(stages),
    )


class SEER(SearchProcedure):
    """SEER's brackets of successive halving on the round template (SEER Alg. 1).

    The execution rules are in the module docstring; the plan is
    ``seer_plan(deadline, worker_seconds, ...)``, kept as :attr:`plan`.

    Args:
        space: The search space the trials are sampled from.
        epochs: Most epochs any trial trains.
        metric: Validation metric every report must carry.
        mode: ``"max"`` or ``"min"``.
        rng: Source of the samples.
        clock: Experiment clock in seconds; stage ends and the deadline count from its
            origin (the engine's: ``run``, start-up included,
            :mod:`~cerebro_spark.search._clock`), else from its value when the procedure
            is built.
        deadline: ``T``, seconds of experiment time (from ``run`` to the end).
        num_workers: Workers of the cluster: the default ``worker_seconds`` is
            ``num_workers * deadline`` (the resources of a fixed cluster, SEER Table 2) and
            the default ``p_max`` is ``num_workers``.
        worker_seconds: ``B``, SEER's resource budget in worker-seconds (default
            ``num_workers * deadline``); formerly ``budget``, a name now kept for dollars.
        eta: Elimination factor, ``> 1``.
        v: Parallelism growth factor, ``>= 1``.
        p_min: Fewest workers per trial.
        p_max: Most workers per trial (default ``num_workers``).
        t_min: Shortest first stage in seconds (default ``epoch_seconds``: SEER §3.2 sets
            it to about one or two epochs).
        epoch_seconds: Seconds of one epoch on one worker (converts stage time to epochs).

    Raises:
        ConfigError: An argument breaks its rule or the plan is infeasible.
    """

    renamed_options: ClassVar[Mapping[str, str]] = {"budget": "worker_seconds"}
    """Old option names still read, each as its new name (with a warning):
    :func:`~cerebro_spark.search.make_procedure` and config loading apply them."""

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
        worker_seconds: float | None = None,
        eta: float = 2,
        v: float = 2,
        p_min: int = 1,
        p_max: int | None = None,
        t_min: float | None = None,
        epoch_seconds: float = 1.0,
    ) -> None:
        super().__init__(metric, mode, rng, clock)
        self.space = check_space(space)
        self.epochs = positive_int("epochs", epochs)
        self.num_workers = positive_int("num_workers", num_workers)
        self.epoch_seconds = check_number("epoch_seconds", epoch_seconds)
        deadline = check_number("deadline", deadline)
        self.plan = seer_plan(
            deadline,
            self.num_workers * deadline if worker_seconds is None else worker_seconds,
            eta=eta,
            v=v,
            p_min=p_min,
            p_max=self.num_workers if p_max is None else p_max,
            t_min=self.epoch_seconds if t_min is None else t_min,
            epoch_seconds=self.epoch_seconds,
        )
        self._t0 = deadline_start(clock)
        self._round_start = 0.0
        self._stage = 0  # 0: not started; K + 1: done
        self._stage_round = 0  # rounds run in the current stage, this one included
        self._members: dict[str, int] = {}  # trial -> bracket index in the current stage
        self._order: list[str] = []  # the current stage's S_k, bracket by bracket
        self._start: dict[str, int] = {}  # member -> its epochs when the stage began
        self._targets: dict[str, int] = {}  # member -> epochs it reaches in this stage
        self._epochs: dict[str, int] = {}
        self._scores: dict[str, float] = {}
        self._live: list[str] = []
        self._paused: list[str] = []
        self._waiting: list[str] = []  # paused members with work left in this stage
        self._done: list[str] = []  # members done with this stage
        self._failed: set[str] = set()  # trials whose user code failed: out of the search

    @property
    def deadline(self) -> float:
        """``T`` in seconds."""
        return self.plan.deadline

    @property
    def stage(self) -> int:
        """Current stage ``k`` (0 before the first suggest, ``K + 1`` when done)."""
        return self._stage

    def bracket(self, trial_id: str) -> int | None:
        """Return the 0-based bracket of a trial of the current stage, else ``None``."""
        return self._members.get(trial_id)

    def _now(self) -> float:
        return float(self.clock()) - self._t0

    # -- the template ---------------------------------------------------------------------

    def suggest(self) -> list[TrialSpec]:
        """Sample all ``sum(N)`` trials at the first call (Alg. 1 line 2), then none.

        None either once the deadline has passed (start-up alone may take it): a finished
        procedure suggests nothing (the epoch template's rule).
        """
        self._round_start = self._now()
        self._stage_round += 1
        if self._stage != 0 or self.is_finished():
            return []
        specs = [self._new_trial(self.space.sample(self.rng)) for _ in range(sum(self.plan.N))]
        for spec in specs:
            self._epochs[spec.trial_id] = 0
        self._enter_stage(1, [spec.trial_id for spec in specs])
        self._stage_round = 1
        self._live, self._waiting = list(self._waiting), []
        return specs

    def resumed(self) -> list[str]:
        """Return the waiting members due to train in this round of the stage."""
        if self.is_finished():
            return []
        due = [t for t in self._waiting if self._epochs[t] < self._due(t, self._stage_round)]
        if not due and not self._live:
            due = list(self._waiting)
        for trial_id in due:
            self._waiting.remove(trial_id)
            self._paused.remove(trial_id)
            self._live.append(trial_id)
        return due

    def is_finished(self) -> bool:
        """After stage ``K`` or past the deadline."""
        return self._stage > self.plan.K or self._now() >= self.deadline

    def stage_spec(self) -> ExperimentSpec:
        """The plan's stages, one cohort per bracket.

        A cohort has the bracket's trials, the epochs each trains in the stage (at most
        ``epochs`` in all) and its workers per trial (at most ``num_workers``). The spec
        carries ``T`` (``deadline``: SEER stops then), ``epoch_seconds`` (the time per
        epoch the stages were shaped with) and the stage ends with the rules that apply
        them (``clock``): a run whose start-up or cluster makes the plan's stages late
        trains fewer epochs in them (at least one each), and the planner simulates that.
        """
        stages = []
        trained = [0] * len(self.plan.N)
        for stage in self.plan.stages:
            cohorts = []
            for i, (trials, p, e) in enumerate(
                zip(stage.trials, stage.resources, stage.epochs, strict=True)
            ):
                epochs = min(e, self.epochs - trained[i])
                if trials > 0 and epochs > 0:
                    cohorts.append(Cohort(trials, epochs, min(p, self.num_workers)))
                    trained[i] += epochs
            if cohorts:
                stages.append(StageSpec(tuple(cohorts)))
        clock = StageClock(
            ends=tuple(stage.end for stage in self.plan.stages),
            trials=tuple(stage.trials for stage in self.plan.stages),
            epochs=tuple(stage.epochs for stage in self.plan.stages),
            resources=tuple(min(p, self.num_workers) for p in self.plan.P),
            max_epochs=self.epochs,
            blocks=tuple(stage.epochs for stage in stages),
        )
        return ExperimentSpec(
            "seer",
            tuple(stages),
            deadline=self.deadline,
            epoch_seconds=self.epoch_seconds,
            clock=clock,
        )

    def resources(self, trial_id: str) -> int:
        """Return ``P`` of the trial's bracket (at most ``num_workers``), else 1."""
        bracket = self._members.get(trial_id)
        if bracket is None or trial_id not in self._live:
            return 1
        return min(self.plan.P[bracket], self.num_workers)

    def on_epoch_end(self, report: EpochReport) -> Decision:
        """Continue, wait for a later round of the stage, or close it (module rules).

        Raises:
            ValueError: The trial is not live or ``report.epoch`` is out of sequence.
            ConfigError: The report lacks the metric.
        """
        trial_id = report.trial_id
        if trial_id not in self._live:
            state = "paused or stopped" if trial_id in self._epochs else "unknown"
            raise ValueError(f"report for trial {trial_id!r}, which is {state}")
        if report.epoch != self._epochs[trial_id] + 1:
            raise ValueError(
                f"trial {trial_id}: report.epoch must be {self._epochs[trial_id] + 1} (its "
                f"completed epochs), got {report.epoch}"
            )
        value = clean_score(self.score({self.metric: self.metric_value(report)}))
        self._epochs[trial_id], self._scores[trial_id] = report.epoch, value
        now = self._now()
        self._live.remove(trial_id)
        if now >= self.deadline:
            self._stage = self.plan.K + 1
            return Decision.STOP
        stage_end = self.plan.stages[self._stage - 1].end
        if now + max(now - self._round_start, 0.0) > stage_end + _EPS:  # time is up
            self._done += self._waiting
            self._waiting = []
        elif self._epochs[trial_id] < self._targets[trial_id]:
            if self._epochs[trial_id] < self._due(trial_id, self._stage_round + 1):
                self._live.append(trial_id)
                return Decision.CONTINUE
            return self._wait(trial_id)
        self._done.append(trial_id)
        if self._live or self._waiting:
            self._paused.append(trial_id)
            return Decision.PAUSE
        self._close_stages()
        if self._stage > self.plan.K or trial_id not in self._members:
            return Decision.STOP
        if trial_id in self._waiting:
            self._waiting.remove(trial_id)
            self._live.append(trial_id)
            return Decision.CONTINUE
        self._paused.append(trial_id)
        return Decision.PAUSE

    def on_trial_failed(self, trial_id: str) -> None:
        """The failed trial is out of the search: it ranks last and enters no later stage.

        A stage that it alone held open closes now (the next stage's members are then
        resumed by :meth:`resumed`).
        """
        if trial_id not in self._live:
            return
        self._live.remove(trial_id)
        self._failed.add(trial_id)
        self._scores.pop(trial_id, None)  # no score ranks last
        self._done.append(trial_id)
        if not self._live and not self._waiting and self._stage <= self.plan.K:
            self._close_stages()

    def _wait(self, trial_id: str) -> Decision:
        self._waiting.append(trial_id)
        self._paused.append(trial_id)
        return Decision.PAUSE

    def _due(self, trial_id: str, stage_round: int) -> int:
        """Epochs a member should have by the end of round ``stage_round`` of the stage.

        The stage's members progress in proportion to their stage epochs ``E``: after
        round ``r`` a member has ``ceil(r * E / M)`` (at most ``E``), ``M`` the stage's
        largest ``E``. A member that is ahead waits a round, so rounds with only the
        high-parallelism members are short, as their epochs are.
        """
        stage_epochs = self._targets[trial_id] - self._start[trial_id]
        most = max(self._targets[t] - self._start[t] for t in self._order)
        ahead = (stage_round * stage_epochs + most - 1) // most if most else 0
        return self._start[trial_id] + min(stage_epochs, ahead)

    # -- stages ---------------------------------------------------------------------------

    def _enter_stage(self, stage: int, ordered: list[str]) -> None:
        """Make ``ordered`` (S_k, bracket by bracket) stage ``stage``'s members.

        Members with epochs to train wait to be resumed; the others are done at once.
        """
        plan_stage = self.plan.stages[stage - 1]
        self._stage, self._stage_round = stage, 0
        self._members, self._order, self._start, self._targets = {}, [], {}, {}
        self._waiting, self._done = [], []
        first = 0
        for bracket, size in enumerate(plan_stage.trials):
            for trial_id in ordered[first : first + size]:
                done = self._epochs[trial_id]
                self._members[trial_id] = bracket
                self._order.append(trial_id)
                self._start[trial_id] = done
                self._targets[trial_id] = min(self.epochs, done + plan_stage.epochs[bracket])
                (self._waiting if self._targets[trial_id] > done else self._done).append(trial_id)
            first += size

    def _close_stages(self) -> None:
        """Close the current stage (and any next one in which no member can train)."""
        while True:
            survivors = [t for t in self._eliminate() if t not in self._failed]
            if self._stage == self.plan.K:
                self._stage = self.plan.K + 1
                self._members, self._waiting = {}, []
                return
            # Best first into the highest bracket: fill S_{k+1} from its end.
            places = sum(self.plan.stages[self._stage].trials)
            self._enter_stage(self._stage + 1, list(reversed(survivors[:places])))
            if self._waiting:
                return

    def _eliminate(self) -> list[str]:
        """Alg. 1 line 9 per bracket, then line 11: the survivors, best first."""
        eta_k = self.plan.eta**self._stage
        survivors: list[str] = []
        for bracket, n_start in enumerate(self.plan.N):
            members = [t for t in self._order if self._members[t] == bracket]
            drop = math.floor(n_start / eta_k + _EPS)
            survivors += self._ranked(members)[: max(len(members) - drop, 0)]
        return self._ranked(survivors)

    def _ranked(self, trials: list[str]) -> list[str]:
        return sorted(trials, key=lambda t: (-self._scores.get(t, -math.inf), t))

    # -- state ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Return the state as JSON values."""
        state = super().state_dict()
        state.update(
            plan={"N": list(self.plan.N), "P": list(self.plan.P), "K": self.plan.K},
            epochs_cap=self.epochs,
            t0=self._t0,
            round_start=self._round_start,
            stage=self._stage,
            stage_round=self._stage_round,
            members=dict(self._members),
            order=list(self._order),
            start=dict(self._start),
            targets=dict(self._targets),
            epochs=dict(self._epochs),
            scores=dict(self._scores),
            live=list(self._live),
            paused=list(self._paused),
            waiting=list(self._waiting),
            done=list(self._done),
            failed=sorted(self._failed),
        )
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output saved by a procedure with the same arguments.

        Raises:
            ConfigError: The state was saved with another plan or epoch cap.
        """
        mine = {"N": list(self.plan.N), "P": list(self.plan.P), "K": self.plan.K}
        if dict(state["plan"]) != mine or state["epochs_cap"] != self.epochs:
            raise ConfigError(
                f"cannot resume SEER: the state has plan {state['plan']} and epochs "
                f"{state['epochs_cap']} but this procedure has plan {mine} and epochs "
                f"{self.epochs}"
            )
        super().load_state_dict(state)
        self._t0 = float(state["t0"])
        self._round_start = float(state["round_start"])
        self._stage = int(state["stage"])
        self._stage_round = int(state["stage_round"])
        self._members = {str(t): int(b) for t, b in state["members"].items()}
        self._order = [str(t) for t in state["order"]]
        self._start = {str(t): int(n) for t, n in state["start"].items()}
        self._targets = {str(t): int(n) for t, n in state["targets"].items()}
        self._epochs = {str(t): int(n) for t, n in state["epochs"].items()}
        self._scores = {str(t): float(s) for t, s in state["scores"].items()}
        self._live = [str(t) for t in state["live"]]
        self._paused = [str(t) for t in state["paused"]]
        self._waiting = [str(t) for t in state["waiting"]]
        self._done = [str(t) for t in state["done"]]
        self._failed = {str(t) for t in state.get("failed", [])}  # absent before failures
