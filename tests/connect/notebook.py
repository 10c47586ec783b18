"""The notebook a user runs, on whichever session they have (:mod:`tests.connect`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sklearn.datasets import load_wine

import cerebro_spark as cs

MLP = {"model": "cerebro_spark.training:MLPSpec", "hidden_units": [16], "batch_size": 16}


def wine() -> pd.DataFrame:
    frame = load_wine(as_frame=True).frame
    frame.insert(0, "id", np.arange(len(frame)))
    return frame


def notebook(spark: Any, store: Path, name: str) -> dict[str, Any]:
    """What a notebook user runs; returns what they would look at."""
    rows = wine()
    features = [c for c in rows.columns if c not in ("id", "target")]
    frame = spark.createDataFrame(rows)
    train = frame.filter("id % 4 != 0")
    held = frame.filter("id % 4 = 0")
    tuner = cs.Tuner(
        {**MLP, "lr": cs.Grid([0.003, 0.01])},
        epochs=2,
        workers=2,
        store=str(store),
        progress=False,
        warm_workers=0,
    )
    result = tuner.fit(train, features=features, label="target", experiment_id=name)
    board = result.leaderboard()
    scored = result.best_model().transform(held).toPandas().sort_values("id")
    local = result.load_model().predict(held.toPandas().sort_values("id")[features])
    return {
        "backend": result.config.backend,
        "dataset": result.state.dataset_id,
        "board": board[["trial_id", "best_epoch"]].to_dict("records"),
        "best": result.best.best_metrics,
        "prediction": list(scored["prediction"]),
        "local": list(local),
        "probability_sums": np.array(scored["probability"].tolist()).sum(axis=1).tolist(),
    }
