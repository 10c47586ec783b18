"""Search spaces and search procedures (Cerebro's epoch template)."""

from cerebro_spark.search._base import (
    Clock,
    Decision,
    EpochReport,
    Mode,
    SearchProcedure,
    TrialSpec,
)

__all__ = ["Clock", "Decision", "EpochReport", "Mode", "SearchProcedure", "TrialSpec"]
