"""Batches of held partitions: the form the model receives, determinism, replay, data wait."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from PIL import Image
from training_fixtures import train_task, validate_task

from cerebro_spark.data import KindOptions, PartitionData, mask_key, prepare_dataset, read_partition
from cerebro_spark.data._format import Manifest
from cerebro_spark.training import run_unit
from cerebro_spark.training._batches import BatchMaker, BatchSeeds, example_features
from cerebro_spark.training._images import Augmentation

pytestmark = pytest.mark.torch

CPU = torch.device("cpu")


def png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(out, format="PNG")
    return out.getvalue()


def dataset(tmp_path: Path, *, mixed: bool) -> tuple[Manifest, PartitionData]:
    """Bright or dark 8x8 digits-like images (the label), plus a category and tokens."""
    rng = np.random.default_rng(0)
    rows = 96
    labels = rng.integers(0, 2, rows)
    pixels = rng.integers(0, 80, (rows, 8, 8)) + labels[:, None, None] * 150
    columns = {"image": pa.array([png(p.astype(np.uint8)) for p in pixels], pa.binary())}
    if mixed:
        columns["colour"] = pa.array([["red", "blue", "green"][i % 3] for i in range(rows)])
        columns["words"] = pa.array([[1 + i % 4] * (1 + i % 5) for i in range(rows)])
    columns["label"] = pa.array(labels)
    features = [name for name in columns if name != "label"]
    manifest = prepare_dataset(
        pa.table(columns), str(tmp_path), features=features, label="label",
        num_partitions=1, seed=0, kinds=KindOptions(image_size=(8, 8)),
    )  # fmt: skip
    uri = f"{tmp_path}/datasets/{manifest.dataset_id}"
    return manifest, read_partition(uri, "train", 0, manifest=manifest)


def test_one_image_column_is_one_normalized_tensor(tmp_path: Path) -> None:
    manifest, part = dataset(tmp_path, mixed=False)
    assert manifest.info.tensor_input and manifest.feature_shape == (1, 8, 8)
    x, y = BatchMaker(part, manifest.info, CPU)(np.arange(part.rows))
    assert isinstance(x, torch.Tensor) and x.shape == (part.rows, 1, 8, 8)
    assert x.dtype == torch.float32 and y.dtype == torch.int64
    assert abs(float(x.mean())) < 1e-5 and abs(float(x.std(unbiased=False)) - 1) < 1e-3
    plain = BatchMaker(part, manifest.info, CPU, augmentation=Augmentation(normalize=False))
    raw, _ = plain(np.arange(3))
    assert float(raw.min()) >= 0.0 and float(raw.max()) <= 1.0


def test_mixed_kinds_are_a_dict_by_column(tmp_path: Path) -> None:
    manifest, part = dataset(tmp_path, mixed=True)
    x, _ = BatchMaker(part, manifest.info, CPU)(np.array([0, 1, 2, 3]))
    assert isinstance(x, dict)
    assert set(x) == {"image", "colour", "words", mask_key("words")}
    assert x["colour"].dtype == torch.int64 and x["colour"].shape == (4,)
    mask, words = x[mask_key("words")], x["words"]
    held = part.columns[2]
    assert held.offsets is not None
    lengths = [int(held.offsets[i + 1] - held.offsets[i]) for i in range(4)]
    assert mask.sum(dim=1).tolist() == lengths and words.shape == (4, max(lengths))
    assert bool((words[~mask] == 0).all())
    example = example_features(manifest.info)
    assert isinstance(example, dict) and set(example) == set(x)


def test_augmented_batches_depend_on_their_seeds_only(tmp_path: Path) -> None:
    manifest, part = dataset(tmp_path, mixed=False)
    rows = np.arange(32)
    augment = Augmentation(crop_padding=2, flip=True)

    def batch(seeds: BatchSeeds, number: int, threads: int = 0) -> torch.Tensor:
        maker = BatchMaker(part, manifest.info, CPU, augmentation=augment, seeds=seeds)
        with maker.batches(np.concatenate([rows, rows]), 32, threads=threads) as batches:
            return list(batches)[number][0]  # type: ignore[return-value]

    one = BatchSeeds(1, 0, 0)
    assert torch.equal(batch(one, 0), batch(one, 0, threads=2))
    assert not torch.equal(batch(one, 0), batch(one, 1))  # same rows, another batch number
    assert not torch.equal(batch(one, 0), batch(BatchSeeds(1, 1, 0), 0))  # another epoch
    plain = BatchMaker(part, manifest.info, CPU)(rows)[0]
    assert not torch.equal(batch(one, 0), plain)


def test_an_augmented_unit_replays_bit_for_bit_and_reports_its_data_wait(
    tmp_path: Path, store
) -> None:
    manifest, part = dataset(tmp_path, mixed=False)
    params = {"channels": [4], "lr": 0.01, "batch_size": 16}
    spec = "test_batches:AugmentedCNN"
    first = run_unit(train_task("a", spec=spec, params=params), part, store, manifest.info)
    run_unit(
        train_task("a", spec=spec, params=params, checkpoint_out="again.pt"),
        part,
        store,
        manifest.info,
    )
    assert first.checkpoint_sha256 is not None
    assert store.get("a/e0s0.pt") == store.get("again.pt")
    assert 0.0 < first.data_wait_seconds < first.seconds
    uri = f"{tmp_path}/datasets/{manifest.dataset_id}"
    validation = read_partition(uri, "validation", 0, manifest=manifest)
    checked = run_unit(validate_task(first.task, "a/e0s0.pt"), validation, store, manifest.info)
    assert checked.rows == validation.rows and checked.data_wait_seconds > 0.0


from cerebro_spark.training import CNNSpec  # noqa: E402


class AugmentedCNN(CNNSpec):
    """The small CNN with a random crop and flip."""

    def augmentation(self, params, info):  # type: ignore[no-untyped-def]
        return Augmentation(crop_padding=2, flip=True)
