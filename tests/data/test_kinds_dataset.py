"""Feature kinds through the plain writer and the reader: what is stored, held and described."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from cerebro_spark.data import (
    UNKNOWN_ID,
    KindOptions,
    dataset_id_for,
    prepare_dataset,
    read_partition,
)
from cerebro_spark.errors import DataError

ROWS = 60


def encoded(pixels: np.ndarray, fmt: str) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


def images(rows: int, size: tuple[int, int], *, seed: int = 0, channels: int = 3) -> list[bytes]:
    rng = np.random.default_rng(seed)
    shape = (*size, 3) if channels == 3 else size
    return [
        encoded(rng.integers(0, 256, shape, dtype=np.uint8), "PNG" if i % 2 else "JPEG")
        for i in range(rows)
    ]


def table(rows: int = ROWS) -> pa.Table:
    rng = np.random.default_rng(1)
    words = np.array(["red", "green", "blue", "cyan", "plum"])
    return pa.table(
        {
            "img": pa.array(images(rows, (12, 10)), pa.binary()),
            "color": pa.array(words[rng.integers(0, 5, rows)].tolist()),
            "shop": pa.array(rng.integers(100, 140, rows)),
            "tokens": pa.array([list(range(1, 1 + i % 7)) for i in range(rows)]),
            "px": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.integers(0, 256, rows * 6).astype(np.uint8)), 6
            ),
            "half": pa.array(rng.normal(size=rows).astype(np.float16)),
            "wide": pa.array(rng.integers(-5, 5, rows).astype(np.int64)),
            "label": pa.array(rng.integers(0, 3, rows)),
        }
    )


KW = {
    "features": ["img", "color", "shop", "tokens", "px", "half", "wide"],
    "label": "label",
    "num_partitions": 2,
    "seed": 3,
}
OPTIONS = KindOptions(categorical=("shop",), image_size=(8, 8), max_length=4)


def test_every_kind_is_stored_held_and_described(tmp_path: Path) -> None:
    manifest = prepare_dataset(table(), str(tmp_path), kinds=OPTIONS, **KW)
    kinds = {c.name: (c.feature_kind, c.dtype, c.shape) for c in manifest.features}
    assert kinds == {
        "img": ("image", "uint8", (3, 8, 8)),
        "color": ("categorical", "int32", ()),
        "shop": ("categorical", "int32", ()),
        "tokens": ("sequence", "int32", ()),
        "px": ("array", "uint8", (6,)),
        "half": ("number", "float16", ()),
        "wide": ("number", "float32", ()),  # int64 is widened to float32, as before
    }
    assert manifest.schema["px"] == "fixed_size_list<item: uint8>[6]"
    assert manifest.schema["img"] == "binary" and manifest.schema["tokens"] == "list<item: int32>"
    tokens = manifest.info.column("tokens")
    assert tokens.max_length == 4 and tokens.cardinality == 7  # ids 1..6 seen before the cut
    assert tokens.statistics is not None and tokens.statistics["max_length"] == 4
    assert manifest.statistics is not None and manifest.statistics.size == 6 + 1 + 1
    assert not manifest.info.tensor_input and manifest.feature_shape == ()

    uri = f"{tmp_path}/datasets/{manifest.dataset_id}"
    part = read_partition(uri, "train", 0, manifest=manifest)
    held = {c.info.name: c for c in part.columns}
    assert held["px"].values.dtype == np.uint8 and held["px"].values.shape == (part.rows, 6)
    assert held["half"].values.dtype == np.float16
    assert held["color"].values.dtype == np.int32
    file = pq.read_table(f"{uri}/train/part-00000.parquet")
    first = file.column("img")[0].as_py()
    assert bytes(held["img"].row(0)) == first  # held encoded, as stored
    assert Image.open(io.BytesIO(first)).size == (8, 8)
    lengths = np.diff(held["tokens"].offsets)
    assert lengths.max() <= 4 and held["tokens"].values.dtype == np.int32


def test_image_statistics_are_the_train_pixels_per_channel(tmp_path: Path) -> None:
    manifest = prepare_dataset(table(), str(tmp_path), kinds=OPTIONS, **KW)
    uri = f"{tmp_path}/datasets/{manifest.dataset_id}"
    pixels = []
    for index in range(2):
        for value in pq.read_table(f"{uri}/train/part-{index:05d}.parquet").column("img"):
            image = Image.open(io.BytesIO(value.as_py())).convert("RGB")
            pixels.append(np.asarray(image, dtype=np.float64).reshape(-1, 3) / 255.0)
    every = np.concatenate(pixels)
    stats = manifest.info.column("img").statistics
    assert stats is not None
    assert np.allclose(stats["mean"], every.mean(axis=0), rtol=1e-12)
    assert np.allclose(stats["std"], every.std(axis=0), rtol=1e-6)


def test_categories_get_frequency_ordered_ids_and_buckets(tmp_path: Path) -> None:
    values = ["a"] * 6 + ["b"] * 4 + ["c"] * 4 + ["d"] * 2 + ["e", "f", "g", "h"]
    data = pa.table({"cat": values, "label": [0, 1] * 10})
    options = KindOptions(vocabulary_limit=3, hash_buckets=2)
    manifest = prepare_dataset(
        data, str(tmp_path), features=["cat"], label="label", num_partitions=1, seed=0,
        kinds=options,
    )  # fmt: skip
    column = manifest.info.column("cat")
    assert column.vocabulary == ("a", "b", "c")  # by count, ties by value
    assert column.hash_buckets == 2 and column.cardinality == 1 + 3 + 2
    assert column.statistics == {"rows": 20, "distinct": 8, "unknown": 0, "hashed": 6}
    uri = f"{tmp_path}/datasets/{manifest.dataset_id}"
    ids = np.concatenate(
        [
            read_partition(uri, s, 0, manifest=manifest).columns[0].values
            for s in ("train", "validation")
        ]
    )
    assert sorted(set(ids.tolist())) <= [1, 2, 3, 4, 5] and np.count_nonzero(ids >= 4) == 6
    no_buckets = prepare_dataset(
        data, str(tmp_path / "u"), features=["cat"], label="label", num_partitions=1, seed=0,
        kinds=KindOptions(vocabulary_limit=3),
    )  # fmt: skip
    column = no_buckets.info.column("cat")
    assert column.cardinality == 4 and column.statistics is not None
    assert column.statistics["unknown"] == 6  # beyond the vocabulary: the reserved id
    assert UNKNOWN_ID == 0


def test_kinds_are_inferred_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="cerebro_spark.data._writer")
    manifest = prepare_dataset(table(), str(tmp_path), kinds=KindOptions(image_size=(8, 8)), **KW)
    kinds = {c.name: c.feature_kind for c in manifest.features}
    assert kinds["img"] == "image" and kinds["color"] == "categorical"
    assert kinds["tokens"] == "sequence" and kinds["shop"] == "number"  # ints: name them
    text = caplog.text
    assert "'img' (binary) is read as image" in text
    assert "'tokens' (list<item: int64>) is read as sequence" in text


def test_the_dataset_depends_on_the_rows_not_their_order_and_on_the_options(
    tmp_path: Path,
) -> None:
    data = table()
    shuffled = data.take(pa.array(np.random.default_rng(9).permutation(data.num_rows)))
    one = prepare_dataset(data, str(tmp_path / "a"), kinds=OPTIONS, **KW)
    two = prepare_dataset(shuffled, str(tmp_path / "b"), kinds=OPTIONS, **KW)
    assert one == two
    for split in ("train", "validation"):
        a = tmp_path / "a" / "datasets" / one.dataset_id / split / "part-00000.parquet"
        b = tmp_path / "b" / "datasets" / one.dataset_id / split / "part-00000.parquet"
        assert a.read_bytes() == b.read_bytes()
    other = KindOptions(categorical=("shop",), image_size=(8, 8), max_length=5)
    assert dataset_id_for(data, kinds=other, **KW) != one.dataset_id


def refused(tmp_path: Path, data: pa.Table, **kw: object) -> str:
    with pytest.raises(DataError) as error:
        prepare_dataset(data, str(tmp_path), **{**KW, **kw})  # type: ignore[arg-type]
    assert not (tmp_path / "datasets").exists() or not any((tmp_path / "datasets").iterdir())
    return str(error.value)


def test_images_of_several_sizes_are_refused_by_name(tmp_path: Path) -> None:
    data = table()
    mixed = images(ROWS, (12, 10))
    mixed[7] = images(1, (9, 9), seed=4)[0]
    data = data.set_column(0, "img", pa.array(mixed, pa.binary()))
    message = refused(tmp_path, data)
    assert "'img'" in message and "--image-size" in message


def test_bytes_that_do_not_decode_are_refused_with_the_row(tmp_path: Path) -> None:
    broken = images(ROWS, (12, 10))
    broken[5] = broken[4][:40]  # a truncated JPEG
    data = table().set_column(0, "img", pa.array(broken, pa.binary()))
    message = refused(tmp_path, data, kinds=KindOptions(image_size=(8, 8)))
    assert "'img'" in message and "row 5" in message


def test_more_ids_than_int32_are_refused(tmp_path: Path) -> None:
    options = KindOptions(vocabulary_limit=2, hash_buckets=2**31 - 2)
    message = refused(tmp_path, table(), kinds=options)
    assert "'color'" in message and "ids are int32, so at most 2147483647" in message


def test_negative_token_ids_are_refused_with_the_row(tmp_path: Path) -> None:
    tokens = [list(range(1, 1 + i % 7)) for i in range(ROWS)]
    tokens[9] = [3, -1]
    data = table().set_column(3, "tokens", pa.array(tokens))
    message = refused(tmp_path, data, kinds=KindOptions(image_size=(8, 8)))
    assert "'tokens'" in message and "row 9" in message


def test_named_columns_must_be_features(tmp_path: Path) -> None:
    message = refused(tmp_path, table(), kinds=KindOptions(categorical=("nope",)))
    assert "'nope'" in message and "not among the features" in message
    with pytest.raises(DataError, match="has one kind"):
        KindOptions(categorical=("a",), image_columns=("a",))
    with pytest.raises(DataError, match="hash_buckets must be an integer >= 0"):
        KindOptions(hash_buckets=-1)


def test_dense_columns_of_one_dtype_are_held_side_by_side(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    data = pa.table(
        {
            "a": rng.normal(size=40).astype(np.float32),
            "v": pa.FixedSizeListArray.from_arrays(pa.array(rng.normal(size=80), pa.float32()), 2),
            "label": rng.integers(0, 2, 40),
        }
    )
    kw = {"features": ["a", "v"], "label": "label", "num_partitions": 1, "seed": 0}
    manifest = prepare_dataset(data, str(tmp_path), **kw)  # type: ignore[arg-type]
    part = read_partition(f"{tmp_path}/datasets/{manifest.dataset_id}", "train", 0)
    assert part.dense_block is not None and part.dense_block.shape == (part.rows, 3)
    a, v = (column.values for column in part.columns)
    assert np.shares_memory(a, part.dense_block) and np.shares_memory(v, part.dense_block)
    assert np.array_equal(part.features, np.concatenate([a[:, None], v], axis=1))
    mixed = data.set_column(0, "a", pa.array(rng.integers(0, 9, 40).astype(np.uint8)))
    manifest = prepare_dataset(mixed, str(tmp_path / "m"), **kw)  # type: ignore[arg-type]
    part = read_partition(f"{tmp_path}/m/datasets/{manifest.dataset_id}", "train", 0)
    assert part.dense_block is None and part.columns[0].values.dtype == np.uint8


def test_array_columns_decoded_a_few_rows_at_a_time_read_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cerebro_spark.data import _reader

    manifest = prepare_dataset(table(), str(tmp_path), kinds=OPTIONS, **KW)
    uri = f"{tmp_path}/datasets/{manifest.dataset_id}"
    whole = read_partition(uri, "train", 0, manifest=manifest)
    monkeypatch.setattr(_reader, "_DECODE_BYTES", 1)  # a row a batch
    pieces = read_partition(uri, "train", 0, manifest=manifest)
    assert whole.rows > 1
    for a, b in zip(whole.columns, pieces.columns, strict=True):
        assert np.array_equal(a.values, b.values)
        assert (a.offsets is None) == (b.offsets is None)
        assert a.offsets is None or np.array_equal(
            a.offsets - a.offsets[0], b.offsets - b.offsets[0]
        )


def test_narrow_integers_are_not_widened_on_disk(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 256, (200, 3, 8, 8)).astype(np.uint8)
    data = pa.table(
        {
            "px": pa.FixedSizeListArray.from_arrays(pa.array(pixels.reshape(-1)), 192),
            "small": pa.array(rng.integers(-9, 9, 200).astype(np.int16)),
            "label": pa.array(rng.integers(0, 2, 200)),
        }
    )
    kw = {"features": ["px", "small"], "label": "label", "num_partitions": 1, "seed": 0}
    manifest = prepare_dataset(data, str(tmp_path), **kw)  # type: ignore[arg-type]
    uri = f"{tmp_path}/datasets/{manifest.dataset_id}"
    train = manifest.partition("train", 0)
    assert train.bytes < train.rows * 192 * 1.1  # random bytes: about their own size
    meta = pq.ParquetFile(f"{uri}/{train.path}").metadata.row_group(0)
    encodings = {meta.column(i).path_in_schema: meta.column(i).encodings for i in range(3)}
    assert "RLE_DICTIONARY" in encodings["px.list.element"]
    assert "RLE_DICTIONARY" in encodings["small"]
    assert "RLE_DICTIONARY" not in encodings["label"]
    part = read_partition(uri, "train", 0, manifest=manifest)
    assert part.columns[0].values.dtype == np.uint8 and part.columns[1].values.dtype == np.int16
