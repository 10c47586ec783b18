"""Run any registered search procedure on the simulated workload in virtual time.

The loop is the engine's epoch template (:class:`~cerebro_spark.search.EpochTemplate`, the
one the driver uses, with the same rules and errors): each round the procedure's
:meth:`~cerebro_spark.search.SearchProcedure.suggest` and
:meth:`~cerebro_spark.search.SearchProcedure.resumed` are asked, every live trial trains one
epoch on :meth:`~cerebro_spark.search.SearchProcedure.resources` workers (at most the
cluster's), the round lasts the list-scheduled makespan of those epochs
(:mod:`cerebro_spark.simulate._cluster`), and then each live trial's report goes to
:meth:`~cerebro_spark.search.SearchProcedure.on_epoch_end`. Time is a
:class:`~cerebro_spark.simulate.VirtualClock` injected into the procedure. The run ends at
the deadline (a round that would end later is cut there: only epochs finished by then
count), when the procedure is finished with nothing live, or when it stalls.

The result is the best score any trial reached by the deadline, the quantity of
HyperSched Fig. 5/8 and SEER Table 2.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cerebro_spark.errors import ConfigError
from cerebro_spark.search import (
    Decision,
    EpochReport,
    EpochTemplate,
    TrialStatus,
    make_procedure,
    procedure_options,
)
from cerebro_spark.search._hypersched import check_number, check_scaling
from cerebro_spark.simulate._cluster import EpochJob, VirtualClock, epoch_seconds, schedule_round
from cerebro_spark.simulate._workload import SIMULATED_SPACE, Curve, ParametricWorkload

_PROCEDURE_STREAM = 1
METRIC = "score"
"""The metric the simulated trials report (maximised)."""


@dataclasses.dataclass(frozen=True)
class SimulationSettings:
    """The simulated cluster, workload and deadline.

    Attributes:
        deadline: Seconds of virtual time.
        num_workers: Workers of the cluster (HyperSched's atoms).
        scaling: Speed-up of a trial on ``k`` workers: ``"linear"``, ``"sqrt"``, ``"none"``.
        overhead: Seconds a trial loses when it starts or its worker count changes.
        epochs: Epoch budget per trial passed to the procedures (``R``).
        epoch_seconds: Seconds of one epoch on one worker.
        steps_per_epoch: Steps ``k`` of the score model per epoch.
    """

    deadline: float
    num_workers: int
    scaling: str = "linear"
    overhead: float = 0.0
    epochs: int = 50
    epoch_seconds: float = 1.0
    steps_per_epoch: int = 10

    def __post_init__(self) -> None:
        check_number("deadline", self.deadline)
        check_scaling(self.scaling)
        check_number("overhead", self.overhead, strict=False)
        check_number("epoch_seconds", self.epoch_seconds)
        for name in ("num_workers", "epochs", "steps_per_epoch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")

    def procedure_defaults(self) -> dict[str, Any]:
        """Options every procedure gets when it accepts them (the profile it may use)."""
        return {
            "deadline": self.deadline,
            "num_workers": self.num_workers,
            "epoch_seconds": self.epoch_seconds,
            "scaling": self.scaling,
            "startup_overhead": self.overhead,
        }


@dataclasses.dataclass(frozen=True)
class SimulationResult:
    """One simulated run.

    Attributes:
        procedure: Registered name of the procedure.
        seed: Seed of the workload and of the procedure's generator.
        best_score: Best score reached by the deadline (NaN when no epoch finished).
        best_trial: The trial that reached it.
        trials: Trials the procedure started.
        rounds: Rounds run.
        trial_epochs: Epochs finished by the deadline, over all trials.
        end: Virtual seconds when the run ended.
        reason: ``"deadline"``, ``"finished"`` or ``"stalled"``.
    """

    procedure: str
    seed: int
    best_score: float
    best_trial: str | None
    trials: int
    rounds: int
    trial_epochs: int
    end: float
    reason: str


@dataclasses.dataclass(frozen=True)
class ProcedureSummary:
    """A procedure's results over several seeds (mean and sample std of the best score)."""

    procedure: str
    results: tuple[SimulationResult, ...]

    @property
    def scores(self) -> list[float]:
        """Best score of each seed."""
        return [r.best_score for r in self.results]

    @property
    def mean(self) -> float:
        """Mean best score."""
        return float(np.mean(self.scores))

    @property
    def std(self) -> float:
        """Sample standard deviation of the best score (0 for one seed)."""
        return float(np.std(self.scores, ddof=1)) if len(self.results) > 1 else 0.0

    @property
    def mean_trials(self) -> float:
        """Mean number of trials started."""
        return float(np.mean([r.trials for r in self.results]))


def _options(
    name: str, settings: SimulationSettings, overrides: Mapping[str, Any] | None
) -> dict[str, Any]:
    accepted = procedure_options(name)
    options = {k: v for k, v in settings.procedure_defaults().items() if k in accepted}
    if accepted.get("num_trials"):  # required (random search): one trial per worker, twice
        options["num_trials"] = 2 * settings.num_workers
    options.update(overrides or {})
    return options


def run_simulation(
    procedure: str,
    settings: SimulationSettings,
    *,
    seed: int,
    options: Mapping[str, Any] | None = None,
) -> SimulationResult:
    """Run one registered procedure on the simulated workload until its deadline.

    Args:
        procedure: A name registered in :data:`cerebro_spark.search.PROCEDURES`.
        settings: Cluster, workload and deadline.
        seed: Seeds the workload and the procedure's generator.
        options: The procedure's own options; ``deadline``, ``num_workers``,
            ``epoch_seconds``, ``scaling`` and ``startup_overhead`` are filled in from
            ``settings`` when the procedure accepts them and ``options`` does not set them.

    Raises:
        ConfigError: Unknown procedure or a bad option.
        ProcedureContractError: The procedure broke a rule of the epoch template (resumed
            a trial that is not paused, asked for resources that are not an integer >= 1).
    """
    workload = ParametricWorkload(seed=seed, steps_per_epoch=settings.steps_per_epoch)
    clock = VirtualClock()
    proc = make_procedure(
        procedure,
        space=SIMULATED_SPACE,
        epochs=settings.epochs,
        metric=METRIC,
        mode="max",
        rng=np.random.default_rng([seed, _PROCEDURE_STREAM]),
        clock=clock,
        **_options(procedure, settings, options),
    )
    template = EpochTemplate(proc, name=procedure, epochs=settings.epochs)
    curves: dict[str, Curve] = {}
    steps: dict[str, int] = {}
    epochs: dict[str, int] = {}
    workers: dict[str, int] = {}
    status: dict[str, TrialStatus] = {}  # every trial started
    live: list[str] = []  # in the order the round's epochs are list-scheduled
    best, best_trial = -math.inf, None
    rounds = trial_epochs = 0
    reason = "deadline"
    while clock.now < settings.deadline:
        opening = template.open_round(status)
        for spec in opening.added:
            curves[spec.trial_id] = workload.curve(spec.params)
            steps[spec.trial_id] = steps.get(spec.clone_from, 0) if spec.clone_from else 0
            epochs[spec.trial_id] = 0
            status[spec.trial_id] = "running"
            live.append(spec.trial_id)
        for trial_id in opening.resumed:
            status[trial_id] = "running"
            live.append(trial_id)
        if not live:
            reason = "stalled" if opening.stalled else "finished"
            break
        jobs = []
        for trial_id in live:
            # a trial on more workers than the cluster has trains on all of them
            k = min(template.resources(trial_id), settings.num_workers)
            seconds = epoch_seconds(
                settings.epoch_seconds,
                k,
                settings.scaling,
                overhead=settings.overhead,
                changed=k != workers.get(trial_id),
            )
            workers[trial_id] = k
            jobs.append(EpochJob(trial_id, k, seconds))
        schedule = schedule_round(jobs, settings.num_workers)
        start, rounds = clock.now, rounds + 1
        scores: dict[str, float] = {}
        for trial_id in live:
            steps[trial_id] += settings.steps_per_epoch
            epochs[trial_id] += 1
            scores[trial_id] = curves[trial_id].score(steps[trial_id])
            if start + schedule.finish[trial_id] <= settings.deadline:
                trial_epochs += 1
                if scores[trial_id] > best:
                    best, best_trial = scores[trial_id], trial_id
        if start + schedule.makespan > settings.deadline:
            clock.now = settings.deadline
            break
        clock.now = start + schedule.makespan
        for trial_id in list(live):
            score = scores[trial_id]
            metrics = {METRIC: score, "loss": 1.0 - score}
            report = EpochReport(trial_id, epochs[trial_id], metrics, settings.epoch_seconds)
            decision, status[trial_id] = template.close_epoch(report)
            if decision is not Decision.CONTINUE:
                live.remove(trial_id)
    return SimulationResult(
        procedure=procedure,
        seed=seed,
        best_score=best if best_trial is not None else math.nan,
        best_trial=best_trial,
        trials=len(curves),
        rounds=rounds,
        trial_epochs=trial_epochs,
        end=clock.now,
        reason=reason,
    )


def compare_procedures(
    procedures: Sequence[str],
    settings: SimulationSettings,
    *,
    seeds: int | Sequence[int],
    options: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[ProcedureSummary]:
    """Simulate each procedure on the same seeds (so the same landscapes).

    Args:
        procedures: Registered names.
        settings: Cluster, workload and deadline.
        seeds: Number of seeds (``0 .. seeds-1``) or the seeds themselves.
        options: Per-procedure options, by procedure name.
    """
    seed_list = list(range(seeds)) if isinstance(seeds, int) else list(seeds)
    if not seed_list:
        raise ConfigError("seeds must name at least one seed")
    options = options or {}
    return [
        ProcedureSummary(
            name,
            tuple(
                run_simulation(name, settings, seed=s, options=options.get(name)) for s in seed_list
            ),
        )
        for name in procedures
    ]


def format_table(summaries: Sequence[ProcedureSummary], settings: SimulationSettings) -> str:
    """Return a Markdown table: procedure, best score mean ± std, trials, seeds."""
    lines = [
        f"best score at the deadline: T={settings.deadline:g} s, N={settings.num_workers} "
        f"workers, scaling={settings.scaling}, overhead={settings.overhead:g} s, "
        f"R={settings.epochs} epochs of {settings.epoch_seconds:g} s",
        "",
        "| procedure | best score (mean ± std) | trials (mean) | seeds |",
        "|:--|--:|--:|--:|",
    ]
    for s in summaries:
        lines.append(
            f"| {s.procedure} | {s.mean:.4f} ± {s.std:.4f} | {s.mean_trials:.1f} "
            f"| {len(s.results)} |"
        )
    return "\n".join(lines)


def summaries_to_json(summaries: Sequence[ProcedureSummary], settings: SimulationSettings) -> str:
    """Return the summaries and settings as a JSON document."""
    document = {
        "settings": dataclasses.asdict(settings),
        "results": [
            {
                "procedure": s.procedure,
                "mean": s.mean,
                "std": s.std,
                "mean_trials": s.mean_trials,
                "runs": [dataclasses.asdict(r) for r in s.results],
            }
            for s in summaries
        ],
    }
    return json.dumps(document, indent=2, allow_nan=True)
