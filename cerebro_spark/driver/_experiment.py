"""The driver loop: Cerebro's epoch template on model hopper parallelism (Cerebro §4.2).

Each *round*, the search procedure proposes trials and the engine trains every live
trial one epoch with the MOP scheduler (Cerebro Alg. 1–2, §5.5–§5.6): one training unit
per partition, in the trial's visit order, on whichever worker holds the partition; then
one validation unit per validation partition. The procedure then sees each trial's
row-weighted validation metrics and decides continue / pause / stop.

Every change is an event in ``events.jsonl``, applied to :class:`ExperimentState` through
the same code path that ``resume`` uses, so a run killed at any point continues from its
log without redoing a finished unit.

Group units (Cerebro §5.7, the "Horovod hybrid"; SEER's resources per trial): at each
round start the procedure says how many workers each live trial trains on
(:meth:`~cerebro_spark.search.SearchProcedure.resources`); the answers are logged in
``round_start`` and the MOP scheduler forms groups of up to that many workers
(:class:`~cerebro_spark.mop.MopScheduler`). A group is submitted with
``Backend.submit_group``; its ``k`` results are combined only when all ``k`` are in (one
``unit_end`` per partition, see :mod:`~cerebro_spark.driver._events`), and a group that
fails goes back to the queue whole (§5.6).
Packed units (issue 27): with ``pack`` on, each round's MOP scheduler is given the
round's ``pack_size`` (logged in ``round_start``, so a resumed round packs as it began)
and a pack key per live trial: its spec and :func:`~cerebro_spark.training.pack_fingerprint`
(trials training on groups of workers get none: they are never packed). Seeded visit
orders give the trials of one key, in chunks of ``pack_size``, one order
(:class:`~cerebro_spark.mop.VisitSlots`). A pack goes to ``Backend.submit_pack``;
its members are handled, retried and failed each as its own trial's unit. Each round
builds a fresh scheduler from the live trials: a trial that a procedure stopped, paused
or that failed is in no later pack, and a PBT clone gets its own key.
Replays reproduce groups: the logged visit order, the same
group sizes and the same workers form the same groups, and :func:`logged_group_plans`
recovers the groups a run actually formed (after worker losses, too) to impose them.

Workers (who holds which partitions) are facts in the log too: the engine drains the
backend's membership changes (:meth:`~cerebro_spark.backends.Backend.changes`) into
``worker_*`` events and keeps no other record; the MOP scheduler of a round starts from
:meth:`ExperimentState.ready_workers`, and a resumed run starts its workers with the
logged placement. The engine does not wait for every worker: ``Backend.start`` returns
once one is ready, and the others join the round under way as they become ready (a
round that no ready worker can go on with waits while ``Backend.starting()`` says some
are starting; a round with groups starts once none is, so its groups form on every
worker). Between "the procedure decided the next round" and "visit orders are
drawn for the workers that exist" lies the **stage boundary** (:class:`Stage`): the one
place where an ``on_stage`` hook (a cluster manager) may add or retire workers, whose new
membership the round then uses.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from cerebro_spark._redact import redact, redact_uri
from cerebro_spark.backends import (
    Backend,
    Membership,
    WorkerChange,
    WorkerJob,
    next_worker_index,
)
from cerebro_spark.data import Manifest
from cerebro_spark.driver._checkpoints import CheckpointKeeper
from cerebro_spark.driver._config import ExperimentConfig, worker_budget
from cerebro_spark.driver._events import EventLog
from cerebro_spark.driver._heap import frozen_heap
from cerebro_spark.driver._layout import experiment_prefix, logged_key
from cerebro_spark.driver._leaderboard import (
    LEADERBOARD_NAME,
    best_trial,
    leaderboard_csv,
    rank,
    rank_key,
)
from cerebro_spark.driver._membership import RoundMembership, membership_events
from cerebro_spark.driver._preflight import Preflight
from cerebro_spark.driver._preflight import preflight as run_preflight
from cerebro_spark.driver._procedure import (
    SCHEDULER_STREAM,
    VISIT_ORDER_STREAM,
    build_procedure,
    trial_seed,
)
from cerebro_spark.driver._progress import Progress
from cerebro_spark.driver._rounds import WAIT_SECONDS, RoundCounters, RoundHooks, RoundRunner
from cerebro_spark.driver._stage import Stage, StageHook
from cerebro_spark.driver._state import (
    COMPLETED,
    FAILED,
    PAUSED,
    RUNNING,
    STOPPED,
    ExperimentState,
    TrialState,
    epoch_metrics,
    improves,
)
from cerebro_spark.driver._state_delta import StateLog
from cerebro_spark.driver._stored import check_log_head
from cerebro_spark.driver._warm import WarmKey, park, take_warm
from cerebro_spark.errors import (
    CerebroError,
    ConfigError,
    SearchFailedError,
)
from cerebro_spark.metrics import Metric
from cerebro_spark.mop import (
    MopScheduler,
    RandomizedRule,
    SchedulingRule,
    Unit,
    VisitSlots,
    WorkAwareRule,
    grouped_visit_orders,
    trial_visit_order,
)
from cerebro_spark.search import (
    Decision,
    EpochReport,
    EpochTemplate,
    SearchProcedure,
)
from cerebro_spark.search.space import SearchSpace
from cerebro_spark.store import ExperimentLease, Store
from cerebro_spark.training import load_spec, pack_fingerprint
from cerebro_spark.training._metrics import family_metrics
from cerebro_spark.units import (
    UnitKind,
)

logger = logging.getLogger(__name__)

VisitOrders = Mapping[int, Mapping[str, list[int]]]
"""Visit orders to impose, by round then trial (``replay``)."""
GroupPlans = Mapping[int, Mapping[str, Sequence[int]]]
"""Group sizes to impose along the visit orders, by round then trial (``replay``)."""


class Reporter(Protocol):
    """Pages kept beside a running experiment, read from its log (the report).

    The front door attaches one (:attr:`Experiment.reporter`); the driver only says when.
    """

    def request(self) -> None:
        """Refresh from the log now (a round ended); must return at once."""

    def wait(self) -> None:
        """Return once no refresh is running (before the run returns or raises)."""

    def final(self) -> None:
        """The last refresh, once the run's events are all written."""


class Experiment:
    """Runs (or resumes) one experiment on a backend.

    Args:
        config: The validated experiment config.
        store: The root store (datasets, experiments).
        experiment_id: Id of the experiment; its files live in ``experiments/<id>/``.
        backend_factory: Builds the backend for a number of workers.
        visit_orders: Visit orders to impose by round and trial (``replay``).
        group_plans: Group sizes to impose by round and trial (``replay``, with
            ``visit_orders``; see :func:`logged_group_plans`). Trials a round does not
            name train one unit at a time; ``None`` asks the procedure's
            :meth:`~cerebro_spark.search.SearchProcedure.resources`.
        on_stage: Called at every stage boundary (see :data:`StageHook`).
        preflight: The driver's checks of this config (:func:`preflight`), if already
            made; otherwise they are made here, before any worker starts. Its config
            (metric and mode resolved) is the one the experiment runs.
        lease: The experiment's lease, held by the caller (``run``, ``resume``): while
            given, every event and every checkpoint deletion first checks it is still
            held, so a driver another one took over from writes and deletes nothing.
        started: ``time.monotonic()`` when ``run`` (or ``resume``) was called (default:
            now): experiment time counts from there, start-up included (:meth:`clock`).

    Attributes:
        reporter: Refreshed at round ends and once at the end (``None``: no pages);
            the front door attaches the report here (:mod:`cerebro_spark.engine`).
    """

    def __init__(
        self,
        config: ExperimentConfig,
        store: Store,
        experiment_id: str,
        backend_factory: Callable[[ExperimentConfig], Backend],
        *,
        visit_orders: VisitOrders | None = None,
        group_plans: GroupPlans | None = None,
        on_stage: StageHook | None = None,
        preflight: Preflight | None = None,
        lease: ExperimentLease | None = None,
        started: float | None = None,
    ) -> None:
        self.lease = lease
        self.preflight = preflight if preflight is not None else run_preflight(config, store)
        config = self.config = self.preflight.config
        self.metric, self.mode = config.objective
        self.root = store
        self.experiment_id = experiment_id
        self.prefix = experiment_prefix(experiment_id)
        self.store = store.child(self.prefix)
        self.backend_factory = backend_factory
        self.imposed_orders = visit_orders
        self.imposed_plans = group_plans
        self.on_stage = on_stage
        if group_plans is not None and visit_orders is None:
            raise ConfigError("group_plans size groups along visit orders: impose both")
        self.log = EventLog(self.store)
        self.log.before_write = self._check_lease  # buffered events: still the holder?
        events = self.log.read()
        check_log_head(self.store, events, experiment_id)  # an emptied log is not re-run
        self.state = ExperimentState.from_events(events, self.prefix)
        self.checkpoints = CheckpointKeeper(
            store, self.prefix, self.state, self.log, self._check_lease
        )
        self._time_before = self.state.experiment_seconds
        self._session_started = time.monotonic() if started is None else started
        self.space = SearchSpace.from_config(config.space)
        self.procedure = self._make_procedure()
        self.progress = Progress(epochs=config.epochs, clock=self.clock, origin=0.0)  # since run
        self.manifest: Manifest | None = None
        self._top: str | None = None  # the best trial so far (progress), once known
        self._top_known = False
        self._membership = RoundMembership()  # the round's schedule, kept to the log
        self._unit_seconds: dict[tuple[str, UnitKind], float] = {}
        self._unit_counts: dict[tuple[str, UnitKind], int] = {}
        self._counters = RoundCounters()  # of this driver session, across its rounds
        self.reporter: Reporter | None = None
        self._pack_size = self.preflight.pack_size
        self._procedure_states = StateLog(self.state.procedure_state)  # snapshots and deltas
        self._fingerprints: dict[str, str | None] = {}  # by spec and params (JSON)
        self._slots = VisitSlots(self._pack_size)  # each trial's, from the trials before it
        self._report_due = False  # a round ended: refresh once the next round is under way

    # -- events ---------------------------------------------------------------------------

    def _check_lease(self) -> None:
        if self.lease is not None:
            self.lease.check()

    def _emit(self, event: str, **fields: Any) -> None:
        self._check_lease()
        record = self.log.append(event, **fields)
        self.state.apply(record)

    # -- set-up ---------------------------------------------------------------------------

    def clock(self) -> float:
        """Experiment time in seconds: 0 at ``run``, start-up included, down-time not."""
        return self._time_before + time.monotonic() - self._session_started

    def _make_procedure(self) -> SearchProcedure:
        procedure = build_procedure(self.config, self.clock)
        if self.state.procedure_state is not None:
            procedure.load_state_dict(self.state.procedure_state)
            if self.state.round_open:  # its failures came after the state was saved
                for trial_id in self.state.round_trials:
                    if self.state.trials[trial_id].status == FAILED:
                        procedure.on_trial_failed(trial_id)
        return procedure

    def _rule(self) -> SchedulingRule:
        if self.config.rule == "randomized":
            return RandomizedRule()
        # Per trial and kind, the same on every worker: the scheduler indexes trials by
        # their work left (O(log |S|) a decision); it reads a trial's estimates again
        # after each of its units, so the means _measure updates are seen.
        return WorkAwareRule.per_trial(self._estimate_unit_seconds)

    def _estimate_unit_seconds(self, trial: str, kind: UnitKind) -> float:
        """Mean measured seconds of the trial's units of this kind (1.0 before any)."""
        return self._unit_seconds.get((trial, kind), 1.0)

    def _measure(self, unit: Unit, seconds: float) -> None:
        key = (unit.trial, unit.kind)
        count = self._unit_counts.get(key, 0)
        mean = self._unit_seconds.get(key, 0.0)
        self._unit_counts[key] = count + 1
        self._unit_seconds[key] = mean + (seconds - mean) / (count + 1)

    # -- the run --------------------------------------------------------------------------

    def run(self) -> list[TrialState]:
        """Run the experiment to the end and return the trials best first.

        However it ends, the events it appended are written (:meth:`EventLog.flush`)
        before it returns or raises, so that ``resume`` goes on from all of them.
        """
        try:
            with frozen_heap():  # the collector skips the objects from before the run
                ranked = self._run()
        except BaseException:
            self._wait_for_report()  # nothing writes the report after the run
            try:
                self.log.flush()
            except Exception as error:  # the run's own error says more; this is logged
                logger.error("could not write the last events of the run: %s", error)
            raise
        self.log.flush()
        return ranked

    def _run(self) -> list[TrialState]:
        started = time.monotonic()
        resumed = bool(self.state.trials) or self.state.round >= 0
        if self.state.finished:
            logger.info("experiment %s already finished", self.experiment_id)
            ranked = rank(self.state.trials.values(), self.metric, self.mode)
            self._check_outcome(ranked)
            return ranked
        self._emit(
            "experiment_start",
            experiment_id=self.experiment_id,
            config=redact(self.config.to_dict()),
            resumed=resumed,
            startup=round(time.monotonic() - self._session_started, 3),  # since run
        )
        placement = self._logged_placement()
        self._end_previous_session()
        dataset_uri, self.manifest = self.preflight.dataset_uri, self.preflight.manifest
        if self.state.dataset_id not in (None, self.manifest.dataset_id):
            raise CerebroError(
                f"experiment {self.experiment_id} was run on dataset {self.state.dataset_id}, "
                f"but its config now resolves to {self.manifest.dataset_id}"
            )
        self._emit(
            "dataset",
            dataset_id=self.manifest.dataset_id,
            uri=redact_uri(dataset_uri),  # no credentials of a store URI in the log
            partitions=self.manifest.num_partitions,
            rows={
                "train": self.manifest.rows("train"),
                "validation": self.manifest.rows("validation"),
            },
        )
        job = WorkerJob(
            dataset_uri, self.root, self.config.torch_threads, worker_budget(self.config)
        )
        warm = self._warm_eligible(placement)
        backend = take_warm(self._warm_key(job)) if warm else None
        reused = backend is not None
        if backend is None:
            backend = self.backend_factory(self.config)
        baseline: dict[str, int] = {}  # bytes warm workers read for the searches before
        parked = False
        try:
            if reused:
                baseline = self._announce_warm(backend)
            else:
                backend.start(
                    job, placement=placement, first_worker=next_worker_index(self.state.workers)
                )  # returns once a worker is ready: the others join the rounds as they are
            self._sync_membership(backend)
            while self._next_round(backend):
                self._run_round(backend)
                self._end_round()
            if self.on_stage is not None:
                final = Stage(self.state.round + 1, (), {}, seconds=self.clock(), final=True)
                self._stage_boundary(final, backend)
            for worker_id, info in sorted(backend.workers().items()):
                read = info.bytes_read - baseline.get(worker_id, 0)
                self._emit("worker_bytes", worker=worker_id, bytes_read=read)
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
            if warm:
                park(self._warm_key(job), backend, self.config.warm_workers)
                parked = True
        finally:
            if not parked:
                backend.close()
        self._sync_membership(backend)  # the workers the close stopped (none when parked)
        self.checkpoints.sweep()
        ranked = rank(self.state.trials.values(), self.metric, self.mode)
        best = best_trial(ranked)
        self._write_leaderboard()
        best_key, best_sha256 = self.checkpoints.write_best(best, self.store, self.metric)
        self._emit(
            "experiment_end",
            best_trial=best.trial_id if best else None,
            best_epoch=best.best_epoch if best else None,
            best_checkpoint=_logged(best_key),
            best_checkpoint_sha256=best_sha256,
            failed=len(self.state.failures),
            seconds=round(time.monotonic() - started, 3),
        )
        self.log.flush()
        self._wait_for_report()
        if self.reporter is not None:
            self.reporter.final()
        self._check_outcome(ranked)
        return ranked

    def _warm_eligible(self, placement: object) -> bool:
        """Whether this search's workers are kept warm for the next (and may be warm).

        Not with ``warm_workers: 0``, nor for a resumed run that starts its workers
        where its log placed them, nor for an elastic run (its cluster is resized).
        """
        return self.config.warm_workers > 0 and placement is None and self.on_stage is None

    def _warm_key(self, job: WorkerJob) -> WarmKey:
        application = None
        if "pyspark" in sys.modules:  # a Spark application runs only if pyspark was imported
            from pyspark.sql import SparkSession

            with contextlib.suppress(Exception):  # a session without a SparkContext
                session = SparkSession.getActiveSession()
                application = None if session is None else session.sparkContext.applicationId
        return WarmKey(
            factory=self.backend_factory,
            backend=self.config.backend,
            workers=self.config.workers,
            device=self.config.device,
            application=application,
            # the config's worker memory: one derived from the memory free now varies
            job=(job.dataset_uri, job.store.uri, job.torch_threads, self.config.worker_memory),
        )

    def _announce_warm(self, backend: Backend) -> dict[str, int]:
        """Log a warm backend's workers as joined and ready; return the bytes each had read."""
        workers = sorted(backend.workers().values(), key=lambda info: info.worker_id)
        kinds = (Membership.JOINED, Membership.READY)
        changes = [WorkerChange(kind, info) for info in workers for kind in kinds]
        for event, fields in membership_events(changes, self._membership.unit_of):
            if "bytes_read" in fields:
                fields["bytes_read"] = 0  # nothing read for this search
            self._emit(event, **fields)
            self._membership.follow(event, fields)
        return {info.worker_id: info.bytes_read for info in workers}

    def _check_outcome(self, ranked: Sequence[TrialState]) -> None:
        """Fail a search that produced nothing; warn when only some of its trials failed.

        A search produced nothing when no trial that did not fail reported a finite value
        of the metric -- whatever the procedure, and whether or not it ever suggested a
        trial (a deadline-bound one suggests none once its deadline has passed, which
        start-up alone may take).

        Raises:
            SearchFailedError: No trial completed an epoch with a finite metric: the
                procedure suggested none, every trial failed, or none got that far. The
                message names the first failure (or the deadline, or why the search was
                stopped); the log, leaderboard and checkpoints are written by then.
        """
        state, experiment_id, metric = self.state, self.experiment_id, self.metric
        url = self.root.url(self.prefix)
        failed = [state.trials[t] for t in state.failures if state.trials[t].status == FAILED]
        if best_trial(ranked) is None:
            if not ranked:
                what = (
                    f"search procedure {self.config.procedure!r} of experiment {experiment_id} "
                    "suggested no trial: nothing was trained"
                )
                if self.config.deadline is not None:
                    what += (
                        f"; its deadline of {self.config.deadline:g} s (from run, start-up "
                        f"included) had passed or was too short: the run ended at "
                        f"{self.clock():.1f} s of experiment time"
                    )
            elif failed and len(failed) == len(ranked):
                what = f"every trial of experiment {experiment_id} failed ({len(failed)} trials)"
            elif failed:
                what = (
                    f"no trial of experiment {experiment_id} reported a finite {metric}; "
                    f"{len(failed)} of {len(ranked)} trials failed"
                )
            else:
                what = f"no trial of experiment {experiment_id} reported a finite {metric}"
            if failed:
                what += f"; the first failure: trial {failed[0].trial_id}: {failed[0].error}"
            if state.stopped is not None:
                what += f"; the search was stopped: {state.stopped}"
            raise SearchFailedError(
                f"{what} (event log and leaderboard in {url})",
                experiment_id=experiment_id,
                url=url,
                failures=[(t.trial_id, t.error or "") for t in failed],
                trials=ranked,
            )
        if failed:
            first = failed[0]
            logger.warning(
                "%d of %d trials failed (the first: trial %s: %s); the others' results "
                "stand, see leaderboard.csv in %s",
                len(failed),
                len(ranked),
                first.trial_id,
                first.error,
                url,
            )

    def _logged_placement(self) -> list[list[int]] | None:
        """The partitions of each worker taking units at the end of the log, if any."""
        ready = self.state.ready_workers()
        order = sorted(ready, key=lambda w: (next_worker_index([w]), w))
        return [sorted(ready[w]) for w in order] or None

    def _end_previous_session(self) -> None:
        """Record that the workers of a previous driver session are gone (they died with it)."""
        for worker_id, worker in sorted(self.state.workers.items()):
            if worker.present:
                self._emit(
                    "worker_lost",
                    worker=worker_id,
                    reason="the driver session that ran it ended",
                    unit=None,
                )

    def _next_round(self, backend: Backend) -> bool:
        """Open the next round (or continue the open one); False when the search is done."""
        if self.state.round_open:
            logger.info("resuming round %d", self.state.round + 1)
            if self.state.round_group_plans or any(
                k > 1 for k in self.state.round_resources.values()
            ):
                self._await_starting(backend)
            return True
        if self.state.stopped is not None:
            return False
        # The epoch template's rules (search/_template.py): it refuses a resumed trial that
        # is not paused (a failed one included), a reused id, a finished procedure's trials.
        opening = self._template().open_round(self._statuses_for_opening())
        for spec in opening.added:
            self._add_trial(spec.trial_id, spec.params, spec.clone_from)
        for trial_id in opening.resumed:
            self._emit("trial_resumed", trial=trial_id)
        live = self.state.live_trials()
        if not live:
            if opening.stalled:
                logger.warning(
                    "%s suggested no trial and has none live: stopping", self.config.procedure
                )
            return False
        number = self.state.round + 1
        resources = {t: self._resources(t) for t in live}
        pack = self._pack_size
        stop = self._stage_boundary(
            Stage(number, tuple(live), resources, seconds=self.clock()), backend
        )
        if stop is not None:
            self._stop_search(stop)
            return False
        if any(k > 1 for k in resources.values()):
            self._await_starting(backend)
        self._emit(
            "round_start",
            round=number,
            trials=live,
            epochs={t: self.state.trials[t].epochs for t in live},
            visit_orders=self._visit_orders(number, live, resources),
            resources=resources,
            group_plans=self._imposed_group_plans(number, live),
            **self._procedure_states.fields(self.procedure.state_dict()),
            **({"pack_size": pack} if pack > 1 else {}),  # off: the events of old
        )
        return True

    def _stage_boundary(self, stage: Stage, backend: Backend) -> str | None:
        """Where a cluster manager may resize, before the round's visit orders are drawn.

        Returns:
            Why the search must stop, if the hook says so.
        """
        self._sync_membership(backend)
        if self.on_stage is None:
            return None
        self.log.flush()  # a resize acts on the cluster: the log is current first
        directive = self.on_stage(stage, backend)
        self._sync_membership(backend)
        if directive is None:
            return None
        for event, fields in directive.events:
            self._emit(event, **fields)
        return directive.stop

    def _await_starting(self, backend: Backend) -> None:
        """Wait until no worker is starting, before a round with groups.

        A round's groups are formed on the workers there are (Cerebro §5.7): a group round
        does not start on the first few.
        """
        if not backend.starting():
            return
        logger.info(
            "waiting for %d starting workers: the groups of this round are formed on every worker",
            backend.starting(),
        )
        self.log.flush()  # idle: the log is made current while the driver waits
        while backend.starting():
            time.sleep(WAIT_SECONDS)
            self._sync_membership(backend)
        self._sync_membership(backend)

    def _stop_search(self, reason: str) -> None:
        """End the search before its next round: every live trial is stopped."""
        logger.warning("stopping the search: %s", reason)
        self._emit("search_stopped", round=self.state.round, reason=reason)
        for trial_id in self.state.live_trials():
            trial = self.state.trials[trial_id]
            self._emit(
                "decision",
                round=self.state.round,
                trial=trial_id,
                epoch=trial.epochs,
                decision=Decision.STOP.value,
                status=COMPLETED if trial.epochs >= self.config.epochs else STOPPED,
            )

    def _resources(self, trial_id: str) -> int:
        """The procedure's number of workers for a trial's next epoch (Cerebro §5.7).

        Raises:
            ProcedureContractError: Not an integer >= 1 (the epoch template's rule).
        """
        return self._template().resources(trial_id)

    def _template(self) -> EpochTemplate:
        """The epoch template's rules around this experiment's procedure."""
        return EpochTemplate(self.procedure, name=self.config.procedure, epochs=self.config.epochs)

    def _statuses_for_opening(self) -> dict[str, str]:
        """Every trial's status as the procedure last saw it, for the template.

        A driver that died after a round's opening was logged (its ``trial_added`` and
        ``trial_resumed`` events) but before its ``round_start`` (at the stage boundary)
        left a procedure restored from the state saved before that opening: it suggests
        and resumes those trials again. To the template they are what that state knew:
        not added yet, paused. Only the first opening of a resumed session can follow such
        an opening; it reads the log once to find it.
        """
        statuses = {t: trial.status for t, trial in self.state.trials.items()}
        if self.state.sessions < 2 or self.__dict__.get("_reopened", False):
            return statuses
        self._reopened = True
        added: set[str] = set()
        resumed: set[str] = set()
        for event in self.log.read():  # the opening is what follows the last saved state
            kind = event["event"]
            if kind in ("round_start", "round_end"):
                added.clear()
                resumed.clear()
            elif kind == "trial_added":
                added.add(event["trial"])
            elif kind == "trial_resumed":
                resumed.add(event["trial"])
        for trial_id in resumed:
            if statuses.get(trial_id) == RUNNING:
                statuses[trial_id] = PAUSED
        for trial_id in added:
            statuses.pop(trial_id, None)
        return statuses

    def _imposed_group_plans(self, number: int, live: list[str]) -> dict[str, list[int]] | None:
        if self.imposed_plans is None:
            return None
        plans = self.imposed_plans.get(number, {})
        return {t: [int(size) for size in plans[t]] for t in live if t in plans}

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

    def _visit_orders(
        self, number: int, live: list[str], resources: Mapping[str, int]
    ) -> dict[str, list[int]] | None:
        """The round's visit orders: imposed (replay), none (dynamic) or seeded.

        A seeded order is a function of the experiment seed, the trial's slot and the
        epoch it is about to train (issue 29: another trial's failure, stop or clone, or
        the size of the search, never changes a trial's weights;
        :func:`~cerebro_spark.mop.trial_visit_order`); only a group trial's order is then
        rearranged, so that its groups form on the current workers (§5.7).
        """
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
        for trial_id in list(self.state.trials)[len(self._slots) :]:  # in creation order
            key = self._pack_key(trial_id) if self._pack_size > 1 else None
            self._slots.add(trial_id, key)  # pack mates (one key, one chunk) share a slot
        partitions = range(self.manifest.num_partitions)
        entropy = (self.config.seed, VISIT_ORDER_STREAM)
        orders = {
            t: trial_visit_order(partitions, entropy, self.state.trials[t].epochs, self._slots[t])
            for t in live
        }
        return grouped_visit_orders(orders, resources, self.state.ready_workers())

    def _pack_keys(self, live: Sequence[str], sizes: Mapping[str, int]) -> dict[str, str]:
        """Each live trial's pack key (issue 27); none for group trials (``sizes`` > 1)."""
        keys = {t: self._pack_key(t) for t in live if sizes.get(t, 1) <= 1}
        return {t: key for t, key in keys.items() if key is not None}

    def _pack_key(self, trial_id: str) -> str | None:
        """A trial's pack key: its spec and model structure.

        ``None`` where its model cannot be built from its params (its units fail as they
        would).
        """
        assert self.manifest is not None  # ok: set in run() before any round
        trial = self.state.trials[trial_id]
        params = {k: v for k, v in trial.params.items() if k != "model"}
        cached = f"{trial.spec}\n{json.dumps(params, sort_keys=True, default=str)}"
        if cached not in self._fingerprints:
            try:
                digest = pack_fingerprint(load_spec(trial.spec), params, self.manifest.info)
                self._fingerprints[cached] = f"{trial.spec}:{digest}"
            except Exception as error:  # user code: its own units will report it
                logger.info("trial %s is not packed: %s", trial_id, error)
                self._fingerprints[cached] = None
        return self._fingerprints[cached]

    def _round_rng(self, number: int) -> np.random.Generator:
        return np.random.default_rng(
            np.random.SeedSequence([self.config.seed, SCHEDULER_STREAM, number])
        )

    # -- one round ------------------------------------------------------------------------

    def _run_round(self, backend: Backend) -> None:
        assert self.manifest is not None  # ok: set in run() before any round
        state = self.state
        live = [t for t in state.round_trials if state.trials[t].status == RUNNING]
        partitions = range(self.manifest.num_partitions)
        alive = set(live)
        done = [Unit(u.trial, u.partition, u.kind) for u in state.done_units if u.trial in alive]
        sizes: dict[str, int] = {}
        plans: dict[str, list[int]] | None = None
        if state.round_group_plans is not None:
            plans = {t: p for t, p in state.round_group_plans.items() if t in alive}
        else:
            sizes = {t: k for t, k in state.round_resources.items() if t in alive and k > 1}
        orders = state.visit_orders
        if orders is not None:  # a resumed round: trials that failed in it are out
            orders = {t: order for t, order in orders.items() if t in alive}
        pack = state.round_pack_size
        unpacked = {t: 2 for t in (plans or {})} | sizes  # group trials are never packed
        keys = self._pack_keys(live, unpacked) if pack > 1 else None
        scheduler = MopScheduler(
            trials=live,
            partitions=partitions,
            workers=state.ready_workers(),
            rng=self._round_rng(state.round),
            rule=self._rule(),
            visit_orders=orders,
            validate=True,
            completed=done,
            group_sizes=sizes,
            group_plans=plans or None,
            pack_keys=keys,
            pack_size=pack,
        )
        epoch = max((state.trials[t].epochs for t in live), default=0)
        self.progress.start_round(state.round, 2 * len(live) * len(partitions), len(done), epoch)
        for trial_id in live:
            self._maybe_finish_epoch(trial_id)
        self._membership = RoundMembership(scheduler)
        RoundRunner(
            scheduler,
            backend,
            state=state,
            log=self.log,
            progress=self.progress,
            checkpoints=self.checkpoints,
            membership=self._membership,
            counters=self._counters,
            hooks=RoundHooks(
                emit=self._emit,
                sync=self._sync_membership,
                units_out=self._request_report,
                unit_done=self._measure,
                validation_in=self._maybe_finish_epoch,
                fail_trial=self._fail_trial,
            ),
            prefix=self.prefix,
            epoch_units=self.manifest.num_partitions,
        ).run()
        self._membership = RoundMembership()  # between rounds: no schedule to keep

    def _fail_trial(self, trial_id: str, error: CerebroError, scheduler: MopScheduler) -> None:
        scheduler.remove_trial(trial_id)
        self._emit("trial_failed", trial=trial_id, error=str(error))
        self.procedure.on_trial_failed(trial_id)
        logger.error("trial %s failed: %s", trial_id, error)

    def _maybe_finish_epoch(self, trial_id: str) -> None:
        """Emit a trial's epoch metrics once all its validation units are in."""
        assert self.manifest is not None  # ok: set in run() before any round
        state = self.state
        validated = state.validation_units.get(trial_id, 0)  # of the open round
        trial = state.trials[trial_id]
        if validated < self.manifest.num_partitions or trial_id in state.reported:
            return
        metrics = epoch_metrics(state, trial_id, self._family(trial.spec))
        previous_best = trial.best_checkpoint
        self._emit(
            "trial_epoch",
            round=state.round,
            trial=trial_id,
            epoch=trial.epochs + 1,
            metrics=metrics,
            checkpoint=_logged(trial.checkpoint),
            checkpoint_sha256=trial.checkpoint_sha256,
            **self._best_fields(trial, metrics),
        )
        self.checkpoints.drop(previous_best, trial_id)  # once logged: no longer the best
        self._update_best(trial_id)

    def _family(self, spec: str) -> Mapping[str, Metric]:
        """The metrics of a spec's trials (from the pre-flight, else built now)."""
        family = self.preflight.families.get(spec)
        if family is None:
            assert self.manifest is not None  # ok: set in run() before any round
            family = family_metrics(load_spec(spec), self.manifest.info)
            self.preflight = dataclasses.replace(
                self.preflight, families={**self.preflight.families, spec: family}
            )
        return family

    def _best_fields(self, trial: TrialState, metrics: Mapping[str, float]) -> dict[str, Any]:
        """The ``best_*`` fields of the ``trial_epoch`` that reports ``metrics``.

        The checkpoint a trial has when its epoch's validation is in is the one trained
        through that epoch: it becomes the best if the epoch improves on the best so far
        (:func:`~cerebro_spark.driver._state.improves`); the best before it is then
        deleted once the event is logged, unless a trial still needs it.
        """
        if improves(metrics, trial.best_metrics or None, self.metric, self.mode):
            return {
                "best_epoch": trial.epochs + 1,
                "best_checkpoint": _logged(trial.checkpoint),
                "best_checkpoint_sha256": trial.checkpoint_sha256,
            }
        return {
            "best_epoch": trial.best_epoch,
            "best_checkpoint": _logged(trial.best_checkpoint),
            "best_checkpoint_sha256": trial.best_checkpoint_sha256,
        }

    def _update_best(self, reported: str) -> None:
        """Show the best trial so far (:func:`best_trial` of the leaderboard's ranking).

        Only the trial that ``reported`` an epoch changed its rank since the last call
        (a rank only improves), so it is compared with the best so far; the whole field
        is ranked again only at the first call, when the best itself reported, or when
        the best has failed since.
        """
        trials = self.state.trials
        top = None if self._top is None else trials[self._top]
        if (
            not self._top_known
            or reported == self._top
            or (top is not None and top.status == FAILED)
        ):
            eligible = [
                t for t in trials.values() if t.status != FAILED and t.best_epoch is not None
            ]
            top = min(eligible, key=self._rank_key, default=None)
        else:
            trial = trials[reported]
            if (
                trial.status != FAILED
                and trial.best_epoch is not None
                and (top is None or self._rank_key(trial) < self._rank_key(top))
            ):
                top = trial
        self._top_known = True
        self._top = None if top is None else top.trial_id
        if top is not None:
            value = top.best_metrics[self.metric]
            self.progress.best = (
                f"{self.metric} {value:.4f} ({top.trial_id}, epoch {top.best_epoch})"
            )

    def _rank_key(self, trial: TrialState) -> tuple[int, float, float, str]:
        return rank_key(trial, self.metric, self.mode)

    # -- workers --------------------------------------------------------------------------

    def _sync_membership(self, backend: Backend) -> bool:
        """Log the backend's membership changes; the round's schedule follows each.

        Returns:
            Whether there was any change.
        """
        changes = backend.changes()
        for event, fields in membership_events(changes, self._membership.unit_of):
            self._emit(event, **fields)
            self._membership.follow(event, fields)
        return bool(changes)

    # -- decisions ------------------------------------------------------------------------

    def _end_round(self) -> None:
        """Let the procedure decide every live trial's fate (Cerebro §4.2 template)."""
        state = self.state
        template = self._template()
        for trial_id in state.round_trials:
            trial = state.trials[trial_id]
            if trial.status != RUNNING:
                continue
            report = EpochReport(
                trial_id, trial.epochs, dict(trial.metrics), state.unit_seconds[trial_id]
            )
            decision, status = template.close_epoch(report)  # a Decision, or refused
            self._emit(
                "decision",
                round=state.round,
                trial=trial_id,
                epoch=trial.epochs,
                decision=decision.value,
                status=status,
            )
        self._emit(
            "round_end",
            round=state.round,
            **self._procedure_states.fields(self.procedure.state_dict()),
        )
        self._write_leaderboard()
        if self.procedure.is_finished() and not self.state.live_trials():
            return  # the run ends now: its final refresh follows, this one would be redone
        self.log.flush()  # the report reads the log
        self._report_due = True  # asked for once the next round's first units are out

    def _request_report(self) -> None:
        """Refresh the report in a thread, if a round end asked for it.

        Called once the next round has submitted its first units (or found none to
        submit): the rendering thread would otherwise take the interpreter from the
        round's start while the workers wait for their units.
        """
        if not self._report_due:
            return
        self._report_due = False
        if self.reporter is not None:
            self.reporter.request()  # returns at once: the workers do not wait for pages

    def _wait_for_report(self) -> None:
        """Wait for a report refresh still running from a round end."""
        if self.reporter is not None:
            self.reporter.wait()

    def _write_leaderboard(self) -> None:
        text = leaderboard_csv(self.state.trials.values(), self.metric, self.mode)
        self.store.put(LEADERBOARD_NAME, text.encode())


def _logged(key: str | None) -> str | None:
    """A checkpoint key as the log names it (relative to the experiment)."""
    return None if key is None else logged_key(key)
