"""The experiment's state, folded from its event log.

The engine never keeps a fact twice: every change is an event appended to
``events.jsonl`` and applied to an :class:`ExperimentState` with the same
:meth:`ExperimentState.apply` that ``resume``, ``replay`` and ``leaderboard`` use to
rebuild the state from the log.

Worker membership is folded the same way: ``worker_joined`` / ``worker_ready`` /
``worker_partitions`` / ``worker_retiring`` / ``worker_retired`` / ``worker_lost`` events
build :attr:`ExperimentState.workers`, the engine's only record of who holds what; a
resumed run starts from it.

A group unit (Cerebro §5.7) is logged as one ``unit_end`` per partition, all carrying the
same ``group`` id and ``group_partitions``. They count only together: the state applies
them once the last one is in, so a driver killed while logging them leaves a group that
resume treats as not done (it re-runs the whole group from the checkpoint before it).

The fold checks what it folds: an event of a known kind that lacks a field it needs, or
that names a trial no ``trial_added`` event added, raises
:class:`~cerebro_spark.errors.EventLogError` naming the log and the line (a crash cannot
write such an event); events of kinds this version does not know are skipped with one
warning per kind (a later version may add kinds).

Each trial's **best epoch** (by the experiment's metric and mode, ties broken by the lower
loss, then the earlier epoch; see :func:`epoch_key`) is recorded on its ``trial_epoch``
events (``best_epoch``, ``best_checkpoint``, ``best_checkpoint_sha256``) and folded into
:class:`TrialState`. Logs written before those fields existed are folded with the metric
and mode of their ``experiment_start`` config: the best epoch and its metrics come from
the history, and its checkpoint is known only while it is the trial's latest (the engine
that wrote such logs deleted a checkpoint as soon as the trial trained past it).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from cerebro_spark.driver._events import EVENT_KINDS
from cerebro_spark.driver._heap import paused_collector
from cerebro_spark.driver._layout import experiment_prefix, stored_key
from cerebro_spark.driver._state_delta import apply_delta
from cerebro_spark.errors import EventLogError
from cerebro_spark.metrics import BatchMean, Metric, State, merge_states
from cerebro_spark.units import UnitKind, unpack_states

logger = logging.getLogger(__name__)

RUNNING, PAUSED, COMPLETED, STOPPED, FAILED = "running", "paused", "completed", "stopped", "failed"

JOINED, READY, RETIRING, RETIRED, LOST = "joined", "ready", "retiring", "retired", "lost"
"""A worker's status: registered; taking units; leaving; left normally; died."""

LOSS = "loss"
"""The metric every unit reports; it breaks ties between equal values of the metric."""

_TRIAL_EVENTS = frozenset(
    {"unit_start", "unit_end", "unit_failed", "trial_failed", "trial_epoch", "decision"}
    | {"trial_resumed"}
)
"""Kinds whose ``trial`` field must name a trial added before them."""

_RECOVERY = (
    "a crash cannot write this, so the log was changed by something else: restore "
    "events.jsonl from a copy, or cut it just before this line (as a crash there would "
    "have) and 'cerebro-spark resume' goes on from that point"
)


def epoch_key(metrics: Mapping[str, float], metric: str, mode: str) -> tuple[float, float] | None:
    """How good one epoch's metrics are: smaller is better; ``None`` if it has no value.

    The key is the metric (negated for ``mode="max"``), then the loss (lower is better;
    a missing or non-finite loss ranks after every finite one). An epoch whose ``metric``
    is missing or not finite has no key: it is never a trial's best.

    Args:
        metrics: Validation metrics of one epoch (``{name: value}``).
        metric: The experiment's metric.
        mode: ``"max"`` or ``"min"``.
    """
    value = metrics.get(metric)
    if value is None or not math.isfinite(value):
        return None
    loss = metrics.get(LOSS)
    tie = loss if loss is not None and math.isfinite(loss) else math.inf
    return (-value if mode == "max" else value, tie)


def improves(
    metrics: Mapping[str, float], best: Mapping[str, float] | None, metric: str, mode: str
) -> bool:
    """Whether an epoch's ``metrics`` beat the ``best`` so far (strictly; see :func:`epoch_key`)."""
    key = epoch_key(metrics, metric, mode)
    if key is None:
        return False
    incumbent = None if best is None else epoch_key(best, metric, mode)
    return incumbent is None or key < incumbent


@dataclasses.dataclass
class WorkerState:
    """One worker as the event log knows it.

    Attributes:
        worker_id: Its id (unique within the experiment, across driver sessions).
        status: ``joined``, ``ready``, ``retiring``, ``retired`` or ``lost``.
        partitions: The partitions it holds (or was last given).
        host: Where it runs.
        executor_id: Its Spark executor, if any.
        device: The torch device it trains on.
        bytes_read: Partition bytes it had read at its last event.
        reason: Why it was lost.
    """

    worker_id: str
    status: str = JOINED
    partitions: frozenset[int] = frozenset()
    host: str = ""
    executor_id: str | None = None
    device: str = "cpu"
    bytes_read: int = 0
    reason: str | None = None

    @property
    def present(self) -> bool:
        """Whether it was still there at the last event (not retired, not lost)."""
        return self.status in (JOINED, READY, RETIRING)


@dataclasses.dataclass
class TrialState:
    """One trial as the driver knows it.

    Attributes:
        trial_id: Its id.
        params: Its hyperparameters, as the procedure suggested them.
        seed: Seed of its initial weights and batch orders.
        spec: Import path of its ``ModelSpec``.
        status: ``running``, ``paused``, ``completed`` (ran its epochs), ``stopped`` (stopped
            early by the procedure) or ``failed`` (its user code raised).
        epochs: Epochs it has completed.
        checkpoint: Store key of its latest checkpoint.
        checkpoint_sha256: SHA-256 of that checkpoint.
        metrics: Validation metrics after its latest epoch.
        history: Validation metrics after each epoch.
        error: Why it failed.
        best_epoch: Its best epoch so far (1-based, :func:`epoch_key`), or ``None`` while
            no epoch reported a finite value of the metric.
        best_metrics: Validation metrics after its best epoch.
        best_checkpoint: Store key of the checkpoint trained through its best epoch (kept
            beside the latest); ``None`` if unknown (a log written before best
            checkpoints were kept, whose best epoch was not its latest).
        best_checkpoint_sha256: SHA-256 of that checkpoint.
    """

    trial_id: str
    params: Mapping[str, Any]
    seed: int
    spec: str
    status: str = RUNNING
    epochs: int = 0
    checkpoint: str | None = None
    checkpoint_sha256: str | None = None
    metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)
    history: list[Mapping[str, float]] = dataclasses.field(default_factory=list)
    error: str | None = None
    best_epoch: int | None = None
    best_metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)
    best_checkpoint: str | None = None
    best_checkpoint_sha256: str | None = None

    def needs(self, key: str) -> bool:
        """Whether ``key`` is this trial's latest or best checkpoint (it must be kept)."""
        return key in (self.checkpoint, self.best_checkpoint)


@dataclasses.dataclass(frozen=True)
class DoneUnit:
    """A unit that finished in the open round."""

    trial: str
    partition: int
    kind: UnitKind
    step: int


@dataclasses.dataclass
class ExperimentState:
    """Everything the driver knows about an experiment, rebuilt from events."""

    trials: dict[str, TrialState] = dataclasses.field(default_factory=dict)
    round: int = -1
    round_open: bool = False
    round_trials: list[str] = dataclasses.field(default_factory=list)
    visit_orders: dict[str, list[int]] | None = None
    round_resources: dict[str, int] = dataclasses.field(default_factory=dict)
    round_group_plans: dict[str, list[int]] | None = None
    round_pack_size: int = 1
    """The open round's most trials in one packed unit (``round_start.pack_size``; 1: off)."""
    procedure_state: dict[str, Any] | None = None
    done_units: list[DoneUnit] = dataclasses.field(default_factory=list)
    reported: set[str] = dataclasses.field(default_factory=set)
    validation_sums: dict[str, dict[str, float]] = dataclasses.field(
        default_factory=lambda: defaultdict(dict)
    )
    validation_rows: dict[str, int] = dataclasses.field(default_factory=lambda: defaultdict(int))
    validation_states: dict[str, dict[int, Mapping[str, Any]]] = dataclasses.field(
        default_factory=lambda: defaultdict(dict)
    )
    """The open round's validation metric states, by trial then partition (merged by the
    engine, in partition order, when the trial's last validation unit is in)."""
    validation_units: dict[str, int] = dataclasses.field(default_factory=lambda: defaultdict(int))
    """The open round's validation units done, by trial (with or without states)."""
    unit_seconds: dict[str, float] = dataclasses.field(default_factory=lambda: defaultdict(float))
    worker_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    workers: dict[str, WorkerState] = dataclasses.field(default_factory=dict)
    active_seconds: float = 0.0
    _session_start: float | None = None
    _last_time: float | None = None
    dataset_id: str | None = None
    finished: bool = False
    stopped: str | None = None
    sessions: int = 0
    stage_plans: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    stage_actuals: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    elastic_summary: dict[str, Any] | None = None
    prefix: str | None = None
    """The experiment's folder in its store, where the log was read: the checkpoint keys
    the log names relative to it (or whole, in older logs) are store keys under it."""
    metric: str | None = None
    mode: str | None = None
    failures: list[str] = dataclasses.field(default_factory=list)
    _open_groups: dict[str, dict[int, Mapping[str, Any]]] = dataclasses.field(default_factory=dict)
    _derived_best: set[str] = dataclasses.field(default_factory=set)
    _clones: list[str] = dataclasses.field(default_factory=list)
    _unknown_kinds: set[str] = dataclasses.field(default_factory=set)

    @classmethod
    def from_events(
        cls, events: Iterable[Mapping[str, Any]], prefix: str | None = None
    ) -> ExperimentState:
        """Fold a whole event log.

        Args:
            events: The log's events in order; from
                :func:`~cerebro_spark.driver.read_events`, errors name the log and line.
            prefix: The folder the log was read from (:attr:`prefix`); default: the one
                its ``experiment_start`` names.

        Raises:
            EventLogError: An event is malformed or names an unknown trial (the message
                names where and how to recover).
        """
        state = cls(prefix=prefix)
        position = getattr(events, "position", None)
        with paused_collector():  # the fold makes no cycle; the collector would walk the log
            for index, event in enumerate(events):
                try:
                    state.apply(event)
                except EventLogError as error:
                    where = position(index) if position is not None else f"event {index + 1}"
                    raise EventLogError(f"{where}: {error}; {_RECOVERY}") from error
        return state

    def apply(self, event: Mapping[str, Any]) -> None:
        """Apply one event.

        Kinds this version does not know are skipped (a warning the first time each is
        seen): a later version may add kinds.

        Raises:
            EventLogError: A known event lacks a field, holds a malformed one, or names a
                trial that was never added.
        """
        kind = event.get("event")
        if type(kind) is not str:
            kind = str(kind)
        handler = _handler(type(self), kind)
        if handler is None and kind not in EVENT_KINDS:
            if kind not in self._unknown_kinds:
                self._unknown_kinds.add(kind)
                logger.warning(
                    "skipping events of kind %r, which this version does not know (written "
                    "by a later version?)",
                    kind,
                )
            if isinstance(event.get("time"), (int, float)):  # the driver ran then
                self._clock_event(False, float(event["time"]))
            return
        self._check_trials(kind, event)
        try:
            if "time" in event:
                self._clock_event(
                    kind == "experiment_start",
                    float(event["time"]),
                    float(event.get("startup") or 0.0) if kind == "experiment_start" else 0.0,
                )
            if handler is not None:
                handler(self, event)
        except KeyError as error:
            raise EventLogError(f"the {kind} event lacks its field {error.args[0]!r}") from error
        except (TypeError, ValueError, AttributeError) as error:
            raise EventLogError(f"the {kind} event has a malformed field ({error})") from error

    def _check_trials(self, kind: str, event: Mapping[str, Any]) -> None:
        """Refuse an event naming a trial that no ``trial_added`` event added."""
        named: list[Any] = []
        if kind in _TRIAL_EVENTS:
            named.append(event.get("trial"))
        elif kind == "trial_added" and event.get("clone_from") is not None:
            named.append(event["clone_from"])
        elif kind == "round_start" and isinstance(event.get("trials"), list):
            named.extend(event["trials"])
        for trial in named:
            if not isinstance(trial, str) or trial not in self.trials:
                raise EventLogError(
                    f"the {kind} event names trial {trial!r}, which no earlier trial_added "
                    "event added"
                )

    def _clock_event(self, starts_session: bool, when: float, startup: float = 0.0) -> None:
        """Accumulate the time drivers ran: from each session's start to its last event.

        A session starts when ``run`` (or ``resume``) was called: ``startup`` seconds
        before its ``experiment_start`` (logs before that field: at the event).
        """
        if starts_session or self._session_start is None:
            if self._session_start is not None and self._last_time is not None:
                self.active_seconds += self._last_time - self._session_start
            self._session_start = when - startup
        self._last_time = when

    def experiment_time(self, event: Mapping[str, Any]) -> float:
        """Account for ``event``'s time and return the experiment time at it.

        The rule of :attr:`experiment_seconds` applied to one event (what :meth:`apply`
        does besides folding it), for readers that place every event on the one clock
        (:func:`experiment_times`).
        """
        when = event.get("time")
        if isinstance(when, (int, float)) and not isinstance(when, bool):
            starts = event.get("event") == "experiment_start"
            startup = float(event.get("startup") or 0.0) if starts else 0.0
            self._clock_event(starts, float(when), startup)
        return self.experiment_seconds

    @property
    def experiment_seconds(self) -> float:
        """Experiment time up to the last event: driver down-time is not counted.

        Seconds since ``run``, start-up included: the clock of deadlines, progress and the
        report.
        """
        if self._session_start is None or self._last_time is None:
            return self.active_seconds
        return self.active_seconds + self._last_time - self._session_start

    def live_trials(self) -> list[str]:
        """Ids of trials to train in the next round, in id order."""
        return sorted(t for t, trial in self.trials.items() if trial.status == RUNNING)

    def ready_workers(self) -> dict[str, frozenset[int]]:
        """The availability map: every worker taking units to the partitions it holds."""
        return {w: s.partitions for w, s in sorted(self.workers.items()) if s.status == READY}

    def needs_checkpoint(self, key: str) -> bool:
        """Whether any trial's latest or best checkpoint is ``key``.

        A checkpoint is written into the folder of the trial it trains
        (``.../checkpoints/<trial>/...``); only that trial and clones (``clone_from``,
        which start from another trial's checkpoint) can refer to it, so only they are
        asked. A key of another shape asks every trial.
        """
        _, marker, rest = key.rpartition("/checkpoints/")
        owner = self.trials.get(rest.rpartition("/")[0]) if marker else None
        if owner is None:
            return any(trial.needs(key) for trial in self.trials.values())
        return owner.needs(key) or any(self.trials[t].needs(key) for t in self._clones)

    def _key(self, logged: Any) -> Any:
        """The store key of a checkpoint the log names (relative to the experiment)."""
        if not isinstance(logged, str) or self.prefix is None:
            return logged
        return stored_key(self.prefix, logged)

    def _on_experiment_start(self, event: Mapping[str, Any]) -> None:
        if self.prefix is None and isinstance(event.get("experiment_id"), str):
            self.prefix = experiment_prefix(event["experiment_id"])
        self.sessions += 1
        config = event.get("config") or {}
        self.metric = config.get("metric", self.metric)
        self.mode = config.get("mode", self.mode)

    def _on_dataset(self, event: Mapping[str, Any]) -> None:
        self.dataset_id = event["dataset_id"]

    def _on_trial_added(self, event: Mapping[str, Any]) -> None:
        trial = TrialState(event["trial"], event["params"], event["seed"], event["spec"])
        source = event.get("clone_from")
        if source is not None:
            self._clones.append(trial.trial_id)
            parent = self.trials[source]
            trial.checkpoint = parent.checkpoint
            trial.checkpoint_sha256 = parent.checkpoint_sha256
        self.trials[trial.trial_id] = trial

    def _on_round_start(self, event: Mapping[str, Any]) -> None:
        self.round = event["round"]
        self.round_open = True
        self.round_trials = list(event["trials"])
        self.visit_orders = event["visit_orders"]
        self.round_resources = {t: int(k) for t, k in (event.get("resources") or {}).items()}
        plans = event.get("group_plans")
        self.round_group_plans = None if plans is None else {t: list(p) for t, p in plans.items()}
        self.round_pack_size = int(event.get("pack_size", 1))
        self._fold_procedure_state(event)
        self._open_groups = {}
        self.done_units = []
        self.reported = set()
        self.validation_sums = defaultdict(dict)
        self.validation_rows = defaultdict(int)
        self.validation_states = defaultdict(dict)
        self.validation_units = defaultdict(int)
        self.unit_seconds = defaultdict(float)

    def _on_unit_end(self, event: Mapping[str, Any]) -> None:
        group = event.get("group")
        if group is None:
            self._apply_unit_end(event)
            return
        ends = self._open_groups.setdefault(group, {})
        ends[event["step"]] = event
        if len(ends) == len(event["group_partitions"]):  # the group's last unit_end
            del self._open_groups[group]
            for step in sorted(ends):
                self._apply_unit_end(ends[step])

    def _apply_unit_end(self, event: Mapping[str, Any]) -> None:
        kind = _unit_kind(event["kind"])
        trial = event["trial"]
        self.done_units.append(DoneUnit(trial, event["partition"], kind, event["step"]))
        self.unit_seconds[trial] += event.get("seconds", 0.0)
        if kind is UnitKind.TRAIN:
            record = self.trials[trial]
            if trial in self._derived_best and record.best_checkpoint == record.checkpoint:
                # The engine that wrote this log deleted the checkpoint it moved past.
                record.best_checkpoint = record.best_checkpoint_sha256 = None
            record.checkpoint = self._key(event["checkpoint"])
            record.checkpoint_sha256 = event["checkpoint_sha256"]
        else:
            sums = self.validation_sums[trial]
            for name, value in event["metric_sums"].items():
                sums[name] = sums.get(name, 0.0) + value
            self.validation_rows[trial] += event["rows"]
            self.validation_units[trial] += 1
            states = event.get("metric_states")  # absent in logs of older versions
            if states:
                by_partition = self.validation_states[trial]
                by_partition[int(event["partition"])] = unpack_states(states)

    def _on_trial_failed(self, event: Mapping[str, Any]) -> None:
        trial = self.trials[event["trial"]]
        trial.status = FAILED
        trial.error = event["error"]
        if trial.trial_id not in self.failures:
            self.failures.append(trial.trial_id)

    def _on_trial_epoch(self, event: Mapping[str, Any]) -> None:
        trial = self.trials[event["trial"]]
        trial.epochs = event["epoch"]
        trial.metrics = event["metrics"]
        trial.history.append(event["metrics"])
        self.reported.add(trial.trial_id)
        if "best_epoch" in event:
            self._derived_best.discard(trial.trial_id)
            self._record_best(trial, event)
        else:
            self._derived_best.add(trial.trial_id)
            self._derive_best(trial, event)

    def _record_best(self, trial: TrialState, event: Mapping[str, Any]) -> None:
        """Fold the best epoch a ``trial_epoch`` event records."""
        best = event["best_epoch"]
        trial.best_epoch = None if best is None else int(best)
        trial.best_metrics = (
            trial.history[best - 1] if best is not None and 0 < best <= len(trial.history) else {}
        )
        trial.best_checkpoint = self._key(event.get("best_checkpoint"))
        trial.best_checkpoint_sha256 = event.get("best_checkpoint_sha256")

    def _derive_best(self, trial: TrialState, event: Mapping[str, Any]) -> None:
        """The best epoch of a log written before ``trial_epoch`` recorded it."""
        if self.metric is None or self.mode is None:
            return
        if improves(event["metrics"], trial.best_metrics or None, self.metric, self.mode):
            trial.best_epoch = int(event["epoch"])
            trial.best_metrics = event["metrics"]
            trial.best_checkpoint = self._key(event.get("checkpoint"))
            trial.best_checkpoint_sha256 = event.get("checkpoint_sha256")

    def _on_decision(self, event: Mapping[str, Any]) -> None:
        trial = self.trials[event["trial"]]
        trial.status = event["status"]

    def _on_trial_resumed(self, event: Mapping[str, Any]) -> None:
        self.trials[event["trial"]].status = RUNNING

    def _on_round_end(self, event: Mapping[str, Any]) -> None:
        self.round_open = False
        self._fold_procedure_state(event)

    def _fold_procedure_state(self, event: Mapping[str, Any]) -> None:
        """A snapshot (``procedure_state``) or a delta on the last one (:mod:`._state_delta`)."""
        if "procedure_state_delta" in event:
            self.procedure_state = apply_delta(self.procedure_state, event["procedure_state_delta"])
        else:
            self.procedure_state = event["procedure_state"]

    def _on_worker_bytes(self, event: Mapping[str, Any]) -> None:
        self.worker_bytes[event["worker"]] = event["bytes_read"]

    def _worker(self, event: Mapping[str, Any], status: str | None = None) -> WorkerState:
        """The event's worker, its fields updated from the event."""
        worker = self.workers.setdefault(event["worker"], WorkerState(event["worker"]))
        if status is not None:
            worker.status = status
        if "partitions" in event:
            worker.partitions = frozenset(int(p) for p in event["partitions"])
        for field in ("host", "executor_id", "device", "bytes_read"):
            if field in event:
                setattr(worker, field, event[field])
        return worker

    def _on_worker_joined(self, event: Mapping[str, Any]) -> None:
        # Logs written before membership events had "joined" mean ready, with partitions.
        self._worker(event, READY if "partitions" in event else JOINED)

    def _on_worker_ready(self, event: Mapping[str, Any]) -> None:
        self._worker(event, READY)

    def _on_worker_partitions(self, event: Mapping[str, Any]) -> None:
        self._worker(event)

    def _on_worker_retiring(self, event: Mapping[str, Any]) -> None:
        self._worker(event, RETIRING)

    def _on_worker_retired(self, event: Mapping[str, Any]) -> None:
        self._worker(event, RETIRED)

    def _on_worker_lost(self, event: Mapping[str, Any]) -> None:
        self._worker(event, LOST).reason = event.get("reason")

    def _on_experiment_end(self, event: Mapping[str, Any]) -> None:
        self.finished = True

    def _on_search_stopped(self, event: Mapping[str, Any]) -> None:
        self.stopped = str(event["reason"])

    def _on_stage_plan(self, event: Mapping[str, Any]) -> None:
        self.stage_plans[int(event["stage"])] = dict(event)

    def _on_stage_actual(self, event: Mapping[str, Any]) -> None:
        self.stage_actuals[int(event["stage"])] = dict(event)

    def _on_elastic_summary(self, event: Mapping[str, Any]) -> None:
        self.elastic_summary = dict(event)


_Handler = Callable[[ExperimentState, Mapping[str, Any]], None]

_HANDLERS: dict[tuple[type[ExperimentState], str], _Handler | None] = {}
"""Each state class's ``_on_<kind>`` method by kind, looked up once (the fold looks one up
per event; the driver folds an event or more a unit)."""


def experiment_times(events: Iterable[Mapping[str, Any]]) -> list[float]:
    """Each event's experiment time: seconds since ``run``, start-up included.

    The one clock users read (the deadline, progress, the report's timeline, the
    plan-vs-actual table): a resumed run's earlier sessions are counted, the time its
    driver was down is not (:attr:`ExperimentState.experiment_seconds`, event by event).
    """
    clock = ExperimentState()
    return [clock.experiment_time(event) for event in events]


def _handler(cls: type[ExperimentState], kind: str) -> _Handler | None:
    """``cls._on_<kind>``, or ``None`` if ``cls`` has no handler for ``kind``."""
    try:
        return _HANDLERS[cls, kind]
    except KeyError:
        pass
    handler: _Handler | None = getattr(cls, f"_on_{kind}", None)
    if handler is not None or kind in EVENT_KINDS:  # unknown kinds are not remembered
        _HANDLERS[cls, kind] = handler
    return handler


_UNIT_KINDS = {kind.value: kind for kind in UnitKind}


def _unit_kind(value: Any) -> UnitKind:
    """``UnitKind(value)`` by a dict lookup (ValueError, TypeError as it raises them)."""
    kind = _UNIT_KINDS.get(value) if isinstance(value, str) else None
    return kind if kind is not None else UnitKind(value)


def _merge(metric: Metric, states: list[Mapping[str, Any]]) -> State | None:
    return merge_states(metric, [dict(state) for state in states])


def epoch_metrics(
    state: ExperimentState, trial_id: str, family: Mapping[str, Metric]
) -> dict[str, float]:
    """A trial's validation metrics over the whole split, from the open round's units.

    The units' states are merged with the family's metrics in partition order, so a
    metric is the same in every run of the same checkpoints. Units logged by older
    versions carry only row-weighted sums: while any of the round's validation units
    lacks states, the sums are averaged as those versions did.

    Args:
        state: The folded log, in the round of the trial's validation units.
        trial_id: The trial.
        family: Its spec's metrics by name (``"loss"`` included).

    Returns:
        The metrics by name, sorted.
    """
    by_partition = state.validation_states.get(trial_id, {})
    if not by_partition or len(by_partition) < state.validation_units[trial_id]:
        rows = state.validation_rows[trial_id]
        sums = state.validation_sums[trial_id]
        return {name: total / rows for name, total in sorted(sums.items())}
    merged: dict[str, list[Mapping[str, Any]]] = {}
    for partition in sorted(by_partition):
        for name, metric_state in by_partition[partition].items():
            merged.setdefault(name, []).append(metric_state)
    metrics: dict[str, float] = {}
    # Metrics that share an accumulator share their states' objects (unpack_states). The
    # default merge adds field by field whatever the metric: merge those states once.
    added: dict[tuple[int, ...], State | None] = {}
    for name in sorted(merged):
        metric = family.get(name)
        states = merged[name]
        if metric is None and set(states[0]) == {"sum", "count"}:
            metric = BatchMean(name)  # a deprecated per-batch metric
        if metric is None:
            logger.warning(
                "trial %s reported metric %r, which its spec does not produce", trial_id, name
            )
            continue
        if type(metric).merge is not Metric.merge:
            total = _merge(metric, states)
        else:
            key = tuple(map(id, states))
            if key not in added:
                added[key] = _merge(metric, states)
            total = added[key]
        metrics[name] = math.nan if total is None else float(metric.value(total))
    return metrics
