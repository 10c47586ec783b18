"""The driver loop: Cerebro's epoch template on model hopper parallelism (Cerebro §4.2).

Each *round*, the search procedure proposes trials and the engine trains every live
trial one epoch with the MOP scheduler (Cerebro Alg. 1–2, §5.5–§5.6): one training unit
per partition, in the trial's visit order, on whichever worker holds the partition; then
one validation unit per validation partition. The procedure then sees each trial's
row-weighted validation metrics and decides continue / pause / stop.

Every change is an event in ``events.jsonl``, applied to :class:`ExperimentState` through
the same code path that ``resume`` uses, so a run killed at any point continues from its
log without redoing a finished unit.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

import numpy as np

from cerebro_spark.backends import Backend, WorkerJob
from cerebro_spark.data import Manifest
from cerebro_spark.engine._config import ExperimentConfig
from cerebro_spark.engine._dataset import resolve_dataset
from cerebro_spark.engine._events import EventLog
from cerebro_spark.engine._leaderboard import LEADERBOARD_NAME, leaderboard_csv, rank
from cerebro_spark.engine._progress import Progress
from cerebro_spark.engine._state import (
    COMPLETED,
    FAILED,
    PAUSED,
    RUNNING,
    STOPPED,
    ExperimentState,
    TrialState,
)
from cerebro_spark.errors import (
    CerebroError,
    ConfigError,
    StoreError,
    TrialError,
    WorkerLostError,
)
from cerebro_spark.mop import (
    Assignment,
    MopScheduler,
    RandomizedRule,
    SchedulingRule,
    Unit,
    WorkAwareRule,
    seeded_visit_orders,
)
from cerebro_spark.search import (
    Decision,
    EpochReport,
    SearchProcedure,
    make_procedure,
    procedure_options,
)
from cerebro_spark.search.space import SearchSpace
from cerebro_spark.store import Store
from cerebro_spark.units import UnitKind, UnitResult, UnitTask

logger = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
BEST_CHECKPOINT_NAME = "best.pt"
_WAIT_SECONDS = 0.5
MAX_UNIT_RETRIES = 3
"""Times a unit is retried after I/O errors before the experiment gives up."""

# Streams of randomness derived from the experiment seed (never global state).
_PROCEDURE_STREAM, _SCHEDULER_STREAM, _TRIAL_STREAM = 0, 1, 2

VisitOrders = Mapping[int, Mapping[str, list[int]]]
"""Visit orders to impose, by round then trial (``replay``)."""


def experiment_prefix(experiment_id: str) -> str:
    """Return the store prefix of an experiment."""
    return f"experiments/{experiment_id}"


def trial_seed(experiment_seed: int, trial_id: str) -> int:
    """Derive a trial's seed from the experiment seed and its id."""
    sequence = np.random.SeedSequence(
        [experiment_seed, _TRIAL_STREAM, zlib.crc32(trial_id.encode())]
    )
    return int(sequence.generate_state(1, np.uint32)[0])


class Experiment:
    """Runs (or resumes) one experiment on a backend.

    Args:
        config: The validated experiment config.
        store: The root store (datasets, experiments).
        experiment_id: Id of the experiment; its files live in ``experiments/<id>/``.
        backend_factory: Builds the backend for a number of workers.
        visit_orders: Visit orders to impose by round and trial (``replay``).
    """

    def __init__(
        self,
        config: ExperimentConfig,
        store: Store,
        experiment_id: str,
        backend_factory: Callable[[ExperimentConfig], Backend],
        *,
        visit_orders: VisitOrders | None = None,
    ) -> None:
        self.config = config
        self.root = store
        self.experiment_id = experiment_id
        self.prefix = experiment_prefix(experiment_id)
        self.store = store.child(self.prefix)
        self.backend_factory = backend_factory
        self.imposed_orders = visit_orders
        self.log = EventLog(self.store)
        self.state = ExperimentState.from_events(self.log.read())
        self._time_before = self.state.experiment_seconds
        self._session_started = time.monotonic()
        self.space = SearchSpace.from_config(config.space)
        self.procedure = self._make_procedure()
        self.progress = Progress()
        self.manifest: Manifest | None = None
        self._known_workers: dict[str, frozenset[int]] = {}
        self._unit_seconds: dict[tuple[str, UnitKind], float] = {}
        self._unit_counts: dict[tuple[str, UnitKind], int] = {}
        self._retries: dict[tuple[Unit, int], int] = {}

    # -- events ---------------------------------------------------------------------------

    def _emit(self, event: str, **fields: Any) -> None:
        record = self.log.append(event, **fields)
        self.state.apply(record)

    # -- set-up ---------------------------------------------------------------------------

    def clock(self) -> float:
        """Experiment time in seconds: 0 at the first start, not counting driver down-time."""
        return self._time_before + time.monotonic() - self._session_started

    def _make_procedure(self) -> SearchProcedure:
        config = self.config
        rng = np.random.default_rng(np.random.SeedSequence([config.seed, _PROCEDURE_STREAM]))
        options = dict(config.procedure_options)
        if "num_workers" in procedure_options(config.procedure):
            options.setdefault("num_workers", config.workers)
        procedure = make_procedure(
            config.procedure,
            space=self.space,
            epochs=config.epochs,
            metric=config.metric,
            mode=config.mode,
            rng=rng,
            clock=self.clock,
            **options,
        )
        if self.state.procedure_state is not None:
            procedure.load_state_dict(self.state.procedure_state)
        return procedure

    def _rule(self) -> SchedulingRule:
        if self.config.rule == "randomized":
            return RandomizedRule()
        return WorkAwareRule(self._estimate_unit_seconds)

    def _estimate_unit_seconds(self, unit: Unit, worker: str) -> float:
        """Mean measured seconds of the trial's units of this kind (1.0 before any)."""
        del worker
        return self._unit_seconds.get((unit.trial, unit.kind), 1.0)

    def _measure(self, unit: Unit, seconds: float) -> None:
        key = (unit.trial, unit.kind)
        count = self._unit_counts.get(key, 0)
        mean = self._unit_seconds.get(key, 0.0)
        self._unit_counts[key] = count + 1
        self._unit_seconds[key] = mean + (seconds - mean) / (count + 1)

    # -- the run --------------------------------------------------------------------------

    def run(self) -> list[TrialState]:
        """Run the experiment to the end and return the trials best first."""
        started = time.monotonic()
        resumed = bool(self.state.trials) or self.state.round >= 0
        if self.state.finished:
            logger.info("experiment %s already finished", self.experiment_id)
            return rank(self.state.trials.values(), self.config.metric, self.config.mode)
        self._emit(
            "experiment_start",
            experiment_id=self.experiment_id,
            config=self.config.to_dict(),
            resumed=resumed,
        )
        self.manifest = resolve_dataset(self.config, self.root)
        if self.state.dataset_id not in (None, self.manifest.dataset_id):
            raise CerebroError(
                f"experiment {self.experiment_id} was run on dataset {self.state.dataset_id}, "
                f"but its config now resolves to {self.manifest.dataset_id}"
            )
        dataset_uri = self.root.url(f"datasets/{self.manifest.dataset_id}")
        self._emit(
            "dataset",
            dataset_id=self.manifest.dataset_id,
            uri=dataset_uri,
            partitions=self.manifest.num_partitions,
            rows={
                "train": self.manifest.rows("train"),
                "validation": self.manifest.rows("validation"),
            },
        )
        backend = self.backend_factory(self.config)
        try:
            backend.start(WorkerJob(dataset_uri, self.root, self.config.torch_threads))
            self._sync_workers(backend, None)
            while self._next_round():
                self._run_round(backend)
                self._end_round()
            for worker_id, info in sorted(backend.workers().items()):
                self._emit("worker_bytes", worker=worker_id, bytes_read=info.bytes_read)
            for trial in sorted(self.state.trials.values(), key=lambda t: t.trial_id):
                if trial.status == PAUSED:  # the procedure finished without resuming it
                    self._emit(
                        "decision",
                        round=self.state.round,
                        trial=trial.trial_id,
                        epoch=trial.epochs,
                        decision=Decision.STOP.value,
                        status=STOPPED,
                    )
        finally:
            backend.close()
        ranked = rank(self.state.trials.values(), self.config.metric, self.config.mode)
        best = next((t for t in ranked if t.metrics and t.status != FAILED), None)
        if best is not None and best.checkpoint is not None:
            self.store.put(BEST_CHECKPOINT_NAME, self.root.get(best.checkpoint))
        self._write_leaderboard()
        self._emit(
            "experiment_end",
            best_trial=best.trial_id if best else None,
            seconds=round(time.monotonic() - started, 3),
        )
        return ranked

    def _next_round(self) -> bool:
        """Open the next round (or continue the open one); False when the search is done."""
        if self.state.round_open:
            logger.info("resuming round %d", self.state.round + 1)
            return True
        for spec in self.procedure.suggest():
            self._add_trial(spec.trial_id, spec.params, spec.clone_from)
        for trial_id in self.procedure.resumed():
            self._emit("trial_resumed", trial=trial_id)
        live = self.state.live_trials()
        if not live:
            if not self.procedure.is_finished():
                logger.warning(
                    "%s suggested no trial and has none live: stopping", self.config.procedure
                )
            return False
        number = self.state.round + 1
        self._emit(
            "round_start",
            round=number,
            trials=live,
            epochs={t: self.state.trials[t].epochs for t in live},
            visit_orders=self._visit_orders(number, live),
            procedure_state=self.procedure.state_dict(),
        )
        return True

    def _add_trial(self, trial_id: str, params: Mapping[str, Any], clone_from: str | None) -> None:
        spec = params.get("model", self.config.model)
        if not isinstance(spec, str):
            raise ConfigError(
                f"trial {trial_id} has no model spec: set 'model' in the config or a 'model' "
                f"param in the space (import path 'package.module:Class'), got {spec!r}"
            )
        self._emit(
            "trial_added",
            trial=trial_id,
            params=dict(params),
            seed=trial_seed(self.config.seed, trial_id),
            spec=spec,
            clone_from=clone_from,
        )

    def _visit_orders(self, number: int, live: list[str]) -> dict[str, list[int]] | None:
        if self.imposed_orders is not None:
            orders = self.imposed_orders.get(number, {})
            missing = [t for t in live if t not in orders]
            if missing:
                raise CerebroError(
                    f"replay has no visit order for round {number + 1}, trials {missing}"
                )
            return {t: list(orders[t]) for t in live}
        if self.config.visit_order == "dynamic":
            return None
        assert self.manifest is not None  # ok: set in run() before any round
        return seeded_visit_orders(
            live, range(self.manifest.num_partitions), self._round_rng(number)
        )

    def _round_rng(self, number: int) -> np.random.Generator:
        return np.random.default_rng(
            np.random.SeedSequence([self.config.seed, _SCHEDULER_STREAM, number])
        )

    # -- one round ------------------------------------------------------------------------

    def _run_round(self, backend: Backend) -> None:
        assert self.manifest is not None  # ok: set in run() before any round
        state = self.state
        live = [t for t in state.round_trials if state.trials[t].status == RUNNING]
        partitions = range(self.manifest.num_partitions)
        done = [Unit(u.trial, u.partition, u.kind) for u in state.done_units if u.trial in live]
        scheduler = MopScheduler(
            trials=live,
            partitions=partitions,
            workers=dict(self._known_workers),
            rng=self._round_rng(state.round),
            rule=self._rule(),
            visit_orders=state.visit_orders,
            validate=True,
            completed=done,
        )
        self.progress.start_round(state.round, 2 * len(live) * len(partitions), len(done))
        for trial_id in live:
            self._maybe_finish_epoch(trial_id)
        running: dict[Future[UnitResult], Assignment] = {}
        while not scheduler.finished:
            for assignment in scheduler.assign():
                running[self._submit(backend, assignment)] = assignment
            if not running:
                if scheduler.stalled:
                    raise CerebroError(
                        "no live worker holds the partitions the remaining units need; "
                        f"workers: {sorted(self._known_workers)}"
                    )
                time.sleep(_WAIT_SECONDS)
                self._sync_workers(backend, scheduler)
                continue
            finished, _ = wait(list(running), timeout=_WAIT_SECONDS, return_when=FIRST_COMPLETED)
            for future in finished:
                self._handle(future, running.pop(future), scheduler)
            self._sync_workers(backend, scheduler, running)
            self.progress.maybe_log()
        self.progress.maybe_log(force=True)

    def _submit(self, backend: Backend, assignment: Assignment) -> Future[UnitResult]:
        unit = assignment.unit
        trial = self.state.trials[unit.trial]
        params = {k: v for k, v in trial.params.items() if k != "model"}
        checkpoint_out = None
        if unit.kind is UnitKind.TRAIN:
            checkpoint_out = (
                f"{self.prefix}/checkpoints/{trial.trial_id}/"
                f"e{trial.epochs:04d}-s{assignment.step:04d}.pt"
            )
        task = UnitTask(
            kind=unit.kind,
            trial_id=trial.trial_id,
            spec=trial.spec,
            params=params,
            trial_seed=trial.seed,
            epoch=trial.epochs,
            partition=unit.partition,
            step=assignment.step,
            epoch_units=self.manifest.num_partitions if self.manifest else 1,
            checkpoint_in=trial.checkpoint,
            checkpoint_out=checkpoint_out,
        )
        self.log.append(
            "unit_start",
            round=self.state.round,
            trial=trial.trial_id,
            epoch=trial.epochs,
            kind=unit.kind.value,
            partition=unit.partition,
            step=assignment.step,
            worker=assignment.worker,
        )
        return backend.submit(assignment.worker, task)

    def _handle(
        self, future: Future[UnitResult], assignment: Assignment, scheduler: MopScheduler
    ) -> None:
        unit = assignment.unit
        where = {
            "round": self.state.round,
            "trial": unit.trial,
            "epoch": self.state.trials[unit.trial].epochs,
            "kind": unit.kind.value,
            "partition": unit.partition,
            "step": assignment.step,
            "worker": assignment.worker,
        }
        try:
            result = future.result()
        except WorkerLostError as error:
            self._emit("unit_failed", **where, reason="worker_lost", error=str(error))
            self._lose_worker(assignment.worker, scheduler)
            return
        except StoreError as error:
            self._emit("unit_failed", **where, reason="io_error", error=str(error))
            key = (unit, self.state.trials[unit.trial].epochs)
            self._retries[key] = self._retries.get(key, 0) + 1
            if self._retries[key] > MAX_UNIT_RETRIES:
                raise CerebroError(
                    f"unit {unit} failed {self._retries[key]} times with I/O errors; last: {error}"
                ) from error
            logger.warning("retrying %s after an I/O error: %s", unit, error)
            scheduler.fail(unit, worker=assignment.worker)
            return
        except TrialError as error:
            self._emit("unit_failed", **where, reason="trial_error", error=str(error))
            scheduler.remove_trial(unit.trial)
            self._emit("trial_failed", trial=unit.trial, error=str(error))
            self.procedure.on_trial_failed(unit.trial)
            logger.error("trial %s failed: %s", unit.trial, error)
            return
        previous = self.state.trials[unit.trial].checkpoint
        self._emit(
            "unit_end",
            **where,
            seconds=round(result.seconds, 6),
            io_seconds=round(result.io_seconds, 6),
            rows=result.rows,
            metric_sums=dict(result.metric_sums),
            checkpoint=result.task.checkpoint_out,
            checkpoint_bytes=result.checkpoint_bytes,
            checkpoint_sha256=result.checkpoint_sha256,
        )
        scheduler.complete(unit, worker=assignment.worker)
        self.progress.unit_done()
        self._measure(unit, result.seconds)
        if unit.kind is UnitKind.TRAIN:
            self._drop_checkpoint(previous, unit.trial)
        else:
            self._maybe_finish_epoch(unit.trial)

    def _drop_checkpoint(self, key: str | None, trial_id: str) -> None:
        """Delete a trial's superseded checkpoint (Cerebro §5.6: only the last is needed)."""
        own = f"{self.prefix}/checkpoints/{trial_id}/"
        if key is None or not key.startswith(own):
            return  # a checkpoint cloned from another trial stays with its owner
        if any(t.checkpoint == key for t in self.state.trials.values()):
            return
        self.root.delete(key)

    def _maybe_finish_epoch(self, trial_id: str) -> None:
        """Emit a trial's epoch metrics once all its validation units are in."""
        assert self.manifest is not None  # ok: set in run() before any round
        state = self.state
        validated = sum(
            1 for u in state.done_units if u.trial == trial_id and u.kind is UnitKind.VALIDATE
        )
        trial = state.trials[trial_id]
        if validated < self.manifest.num_partitions or trial_id in state.reported:
            return
        rows = state.validation_rows[trial_id]
        metrics = {
            name: total / rows for name, total in sorted(state.validation_sums[trial_id].items())
        }
        self._emit(
            "trial_epoch",
            round=state.round,
            trial=trial_id,
            epoch=trial.epochs + 1,
            metrics=metrics,
            checkpoint=trial.checkpoint,
            checkpoint_sha256=trial.checkpoint_sha256,
        )
        self._update_best()

    def _update_best(self) -> None:
        ranked = rank(self.state.trials.values(), self.config.metric, self.config.mode)
        if ranked and self.config.metric in ranked[0].metrics:
            top = ranked[0]
            self.progress.best = (
                f"{self.config.metric} {top.metrics[self.config.metric]:.4f} ({top.trial_id})"
            )

    # -- workers --------------------------------------------------------------------------

    def _sync_workers(
        self,
        backend: Backend,
        scheduler: MopScheduler | None,
        running: Mapping[Future[UnitResult], Assignment] | None = None,
    ) -> None:
        """Tell the scheduler about workers that joined, left or were re-homed."""
        live = backend.workers()
        for worker_id in sorted(set(self._known_workers) - set(live)):
            self._lose_worker(worker_id, scheduler)
        for worker_id, info in sorted(live.items()):
            known = self._known_workers.get(worker_id)
            if known is None:
                self._emit(
                    "worker_joined",
                    worker=worker_id,
                    partitions=sorted(info.partitions),
                    host=info.host,
                    device=info.device,
                    bytes_read=info.bytes_read,
                )
                if scheduler is not None:
                    scheduler.add_worker(worker_id, info.partitions)
            elif known != info.partitions and scheduler is not None:
                scheduler.set_partitions(worker_id, info.partitions)
            self._known_workers[worker_id] = info.partitions

    def _lose_worker(self, worker_id: str, scheduler: MopScheduler | None) -> None:
        """Forget a dead worker; its running unit goes back to the queue (Cerebro §5.6)."""
        if self._known_workers.pop(worker_id, None) is None:
            return
        unit = scheduler.remove_worker(worker_id) if scheduler is not None else None
        self._emit(
            "worker_lost",
            worker=worker_id,
            unit=None if unit is None else [unit.trial, unit.kind.value, unit.partition],
        )
        if unit is not None:
            logger.warning(
                "worker %s lost while running %s; the unit is queued again", worker_id, unit
            )

    # -- decisions ------------------------------------------------------------------------

    def _end_round(self) -> None:
        """Let the procedure decide every live trial's fate (Cerebro §4.2 template)."""
        state = self.state
        for trial_id in state.round_trials:
            trial = state.trials[trial_id]
            if trial.status != RUNNING:
                continue
            report = EpochReport(
                trial_id, trial.epochs, dict(trial.metrics), state.unit_seconds[trial_id]
            )
            decision = self.procedure.on_epoch_end(report)
            status = {
                Decision.CONTINUE: RUNNING,
                Decision.PAUSE: PAUSED,
                Decision.STOP: COMPLETED if trial.epochs >= self.config.epochs else STOPPED,
            }[decision]
            self._emit(
                "decision",
                round=state.round,
                trial=trial_id,
                epoch=trial.epochs,
                decision=decision.value,
                status=status,
            )
        self._emit("round_end", round=state.round, procedure_state=self.procedure.state_dict())
        self._write_leaderboard()

    def _write_leaderboard(self) -> None:
        text = leaderboard_csv(self.state.trials.values(), self.config.metric, self.config.mode)
        self.store.put(LEADERBOARD_NAME, text.encode())
