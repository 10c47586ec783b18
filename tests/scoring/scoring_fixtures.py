"""A small real experiment for the scoring tests: breast_cancer with string labels.

``train_experiment(root)`` writes 85% of sklearn's breast_cancer (unscaled, labels
``"malignant"`` / ``"benign"``) as Parquet, runs a grid of two MLPs on it with the local
backend, and keeps the other 15% as a held-out set (``held_out.parquet``) that no part of
the experiment saw.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from cerebro_spark.data import load_source
from cerebro_spark.engine import parse_config, run_experiment

EXPERIMENT = "bc"
NAMES = {0: "malignant", 1: "benign"}


@dataclasses.dataclass(frozen=True)
class Trained:
    store: str
    experiment_id: str
    held_out_path: str
    held_out: pd.DataFrame
    features: list[str]

    @property
    def experiment_uri(self) -> str:
        return f"{self.store}/experiments/{self.experiment_id}"


def breast_cancer_frames(seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    table, meta = load_source("sklearn:breast_cancer")
    frame = table.to_pandas()
    frame["diagnosis"] = frame.pop(meta["label"]).map(NAMES)
    frame.insert(0, "row_id", np.arange(len(frame), dtype=np.int64))
    order = np.random.default_rng(seed).permutation(len(frame))
    cut = int(len(frame) * 0.85)
    train = frame.iloc[order[:cut]].reset_index(drop=True)
    held_out = frame.iloc[order[cut:]].reset_index(drop=True)
    return train, held_out, list(meta["features"])


def train_experiment(root: Path) -> Trained:
    train, held_out, features = breast_cancer_frames()
    pq.write_table(pa.Table.from_pandas(train, preserve_index=False), root / "train.parquet")
    held_out_path = root / "held_out.parquet"
    pq.write_table(pa.Table.from_pandas(held_out, preserve_index=False), held_out_path)
    store = str(root / "store")
    config = parse_config(
        {
            "name": "bc",
            "seed": 3,
            "store": store,
            "data": {
                "source": str(root / "train.parquet"),
                "label": "diagnosis",
                "features": features,
                "partitions": 2,
            },
            "procedure": "grid",
            "epochs": 4,
            "workers": 2,
            "space": {
                "model": "cerebro_spark.training:MLPSpec",
                "hidden_units": {"grid": [[16], [32]]},
                "lr": 0.01,
                "batch_size": 32,
            },
        }
    )
    run_experiment(config, experiment_id=EXPERIMENT)
    return Trained(store, EXPERIMENT, str(held_out_path), held_out, features)
