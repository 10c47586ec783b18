"""Search spaces and search procedures (Cerebro's epoch template)."""

from cerebro_spark.search._asha import ASHA
from cerebro_spark.search._base import (
    Clock,
    Decision,
    EpochReport,
    Mode,
    SearchProcedure,
    TrialSpec,
)
from cerebro_spark.search._grid import MAX_GRID_TRIALS, GridSearch
from cerebro_spark.search._hyperband import Hyperband
from cerebro_spark.search._hypersched import HyperSched
from cerebro_spark.search._pbt import PBT
from cerebro_spark.search._random import RandomSearch
from cerebro_spark.search._registry import (
    PROCEDURES,
    check_procedure_options,
    make_procedure,
    procedure_options,
)
from cerebro_spark.search._seer import SEER, SeerPlan, seer_plan
from cerebro_spark.search._sha import SuccessiveHalving
from cerebro_spark.search._stages import Cohort, ExperimentSpec, StageClock, StageSpec
from cerebro_spark.search._template import EpochTemplate, RoundOpening, TrialStatus
from cerebro_spark.search._tpe import TPESearch
from cerebro_spark.search.space import (
    Choice,
    Distribution,
    Grid,
    IntUniform,
    LogUniform,
    Quantized,
    SearchSpace,
    Uniform,
)

__all__ = [
    "ASHA",
    "MAX_GRID_TRIALS",
    "PBT",
    "PROCEDURES",
    "SEER",
    "Choice",
    "Clock",
    "Cohort",
    "Decision",
    "Distribution",
    "EpochReport",
    "EpochTemplate",
    "ExperimentSpec",
    "Grid",
    "GridSearch",
    "HyperSched",
    "Hyperband",
    "IntUniform",
    "LogUniform",
    "Mode",
    "Quantized",
    "RandomSearch",
    "RoundOpening",
    "SearchProcedure",
    "SearchSpace",
    "SeerPlan",
    "StageClock",
    "StageSpec",
    "SuccessiveHalving",
    "TPESearch",
    "TrialSpec",
    "TrialStatus",
    "Uniform",
    "check_procedure_options",
    "make_procedure",
    "procedure_options",
    "seer_plan",
]
