"""Scoring raw rows of the image, categorical and sequence kinds (issue 25, part 4).

A tiny dataset (PNG images resized 12x16 -> 8x8, a categorical string column with hash
buckets, token lists cut to 4) trains one real unit of a small spec defined here; then
``load_model(...).predict`` on the raw rows equals the network run on the dataset's own
held partitions through ``BatchMaker``, unseen categories go to their hash bucket, and bad
rows are refused naming the column and the row. The Spark Transformer scores the same raw
rows in its tasks with the same predictions.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch
from PIL import Image
from torch import nn

from cerebro_spark.data import (
    ColumnInfo,
    HeldColumn,
    KindOptions,
    PartitionData,
    mask_key,
    prepare_dataset,
    read_partition,
)
from cerebro_spark.data._kinds import category_hash
from cerebro_spark.errors import ConfigError, DataError
from cerebro_spark.scoring import load_model
from cerebro_spark.scoring._inputs import raw_partition
from cerebro_spark.store import open_store
from cerebro_spark.training import ModelSpec, run_unit
from cerebro_spark.training._batches import BatchMaker
from cerebro_spark.units import UnitKind, UnitTask

pytestmark = pytest.mark.torch

ROWS = 48
COLORS = ("red", "red", "red", "green", "green", "blue", "teal", "pink")
KINDS = KindOptions(
    image_columns=("img",),
    categorical=("color",),
    sequence_columns=("tokens",),
    image_size=(8, 8),
    image_channels=3,
    vocabulary_limit=3,
    hash_buckets=2,
    max_length=4,
)


class TinyKinds(nn.Module):
    """Flattened image, colour embedding and masked mean of token embeddings -> classes."""

    def __init__(self, image: ColumnInfo, colors: int, tokens: int, classes: int) -> None:
        super().__init__()
        self.image = nn.Linear(int(np.prod(image.shape)), 4)
        self.color = nn.Embedding(colors, 4)
        self.tokens = nn.Embedding(tokens, 4)
        self.head = nn.Linear(12, classes)

    def forward(self, x: dict[str, torch.Tensor]) -> torch.Tensor:
        image = self.image(torch.flatten(x["img"], 1))
        mask = x[mask_key("tokens")].unsqueeze(-1).to(torch.float32)
        tokens = (self.tokens(x["tokens"]) * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return self.head(torch.cat([image, self.color(x["color"]), tokens], dim=1))


class TinyKindsSpec(ModelSpec):
    """The spec of :class:`TinyKinds` (imported by ``load_spec`` as ``test_kinds_scoring:``)."""

    def build_model(self, params, info):
        color, tokens = info.column("color"), info.column("tokens")
        return TinyKinds(
            info.column("img"), color.cardinality, tokens.cardinality, info.num_classes
        )


def png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def raw_frame(seed: int = 0) -> pd.DataFrame:
    """Raw rows: 12x16 RGB PNGs, colour strings, 1..9 tokens (the first is the row id)."""
    rng = np.random.default_rng(seed)
    images, colors, tokens, labels = [], [], [], []
    for row in range(ROWS):
        pixels = rng.integers(0, 256, size=(12, 16, 3), dtype=np.uint8)
        images.append(png(pixels))
        colors.append(str(rng.choice(COLORS)))
        tokens.append([row, *rng.integers(1, 30, size=int(rng.integers(0, 9))).tolist()])
        labels.append("a" if (colors[-1] in ("red", "teal")) ^ (pixels.mean() > 127.5) else "b")
    return pd.DataFrame(
        {"row_id": np.arange(ROWS), "img": images, "color": colors, "tokens": tokens, "y": labels}
    )


class Trained:
    def __init__(self, root: Path) -> None:
        self.frame = raw_frame()
        store = open_store(str(root))
        self.manifest = prepare_dataset(
            self.frame,
            store,
            features=["img", "color", "tokens"],
            label="y",
            num_partitions=1,
            seed=0,
            kinds=KINDS,
        )
        uri = f"{root}/datasets/{self.manifest.dataset_id}"
        self.parts = [
            read_partition(uri, split, 0, manifest=self.manifest)
            for split in ("train", "validation")
        ]
        task = UnitTask(
            kind=UnitKind.TRAIN,
            trial_id="k",
            spec="test_kinds_scoring:TinyKindsSpec",
            params={"lr": 0.05, "batch_size": 8},
            trial_seed=0,
            epoch=0,
            partition=0,
            step=0,
            epoch_units=1,
            checkpoint_out="k.pt",
        )
        run_unit(task, self.parts[0], store, self.manifest.info)
        self.checkpoint = store.get("k.pt")

    def column(self, name: str) -> ColumnInfo:
        return self.manifest.info.column(name)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return Trained(tmp_path_factory.mktemp("kinds"))


def reference(model, trained: Trained, part: PartitionData) -> tuple[np.ndarray, np.ndarray]:
    """Probabilities of a held partition's rows through BatchMaker, and their raw rows."""
    maker = BatchMaker(part, trained.manifest.info, torch.device("cpu"))
    features, _ = maker(np.arange(part.rows, dtype=np.int64))
    with torch.no_grad():
        proba = torch.softmax(model.network(features).double(), dim=1).numpy()
    tokens = part.columns[2]
    rows = np.array([int(tokens.row(i)[0]) for i in range(part.rows)])
    return proba, rows


def test_raw_rows_score_as_the_prepared_partitions(trained):
    model = load_model(trained.checkpoint, device="cpu")
    assert model.classes == ("a", "b") and not model.dense
    frame = trained.frame.sample(frac=1.0, random_state=1)  # order and extra columns free
    proba = model.predict_proba(frame)
    predicted = model.predict(frame)
    position = {row: i for i, row in enumerate(frame["row_id"])}
    seen = 0
    for part in trained.parts:
        expected, rows = reference(model, trained, part)
        got = proba[[position[row] for row in rows]]
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-12)
        seen += len(rows)
    assert seen == ROWS
    assert list(predicted) == list(np.asarray(model.classes)[proba.argmax(axis=1)])
    # what the rows became: resized images, ids, tokens cut to max_length
    held = model.partition(frame)
    image, color, tokens = held.columns
    assert image.info.shape == (3, 8, 8)
    assert Image.open(io.BytesIO(image.row(0).tobytes())).size == (8, 8)
    assert color.values.dtype == np.int32 and tokens.values.dtype == np.int32
    assert int(np.diff(tokens.offsets).max()) == 4
    assert model.predict(held).tolist() == predicted.tolist()
    assert model.predict_proba(frame.iloc[:0]).shape == (0, 2)
    with pytest.raises(ConfigError, match=r"use ScoringModel\.partition"):
        model.features(frame)
    with pytest.raises(TypeError, match="pandas DataFrame or a pyarrow Table"):
        model.predict(np.zeros((2, 3)))


def test_other_sizes_modes_and_unseen_categories(trained):
    model = load_model(trained.checkpoint, device="cpu")
    frame = trained.frame.iloc[:6].reset_index(drop=True)
    # an unseen colour takes its hash bucket (the same id the held rows are given here)
    unseen = frame.assign(color="ultraviolet")
    info = trained.column("color")
    bucket = 1 + len(info.vocabulary) + int(category_hash(pa.array(["ultraviolet"]))[0] % 2)
    held = model.partition(frame)
    image, color, tokens = held.columns
    recolored = PartitionData(
        "x",
        0,
        (image, HeldColumn(color.info, np.full(6, bucket, np.int32)), tokens),
        held.labels,
        0,
    )
    assert model.partition(unseen).columns[1].values.tolist() == [bucket] * 6
    np.testing.assert_allclose(
        model.predict_proba(unseen), model.predict_proba(recolored), rtol=1e-6, atol=1e-12
    )
    # Spark's image struct (raw BGR pixels) and a Table score as the PNG of those pixels
    pixels = np.asarray(Image.open(io.BytesIO(frame["img"][0])))
    struct = {
        "origin": "file:/x.png",
        "height": 12,
        "width": 16,
        "nChannels": 3,
        "mode": 16,
        "data": np.ascontiguousarray(pixels[:, :, ::-1]).tobytes(),
    }
    table = pa.Table.from_pandas(frame.iloc[:1].assign(img=[struct]), preserve_index=False)
    np.testing.assert_allclose(
        model.predict_proba(table), model.predict_proba(frame.iloc[:1]), rtol=1e-6, atol=1e-12
    )
    # a grayscale JPEG of yet another size, and token arrays of numpy
    gray = io.BytesIO()
    Image.fromarray(np.full((5, 7), 99, np.uint8)).save(gray, format="JPEG")
    other = frame.assign(img=[gray.getvalue()] * 6, tokens=[np.array([1, 2, 3])] * 6)
    assert model.predict(other).shape == (6,)


def test_bad_rows_are_refused_with_column_and_row(trained):
    model = load_model(trained.checkpoint, device="cpu")
    frame = trained.frame.iloc[:4].reset_index(drop=True)
    limit = trained.column("tokens").cardinality
    tokens = list(frame["tokens"])
    tokens[2] = [1, limit, 3]
    with pytest.raises(DataError, match=r"sequence column 'tokens' row 2 .*token beyond"):
        model.predict(frame.assign(tokens=tokens))
    tokens[2] = [1, 2, 3, 4, limit]  # cut at max_length 4: never seen by the model
    assert model.predict(frame.assign(tokens=tokens)).shape == (4,)
    images = list(frame["img"])
    images[1] = images[1][:40]
    with pytest.raises(DataError, match=r"image column 'img' row 1 .*does not decode"):
        model.predict(frame.assign(img=images))
    with pytest.raises(DataError, match=r"categorical column 'color' row 3 is null"):
        model.predict(frame.assign(color=["red", "red", "red", None]))
    with pytest.raises(DataError, match="'tokens'"):
        model.predict(frame.drop(columns=["tokens"]))


def test_raw_columns_follow_the_stored_rules():
    """Unseen categories without buckets get id 0; dense columns keep their stored dtype."""
    color = ColumnInfo("c", "int32", kind="categorical", vocabulary=("x", "y"), cardinality=3)
    pixels = ColumnInfo("p", "uint8", (2,), kind="array")
    table = pa.table({"p": [[0, 255], [7, 8]], "c": ["y", "never"]})
    part = raw_partition(table, [pixels, color])
    assert part.columns[0].values.dtype == np.uint8
    assert part.columns[0].values.tolist() == [[0, 255], [7, 8]]
    assert part.columns[1].values.tolist() == [2, 0]
    with pytest.raises(DataError, match=r"'p' row 1 .*integer in 0..255"):
        raw_partition(pa.table({"p": [[0, 1], [2, 256]], "c": ["x", "x"]}), [pixels, color])
    with pytest.raises(DataError, match=r"'p' row 0 .*NaN or infinite"):
        raw_partition(pa.table({"p": [[0.0, np.nan]], "c": ["x"]}), [pixels, color])


@pytest.mark.spark
def test_the_transformer_scores_raw_rows_in_its_tasks(spark, trained):
    from cerebro_spark.scoring import ModelTransformer

    spark.sparkContext.addPyFile(__file__)  # the tasks import this module's spec
    model = load_model(trained.checkpoint, device="cpu")
    frame = trained.frame.assign(tokens=[[int(t) for t in row] for row in trained.frame["tokens"]])
    schema = "row_id long, img binary, color string, tokens array<int>, y string"
    rows = spark.createDataFrame(frame, schema=schema).repartition(2)
    transformer = ModelTransformer.from_checkpoint(trained.checkpoint, batchSize=16)
    scored = transformer.transform(rows).toPandas().sort_values("row_id").reset_index(drop=True)
    assert list(scored.columns) == [*frame.columns, "prediction", "probability"]
    assert list(scored["prediction"]) == list(model.predict(frame))
    np.testing.assert_allclose(
        np.stack(scored["probability"].to_numpy()), model.predict_proba(frame), rtol=1e-6
    )
    assert list(scored["img"]) == list(frame["img"])  # passed through unchanged
    images = list(frame["img"])
    images[5] = b"\x89PNG\r\n\x1a\nnot really"
    bad = spark.createDataFrame(frame.assign(img=images), schema=schema).coalesce(1)
    with pytest.raises(Exception, match=r"image column 'img' row 5 .*does not decode"):
        transformer.transform(bad).collect()
    with pytest.raises(DataError, match="image column 'img' has Spark type string"):
        transformer.transform(rows.withColumn("img", rows["color"]))
