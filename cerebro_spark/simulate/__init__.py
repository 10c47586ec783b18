"""Virtual-time simulation: search procedures on HyperSched's workload; MOP epochs at scale.

No torch, no Spark: any registered procedure runs on Cerebro's round template with a
virtual clock (:func:`run_simulation`, :func:`compare_procedures`); the ``simulate``
command is built by :func:`add_simulate_command`. The MOP epoch model predicts an epoch's
makespan and driver load at any number of workers from the per-unit overheads measured on
a real run's event log (:func:`measure_overheads`, :func:`predict_epoch`).
"""

from cerebro_spark.simulate._cli import add_simulate_command
from cerebro_spark.simulate._cluster import (
    EpochJob,
    RoundSchedule,
    VirtualClock,
    epoch_seconds,
    schedule_round,
)
from cerebro_spark.simulate._epoch import EpochPrediction, epoch_bound, placement, predict_epoch
from cerebro_spark.simulate._overheads import UnitOverheads, measure_overheads, round_makespans
from cerebro_spark.simulate._run import (
    METRIC,
    ProcedureSummary,
    SimulationResult,
    SimulationSettings,
    compare_procedures,
    format_table,
    run_simulation,
    summaries_to_json,
)
from cerebro_spark.simulate._workload import (
    SIMULATED_SPACE,
    Curve,
    ParametricWorkload,
    parametric_score,
)

__all__ = [
    "METRIC",
    "SIMULATED_SPACE",
    "Curve",
    "EpochJob",
    "EpochPrediction",
    "ParametricWorkload",
    "ProcedureSummary",
    "RoundSchedule",
    "SimulationResult",
    "SimulationSettings",
    "UnitOverheads",
    "VirtualClock",
    "add_simulate_command",
    "compare_procedures",
    "epoch_bound",
    "epoch_seconds",
    "format_table",
    "measure_overheads",
    "parametric_score",
    "placement",
    "predict_epoch",
    "round_makespans",
    "run_simulation",
    "schedule_round",
    "summaries_to_json",
]
