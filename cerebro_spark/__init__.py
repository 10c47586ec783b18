"""cerebro-spark: deep learning model selection on Apache Spark with model hopper parallelism."""

from __future__ import annotations

__version__ = "0.1.0"
