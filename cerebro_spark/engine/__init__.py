"""The engine: configs, the driver loop, the event log, the leaderboard, resume and replay."""

from cerebro_spark.engine._api import (
    ExperimentResult,
    ReplayReport,
    ReplayRow,
    default_backend,
    load_state,
    logged_visit_orders,
    replay_experiment,
    resume_experiment,
    run_experiment,
)
from cerebro_spark.engine._config import DataConfig, ExperimentConfig, load_config, parse_config
from cerebro_spark.engine._events import EVENT_KINDS, EventList, EventLog, read_events
from cerebro_spark.engine._experiment import (
    Experiment,
    Stage,
    StageDirective,
    StageHook,
    build_procedure,
    experiment_prefix,
    experiment_spec,
    logged_group_plans,
    trial_seed,
)
from cerebro_spark.engine._leaderboard import (
    best_trial,
    format_table,
    leaderboard_csv,
    leaderboard_rows,
    rank,
)
from cerebro_spark.engine._state import ExperimentState, TrialState, WorkerState

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
