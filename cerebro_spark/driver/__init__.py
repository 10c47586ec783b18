"""The driver: the lower floor that runs a search and knows only seams.

Config, event log, state, leaderboard, pre-flight and the round runner
(:class:`Experiment`) live here, with the stage seam (:class:`Stage`,
:class:`StageDirective`, :data:`StageHook`) a cluster manager plugs into and the
:class:`Reporter` seam the report plugs into. It imports neither the report, nor the
trackers, nor the cluster managers: the front door (:mod:`cerebro_spark.engine`) composes
them, and the report, the trackers and scoring read what this floor writes.
"""

from cerebro_spark.driver._config import DataConfig, ExperimentConfig, load_config, parse_config
from cerebro_spark.driver._costs import cost_table
from cerebro_spark.driver._events import EVENT_KINDS, EventList, EventLog, read_events
from cerebro_spark.driver._experiment import Experiment, Reporter
from cerebro_spark.driver._group_plans import logged_group_plans
from cerebro_spark.driver._layout import BEST_CHECKPOINT_NAME, CONFIG_NAME, experiment_prefix
from cerebro_spark.driver._leaderboard import (
    best_trial,
    format_table,
    leaderboard_csv,
    leaderboard_rows,
    rank,
)
from cerebro_spark.driver._preflight import Preflight, preflight
from cerebro_spark.driver._procedure import build_procedure, experiment_spec, trial_seed
from cerebro_spark.driver._stage import Stage, StageDirective, StageHook
from cerebro_spark.driver._state import ExperimentState, TrialState, WorkerState
from cerebro_spark.driver._stored import config_key, load_experiment_config, load_state
from cerebro_spark.driver._warm import release_workers

__all__ = [
    "BEST_CHECKPOINT_NAME",
    "CONFIG_NAME",
    "EVENT_KINDS",
    "DataConfig",
    "EventList",
    "EventLog",
    "Experiment",
    "ExperimentConfig",
    "ExperimentState",
    "Preflight",
    "Reporter",
    "Stage",
    "StageDirective",
    "StageHook",
    "TrialState",
    "WorkerState",
    "best_trial",
    "build_procedure",
    "config_key",
    "cost_table",
    "experiment_prefix",
    "experiment_spec",
    "format_table",
    "leaderboard_csv",
    "leaderboard_rows",
    "load_config",
    "load_experiment_config",
    "load_state",
    "logged_group_plans",
    "parse_config",
    "preflight",
    "rank",
    "read_events",
    "release_workers",
    "trial_seed",
]
