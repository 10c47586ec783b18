"""Training units: the user's ModelSpec, ready specs, and the unit that trains one sub-epoch."""

from cerebro_spark.training._spec import ModelSpec

__all__ = ["ModelSpec"]
