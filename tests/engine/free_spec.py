"""A built-in MLP that declares no hyperparameters, for tests whose fake backends read params.

Those tests build the model once, in the driver's pre-flight, and label their trials with
params only their backends read (``hidden``, ``curve``): a spec declaring its params would
refuse them (:attr:`cerebro_spark.training.ModelSpec.hyperparameters`).
"""

from cerebro_spark.training import MLPSpec


class FreeSpec(MLPSpec):
    """:class:`MLPSpec`, any param accepted (a subclass inherits no declaration)."""
