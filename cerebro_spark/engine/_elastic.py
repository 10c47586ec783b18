"""Elastic execution: the cluster follows the plan between stages, the meter bills it.

With ``elastic:`` in a config, :func:`elastic_run` plans the search before anything starts
(:func:`cerebro_spark.elastic.plan` on the procedure's stages, from a profile file or a
pilot), starts the cluster at the first stage's size, and hands the engine an
:class:`ElasticController` as its stage hook. At every stage boundary the controller:

1. closes the stage that ended: ``stage_actual`` with its measured seconds, executors and
   dollars (the :class:`~cerebro_spark.cluster.CostMeter`'s bill at the boundary minus the
   bill at the stage's start) beside the ``stage_plan`` logged at the start;
2. re-plans the remaining stages from the measured state (time left, money left, workers
   running) when the stage's seconds drifted from the plan by more than ``replan_drift``
   or a resize failed;
3. stops the search, with a ``search_stopped`` event that says why, when the next stage
   would overrun the budget;
4. resizes to the next stage's workers. To shrink it retires the idle workers holding the
   fewest sole-copy partitions (their partitions are re-homed on the others, their tasks
   end normally) and only then releases their executors, so Spark re-runs nothing. To grow
   it asks early: from the round at whose start the next stage is less than the
   provider's latency away, so that the workers are ready when the stage starts; at the
   boundary it waits for them up to ``resize_timeout`` and otherwise goes on with what it
   has. A lost executor is survived as always (Q/Q').

Every round also checks the budget against the bill so far plus the round ahead, and the
run calibrates early (:mod:`cerebro_spark.elastic._calibration`): the controller listens to
the event log (:meth:`ElasticController.observe`); at its first boundary it compares the
measured start-up with the first stage's planned lead, and at the first boundary after a
trial-epoch's worth of units with the profile's trial-epoch. A measurement off by more than
``replan_drift`` replaces the profile's values (a ``calibration`` event) and re-plans at
once: from the first stage for start-up, from the stage after the current one in the middle
of a stage (its time left less the current stage's rest at the measured pace).

After the last round it logs the last ``stage_actual`` (with its ``parts``: start-up or
resizing, units, hops, validation, waiting; :mod:`cerebro_spark.elastic._summary`) and an
``elastic_summary``: the actual seconds and dollars against the deadline, the budget, the
*first* plan and the *last* re-plan, each re-plan with its reason, and a line per missed
deadline or budget saying by how much and why, each also logged as a WARNING
(:func:`cost_table` renders the predicted-vs-actual table from the log).

Mapping a plan's stages onto the engine's rounds: a stage of ``e`` epochs is ``e`` rounds
(one epoch of every live trial per round), so stage ``k`` starts at the round numbered
``sum(epochs of stages before k)``.

Where the manager will have nothing to resize (a Spark Connect session on serverless
compute: :attr:`~cerebro_spark.engine._managers.ManagerEntry.given_capacity`), the run
takes the capacity the session gives as given: every stage is planned, re-planned and run
at those workers (:func:`plan_at_capacity`), priced at the config's instance type, and
the plan is refused, saying why and what to do, when it misses the deadline or the
budget there. Where the pool does not see the executors a grow adds (Spark Connect:
:attr:`~cerebro_spark.cluster.Capabilities.workers_follow`), the controller waits for them
and starts their workers itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import wait as wait_futures
from pathlib import Path
from typing import Any

from cerebro_spark.backends import Backend, WorkerInfo
from cerebro_spark.cluster import ClusterManager, CostMeter, ResizeTimeout
from cerebro_spark.driver._config import ElasticConfig, ExperimentConfig, pack_size
from cerebro_spark.driver._procedure import experiment_spec
from cerebro_spark.driver._stage import Stage, StageDirective
from cerebro_spark.elastic import (
    FASTEST_SLACK,
    Calibration,
    Outcome,
    Plan,
    PlanInfeasible,
    PriceCatalog,
    Profile,
    Simulator,
    TypeProfile,
    calibrated,
    load_catalog,
    load_change,
    load_profile,
    machine_load,
    partition_moves,
    plan,
    plan_deadline,
    planned_parts,
    startup_calibration,
    summarize,
    units_calibration,
)
from cerebro_spark.engine._managers import BackendFactory, GivenCapacity, manager_entry
from cerebro_spark.engine._pilot import pilot_profile
from cerebro_spark.errors import ConfigError
from cerebro_spark.search import ExperimentSpec
from cerebro_spark.training import choose_pack_size

logger = logging.getLogger(__name__)

_POLL_S = 0.5
PILOT_SCALE_SECONDS = 10.0
"""Provider latency (request to executor) an automatic pilot assumes: a fixed cluster
cannot measure it; write a profile by hand where your provider's differs."""


@dataclasses.dataclass(frozen=True)
class StagePlan:
    """One stage of the plan being followed.

    Attributes:
        index: Its number (0-based, as the ``stage`` of the log's events; users read
            it + 1, as ``plan`` prints it).
        trials: Live trials.
        epochs: Epochs (rounds) it spans.
        workers: Executors (one worker each) it runs on.
        start: Predicted seconds from ``run`` to its training start.
        end: Predicted seconds from ``run`` to its end.
        usd: Predicted dollars charged to it.
    """

    index: int
    trials: int
    epochs: int
    workers: int
    start: float
    end: float
    usd: float
    begin: float = 0.0

    @property
    def seconds(self) -> float:
        """Predicted seconds of its span, resizes included.

        From the end of the stage before (or the moment the plan was made) to its end.
        """
        return self.end - self.begin

    def to_event(self, replan: int) -> dict[str, Any]:
        """The ``stage_plan`` event's fields."""
        return {
            "stage": self.index,
            "trials": self.trials,
            "epochs": self.epochs,
            "workers": self.workers,
            "start": round(self.start, 3),
            "end": round(self.end, 3),
            "usd": round(self.usd, 6),
            "begin": round(self.begin, 3),
            "replan": replan,
        }


def stages_of(outcome: Outcome, first: int = 0, offset: float = 0.0) -> list[StagePlan]:
    """The stages of a simulated allocation, numbered from ``first``.

    Times are shifted by ``offset`` (a re-plan's t = 0 is the moment it was made); the
    first stage's span begins there.
    """
    stages = []
    begin = offset
    for i, s in enumerate(outcome.stages):
        end = offset + s.end
        stages.append(
            StagePlan(first + i, s.trials, s.epochs, s.workers, offset + s.start, end, s.usd, begin)
        )
        begin = end
    return stages


def stages_from_json(raw: Mapping[str, Any], spec: ExperimentSpec, where: str) -> list[StagePlan]:
    """The stages of a plan written by ``cerebro-spark plan --format json``.

    Raises:
        ConfigError: The file is not a feasible plan of this search's stages.
    """
    if not raw.get("feasible", False):
        raise ConfigError(f"plan {where} is not feasible (feasible: {raw.get('feasible')!r})")
    stages = raw.get("stages")
    if not isinstance(stages, list) or len(stages) != spec.num_stages():
        raise ConfigError(
            f"plan {where} has {len(stages) if isinstance(stages, list) else 'no'} stages; "
            f"this config's {spec.procedure} search has {spec.num_stages()}"
        )
    out: list[StagePlan] = []
    for i, (stage, expected) in enumerate(zip(stages, spec.stages, strict=True)):
        if (stage.get("trials"), stage.get("epochs")) != (expected.trials, expected.epochs):
            raise ConfigError(
                f"plan {where}: stage {i + 1} plans {stage.get('trials')} trials x "
                f"{stage.get('epochs')} epochs, but this config's stage {i + 1} has "
                f"{expected.trials} x {expected.epochs}"
            )
        workers = stage.get("workers")
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ConfigError(f"plan {where}: stage {i + 1} workers must be an integer >= 1")
        out.append(
            StagePlan(
                i,
                expected.trials,
                expected.epochs,
                workers,
                float(stage.get("start", 0.0)),
                float(stage.get("end", 0.0)),
                float(stage.get("usd", 0.0)),
                out[-1].end if out else 0.0,
            )
        )
    return out


def victims_to_retire(workers: Mapping[str, WorkerInfo], count: int) -> list[str]:
    """The ``count`` workers to retire: those holding the fewest sole-copy partitions.

    Chosen one at a time (a partition becomes a sole copy once its other holder is
    chosen); ties go to the worker with fewer partitions, then the newest.
    """
    left = dict(workers)
    chosen: list[str] = []
    for _ in range(min(count, max(0, len(left) - 1))):

        def cost(worker: str) -> tuple[int, int, int]:
            others = [i.partitions for w, i in left.items() if w != worker]
            sole = sum(1 for p in left[worker].partitions if not any(p in o for o in others))
            index = int(worker[1:]) if worker[1:].isdigit() else 0
            return (sole, len(left[worker].partitions), -index)

        victim = min(sorted(left), key=cost)
        chosen.append(victim)
        del left[victim]
    return chosen


class ElasticController:
    """The stage hook of an elastic run (see the module docstring).

    Args:
        manager: Resizes the cluster.
        meter: Bills it (started by the controller, stopped after the last stage).
        stages: The plan being followed.
        deadline: The config's deadline: seconds from ``run`` to the end, start-up
            included (:attr:`ExperimentConfig.deadline`).
        budget: Most dollars (``None``: no limit).
        started_at: Unix time at which this session's ``run`` (or ``resume``) was called.
            Times since ``run`` (the plan's t = 0, stage ends, the re-plan's time left) are
            experiment time, the driver's clock that every :class:`Stage` carries
            (``Stage.seconds``): the same clock the procedure's deadline, progress and the
            report read. ``started_at`` places this session's start on it, where its first
            stage begins (its start-up is its own).
        lead_seconds: Seconds from a request to a new worker ready (provider latency,
            worker start, partition loads): how early growth is asked for.
        resize_timeout: Seconds a boundary waits for the cluster to reach its size.
        replan_drift: Share of drift in a stage's seconds, start-up or first units that
            triggers a re-plan.
        replan: Plans the remaining stages from ``(index, time left, money left,
            workers running, profile)``; returns the new stages (numbered from ``index``,
            times from the plan's t = 0) or raises ``PlanInfeasible``. ``None``: never
            re-plan.
        plan_fields: Extra fields of the ``elastic_plan`` event.
        profile: The profile the stages were planned with (``None``: no calibration,
            no planned parts but the lead).
        instance_type: The type of ``profile`` the plan uses.
        clock: Unix time (for tests).
    """

    def __init__(
        self,
        manager: ClusterManager,
        meter: CostMeter,
        stages: list[StagePlan],
        *,
        deadline: float,
        budget: float | None,
        started_at: float,
        lead_seconds: float,
        resize_timeout: float,
        replan_drift: float,
        replan: Callable[[int, float, float | None, int, Profile | None], list[StagePlan]]
        | None = None,
        plan_fields: Mapping[str, Any] | None = None,
        profile: Profile | None = None,
        instance_type: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.manager = manager
        self.meter = meter
        self.stages = list(stages)
        self.deadline = deadline
        self.budget = budget
        self.started_at = started_at
        self.lead_seconds = lead_seconds
        self.resize_timeout = resize_timeout
        self.replan_drift = replan_drift
        self._replan = replan
        self._plan_fields = dict(plan_fields or {})
        self._clock = clock
        self._first_rounds = self._rounds_of(self.stages)
        self._current: int | None = None
        self._stage_began = 0.0  # experiment seconds
        self._session_began = 0.0  # experiment seconds at this session's run (or resume)
        self._stage_usd = 0.0
        self._stage_executors = 0
        self._grow_requested: int | None = None
        self._replans = 0
        self._failed_resizes = 0
        self._stopped: str | None = None
        self.profile = profile
        self.instance_type = instance_type
        self._first_plan = self._totals()
        self._first_stages = {s.index: s for s in self.stages}
        self._replan_log: list[dict[str, Any]] = []
        self._first_typed = self._typed()
        self._stage_typed = {s.index: self._first_typed for s in self.stages}
        # What the event log measured (observe): the calibration's and the stage's parts.
        self._units: list[float] = []
        self._hops: list[float] = []
        self._validations: list[float] = []
        self._validating: dict[tuple[str, int], tuple[float, int]] = {}
        self._work = dict.fromkeys(("units", "hops", "validation"), 0.0)
        self._lead = 0.0  # seconds of the open stage's start-up or resize
        self._checked: set[str] = set()
        self._first_of_session = True
        self._actuals: list[dict[str, Any]] = []

    # -- the hook ----------------------------------------------------------------------------

    def __call__(self, stage: Stage, backend: Backend) -> StageDirective:
        """Resize at a stage boundary; check the budget at every round."""
        events: list[tuple[str, Mapping[str, Any]]] = []
        now = stage.seconds  # experiment time: seconds since run
        if self._current is None:
            self.meter.start()
            self._session_began = max(0.0, now - (self._clock() - self.started_at))
            events.append(("elastic_plan", self._plan_event()))
            events += [("stage_plan", s.to_event(0)) for s in self.stages]
        if stage.final:
            if self._current is not None:
                events.append(("stage_actual", self._close_stage(now)))
            self.meter.stop()
            summary = self._summary(now)
            for line in summary["misses"]:
                logger.warning("%s", line)
            events.append(("elastic_summary", summary))
            return StageDirective(tuple(events))
        index = self._stage_of(stage.round)
        fresh_stage = index != self._current
        off = self._calibrate(now, index, fresh_stage, events)
        if fresh_stage:
            if self._current is not None:
                actual = self._close_stage(now)
                events.append(("stage_actual", actual))
                events += self._maybe_replan(index, backend, actual, now, off)
            elif off:  # the first boundary: start-up (or a resumed run's units) measured
                events += self._replan_from(index, [c.reason for c in off], now, backend)
            stop = self._over_budget(self._planned(index).usd, f"stage {index + 1}")
            if stop is not None:
                return StageDirective(tuple(events), stop)
            self._open_stage(index, now)  # the resize is the stage's first step (its SCALE)
            resized = self._resize(self._planned(index).workers, backend, index)
            self._lead += sum(float(f.get("seconds", 0.0)) for _, f in resized)
            events += resized
            self._stage_executors = len(self.manager.executors())
        else:
            if off:  # mid-stage: the stages after this one, at the measured pace
                ahead = max(0.0, self._planned(index).end - now) * off[-1].ratio
                events += self._replan_from(
                    index + 1, [c.reason for c in off], now, backend, ahead=ahead
                )
            stop = self._over_budget(self._round_usd(index), f"round {stage.round + 1}")
            if stop is not None:
                return StageDirective(tuple(events), stop)
        self._maybe_grow_early(stage.round, index)
        return StageDirective(tuple(events))

    def observe(self, record: Mapping[str, Any]) -> None:
        """An event log listener: what the units measured (calibration, stage parts).

        Train units count toward ``units`` (compute) and ``hops`` (checkpoint I/O), and,
        outside groups, toward the calibration; validation units toward ``validation``,
        a trial's validation after an epoch once all its ``P`` units are in.
        """
        if record.get("event") != "unit_end":
            return
        seconds, io = float(record.get("seconds", 0.0)), float(record.get("io_seconds", 0.0))
        if record.get("kind") == "train":
            self._work["units"] += max(0.0, seconds - io)
            self._work["hops"] += io
            if record.get("group") is None:
                self._units.append(max(0.0, seconds - io))
                self._hops.append(io)
            return
        self._work["validation"] += seconds
        if self.profile is None:
            return
        key = (str(record.get("trial")), int(record.get("round", 0)))
        total, count = self._validating.get(key, (0.0, 0))
        total, count = total + seconds, count + 1
        if count >= self.profile.partitions:
            self._validating.pop(key, None)
            self._validations.append(total)
        else:
            self._validating[key] = (total, count)

    def _typed(self) -> TypeProfile | None:
        return None if self.profile is None else self.profile.for_type(self.instance_type)

    def _calibrate(
        self, now: float, index: int, fresh_stage: bool, events: list[tuple[str, Mapping[str, Any]]]
    ) -> list[Calibration]:
        """Compare start-up and the first units with the profile (module docstring).

        Each is checked once, when measured; a ``calibration`` event logs it. Returns the
        measurements that are off by more than ``replan_drift`` (the profile now holds
        their values).
        """
        typed = self._typed()
        if typed is None or self._replan is None:
            return []
        found: list[Calibration] = []
        if "start-up" not in self._checked and self._current is None:
            self._checked.add("start-up")
            first = self._planned(index)
            if index == 0 and fresh_stage:  # a resumed run's start-up is not the plan's
                startup = now - self._session_began
                found.append(startup_calibration(typed, startup, first.start - first.begin))
        if "units" not in self._checked:
            measured = units_calibration(typed, self._units, self._hops, self._validations)
            if measured is not None:
                self._checked.add("units")
                found.append(measured)
        off = []
        for calibration in found:
            events.append(("calibration", calibration.to_event(self.replan_drift)))
            if calibration.off(self.replan_drift):
                assert self.profile is not None  # ok: typed is not None
                self.profile = calibrated(self.profile, self.instance_type, calibration.values)
                logger.warning("calibrating the profile: %s; re-planning", calibration.reason)
                off.append(calibration)
        return off

    # -- stages ------------------------------------------------------------------------------

    @staticmethod
    def _rounds_of(stages: list[StagePlan]) -> list[int]:
        first, rounds = 0, []
        for s in stages:
            rounds.append(first)
            first += s.epochs
        return rounds

    def _stage_of(self, round_number: int) -> int:
        """The plan stage a round belongs to (the last one beyond the plan)."""
        index = 0
        for i, first in enumerate(self._first_rounds):
            if round_number >= first:
                index = i
        return index

    def _planned(self, index: int) -> StagePlan:
        return self.stages[min(index, len(self.stages) - 1)]

    def _open_stage(self, index: int, now: float) -> None:
        """Start stage ``index`` at experiment time ``now``.

        The first stage of a session begins at its ``run`` (or ``resume``): its start-up
        is its own.
        """
        self.meter.sample()
        if self._current is None:
            self._stage_began, self._stage_usd = self._session_began, 0.0
            self._lead = now - self._session_began  # the session's start-up
        else:
            self._stage_began, self._stage_usd = now, self.meter.usd(self._clock())
            self._lead = 0.0
        self._first_of_session = self._current is None
        self._work = dict.fromkeys(self._work, 0.0)
        self._current = index

    def _close_stage(self, now: float) -> dict[str, Any]:
        assert self._current is not None  # ok: only after a stage opened
        unix = self._clock()
        self.meter.sample()
        index = self._current
        planned = self._planned(index)
        seconds = now - self._stage_began
        actual = {
            "stage": index,
            "seconds": round(seconds, 3),
            "planned_seconds": round(planned.seconds, 3),
            "end": round(now, 3),
            "planned_end": round(planned.end, 3),
            "workers": self._stage_executors,
            "planned_workers": planned.workers,
            "executors_at_end": len(self.manager.executors()),
            "usd": round(self.meter.usd(unix) - self._stage_usd, 6),
            "planned_usd": round(planned.usd, 6),
            "spent_usd": round(self.meter.usd(unix), 6),
            **self._parts(index, planned, seconds),
        }
        self._actuals.append(actual)
        return actual

    def _parts(self, index: int, planned: StagePlan, seconds: float) -> dict[str, Any]:
        """The stage's parts, measured and planned (:mod:`cerebro_spark.elastic._summary`)."""
        lead = "start-up" if self._first_of_session else "resizing"
        workers = max(1, self._stage_executors)
        parts = {lead: self._lead, **{k: v / workers for k, v in self._work.items()}}
        parts["waiting"] = max(0.0, seconds - sum(parts.values()))
        first = self._first_stages.get(index, planned)
        return {  # (the summary reads them from _actuals)
            "parts": {k: round(v, 3) for k, v in parts.items()},
            "planned_parts": self._planned_parts(planned, self._stage_typed.get(index)),
            "first_seconds": round(first.seconds, 3),
            "first_parts": self._planned_parts(first, self._first_typed),
        }

    def _planned_parts(self, planned: StagePlan, typed: TypeProfile | None) -> dict[str, float]:
        lead = "start-up" if self._first_of_session else "resizing"
        lead_seconds, train = planned.start - planned.begin, planned.end - planned.start
        if typed is None:
            parts = {lead: max(0.0, lead_seconds), "units": max(0.0, train)}
        else:
            parts = planned_parts(typed, lead_seconds, train, first=self._first_of_session)
        return {k: round(v, 3) for k, v in parts.items()}

    def _totals(self) -> tuple[float, float]:
        """Seconds and dollars of the plan in force."""
        return self.stages[-1].end, sum(s.usd for s in self.stages)

    def _summary(self, now: float) -> dict[str, Any]:
        unix = self._clock()
        usd = self.meter.usd(unix)
        last = self._totals()
        return {
            "seconds": round(now, 3),
            "planned_seconds": round(last[0], 3),  # the last plan's (as before first_plan)
            "usd": round(usd, 6),
            "planned_usd": round(last[1], 6),
            "instance_seconds": round(self.meter.instance_seconds(unix), 3),
            "instances": len(self.meter.held()),
            "replans": self._replans,
            "failed_resizes": self._failed_resizes,
            "stopped": self._stopped,
            "failed_tasks": self.manager.failed_tasks(),
            "deadline": self.deadline,
            "budget": self.budget,
            **summarize(
                deadline=self.deadline,
                seconds=now,
                budget=self.budget,
                usd=usd,
                first_plan=self._first_plan,
                last_plan=last,
                replans=self._replan_log,
                stages=self._actuals,
            ),
        }

    def _plan_event(self) -> dict[str, Any]:
        return {
            **self._plan_fields,
            "deadline": self.deadline,
            "budget": self.budget,
            "seconds": round(self.stages[-1].end, 3),
            "usd": round(sum(s.usd for s in self.stages), 6),
            "workers": [s.workers for s in self.stages],
            "stage_rounds": self._first_rounds,
            "capabilities": dataclasses.asdict(self.manager.capabilities),
        }

    # -- budget ------------------------------------------------------------------------------

    def _over_budget(self, ahead_usd: float, what: str) -> str | None:
        if self.budget is None:
            return None
        spent = self.meter.usd()
        if spent + ahead_usd <= self.budget + 1e-9:
            return None
        self._stopped = (
            f"the budget of ${self.budget:.4f} would be overrun: ${spent:.4f} spent and "
            f"{what} would cost about ${ahead_usd:.4f}"
        )
        return self._stopped

    def _round_usd(self, index: int) -> float:
        """Predicted dollars of one more round of stage ``index`` on today's executors."""
        planned = self._planned(index)
        round_seconds = planned.seconds / max(1, planned.epochs)
        rate = self.meter.price.usd_per_hour / 3600.0
        return len(self.manager.executors()) * rate * round_seconds

    # -- resizing ----------------------------------------------------------------------------

    def _maybe_grow_early(self, round_number: int, index: int) -> None:
        """Ask for the next stage's extra executors once it is less than the lead away."""
        following = index + 1
        if following >= len(self.stages) or not self.manager.capabilities.resizable:
            return
        target = self.stages[following].workers
        if target <= len(self.manager.executors()) or self._grow_requested == following:
            return
        planned = self._planned(index)
        round_seconds = planned.seconds / max(1, planned.epochs)
        rounds_left = self._first_rounds[following] - round_number
        if rounds_left * round_seconds > self.lead_seconds:
            return
        logger.info(
            "asking for %d executors for stage %d (%d rounds, about %.0f s, ahead)",
            target,
            following + 1,
            rounds_left,
            rounds_left * round_seconds,
        )
        self._grow_requested = following
        self.manager.resize(self._bounded(target))

    def _bounded(self, target: int) -> int:
        caps = self.manager.capabilities
        bounded = max(target, caps.min_executors)
        return bounded if caps.max_executors is None else min(bounded, caps.max_executors)

    def _resize(
        self, target: int, backend: Backend, index: int
    ) -> list[tuple[str, Mapping[str, Any]]]:
        """Bring the workers to ``target`` (see the module docstring); log what happened."""
        caps = self.manager.capabilities
        workers = backend.workers()
        starting = backend.starting()
        if not caps.resizable or target == len(workers) + starting:
            return []  # (workers still starting join the stage when they are ready)
        if starting and target < len(workers) + starting:  # victims among every worker
            with contextlib.suppress(TimeoutError):
                backend.wait_started(self.resize_timeout)
            workers = backend.workers()
            if target == len(workers):
                return []
        target = self._bounded(target)
        begun = self._clock()
        fields: dict[str, Any] = {"stage": index, "from": len(workers), "target": target}
        try:
            if target < len(workers):
                # Drain first, so that nothing runs on an executor when it is released.
                # Where the platform chooses what to release (Databricks), the retired
                # workers' executors are the idle ones it should take; a node it takes
                # instead loses its worker (re-homed) and a retired one's executor gets a
                # new worker (_top_up).
                victims = victims_to_retire(workers, len(workers) - target)
                executors = [workers[w].executor_id for w in victims]
                logger.info(
                    "stage %d: shrinking %d -> %d workers: retiring %s",
                    index + 1,
                    len(workers),
                    target,
                    victims,
                )
                retiring = [backend.retire(w) for w in victims]
                _, late = wait_futures(retiring, timeout=self.resize_timeout)
                if late:
                    raise TimeoutError(f"workers {victims} did not retire in time")
                for future in retiring:
                    future.result()
                fields["victims"] = victims
                chosen = [e for e in executors if e] if caps.choose_victims else []
                self.manager.resize(target, chosen)
                logger.info("stage %d: executors released; waiting for %d", index + 1, target)
                self.manager.wait(target, self.resize_timeout)
                if not caps.choose_victims:
                    self._top_up(backend, target)
            else:
                if self._grow_requested != index:
                    self.manager.resize(target)
                if not caps.workers_follow:  # the pool does not see them (Spark Connect)
                    self.manager.wait(target, self.resize_timeout)
                    self._top_up(backend, target)
                self._wait_for_workers(backend, target)
        except Exception as error:  # any failure: go on with what there is
            self._failed_resizes += 1
            fields.update(error=f"{type(error).__name__}: {error}", workers=len(backend.workers()))
            logger.warning("resize to %d executors failed: %s; going on", target, error)
            self._grow_requested = None
            return [("resize_failed", {**fields, "seconds": round(self._clock() - begun, 3)})]
        fields.update(workers=len(backend.workers()), seconds=round(self._clock() - begun, 3))
        logger.info(
            "stage %d: %d -> %d workers in %.1f s",
            index + 1,
            fields["from"],
            target,
            fields["seconds"],
        )
        return [("resized", fields)]

    def _top_up(self, backend: Backend, target: int) -> None:
        """Start workers until ``target`` serve, after a shrink the platform chose.

        If it released executors whose workers had not retired (they were lost and
        re-homed), the retired workers' executors are idle: new workers start there. A
        backend that cannot add workers raises (``Backend.add_worker``): the resize failed.
        Also after a grow the pool does not see (``Capabilities.workers_follow``).
        """
        deadline = time.monotonic() + self.resize_timeout
        while len(backend.workers()) + backend.starting() < target:
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not bring the workers back to {target}")
            backend.add_worker()

    def _wait_for_workers(self, backend: Backend, target: int) -> None:
        deadline = time.monotonic() + self.resize_timeout
        while len(backend.workers()) < target:
            if time.monotonic() > deadline:
                raise ResizeTimeout(
                    target,
                    len(backend.workers()),
                    self.resize_timeout,
                    f"{len(self.manager.executors())} executors serve",
                )
            time.sleep(_POLL_S)

    # -- re-planning -------------------------------------------------------------------------

    def _maybe_replan(
        self,
        index: int,
        backend: Backend,
        actual: Mapping[str, Any],
        now: float,
        off: list[Calibration],
    ) -> list[tuple[str, Mapping[str, Any]]]:
        """Re-plan from stage ``index`` if the stage that ended drifted or calibrated."""
        planned = float(actual["planned_seconds"])
        drift = abs(float(actual["seconds"]) - planned) / planned if planned > 0 else 0.0
        reasons = [c.reason for c in off]
        if drift > self.replan_drift:
            reasons.append(
                f"stage {actual['stage'] + 1} took {actual['seconds']:.1f} s, planned "
                f"{planned:.1f} s"
            )
        if self._failed_resizes > self._replans:
            reasons.append("a resize failed")
        return self._replan_from(index, reasons, now, backend)

    def _replan_from(
        self,
        index: int,
        reasons: list[str],
        now: float,
        backend: Backend,
        *,
        ahead: float = 0.0,
    ) -> list[tuple[str, Mapping[str, Any]]]:
        """Re-plan stages ``index``.. (if there are reasons), ``ahead`` seconds from now.

        ``ahead`` is what the current stage still needs (a re-plan in its middle). The
        session's first stage, re-planned at its start, keeps its span from the session's
        start (its start-up is spent, and its own).
        """
        if not reasons or self._replan is None or index >= len(self.stages):
            return []
        elapsed = now + ahead  # experiment seconds since run, where the re-plan starts
        money = None if self.budget is None else self.budget - self.meter.usd(self._clock())
        fields: dict[str, Any] = {
            "stage": index,
            "reason": "; ".join(reasons),
            "elapsed": round(elapsed, 3),
        }
        running = len(backend.workers()) + backend.starting()
        try:
            fresh = self._replan(index, self.deadline - elapsed, money, running, self.profile)
        except Exception as error:  # PlanInfeasible, a bad state: keep the plan
            self._replans += 1
            logger.warning(
                "re-planning from stage %d failed: %s; keeping the plan", index + 1, error
            )
            self._replan_log.append({**fields, "error": str(error)})
            return [("replan_failed", {**fields, "error": str(error)})]
        self._replans += 1
        if self._current is None and fresh:
            fresh[0] = dataclasses.replace(fresh[0], begin=self._session_began)
        self.stages = self.stages[:index] + fresh
        typed = self._typed()
        self._stage_typed.update({s.index: typed for s in fresh if typed is not None})
        seconds, usd = self._totals()
        self._replan_log.append({**fields, "seconds": round(seconds, 3), "usd": round(usd, 6)})
        logger.info(
            "re-planned stages %d.. (%s): workers %s, %.0f s, $%.4f",
            index + 1,
            fields["reason"],
            [s.workers for s in fresh],
            seconds,
            usd,
        )
        return [("replanned", {**fields, "workers": [s.workers for s in fresh]})] + [
            ("stage_plan", s.to_event(self._replans)) for s in fresh
        ]


# -- building an elastic run ---------------------------------------------------------------


def load_plan_inputs(config: ExperimentConfig) -> tuple[Profile, PriceCatalog]:
    """The profile (a file, or a pilot on the config's backend) and the price catalog."""
    elastic = _elastic_of(config)
    catalog = load_catalog(elastic.prices)
    if elastic.profile != "auto":
        return load_profile(elastic.profile), catalog
    if elastic.instance_type is None:
        raise ConfigError(
            "elastic.profile: auto runs a pilot and records it under elastic.instance_type; "
            "set instance_type (an instance type of the price catalog)"
        )

    logger.info("running a pilot to profile %s (elastic.profile: auto)", config.name)
    pilot = config.replace(elastic=None)
    profile = pilot_profile(
        pilot, instance_type=elastic.instance_type, scale_seconds=PILOT_SCALE_SECONDS
    )
    return profile, catalog


def planned_spec(
    config: ExperimentConfig, profile: Profile, capacity: int | None = None
) -> ExperimentSpec:
    """The stages ``run`` follows, with the most executors the run may hold.

    At most the dataset's partitions (a worker beyond them would hold replicas only, and
    the pool starts no more workers than partitions), at most the manager's cap
    (``max_executors``, Databricks' ``max_workers``, EC2's ``max_instances``) and at most
    the ``capacity`` the run takes as given, if any.
    """
    spec = experiment_spec(config)
    caps = [profile.partitions] + ([] if capacity is None else [capacity])
    elastic = _elastic_of(config)
    key = manager_entry(elastic.manager).cap_option
    most = elastic.options.get(key)
    if most is not None:
        if isinstance(most, bool) or not isinstance(most, int) or most < 1:
            raise ConfigError(
                f"elastic.{elastic.manager}.{key} must be an integer >= 1, got {most!r}"
            )
        caps.append(most)
    if spec.max_workers is not None:
        caps.append(spec.max_workers)
    return dataclasses.replace(spec, max_workers=min(caps))


def planned_pack_size(config: ExperimentConfig, profile: Profile) -> int:
    """The most trials in one packed unit the plan assumes (issue 27).

    The config's ``pack``: its ``N`` (``run`` plans after the pre-flight, which resolves
    ``auto`` to the size it measured), 1 when off; an ``auto`` not yet resolved (``plan``)
    takes the size the profile's ``packing`` curve would choose
    (:func:`~cerebro_spark.training.choose_pack_size`), 1 when it measured none.
    """
    size = pack_size(config)
    if size is not None:
        return size
    if profile.packing is None or profile.packing.name is not None:
        logger.info("pack: auto, and the profile has no measured packing table: planned unpacked")
        return 1
    return choose_pack_size(dict(profile.packing.table))


def given_capacity(config: ExperimentConfig) -> GivenCapacity | None:
    """The capacity the config's elastic run takes as given (``None``: it resizes).

    Asks the manager the config names (it may connect to the config's Spark Connect
    session to find out; nothing is started).

    Raises:
        ConfigError: The manager cannot run on the config's session (the message names
            what to use instead).
    """
    elastic = _elastic_of(config)
    return manager_entry(elastic.manager).given_capacity(config, elastic)


def plan_config(
    config: ExperimentConfig,
    profile: Profile,
    catalog: PriceCatalog,
    given: GivenCapacity | None = None,
) -> Plan:
    """Plan a config's search: the stages ``run`` follows, its deadline and budget.

    With ``given``, at that capacity (:func:`plan_at_capacity`).
    """
    elastic = _elastic_of(config)
    spec = planned_spec(config, profile, None if given is None else given.workers)
    deadline = plan_deadline(spec, config.deadline)
    assert deadline is not None  # ok: an elastic config has a deadline (parse_config)
    options: dict[str, Any] = {
        "deadline": deadline,
        "budget": elastic.budget,
        "instance_type": elastic.instance_type,
        "seed": config.seed,
        "pack_size": planned_pack_size(config, profile),
    }
    if given is not None:
        return plan_at_capacity(spec, profile, catalog, given, **options)
    return plan(spec, profile, catalog, **options)


def capacity_type(profile: Profile, catalog: PriceCatalog, instance_type: str | None) -> str:
    """The instance type a run at a given capacity is priced as.

    ``instance_type`` (the config's), else the one type the profile measured that the
    catalog prices.

    Raises:
        ConfigError: No type is given and the profile and catalog share none, or several.
    """
    if instance_type is not None:
        catalog.price(instance_type)  # raises naming the catalog's types
        return instance_type
    shared = [t for t in profile.instance_types if t in catalog.instances]
    if len(shared) != 1:
        raise ConfigError(
            "a run at the capacity the session gives cannot choose its instance type: set "
            "elastic.instance_type to what the session's workers are billed as (a type of "
            f"price catalog {catalog.name}: {sorted(catalog.instances)}); the profile "
            f"measured {profile.instance_types}"
        )
    return shared[0]


def outcome_at_capacity(
    spec: ExperimentSpec,
    profile: Profile,
    catalog: PriceCatalog,
    instance_type: str,
    workers: int,
    *,
    samples: int = 32,
    seed: int = 0,
    running: int = 0,
    pack_size: int = 1,
) -> Outcome:
    """The simulated time and dollars of every stage of ``spec`` on ``workers`` workers."""
    simulator = Simulator(
        spec,
        profile.for_type(instance_type),
        catalog,
        catalog.price(instance_type),
        samples=samples,
        seed=seed,
        running=running,
        pack_size=pack_size,
    )
    return simulator.run((workers,) * len(spec.stages))


def plan_at_capacity(
    spec: ExperimentSpec,
    profile: Profile,
    catalog: PriceCatalog,
    given: GivenCapacity,
    *,
    deadline: float,
    budget: float | None = None,
    instance_type: str | None = None,
    samples: int = 32,
    seed: int = 0,
    pack_size: int = 1,
) -> Plan:
    """The plan of a run that takes its capacity as given: every stage on its workers.

    Nothing is chosen but the instance type's price (:func:`capacity_type`): the stages,
    their seconds and dollars are simulated on ``given.workers`` workers (at most
    ``spec.max_workers``: the dataset's partitions, the manager's cap). The arguments are
    :func:`~cerebro_spark.elastic.plan`'s.

    Raises:
        ConfigError: No instance type to price it at.
        PlanInfeasible: It misses the deadline or the budget (the message says by how
            much, why nothing is resized, and what to change).
    """
    name = capacity_type(profile, catalog, instance_type)
    workers = given.workers
    if spec.max_workers is not None and spec.max_workers < workers:
        logger.info(
            "the session gives %d workers, but the run uses at most %d (the dataset's "
            "partitions, the manager's cap): planned at %d",
            workers,
            spec.max_workers,
            spec.max_workers,
        )
        workers = spec.max_workers
    outcome = outcome_at_capacity(
        spec, profile, catalog, name, workers, samples=samples, seed=seed, pack_size=pack_size
    )
    late = outcome.seconds > deadline + 1e-9
    dear = budget is not None and outcome.usd > budget + 1e-9
    if late or dear:
        misses = []
        if late:
            misses.append(f"the deadline of {deadline:g} s")
        if dear:
            misses.append(f"the budget of ${budget:.4f}")
        raise PlanInfeasible(
            f"at the capacity the session gives, {workers} workers of {name} "
            f"({given.reason}), the search takes {outcome.seconds:.1f} s for "
            f"${outcome.usd:.4f} by the profile, over {' and '.join(misses)}: give the "
            "session more workers (workers: N, as many as its executors run tasks at once), "
            "a later deadline or a larger budget, fewer trials or epochs, or run on a "
            "Databricks cluster the databricks manager can resize (one that names its "
            "cluster id)",
            (name, outcome),
            (name, outcome),
        )
    return Plan(
        spec,
        name,
        deadline,
        budget,
        outcome,
        outcome,
        {name: (outcome.seconds, outcome.usd)},
        price=catalog.price(name),
        pack_size=pack_size,
    )


@contextlib.contextmanager
def elastic_run(
    config: ExperimentConfig, started: float | None = None
) -> Iterator[tuple[BackendFactory, ElasticController]]:
    """Plan, start the cluster, and yield the backend factory and stage hook of a run.

    Every refusal (a bad elastic section, an unknown manager, a plan file that does not
    fit, no plan that meets the deadline and the budget) comes before the cluster
    manager opens anything. The cluster starts at the first stage's size (opened by the
    manager the config names, :func:`~cerebro_spark.engine._managers.manager_entry`) and
    is closed at the end. ``started`` is ``time.monotonic()`` when ``run`` (or
    ``resume``) was called (default: now): the planning, pilot and cluster start that
    follow count against the deadline, as they do on the driver's clock.

    Raises:
        ConfigError: A bad elastic section, or a manager this build cannot run.
        PlanInfeasible: No plan meets the deadline and the budget.
    """
    elastic = _elastic_of(config)
    entry = manager_entry(elastic.manager)  # an unknown manager is refused before any pilot
    given = entry.given_capacity(config, elastic)  # so is a session it cannot run on
    started_at = time.time() - (0.0 if started is None else time.monotonic() - started)
    deadline = config.deadline
    assert deadline is not None  # ok: an elastic config has a deadline (parse_config)
    profile, catalog = load_plan_inputs(config)
    spec = planned_spec(config, profile, None if given is None else given.workers)
    fields: dict[str, Any] = {"manager": elastic.manager, "load": machine_load()}
    if given is not None:
        fields["given_capacity"] = {"workers": given.workers, "reason": given.reason}
    measured = profile.extra.get("measured")
    changed = load_change(
        measured.get("load") if isinstance(measured, Mapping) else None, fields["load"]
    )
    if changed is not None:
        logger.warning("profile %s: %s", elastic.profile, changed)
    if elastic.plan == "auto":
        planned = plan_config(config, profile, catalog, given)
        instance_type = planned.instance_type
        stages = stages_of(planned.outcome)
        fields.update(
            instance_type=instance_type,
            static={
                "workers": planned.static.workers[0],
                "seconds": round(planned.static.seconds, 3),
                "usd": round(planned.static.usd, 6),
            },
        )
    else:
        path = Path(elastic.plan)
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise ConfigError(f"elastic.plan {path} cannot be read as JSON: {error}") from None
        stages = stages_from_json(raw, spec, str(path))
        instance_type = elastic.instance_type or str(raw.get("instance_type") or "")
        if not instance_type:
            raise ConfigError(f"elastic.instance_type is required with plan {path}")
        if given is not None and any(s.workers != spec.max_workers for s in stages):
            raise ConfigError(
                f"plan {path} runs stages on {[s.workers for s in stages]} workers, but the "
                f"run takes its {spec.max_workers} workers as given ({given.reason}): plan "
                "again with this config (elastic.plan: auto) or give the session those workers"
            )
        fields.update(instance_type=instance_type, plan_file=str(path))
    lead = _lead_seconds(profile.for_type(instance_type), stages)
    fields["lead_seconds"] = round(lead, 3)
    if given is not None:
        logger.info(
            "elastic plan at the capacity the session gives, %d workers of %s (%s): "
            "stages %s, %.0f s, $%.4f",
            stages[0].workers,
            instance_type,
            given.reason,
            [s.workers for s in stages],
            stages[-1].end,
            sum(s.usd for s in stages),
        )
    else:
        logger.info(
            "elastic plan on %s: workers %s, %.0f s, $%.4f",
            instance_type,
            [s.workers for s in stages],
            stages[-1].end,
            sum(s.usd for s in stages),
        )

    def replan(
        index: int, seconds: float, usd: float | None, running: int, measured: Profile | None
    ) -> list[StagePlan]:
        """The cheapest plan of the stages left that meets the time and money left.

        When none does (the run is late), the fastest one found. ``measured``: the profile
        as the run calibrated it (``None``: the one it was planned with).
        """
        profile_now = profile if measured is None else measured
        offset = deadline - seconds  # experiment seconds since run
        rest = dataclasses.replace(
            spec,
            stages=spec.stages[index:],
            # a procedure's own deadline counts from the start, the re-plan from now
            deadline=None if spec.deadline is None else max(1.0, spec.deadline - offset),
            epoch_seconds=None,  # checked when the run was planned
        )

        if given is not None:  # nothing to resize: the stages left at the same workers
            return stages_of(
                outcome_at_capacity(
                    rest,
                    profile_now,
                    catalog,
                    instance_type,
                    stages[0].workers,
                    seed=config.seed,
                    running=running,
                    pack_size=planned_pack_size(config, profile_now),
                ),
                index,
                offset,
            )

        def cheapest(deadline: float, budget: float | None) -> Outcome:
            return plan(
                rest,
                profile_now,
                catalog,
                deadline=deadline,
                budget=budget,
                instance_type=instance_type,
                seed=config.seed,
                running=running,
                pack_size=planned_pack_size(config, profile_now),
            ).outcome

        try:
            fresh = cheapest(max(seconds, 1.0), usd if usd is None or usd > 0 else 1e-9)
        except PlanInfeasible as late:
            # Late (or short of money): the cheapest plan that is about as fast as the
            # fastest found, so that no instance is kept idle to gain a re-homing's second.
            fastest = late.fastest[1]
            money = "" if usd is None else f" and the ${max(usd, 0.0):.4f} left of the budget"
            logger.warning(
                "re-planning from stage %d: no plan of the stages left fits the %.1f s left of "
                "the %g s deadline%s (the fastest takes %.1f s for $%.4f): going on as fast as "
                "that, for the least money",
                index + 1,
                max(seconds, 0.0),
                deadline,
                money,
                fastest.seconds,
                fastest.usd,
            )
            try:
                fresh = cheapest(late.fastest[1].seconds * (1 + FASTEST_SLACK), None)
            except PlanInfeasible:
                fresh = late.fastest[1]
        return stages_of(fresh, index, offset)

    opening = entry.open(config, elastic, stages[0].workers, instance_type)
    with opening as (manager, factory):
        meter = CostMeter(manager, catalog, instance_type)
        controller = ElasticController(
            manager,
            meter,
            stages,
            deadline=deadline,
            budget=elastic.budget,
            started_at=started_at,
            lead_seconds=lead,
            resize_timeout=elastic.resize_timeout,
            replan_drift=elastic.replan_drift,
            replan=replan if elastic.plan == "auto" else None,
            plan_fields=fields,
            profile=profile,
            instance_type=instance_type,
        )
        try:
            yield factory, controller
        finally:
            meter.stop()


def _lead_seconds(typed: TypeProfile, stages: list[StagePlan]) -> float:
    """Seconds from asking for executors to their workers ready with their partitions.

    For the most the plan holds (one executor per instance: an upper bound of the instances
    one request starts).
    """
    widest = max(s.workers for s in stages)
    loads, _ = partition_moves(typed.partitions, 0, widest)
    return typed.scale_seconds(widest) + typed.worker_start.mean + loads * typed.load.mean


def _elastic_of(config: ExperimentConfig) -> ElasticConfig:
    if config.elastic is None:
        raise ConfigError(f"config {config.name} has no elastic section")
    return config.elastic
