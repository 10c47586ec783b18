"""Virtual-time simulation of search procedures on HyperSched's parametric workload.

No torch, no Spark: any registered procedure runs on Cerebro's round template with a
virtual clock (:func:`run_simulation`, :func:`compare_procedures`); the ``simulate``
command is built by :func:`add_simulate_command`.
"""

from cerebro_spark.simulate._cli import add_simulate_command
from cerebro_spark.simulate._cluster import (
    EpochJob,
    RoundSchedule,
    VirtualClock,
    epoch_seconds,
    schedule_round,
)
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
    "ParametricWorkload",
    "ProcedureSummary",
    "RoundSchedule",
    "SimulationResult",
    "SimulationSettings",
    "VirtualClock",
    "add_simulate_command",
    "compare_procedures",
    "epoch_seconds",
    "format_table",
    "parametric_score",
    "run_simulation",
    "schedule_round",
    "summaries_to_json",
]
