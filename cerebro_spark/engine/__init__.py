"""The front door: run, resume and replay an experiment, static or elastic.

The upper floor. It composes the driver (:mod:`cerebro_spark.driver`, which runs the
search), the backends, the elastic controller with its cluster managers, the pilot and
the ``plan`` command, and attaches the report and the trackers to the event log. The
driver's public names are re-exported here, so ``cerebro_spark.engine`` keeps them.
"""

from cerebro_spark.driver import (
    EVENT_KINDS,
    DataConfig,
    EventList,
    EventLog,
    Experiment,
    ExperimentConfig,
    ExperimentState,
    Stage,
    StageDirective,
    StageHook,
    TrialState,
    WorkerState,
    best_trial,
    build_procedure,
    experiment_prefix,
    experiment_spec,
    format_table,
    leaderboard_csv,
    leaderboard_rows,
    load_config,
    load_state,
    logged_group_plans,
    parse_config,
    rank,
    read_events,
    trial_seed,
)
from cerebro_spark.engine._api import (
    ExperimentResult,
    ReplayReport,
    ReplayRow,
    logged_visit_orders,
    replay_experiment,
    resume_experiment,
    run_experiment,
)
from cerebro_spark.engine._backend import default_backend

__all__ = [
    "EVENT_KINDS",
    "DataConfig",
    "EventList",
    "EventLog",
    "Experiment",
    "ExperimentConfig",
    "ExperimentResult",
    "ExperimentState",
    "ReplayReport",
    "ReplayRow",
    "Stage",
    "StageDirective",
    "StageHook",
    "TrialState",
    "WorkerState",
    "best_trial",
    "build_procedure",
    "default_backend",
    "experiment_prefix",
    "experiment_spec",
    "format_table",
    "leaderboard_csv",
    "leaderboard_rows",
    "load_config",
    "load_state",
    "logged_group_plans",
    "logged_visit_orders",
    "parse_config",
    "rank",
    "read_events",
    "replay_experiment",
    "resume_experiment",
    "run_experiment",
    "trial_seed",
]
