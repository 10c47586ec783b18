"""Catalogue: raw rows a trained model cannot score are refused by column and row (issue 25).

A model trained on images and token sequences scores raw bytes and token lists; a token
beyond the vocabulary it was trained with, and bytes that are not an image, are refused
with a :class:`DataError` naming the column, the row and the rule, and nothing is scored.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from cerebro_spark.data import prepare_dataset, read_partition
from cerebro_spark.errors import DataError
from cerebro_spark.scoring import load_model
from cerebro_spark.store import open_store
from cerebro_spark.training import run_unit
from cerebro_spark.units import UnitKind, UnitTask

pytestmark = pytest.mark.torch


def png(value: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((6, 6), value, np.uint8), mode="L").save(out, format="PNG")
    return out.getvalue()


def trained(root: Path, frame: pd.DataFrame, spec: str, params: dict) -> bytes:
    store = open_store(str(root))
    manifest = prepare_dataset(
        frame, store, features=[c for c in frame if c != "y"], label="y", num_partitions=1, seed=0
    )
    part = read_partition(f"{root}/datasets/{manifest.dataset_id}", "train", 0, manifest=manifest)
    task = UnitTask(
        kind=UnitKind.TRAIN, trial_id="t", spec=spec, params=params, trial_seed=0, epoch=0,
        partition=0, step=0, epoch_units=1, checkpoint_out="t.pt",
    )  # fmt: skip
    run_unit(task, part, store, manifest.info)
    return store.get("t.pt")


def test_a_token_beyond_the_vocabulary_is_refused_by_row(tmp_path: Path) -> None:
    frame = pd.DataFrame({"tokens": [[1 + i % 5] * (1 + i % 3) for i in range(20)]})
    frame["y"] = [i % 2 for i in range(20)]
    model = load_model(trained(tmp_path, frame, "cerebro_spark.training:SequenceSpec", {"dim": 4}))
    rows = pd.DataFrame({"tokens": [[1, 2], [3], [2, 6, 1]]})
    with pytest.raises(DataError, match=r"'tokens' row 2 holds token id 6.*beyond the vocabulary"):
        model.predict(rows)
    assert len(model.predict(rows.iloc[:2])) == 2  # the good rows still score


def test_bytes_that_are_no_image_are_refused_by_row(tmp_path: Path) -> None:
    frame = pd.DataFrame({"image": [png(40 * (i % 2)) for i in range(20)]})
    frame["y"] = [i % 2 for i in range(20)]
    checkpoint = trained(tmp_path, frame, "cerebro_spark.training:CNNSpec", {"channels": [2]})
    model = load_model(checkpoint)
    rows = pd.DataFrame({"image": [png(0), b"\x89PNG broken", png(40)]})
    with pytest.raises(DataError, match=r"'image'.*row 1"):
        model.predict(rows)
    assert set(model.predict(rows.iloc[[0, 2]])) <= {0, 1}  # the good rows still score
