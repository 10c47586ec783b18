"""cerebro-spark: deep learning model selection on Apache Spark with model hopper parallelism.

The notebook API is here (:class:`Tuner`, :class:`Procedure`, the search space's
distributions, :func:`load_model` and :func:`release_workers`); ``import cerebro_spark``
stays light: each name is imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "Tuner": "cerebro_spark.tuner",
    "TuningResult": "cerebro_spark.tuner",
    "Procedure": "cerebro_spark.tuner",
    "SearchSpace": "cerebro_spark.search",
    "Choice": "cerebro_spark.search",
    "Grid": "cerebro_spark.search",
    "Uniform": "cerebro_spark.search",
    "LogUniform": "cerebro_spark.search",
    "IntUniform": "cerebro_spark.search",
    "Quantized": "cerebro_spark.search",
    "load_model": "cerebro_spark.scoring",
    "release_workers": "cerebro_spark.engine",
    "install_log_filter": "cerebro_spark._redact",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
