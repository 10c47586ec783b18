"""Run, resume and replay experiments: the functions behind the CLI."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from cerebro_spark.backends import Backend
from cerebro_spark.engine._config import ExperimentConfig, parse_config
from cerebro_spark.engine._events import read_events
from cerebro_spark.engine._experiment import (
    BEST_CHECKPOINT_NAME,
    CONFIG_NAME,
    Experiment,
    GroupPlans,
    StageHook,
    VisitOrders,
    experiment_prefix,
    logged_group_plans,
)
from cerebro_spark.engine._leaderboard import best_trial
from cerebro_spark.engine._preflight import preflight
from cerebro_spark.engine._state import FAILED, ExperimentState, TrialState
from cerebro_spark.errors import ConfigError
from cerebro_spark.store import Store, open_store

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


def default_backend(config: ExperimentConfig) -> Backend:
    """Build the backend a config names."""
    if config.backend == "local":
        from cerebro_spark.backends import LocalBackend

        return LocalBackend(config.workers)
    if config.backend == "spark":
        from cerebro_spark.backends import SparkBackend
        from cerebro_spark.spark_session import spark_session

        session = spark_session(
            config.spark.master, f"cerebro-spark {config.name}", config.spark.conf
        )
        ship_user_code(session.sparkContext, config)
        return SparkBackend(config.workers, spark=session)
    raise ConfigError(f"backend must be 'local' or 'spark', got {config.backend!r}")


def ship_user_code(context: Any, config: ExperimentConfig) -> None:
    """Ship the config's spec modules found beside it or in the working directory.

    Spark executors may run on other machines: ``SparkContext.addPyFile`` puts each
    module (a package as a zip) on their Python path
    (:func:`~cerebro_spark.training.user_code_files`). Installed specs are not shipped.

    Args:
        context: The application's ``SparkContext``.
        config: The experiment (its ``model`` and the space's ``model`` values).
    """
    from cerebro_spark.engine._preflight import models_in
    from cerebro_spark.training import user_code_files

    specs = [*models_in(config.space), *([config.model] if config.model else [])]
    for file in user_code_files(specs):
        try:
            context.addPyFile(str(file))
            logger.info("shipped spec module %s to the Spark executors", file)
        except Exception as error:  # already added (a notebook re-run): keep the first
            logger.warning("could not ship %s to the executors: %s", file, error)


def new_experiment_id(config: ExperimentConfig, store: Store) -> str:
    """Return ``<name>-<UTC time>``, made unique within the store."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    base = f"{config.name}-{stamp}"
    candidate, n = base, 1
    while store.exists(f"{experiment_prefix(candidate)}/{CONFIG_NAME}"):
        n += 1
        candidate = f"{base}-{n}"
    return candidate


def run_experiment(
    config: ExperimentConfig,
    *,
    experiment_id: str | None = None,
    backend_factory: BackendFactory = default_backend,
    visit_orders: VisitOrders | None = None,
    group_plans: GroupPlans | None = None,
    on_stage: StageHook | None = None,
) -> ExperimentResult:
    """Run a new experiment to the end.

    Args:
        config: The experiment.
        experiment_id: Its id (default: ``<name>-<UTC time>``); must not exist yet.
        backend_factory: Builds the backend (default: from ``config.backend``).
        visit_orders: Visit orders to impose by round and trial (used by replay).
        group_plans: Data-parallel group sizes to impose along them (used by replay).
        on_stage: Called at every stage boundary (a cluster manager resizing).

    Before anything is written or any worker starts, the driver resolves the dataset and
    checks every model family (:func:`~cerebro_spark.engine._preflight.preflight`): a
    wrong import path, a ``build_model`` that raises or a metric a spec does not produce
    fails here within seconds. ``config.json`` holds the config with ``metric`` and
    ``mode`` resolved.

    With ``config.elastic`` (and the default backend factory and no ``on_stage``), the
    search is planned first and the cluster follows the plan between its stages
    (:mod:`cerebro_spark.engine._elastic`).

    Raises:
        SearchFailedError: The search produced nothing: every trial failed (the message
            names the first failure), or none reported a finite value of the metric. The
            event log, leaderboard and checkpoints are written first.
        ConfigError: The experiment already exists, or the config is bad.
    """
    store = open_store(config.store)
    experiment_id = experiment_id or new_experiment_id(config, store)
    config_key = f"{experiment_prefix(experiment_id)}/{CONFIG_NAME}"
    if store.exists(config_key):
        raise ConfigError(
            f"experiment {experiment_id} already exists in {store.uri}; "
            "use 'cerebro-spark resume' to continue it or pick another id"
        )
    # Before anything is written or started: the dataset, every model family built on
    # the driver, the metric each must produce; config.json keeps the resolved metric.
    checked = preflight(config, store)
    config = checked.config
    # key order kept: it fixes the search space's grid order, hence which trial gets what
    store.put(config_key, json.dumps(config.to_dict(), indent=2).encode())
    with contextlib.ExitStack() as stack:
        if config.elastic is not None and on_stage is None and backend_factory is default_backend:
            from cerebro_spark.engine._elastic import elastic_run

            backend_factory, on_stage = stack.enter_context(elastic_run(config))
        experiment = Experiment(
            config,
            store,
            experiment_id,
            backend_factory,
            visit_orders=visit_orders,
            group_plans=group_plans,
            on_stage=on_stage,
            preflight=checked,
        )
        return ExperimentResult(experiment_id, store, _run_tracked(experiment))


def load_experiment_config(store: Store, experiment_id: str) -> ExperimentConfig:
    """Read the config an experiment was started with."""
    key = f"{experiment_prefix(experiment_id)}/{CONFIG_NAME}"
    if not store.exists(key):
        raise ConfigError(f"no experiment {experiment_id!r} in {store.uri} (missing {key})")
    return parse_config(json.loads(store.get(key)), stored=True)


def resume_experiment(
    store_uri: str,
    experiment_id: str,
    *,
    backend_factory: BackendFactory = default_backend,
    on_stage: StageHook | None = None,
) -> ExperimentResult:
    """Continue an experiment whose driver died, from its event log and checkpoints.

    Its workers start with the placement logged last (who held which partitions).

    Raises:
        SearchFailedError: The search produced nothing (as :func:`run_experiment`); also
            when the experiment had already finished that way.
    """
    store = open_store(store_uri)
    config = load_experiment_config(store, experiment_id)
    experiment = Experiment(config, store, experiment_id, backend_factory, on_stage=on_stage)
    return ExperimentResult(experiment_id, store, _run_tracked(experiment))


def _run_tracked(experiment: Experiment) -> list[TrialState]:
    """Run ``experiment`` followed by the trackers its config asks for (``tracking:``)."""
    from cerebro_spark.tracking import track_experiment

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
    """One trial's final checkpoint in the original run and in the replay."""

    trial_id: str
    original_sha256: str | None
    replay_sha256: str | None

    @property
    def identical(self) -> bool:
        """Whether the two final checkpoints are bit-identical."""
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
) -> ReplayReport:
    """Re-train an experiment from its logged visit order (Cerebro §3.1, reproducibility).

    The replay is a new experiment ``<id>-replay-<n>`` with the same config (optionally
    another number of workers) whose every trial visits the partitions in the order the
    original logged; its final checkpoints are compared with the original's.
    """
    store = open_store(store_uri)
    config = load_experiment_config(store, experiment_id)
    if workers is not None:
        config = config.replace(workers=workers)
    original = ExperimentState.from_events(
        read_events(store.child(experiment_prefix(experiment_id)))
    )
    if not original.finished:
        raise ConfigError(
            f"experiment {experiment_id} has not finished; resume it before replaying it"
        )
    n = 1
    while store.exists(f"{experiment_prefix(f'{experiment_id}-replay-{n}')}/{CONFIG_NAME}"):
        n += 1
    result = run_experiment(
        config,
        experiment_id=f"{experiment_id}-replay-{n}",
        backend_factory=backend_factory,
        visit_orders=logged_visit_orders(store, experiment_id),
        group_plans=logged_group_plans(store, experiment_id),
    )
    replayed = {t.trial_id: t for t in result.trials}
    rows = [
        ReplayRow(
            trial_id,
            trial.checkpoint_sha256,
            replayed[trial_id].checkpoint_sha256 if trial_id in replayed else None,
        )
        for trial_id, trial in sorted(original.trials.items())
    ]
    return ReplayReport(experiment_id, result, rows)


def load_state(store_uri: str, experiment_id: str) -> tuple[ExperimentConfig, ExperimentState]:
    """Return an experiment's config and its state folded from the event log."""
    store = open_store(store_uri)
    config = load_experiment_config(store, experiment_id)
    return config, ExperimentState.from_events(
        read_events(store.child(experiment_prefix(experiment_id)))
    )
