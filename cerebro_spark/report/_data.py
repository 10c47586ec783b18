"""What the report shows, extracted from an experiment's event log (no plotting here).

Everything comes from ``events.jsonl`` (see :mod:`cerebro_spark.driver._events`) and the
config: the units each worker ran and when (``unit_start`` / ``unit_end`` /
``unit_failed``), worker joins, losses and retirements, resizes and stage boundaries, the
procedure's decision after every epoch, the plan beside what each stage cost, and the run's
cost summary. Times are experiment time (:func:`~cerebro_spark.driver._state.experiment_times`):
seconds since ``run``, start-up included, a resumed run's sessions back to back (the time
its driver was down is not on the timeline; a marker shows where a session resumed) --
the clock of the deadline, progress and the plan-vs-actual table.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cerebro_spark.driver import ExperimentConfig, ExperimentState
from cerebro_spark.driver._layout import experiment_prefix
from cerebro_spark.driver._state import experiment_times

UNIT_KINDS = ("train", "validate", "group", "failed", "unfinished")
"""How a unit bar is drawn: a plain train or validation unit, a rank of a group unit,
a unit that failed, a unit that never ended (running now, or its driver died)."""

WORKER_EVENTS = {
    "worker_joined": "joined",
    "worker_ready": "ready",
    "worker_retiring": "retiring",
    "worker_retired": "retired",
    "worker_lost": "lost",
}
"""Membership events marked on a worker's row, by the label shown."""

CLUSTER_EVENTS = ("resized", "resize_failed", "replanned", "replan_failed", "search_stopped")
"""Events marked across every row (the cluster changed or the plan did)."""

DATA_WAIT_TRIALS = 5
"""Trials the data wait summary lists, those that waited the largest share first."""


@dataclasses.dataclass(frozen=True)
class UnitBar:
    """One unit on one worker (one rank of a group unit).

    Attributes:
        worker: The worker that ran it.
        trial: Its trial.
        kind: One of :data:`UNIT_KINDS`.
        start: Experiment seconds (since ``run``) at its ``unit_start``.
        end: Seconds to its ``unit_end`` / ``unit_failed`` (or the log's last event).
        round: Its round.
        epoch: The trial's epoch it trains or validates (0-based, as logged).
        partition: Its partition.
        group: The group unit's id, if it is a rank of one.
        seconds: Seconds the worker measured (``None`` if it never ended).
        error: Why it failed.
        data_wait: Part of ``seconds`` its loop waited for batches (``unit_end``'s
            ``data_wait_seconds``; ``None`` when the log does not say: an old log, or a
            unit that never ended).
    """

    worker: str
    trial: str
    kind: str
    start: float
    end: float
    round: int
    epoch: int
    partition: int
    group: str | None = None
    seconds: float | None = None
    error: str | None = None
    data_wait: float | None = None


@dataclasses.dataclass(frozen=True)
class WaitRow:
    """Data wait of a set of units (a worker's, a trial's, or all of them).

    Attributes:
        name: The worker or trial (``"all"`` for every unit).
        units: Units that logged their data wait.
        wait_seconds: The seconds those units waited for batches.
        unit_seconds: Those units' seconds.
    """

    name: str
    units: int
    wait_seconds: float
    unit_seconds: float

    @property
    def share(self) -> float:
        """``wait_seconds`` over ``unit_seconds`` (0 when the units took no time)."""
        return self.wait_seconds / self.unit_seconds if self.unit_seconds > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class DataWait:
    """How long units waited for their batches: overall, per worker, the worst trials.

    Only units whose ``unit_end`` logged ``data_wait_seconds`` count (logs before the
    field have none, and no summary).

    Attributes:
        overall: Every such unit.
        workers: Per worker, in id order.
        trials: The :data:`DATA_WAIT_TRIALS` trials that waited the largest share of
            their unit seconds (ties: more seconds waited, then trial id).
    """

    overall: WaitRow
    workers: tuple[WaitRow, ...]
    trials: tuple[WaitRow, ...]


def data_wait(units: Iterable[UnitBar], top: int = DATA_WAIT_TRIALS) -> DataWait | None:
    """The data wait summary of ``units``, or ``None`` if none logged its data wait."""
    by_worker: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    by_trial: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    total = [0, 0.0, 0.0]
    for unit in units:
        if unit.data_wait is None or unit.seconds is None:
            continue
        for sums in (by_worker[unit.worker], by_trial[unit.trial], total):
            sums[0] += 1
            sums[1] += unit.data_wait
            sums[2] += unit.seconds
    if not total[0]:
        return None

    def row(name: str, sums: Sequence[float]) -> WaitRow:
        return WaitRow(name, int(sums[0]), float(sums[1]), float(sums[2]))

    trials = sorted(
        (row(name, sums) for name, sums in by_trial.items()),
        key=lambda r: (-r.share, -r.wait_seconds, _natural(r.name)),
    )
    return DataWait(
        overall=row("all", total),
        workers=tuple(row(w, by_worker[w]) for w in sorted(by_worker, key=_natural)),
        trials=tuple(trials[:top]),
    )


@dataclasses.dataclass(frozen=True)
class Marker:
    """A moment worth marking on the timeline.

    Attributes:
        time: Experiment seconds (since ``run``).
        label: What happened (``joined``, ``lost``, ``resized``, ``stage 1`` ...).
        worker: The worker it concerns, or ``None`` for the whole cluster.
        detail: A sentence for the hover text.
    """

    time: float
    label: str
    worker: str | None = None
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class EpochPoint:
    """One validated epoch of a trial and what the procedure decided after it."""

    epoch: int
    metrics: Mapping[str, float]
    round: int
    decision: str | None
    status: str | None


@dataclasses.dataclass(frozen=True)
class RoundSummary:
    """One round of the search: who trained, at which epoch, and what became of them.

    Numbers as logged: ``round`` counts from 0 (shown + 1), ``epochs`` the epochs each
    trial had completed before it, ``decisions`` the epoch each completed in it (from 1).
    """

    round: int
    start: float
    end: float | None
    epochs: Mapping[str, int]
    decisions: Mapping[str, tuple[str, int]]
    """``{trial: (decision, epoch)}`` after the round (``status`` when the log has it)."""
    resumed: tuple[str, ...] = ()
    """Paused trials the procedure resumed for this round (``trial_resumed``)."""


@dataclasses.dataclass(frozen=True)
class StageRow:
    """A stage of the plan beside what it did (``stage``: 0-based, as logged; shown + 1)."""

    stage: int
    planned_workers: int | None
    workers: int | None
    planned_seconds: float | None
    seconds: float | None
    planned_usd: float | None
    usd: float | None
    replan: int


@dataclasses.dataclass
class ReportData:
    """Everything a report shows, from one experiment's config and events.

    Attributes:
        experiment_id: The experiment.
        config: Its config (metric and mode resolved).
        state: Its state, folded from the events.
        origin: Unix time of the first ``run`` call (its ``experiment_start`` less its
            ``startup``; a log before that field: its first event): the timeline's zero.
        last: Experiment seconds at the last event.
        units: Every unit bar, in log order.
        markers: Worker, stage and cluster moments, in log order.
        curves: Every trial's validated epochs, by trial id.
        rounds: Every round, in order.
        stages: The plan's stages beside what they did (empty without a plan).
        trial_seconds: Seconds of each trial's units (the sum over its ``unit_end``
            events, every rank of a group unit counted).
        trial_usd: Each trial's share of the bill (its unit seconds at the run's price per
            instance-second), or ``None`` when the run was not billed.
        unit_failures: ``{reason: count}`` of units that failed and went back to the queue.
        data_wait: How long units waited for batches (:func:`data_wait`), or ``None``
            when no unit logged it.
        peak_workers: The most workers present at once (:func:`peak_workers`): what
            the run had, which may differ from the config's ``workers`` (an elastic plan,
            fewer partitions than workers, workers lost).
    """

    experiment_id: str
    config: ExperimentConfig
    state: ExperimentState
    origin: float
    last: float
    units: list[UnitBar]
    markers: list[Marker]
    curves: dict[str, list[EpochPoint]]
    rounds: list[RoundSummary]
    stages: list[StageRow]
    trial_seconds: dict[str, float]
    trial_usd: dict[str, float] | None
    unit_failures: dict[str, int]
    data_wait: DataWait | None = None
    peak_workers: int = 0

    @property
    def metric(self) -> str:
        """The experiment's metric."""
        return self.config.objective[0]

    @property
    def mode(self) -> str:
        """``"max"`` or ``"min"``."""
        return self.config.objective[1]

    @property
    def workers_line(self) -> str:
        """The workers the run had, as the header says it (:attr:`peak_workers`).

        ``2 workers``; ``2 workers (4 configured)`` when the config asked for others;
        ``up to 3 workers (elastic)``; ``4 workers configured`` before any joined.
        """
        peak, configured = self.peak_workers, self.config.workers
        if peak == 0:
            return f"{configured} workers configured"
        if self.config.elastic is not None:
            return f"up to {peak} workers (elastic)"
        if peak == configured:
            return f"{peak} workers"
        return f"{peak} workers ({configured} configured)"

    @property
    def workers(self) -> list[str]:
        """Every worker that ran a unit or joined, in id order (numbers sort as numbers)."""
        names = {u.worker for u in self.units} | {m.worker for m in self.markers if m.worker}
        return sorted(names, key=_natural)


def _natural(name: str) -> tuple[str, int, str]:
    """``w10`` after ``w9``: the text before the trailing digits, then their value."""
    stem = name.rstrip("0123456789")
    digits = name[len(stem) :]
    return (stem, int(digits) if digits else -1, name)


def _unit_key(event: Mapping[str, Any]) -> tuple[Any, ...]:
    return (
        event.get("round"),
        event.get("trial"),
        event.get("epoch"),
        event.get("kind"),
        event.get("partition"),
        event.get("step"),
        event.get("worker"),
    )


def trial_seconds(events: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Seconds of each trial's units: the sum of its ``unit_end`` seconds, in trial order."""
    totals: dict[str, float] = defaultdict(float)
    for event in events:
        if event.get("event") == "unit_end":
            totals[str(event["trial"])] += float(event.get("seconds") or 0.0)
    return dict(sorted(totals.items()))


def usd_per_second(state: ExperimentState) -> float | None:
    """The run's dollars per instance-second (``elastic_summary``), or ``None``."""
    summary = state.elastic_summary or {}
    usd, seconds = summary.get("usd"), summary.get("instance_seconds")
    if usd is None or not seconds:
        return None
    return float(usd) / float(seconds)


def trial_usd(state: ExperimentState, seconds: Mapping[str, float]) -> dict[str, float] | None:
    """Each trial's share of the bill: its unit seconds at the run's rate, or ``None``."""
    rate = usd_per_second(state)
    if rate is None:
        return None
    return {trial: value * rate for trial, value in seconds.items()}


def _timeline(
    events: Sequence[Mapping[str, Any]], times: Sequence[float], last: float
) -> tuple[list[UnitBar], list[Marker], dict[str, int]]:
    units: list[UnitBar] = []
    markers: list[Marker] = []
    failures: dict[str, int] = defaultdict(int)
    started: dict[tuple[Any, ...], float] = {}
    previous = 0.0
    for event, when in zip(events, times, strict=True):
        kind = event["event"]
        if kind == "experiment_start" and started:  # the session before died mid-units
            units += _unfinished(started, previous)
            started = {}
        previous = when
        if kind == "unit_start":
            started[_unit_key(event)] = when
        elif kind in ("unit_end", "unit_failed"):
            failed = kind == "unit_failed"
            seconds = None if failed else float(event.get("seconds") or 0.0)
            begin = started.pop(_unit_key(event), None)
            if begin is None:  # no unit_start logged: the worker's own measure
                begin = when - (seconds or 0.0)
            if failed:
                failures[str(event.get("reason") or "error")] += 1
            end = when  # the worker was busy until its checkpoint was written ...
            if event.get("trained_at") is not None:  # ... or only until its pass was done
                end = min(when, when - (float(event["time"]) - float(event["trained_at"])))
            units.append(_bar(event, "failed" if failed else None, begin, end, seconds))
        elif kind in WORKER_EVENTS:
            label = WORKER_EVENTS[kind]
            detail = f"worker {event['worker']} {label}"
            if event.get("host"):
                detail += f" on {event['host']}"
            if event.get("reason"):
                detail += f": {event['reason']}"
            markers.append(Marker(when, label, str(event["worker"]), detail))
        elif kind in CLUSTER_EVENTS:
            markers.append(Marker(when, kind.replace("_", " "), None, _cluster_detail(event)))
        elif kind == "stage_actual":
            markers.append(
                Marker(
                    when,
                    f"stage {_shown(event['stage'])} ended",
                    None,
                    f"stage {_shown(event['stage'])}: {event.get('seconds', 0):.1f} s, "
                    f"{event.get('workers')} workers, ${float(event.get('usd', 0)):.4f}",
                )
            )
        elif kind == "experiment_start" and event.get("resumed"):
            markers.append(Marker(when, "resumed", None, "a new driver session resumed the run"))
    units += _unfinished(started, last)  # running now, or the driver died
    return units, markers, dict(failures)


def _unfinished(started: Mapping[tuple[Any, ...], float], end: float) -> list[UnitBar]:
    """Bars of units that started and never ended, drawn to ``end`` (their session's)."""
    bars = []
    for key, begin in started.items():
        round_, trial, epoch, _, partition, _, worker = key
        bars.append(
            UnitBar(
                str(worker), str(trial), "unfinished", begin, max(begin, end), int(round_ or 0),
                int(epoch or 0), int(partition or 0),
            )
        )  # fmt: skip
    return bars


def _bar(
    event: Mapping[str, Any], kind: str | None, begin: float, end: float, seconds: float | None
) -> UnitBar:
    group = event.get("group")
    if kind is None:
        kind = "group" if group is not None else str(event.get("kind", "train"))
    return UnitBar(
        worker=str(event.get("worker")),
        trial=str(event.get("trial")),
        kind=kind,
        start=begin,
        end=max(end, begin),
        round=int(event.get("round") or 0),
        epoch=int(event.get("epoch") or 0),
        partition=int(event.get("partition") or 0),
        group=None if group is None else str(group),
        seconds=seconds,
        error=event.get("error"),
        data_wait=_data_wait(event) if seconds is not None else None,
    )


def _data_wait(event: Mapping[str, Any]) -> float | None:
    """``unit_end``'s ``data_wait_seconds`` (``None`` if absent or not a finite number)."""
    value = event.get("data_wait_seconds")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None  # absent in old logs; a non-finite value is logged as text
    return float(value) if math.isfinite(value) else None


def _cluster_detail(event: Mapping[str, Any]) -> str:
    kind = event["event"]
    if kind in ("resized", "resize_failed"):
        text = (
            f"stage {_shown(event.get('stage'))}: {event.get('from')} -> {event.get('target')} "
            "workers "
            f"({event.get('workers')} serve)"
        )
        if event.get("seconds") is not None:
            text += f" in {float(event['seconds']):.1f} s"
        if event.get("error"):
            text += f"; failed: {event['error']}"
        return text
    if kind in ("replanned", "replan_failed"):
        reason = event.get("reason") or event.get("error")
        return f"from stage {_shown(event.get('stage'))}: {reason}"
    return str(event.get("reason", ""))


def _shown(index: Any) -> Any:
    """A logged 0-based ``stage`` as users read it: counted from 1 (as ``plan`` shows it)."""
    return index + 1 if isinstance(index, int) and not isinstance(index, bool) else index


def _curves_and_rounds(
    events: Sequence[Mapping[str, Any]], times: Sequence[float]
) -> tuple[dict[str, list[EpochPoint]], list[RoundSummary]]:
    epochs: dict[tuple[str, int], tuple[Mapping[str, float], int]] = {}
    decisions: dict[tuple[str, int], tuple[str, str | None]] = {}
    rounds: dict[int, dict[str, Any]] = {}
    resumed: list[str] = []
    for event, when in zip(events, times, strict=True):
        kind = event["event"]
        if kind == "trial_epoch":
            epochs[(event["trial"], int(event["epoch"]))] = (event["metrics"], int(event["round"]))
        elif kind == "decision":
            key = (event["trial"], int(event["epoch"]))
            decisions[key] = (str(event["decision"]), event.get("status"))
            number = int(event.get("round", -1))
            if number in rounds:
                rounds[number]["decisions"][event["trial"]] = (
                    str(event.get("status") or event["decision"]),
                    int(event["epoch"]),
                )
        elif kind == "round_start":
            rounds[int(event["round"])] = {
                "start": when,
                "end": None,
                "epochs": dict(event.get("epochs") or {t: 0 for t in event.get("trials", [])}),
                "decisions": {},
                "resumed": tuple(resumed),
            }
            resumed = []
        elif kind == "trial_resumed":
            resumed.append(str(event["trial"]))
        elif kind == "round_end" and int(event["round"]) in rounds:
            rounds[int(event["round"])]["end"] = when
    curves: dict[str, list[EpochPoint]] = defaultdict(list)
    for (trial, epoch), (metrics, number) in sorted(epochs.items()):
        decision, status = decisions.get((trial, epoch), (None, None))
        curves[trial].append(EpochPoint(epoch, metrics, number, decision, status))
    summaries = [
        RoundSummary(n, r["start"], r["end"], r["epochs"], r["decisions"], r["resumed"])
        for n, r in sorted(rounds.items())
    ]
    return dict(curves), summaries


def _stages(state: ExperimentState) -> list[StageRow]:
    rows = []
    for index in sorted(set(state.stage_plans) | set(state.stage_actuals)):
        plan = state.stage_plans.get(index, {})
        actual = state.stage_actuals.get(index, {})
        rows.append(
            StageRow(
                stage=index,
                planned_workers=actual.get("planned_workers", plan.get("workers")),
                workers=actual.get("workers"),
                planned_seconds=actual.get("planned_seconds", _span(plan)),
                seconds=actual.get("seconds"),
                planned_usd=actual.get("planned_usd", plan.get("usd")),
                usd=actual.get("usd"),
                replan=int(plan.get("replan", 0)),
            )
        )
    return rows


def _span(plan: Mapping[str, Any]) -> float | None:
    if "end" not in plan:
        return None
    return float(plan["end"]) - float(plan.get("begin", plan.get("start", 0.0)))


def _run_origin(events: Sequence[Mapping[str, Any]]) -> float:
    """Unix time of the first ``run`` call (see :attr:`ReportData.origin`)."""
    for event in events:
        if event.get("event") == "experiment_start" and "time" in event:
            return float(event["time"]) - float(event.get("startup") or 0.0)
    return min((float(e["time"]) for e in events if "time" in e), default=0.0)


def collect(
    experiment_id: str, config: ExperimentConfig, events: Sequence[Mapping[str, Any]]
) -> ReportData:
    """Extract what the report shows from an experiment's config and events.

    Args:
        experiment_id: The experiment's id.
        config: Its config, metric and mode resolved (as ``config.json`` holds it).
        events: Its whole event log, in order (:func:`~cerebro_spark.driver.read_events`).
    """
    state = ExperimentState.from_events(events, experiment_prefix(experiment_id))
    times = experiment_times(events)  # the one clock: seconds since run
    last = max(times, default=0.0)
    units, markers, failures = _timeline(events, times, last)
    curves, rounds = _curves_and_rounds(events, times)
    seconds = trial_seconds(events)
    return ReportData(
        experiment_id=experiment_id,
        config=config,
        state=state,
        origin=_run_origin(events),
        last=last,
        units=units,
        markers=markers,
        curves=curves,
        rounds=rounds,
        stages=_stages(state),
        trial_seconds=seconds,
        trial_usd=trial_usd(state, seconds),
        unit_failures=failures,
        data_wait=data_wait(units),
        peak_workers=peak_workers(events),
    )


def peak_workers(events: Sequence[Mapping[str, Any]]) -> int:
    """The most workers present at once: joined and not yet retired or lost.

    A new driver session (``experiment_start``) starts with none: the workers of the
    session before died with it (the driver logs them lost, too).
    """
    present: set[str] = set()
    peak = 0
    for event in events:
        kind = event["event"]
        if kind == "experiment_start":
            present.clear()
        elif kind == "worker_joined":
            present.add(str(event["worker"]))
            peak = max(peak, len(present))
        elif kind in ("worker_retired", "worker_lost"):
            present.discard(str(event["worker"]))
    return peak
