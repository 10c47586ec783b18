"""The notebook API: a :class:`Tuner`, fitted on data, gives a :class:`TuningResult`.

Describe a search with :class:`Tuner`, ``fit`` it on your data, and read the results as
pandas or Spark tables.
"""

from cerebro_spark.tuner._display import ProgressDisplay
from cerebro_spark.tuner._procedure import Procedure
from cerebro_spark.tuner._result import TuningResult
from cerebro_spark.tuner._tuner import Tuner

__all__ = ["Procedure", "ProgressDisplay", "Tuner", "TuningResult"]
