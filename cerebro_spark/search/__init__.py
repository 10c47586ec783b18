"""Search spaces and search procedures (Cerebro's epoch template)."""

from cerebro_spark.search._base import (
    Clock,
    Decision,
    EpochReport,
    Mode,
    SearchProcedure,
    TrialSpec,
)
from cerebro_spark.search._grid import MAX_GRID_TRIALS, GridSearch
from cerebro_spark.search._random import RandomSearch
from cerebro_spark.search._registry import PROCEDURES, make_procedure, procedure_options
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
    "MAX_GRID_TRIALS",
    "PROCEDURES",
    "Choice",
    "Clock",
    "Decision",
    "Distribution",
    "EpochReport",
    "Grid",
    "GridSearch",
    "IntUniform",
    "LogUniform",
    "Mode",
    "Quantized",
    "RandomSearch",
    "SearchProcedure",
    "SearchSpace",
    "TrialSpec",
    "Uniform",
    "make_procedure",
    "procedure_options",
]
