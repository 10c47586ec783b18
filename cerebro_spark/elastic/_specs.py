"""A procedure's stages from its options alone (``plan --procedure``, benchmarks, tests).

``plan CONFIG`` builds the procedure from a config with the engine's ``build_procedure``
(:func:`cerebro_spark.driver.experiment_spec`), exactly as ``run`` does. Without a config
(``plan --procedure sha --trials ...``) there is no search space or model to build: a
one-parameter space stands in, which changes nothing of the stage structure of SHA,
Hyperband, SEER, ASHA or HyperSched (it depends on their options and ``epochs`` only; a
grid's would depend on the space).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cerebro_spark.errors import ConfigError
from cerebro_spark.search import ExperimentSpec, SearchSpace, make_procedure

_PLACEHOLDER_SPACE = {"x": {"uniform": [0.0, 1.0]}}


def procedure_spec(name: str, epochs: int, **options: Any) -> ExperimentSpec:
    """The stage spec of procedure ``name`` built with ``options`` (``epochs``: ``R``).

    Raises:
        ConfigError: A bad option (from the procedure), or the procedure gives no stage
            structure.
    """
    procedure = make_procedure(
        name,
        space=SearchSpace.from_config(_PLACEHOLDER_SPACE),
        epochs=epochs,
        metric="loss",
        mode="min",
        rng=np.random.default_rng(0),
        clock=lambda: 0.0,
        **options,
    )
    spec = procedure.stage_spec()
    if spec is None:
        raise ConfigError(f"search procedure {name!r} gives no stage structure to plan")
    return spec
