"""cerebro-spark: deep learning model selection on Apache Spark with model hopper parallelism."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "load_model":  # imported on first use: ``import cerebro_spark`` stays light
        from cerebro_spark.scoring import load_model

        return load_model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
