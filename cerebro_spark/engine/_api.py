"""Run, resume and replay experiments: the functions behind the CLI."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import itertools
import json
import logging
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator

from cerebro_spark._redact import redact
from cerebro_spark.backends import Backend
from cerebro_spark.backends._pool import check_worker_count
from cerebro_spark.driver._config import (
    ExperimentConfig,
    check_name,
    pack_size,
    parse_pack,
    validate_config,
)
from cerebro_spark.driver._events import read_events
from cerebro_spark.driver._experiment import Experiment, GroupPlans, VisitOrders
from cerebro_spark.driver._group_plans import logged_group_plans
from cerebro_spark.driver._layout import BEST_CHECKPOINT_NAME, experiment_prefix
from cerebro_spark.driver._leaderboard import best_trial
from cerebro_spark.driver._preflight import preflight
from cerebro_spark.driver._stage import StageHook
from cerebro_spark.driver._state import FAILED, ExperimentState, TrialState
from cerebro_spark.driver._stored import config_key, load_experiment_config, read_experiment_events
from cerebro_spark.engine._backend import check_backend_settings, default_backend
from cerebro_spark.engine._elastic import ElasticController, elastic_run
from cerebro_spark.errors import ConfigError, LeaseError
from cerebro_spark.report import ReportRefresher
from cerebro_spark.store import (
    ExperimentLease,
    FileSystemStore,
    Store,
    experiment_lease,
    open_store,
)
from cerebro_spark.store._lease import default_timeout
from cerebro_spark.tracking import track_experiment
from cerebro_spark.training import (
    CONTENT_DIGEST_KEY,
    CheckpointError,
    content_digest,
    decode_checkpoint,
)

logger = logging.getLogger(__name__)

BackendFactory = Callable[[ExperimentConfig], Backend]


@dataclasses.dataclass(frozen=True)
class ExperimentResult:
    """What a finished run returns.

    A run in which some trials failed still returns one (its leaderboard shows their
    errors and a warning is logged); a run that produced nothing raises
    :class:`~cerebro_spark.errors.SearchFailedError` instead.

    Attributes:
        experiment_id: Its id.
        store: The root store it lives in.
        trials: Every trial, best first (by its best epoch; failed trials last).
    """

    experiment_id: str
    store: Store
    trials: list[TrialState]

    @property
    def best(self) -> TrialState | None:
        """The best trial, or ``None`` when no trial reported a finite metric.

        Its ``best_epoch``, ``best_metrics`` and ``best_checkpoint`` are what ``best.pt``
        holds.
        """
        return best_trial(self.trials)

    @property
    def failed(self) -> list[TrialState]:
        """The trials that failed (their ``error`` says why), in id order."""
        return sorted((t for t in self.trials if t.status == FAILED), key=lambda t: t.trial_id)

    @property
    def best_checkpoint_url(self) -> str | None:
        """URI of ``best.pt`` (the best epoch of the best trial), or ``None`` without one."""
        if self.best is None:
            return None
        return self.store.url(f"{experiment_prefix(self.experiment_id)}/{BEST_CHECKPOINT_NAME}")

    @property
    def url(self) -> str:
        """URI of the experiment's directory."""
        return self.store.url(experiment_prefix(self.experiment_id))


def new_experiment_id(config: ExperimentConfig, store: Store) -> str:
    """Return ``<name>-<UTC time>``, made unique within the store."""
    return next(_new_ids(config, store))


def _new_ids(config: ExperimentConfig, store: Store) -> Iterator[str]:
    """``<name>-<UTC time>``, then ``...-2``, ``...-3``: each not yet started in the store."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    base = f"{config.name}-{stamp}"
    yield from _free_ids(store, (base if n == 1 else f"{base}-{n}" for n in itertools.count(1)))


def _free_ids(store: Store, candidates: Iterator[str]) -> Iterator[str]:
    for candidate in candidates:
        if not store.exists(config_key(candidate)):
            yield candidate


def _check_lease_timeout(timeout: float | None) -> None:
    """Refuse a bad lease timeout before anything is prepared or written."""
    if timeout is None:
        default_timeout()  # CEREBRO_LEASE_TIMEOUT_SECONDS
    elif isinstance(timeout, bool) or not timeout > 0 or timeout == float("inf"):
        raise ConfigError(f"lease_timeout must be a number of seconds > 0, got {timeout!r}")


def _lease(store: Store, experiment_id: str, timeout: float | None) -> ExperimentLease:
    return experiment_lease(
        store,
        experiment_prefix(experiment_id),
        f"experiment {experiment_id} in {store.uri}",
        timeout=timeout,
    )


def check_store_writable(store: Store) -> None:
    """Refuse a local store that cannot be written, before anything is prepared or run.

    A store under a regular file, or in a directory this user may not write (or on a
    read-only file system), is refused naming the path. Object stores are checked by
    their first write (the experiment's lease).

    Raises:
        ConfigError: Naming the store and the rule.
    """
    if not isinstance(store, FileSystemStore) or store.filesystem.type_name != "local":
        return
    existing = store.root
    while not os.path.exists(existing):
        parent = os.path.dirname(existing)
        if parent == existing:
            break
        existing = parent
    if not os.path.isdir(existing):
        raise ConfigError(
            f"store {store.uri} is under {existing}, which is a regular file: a store must "
            "be a directory (or a path where one can be created)"
        )
    try:  # a probe, removed at once: access() says yes to root on a read-only mount
        os.rmdir(tempfile.mkdtemp(prefix=".cerebro-probe-", dir=existing))
    except OSError as error:
        raise ConfigError(
            f"store {store.uri} is not writable: cannot create a directory in {existing} "
            f"({error.strerror or error}); a store must be a directory this user can write"
        ) from None


@contextlib.contextmanager
def _claim(
    store: Store,
    config: ExperimentConfig,
    candidates: Iterator[str],
    *,
    explicit: bool,
    lease_timeout: float | None,
) -> Iterator[tuple[str, ExperimentLease]]:
    """Create the experiment atomically: take its lease, then write ``config.json``.

    Two drivers starting the same id at once: exactly one takes the lease; the other is
    refused (``explicit``) or tries the next candidate id. The lease is held until the
    ``with`` block ends.
    """
    for experiment_id in candidates:
        lease = _lease(store, experiment_id, lease_timeout)
        try:
            lease.acquire()
        except LeaseError:
            if explicit:
                raise
            continue
        try:
            if store.exists(config_key(experiment_id)):
                if explicit:
                    raise ConfigError(
                        f"experiment {experiment_id} already exists in {store.uri}; "
                        "use 'cerebro-spark resume' to continue it or pick another id"
                    )
                continue
            # key order kept: it fixes the search space's grid order, hence which trial
            # gets what; credentials are redacted (resume takes them from the config file)
            document = redact(config.to_dict())
            store.put(config_key(experiment_id), json.dumps(document, indent=2).encode())
            yield experiment_id, lease
            return
        finally:
            lease.release()
    raise ConfigError(f"found no free experiment id in {store.uri}")


def run_experiment(
    config: ExperimentConfig,
    *,
    experiment_id: str | None = None,
    backend_factory: BackendFactory = default_backend,
    visit_orders: VisitOrders | None = None,
    group_plans: GroupPlans | None = None,
    on_stage: StageHook | None = None,
    lease_timeout: float | None = None,
) -> ExperimentResult:
    """Run a new experiment to the end.

    Args:
        config: The experiment.
        experiment_id: Its id (default: ``<name>-<UTC time>``); must not exist yet.
        backend_factory: Builds the backend (default: from ``config.backend``).
        visit_orders: Visit orders to impose by round and trial (used by replay).
        group_plans: Data-parallel group sizes to impose along them (used by replay).
        on_stage: Called at every stage boundary (a cluster manager resizing).
        lease_timeout: Seconds after its last heartbeat the experiment's lease is stale
            (default: ``CEREBRO_LEASE_TIMEOUT_SECONDS``, else 60; see
            :mod:`cerebro_spark.store._lease`).

    The whole config is checked first (:func:`validate_config`: fields changed in code
    or by CLI overrides too), then the id and the store, so a bad input writes nothing
    and never blocks its id. The experiment is created atomically: its lease is taken
    (a conditional write) before ``config.json`` is written, and held, renewed by a
    heartbeat, until the run ends; a second driver on the same id is refused.
    ``config.json`` holds the config with credentials redacted (:func:`redact`).

    Before anything is written or any worker starts, the driver resolves the dataset and
    checks every model family (:func:`~cerebro_spark.driver._preflight.preflight`): a
    wrong import path, a ``build_model`` that raises or a metric a spec does not produce
    fails here within seconds. ``config.json`` holds the config with ``metric`` and
    ``mode`` resolved.

    With ``config.elastic`` (and the default backend factory and no ``on_stage``), the
    search is planned first and the cluster follows the plan between its stages
    (:mod:`cerebro_spark.engine._elastic`); it is planned before the id is claimed, so a
    plan refused (no plan meets the deadline or the budget) writes nothing.

    Raises:
        SearchFailedError: The search produced nothing: every trial failed (the message
            names the first failure), or none reported a finite value of the metric. The
            event log, leaderboard and checkpoints are written first.
        ConfigError: The experiment already exists, or the config is bad.
        LeaseError: Another driver holds the experiment (named with since when).
    """
    started = time.monotonic()  # the deadline and experiment time count from here
    validate_config(config)
    _check_lease_timeout(lease_timeout)
    if experiment_id is not None:
        check_name(experiment_id, "experiment id")
    store = open_store(config.store)
    if experiment_id is not None and store.exists(config_key(experiment_id)):
        raise ConfigError(
            f"experiment {experiment_id} already exists in {store.uri}; "
            "use 'cerebro-spark resume' to continue it or pick another id"
        )
    candidates = iter([experiment_id]) if experiment_id is not None else _new_ids(config, store)
    return _run(
        config,
        candidates,
        explicit=experiment_id is not None,
        backend_factory=backend_factory,
        visit_orders=visit_orders,
        group_plans=group_plans,
        on_stage=on_stage,
        lease_timeout=lease_timeout,
        started=started,
    )


def _run(
    config: ExperimentConfig,
    candidates: Iterator[str],
    *,
    explicit: bool,
    backend_factory: BackendFactory = default_backend,
    visit_orders: VisitOrders | None = None,
    group_plans: GroupPlans | None = None,
    on_stage: StageHook | None = None,
    lease_timeout: float | None = None,
    started: float | None = None,
) -> ExperimentResult:
    """Check, claim an id among ``candidates`` and run (:func:`run_experiment`).

    ``started`` is ``time.monotonic()`` when ``run`` was called (default: now): the
    experiment's clock, and its deadline, count from there.
    """
    started = time.monotonic() if started is None else started
    store = open_store(config.store)
    check_store_writable(store)
    if backend_factory is default_backend:
        check_backend_settings(config)  # its backend would refuse them once the id is taken
    # Before anything is written or started: the dataset, every model family built on
    # the driver, the metric each must produce; config.json keeps the resolved metric.
    checked = preflight(config, store, started=started)
    config = checked.config
    if backend_factory is default_backend and config.elastic is None:
        # its worker pool would refuse them once the experiment is written: refuse now
        check_worker_count(
            config.workers, checked.manifest.num_partitions, checked.dataset_uri, "workers"
        )
    with contextlib.ExitStack() as stack:
        if config.elastic is not None and on_stage is None and backend_factory is default_backend:
            # Planned before the id is claimed: a plan refused (PlanInfeasible) writes nothing.
            backend_factory, on_stage = stack.enter_context(elastic_run(config, started))
        experiment_id, lease = stack.enter_context(
            _claim(store, config, candidates, explicit=explicit, lease_timeout=lease_timeout)
        )
        experiment = Experiment(
            config,
            store,
            experiment_id,
            backend_factory,
            visit_orders=visit_orders,
            group_plans=group_plans,
            on_stage=on_stage,
            preflight=checked,
            lease=lease,
            started=started,
        )
        return ExperimentResult(experiment_id, store, _run_tracked(experiment))


def resume_experiment(
    store_uri: str,
    experiment_id: str,
    *,
    backend_factory: BackendFactory = default_backend,
    on_stage: StageHook | None = None,
    secrets: ExperimentConfig | None = None,
    lease_timeout: float | None = None,
) -> ExperimentResult:
    """Continue an experiment whose driver died, from its event log and checkpoints.

    Its workers start with the placement logged last (who held which partitions). The
    experiment's lease is taken first (a stale one, or one whose driver on this host is
    gone, is taken over); while another driver holds it, ``resume`` is refused. An
    elastic experiment goes on elastic (with the default backend and no ``on_stage``): its
    cluster is started again and resized at the stage boundaries left as its plan says
    (planned again as at ``run``; stage times and the deadline are experiment time, which
    goes on from where the earlier sessions left it).

    Args:
        store_uri: The root store.
        experiment_id: The experiment.
        backend_factory: Builds the backend (default: from the config).
        on_stage: Called at every stage boundary.
        secrets: The config it was started with, for values redacted from
            ``config.json`` (:func:`load_experiment_config`).
        lease_timeout: As for :func:`run_experiment`.

    Raises:
        SearchFailedError: The search produced nothing (as :func:`run_experiment`); also
            when the experiment had already finished that way.
        LeaseError: Another driver holds the experiment.
    """
    started = time.monotonic()  # this session's experiment time counts from here
    _check_lease_timeout(lease_timeout)
    store = open_store(store_uri)
    config = load_experiment_config(store, experiment_id, secrets=secrets, need_secrets=True)
    with contextlib.ExitStack() as stack:
        lease = stack.enter_context(_lease(store, experiment_id, lease_timeout))  # log read after
        if config.elastic is not None and on_stage is None and backend_factory is default_backend:
            # An elastic run goes on elastic: its cluster again, resized as its plan says.
            backend_factory, on_stage = stack.enter_context(elastic_run(config, started))
        experiment = Experiment(
            config,
            store,
            experiment_id,
            backend_factory,
            on_stage=on_stage,
            lease=lease,
            started=started,
        )
        return ExperimentResult(experiment_id, store, _run_tracked(experiment))


def _run_tracked(experiment: Experiment) -> list[TrialState]:
    """Run ``experiment`` with its report and the trackers its config asks for.

    Both read the event log the driver writes: the report is refreshed beside the run
    (:attr:`Experiment.reporter`), the trackers (``tracking:``) listen to the log, as an
    elastic controller does (its early calibration and stage parts).
    """
    experiment.reporter = ReportRefresher(
        experiment.store, experiment.experiment_id, experiment.config
    )
    if isinstance(experiment.on_stage, ElasticController):  # it measures the units
        experiment.log.listeners.append(experiment.on_stage.observe)
    with track_experiment(experiment):
        return experiment.run()


def logged_visit_orders(store: Store, experiment_id: str) -> dict[int, dict[str, list[int]]]:
    """Return the visit order each trial actually took, by round (from ``unit_end`` events)."""
    steps: dict[int, dict[str, dict[int, int]]] = defaultdict(lambda: defaultdict(dict))
    for event in read_events(store.child(experiment_prefix(experiment_id))):
        if event["event"] == "unit_end" and event["kind"] == "train":
            steps[event["round"]][event["trial"]][event["step"]] = event["partition"]
    return {
        round_: {trial: [by_step[s] for s in sorted(by_step)] for trial, by_step in trials.items()}
        for round_, trials in steps.items()
    }


@dataclasses.dataclass(frozen=True)
class ReplayRow:
    """One trial's final checkpoint in the original run and in the replay.

    Attributes:
        trial_id: The trial.
        original_sha256: The SHA-256 of the original's final checkpoint, as logged.
        replay_sha256: The SHA-256 of the replay's.
        same_content: Where the bytes differ because the original was written before
            checkpoints carried their own digest: whether the original's content (read
            from the store) equals the replay's, tensor for tensor and value for value
            (:func:`~cerebro_spark.training.content_digest`); ``None`` where the bytes
            decide.
        max_weight_diff: For a replay that packs otherwise than the original (``pack``
            of :func:`replay_experiment`), the largest absolute difference between the
            two final models' weights (packed kernels round otherwise: equal within
            float rounding, not bit for bit); ``None`` for a replay that packs the same.
    """

    trial_id: str
    original_sha256: str | None
    replay_sha256: str | None
    same_content: bool | None = None
    max_weight_diff: float | None = None

    @property
    def identical(self) -> bool:
        """Whether the two final checkpoints are the same: bit for bit, or in content.

        In content for an original written before checkpoints carried their own digest.
        """
        if self.same_content is not None:
            return self.same_content
        return self.original_sha256 is not None and self.original_sha256 == self.replay_sha256


@dataclasses.dataclass(frozen=True)
class ReplayReport:
    """The result of :func:`replay_experiment`."""

    original_id: str
    replay: ExperimentResult
    rows: list[ReplayRow]

    @property
    def identical(self) -> bool:
        """Whether every trial's final checkpoint was reproduced bit for bit."""
        return all(row.identical for row in self.rows)


def replay_experiment(
    store_uri: str,
    experiment_id: str,
    *,
    workers: int | None = None,
    backend_factory: BackendFactory = default_backend,
    secrets: ExperimentConfig | None = None,
    lease_timeout: float | None = None,
    pack: int | str | None = None,
) -> ReplayReport:
    """Re-train an experiment from its logged visit order (Cerebro §3.1, reproducibility).

    The replay is a new experiment ``<id>-replay-<n>`` with the same config (optionally
    another number of workers) whose every trial visits the partitions in the order the
    original logged; its final checkpoints are compared with the original's.
    ``pack`` (``"off"`` or ``N``) replays with other packing (issue 27): ``"off"`` trains a
    packed experiment's unpacked twin, every trial in the order it was packed in, and
    each row then also gives the largest weight difference (:class:`ReplayRow`).
    Its id is claimed atomically (two replays at once get ``-replay-1`` and ``-replay-2``);
    ``secrets`` and ``lease_timeout`` are as for :func:`resume_experiment`.
    """
    _check_lease_timeout(lease_timeout)
    store = open_store(store_uri)
    config = load_experiment_config(store, experiment_id, secrets=secrets, need_secrets=True)
    config = config.replace(store=store.uri)  # the replay lives beside the original
    if workers is not None:
        config = config.replace(workers=workers)
    repacked = False
    if pack is not None:
        new_pack = parse_pack(pack)
        if new_pack == "auto":
            raise ConfigError(
                "replay pack must be 'off' or an int >= 1, got 'auto' (a replay measures "
                "nothing: it trains what the original did, packed or not)"
            )
        repacked = pack_size(config) != pack_size(config.replace(pack=new_pack))
        config = config.replace(pack=new_pack)
    validate_config(config)
    original = ExperimentState.from_events(
        read_experiment_events(store, experiment_id), experiment_prefix(experiment_id)
    )
    if not original.finished:
        raise ConfigError(
            f"experiment {experiment_id} has not finished; resume it before replaying it"
        )
    candidates = _free_ids(store, (f"{experiment_id}-replay-{n}" for n in itertools.count(1)))
    result = _run(
        config,
        candidates,
        explicit=False,
        backend_factory=backend_factory,
        visit_orders=logged_visit_orders(store, experiment_id),
        group_plans=logged_group_plans(store, experiment_id),
        lease_timeout=lease_timeout,
    )
    replayed = {t.trial_id: t for t in result.trials}
    rows = [
        _replay_row(store, trial, replayed.get(trial_id), repacked)
        for trial_id, trial in sorted(original.trials.items())
    ]
    return ReplayReport(experiment_id, result, rows)


def _replay_row(
    store: Store, original: TrialState, replay: TrialState | None, repacked: bool = False
) -> ReplayRow:
    """Compare a trial's final checkpoints: by bytes, or by content for an older original.

    ``repacked``: the replay packs otherwise, so its weights are also compared by value.
    """
    row = ReplayRow(
        original.trial_id,
        original.checkpoint_sha256,
        replay.checkpoint_sha256 if replay is not None else None,
    )
    if replay is None or not original.checkpoint or not replay.checkpoint:
        return row
    if repacked:
        old_model = decode_checkpoint(store.get(original.checkpoint))["model"]
        new_model = decode_checkpoint(store.get(replay.checkpoint))["model"]
        diff = max(
            (float((old_model[n].double() - new_model[n].double()).abs().max()) for n in old_model),
            default=0.0,
        )
        row = dataclasses.replace(row, max_weight_diff=diff)
    if row.identical:
        return row
    try:
        old = decode_checkpoint(store.get(original.checkpoint))
    except (OSError, CheckpointError):  # gone or unreadable: the bytes decide
        return row
    if CONTENT_DIGEST_KEY in old:
        return row  # written with its digest: its bytes are comparable
    new = decode_checkpoint(store.get(replay.checkpoint))
    return dataclasses.replace(row, same_content=content_digest(old) == content_digest(new))
