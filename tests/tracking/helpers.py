"""A tiny experiment for the tracking tests: digits, two MLPs, two epochs."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def tiny_config(store: Path, tracking: dict[str, Any], **changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": "tracked",
        "seed": 3,
        "store": str(store),
        "data": {"source": "sklearn:digits", "partitions": 2},
        "procedure": "grid",
        "epochs": 2,
        "workers": 2,
        "space": {
            "model": "cerebro_spark.training:MLPSpec",
            "hidden_units": {"grid": [[16], [32]]},
            "lr": 0.003,
            "batch_size": 64,
        },
        "tracking": tracking,
    }
    raw.update(changes)
    return raw
