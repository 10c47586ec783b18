"""Tuner.fit and the CLI on images, categories and token sequences (issue 25): kinds are
inferred as ``prepare`` infers them, and the three families search them end to end."""

import io
import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from cerebro_spark.cli import main
from cerebro_spark.tuner import Tuner

pytestmark = [pytest.mark.torch, pytest.mark.slow]


def png(value: int, rng: np.random.Generator) -> bytes:
    pixels = (rng.integers(0, 60, (10, 10)) + value * 180).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(out, format="PNG")
    return out.getvalue()


def mixed_frame(rows: int = 160) -> pd.DataFrame:
    """The label shows in every column: the image's brightness, the shop, the tokens."""
    rng = np.random.default_rng(4)
    label = rng.integers(0, 2, rows)
    return pd.DataFrame(
        {
            "photo": [png(int(v), rng) for v in label],
            "shop": [f"shop-{v}{rng.integers(0, 3)}" for v in label],
            "tokens": [[int(v) * 5 + 1] * int(rng.integers(1, 6)) for v in label],
            "price": rng.normal(size=rows) + label,
            "label": label,
        }
    )


def test_fit_infers_kinds_and_searches_images_and_sequences(tmp_path):
    shared = {"lr": 0.01, "batch_size": 32}
    space = {
        "choice": [
            {
                "model": "cerebro_spark.training:ResNetSpec",
                "image_column": "photo",
                "width": 0.125,
                "flip": True,
                **shared,
            },
            {"model": "cerebro_spark.training:SequenceSpec", "dim": 8, **shared},
        ]
    }
    tuner = Tuner(
        space, epochs=2, workers=2, backend="local", store=str(tmp_path), seed=1, progress=False
    )
    result = tuner.fit(mixed_frame(), experiment_id="mixed")
    board = result.leaderboard()
    assert set(board["model"]) == {"ResNetSpec", "SequenceSpec"}
    assert board["accuracy"].min() > 0.9  # both read their column
    manifest = json.loads(
        (tmp_path / "datasets" / result.state.dataset_id / "manifest.json").read_text()
    )
    kinds = {c["name"]: c.get("kind") for c in manifest["features"]}
    assert kinds == {
        "photo": "image",
        "shop": "categorical",
        "tokens": "sequence",
        "price": "number",
    }


def test_fit_with_kinds_searches_an_embedding_mlp(tmp_path):
    frame = mixed_frame().drop(columns=["photo", "tokens"])
    frame["store_id"] = np.arange(len(frame)) % 7  # an integer category, named
    space = {"model": "cerebro_spark.training:EmbeddingMLPSpec", "lr": 0.01, "batch_size": 32}
    tuner = Tuner(space, epochs=2, workers=1, backend="local", store=str(tmp_path), seed=1)
    result = tuner.fit(frame, kinds={"categorical": ["store_id"]}, experiment_id="tab")
    assert result.leaderboard().loc[0, "accuracy"] > 0.9
    manifest = json.loads(
        (tmp_path / "datasets" / result.state.dataset_id / "manifest.json").read_text()
    )
    store_id = next(c for c in manifest["features"] if c["name"] == "store_id")
    assert store_id["kind"] == "categorical" and store_id["cardinality"] == 8


def test_the_cli_prepares_and_runs_images(tmp_path):
    frame = mixed_frame(120)
    path = tmp_path / "photos.parquet"
    pq.write_table(pa.Table.from_pandas(frame[["photo", "label"]], preserve_index=False), path)
    store = tmp_path / "store"
    prepare = ["prepare", "--input", str(path), "--engine", "python", "--store", str(store)]
    prepare += ["--image-size", "12", "12", "--partitions", "2", "--name", "photos"]
    assert main(prepare) == 0
    config = tmp_path / "c.yaml"
    config.write_text(
        "name: photos\ndata: {dataset: photos}\nepochs: 1\nworkers: 2\nbackend: local\n"
        "space: {model: cerebro_spark.training:ResNetSpec, width: 0.125, crop_padding: 2, "
        "lr: 0.01, batch_size: 16}\n"
    )
    assert main(["run", str(config), "--store", str(store), "--experiment-id", "cli"]) == 0
    events = [
        json.loads(line)
        for line in (store / "experiments" / "cli" / "events.jsonl").read_text().splitlines()
    ]
    units = [e for e in events if e["event"] == "unit_end"]
    assert units and all(0 < e["data_wait_seconds"] < e["seconds"] for e in units)


def test_an_augmented_image_run_replays_bit_for_bit(tmp_path):
    from cerebro_spark.engine import parse_config, replay_experiment, run_experiment

    raw = {
        "name": "aug",
        "seed": 5,
        "store": str(tmp_path),
        "data": {"source": "sklearn:digits_png", "partitions": 2, "image_size": [12, 12]},
        "procedure": "grid",
        "epochs": 2,
        "workers": 2,
        "backend": "local",
        "space": {
            "model": "cerebro_spark.training:ResNetSpec",
            "width": 0.125,
            "crop_padding": 2,
            "flip": True,
            "lr": {"grid": [0.003, 0.01]},
            "batch_size": 64,
        },
    }
    result = run_experiment(parse_config(raw), experiment_id="aug")
    assert all(t.status == "completed" for t in result.trials)
    report = replay_experiment(str(tmp_path), "aug", workers=1)
    assert report.identical, report.rows
