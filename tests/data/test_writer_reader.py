from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dataset_helpers import dataset_files, make_table

from cerebro_spark.data import (
    MANIFEST_NAME,
    PARQUET_OPTIONS,
    SPLITS,
    dataset_id_for,
    prepare_dataset,
    read_manifest,
    read_partition,
    write_dataset,
)
from cerebro_spark.store import open_store

KW = {"features": ["rowid", "x", "vec"], "label": "y", "num_partitions": 3, "seed": 7}


def read_all(uri: str) -> dict[str, list]:
    manifest = read_manifest(uri)
    return {
        split: [read_partition(uri, split, i, manifest=manifest) for i in range(3)]
        for split in SPLITS
    }


def test_round_trip(tmp_path: Path) -> None:
    table = make_table(100)
    uri = str(tmp_path / "ds")
    manifest = write_dataset(table, uri, source="unit test", **KW)

    assert read_manifest(uri) == manifest
    assert manifest.task == "classification"
    assert manifest.num_classes == 3
    assert manifest.classes == (0, 1, 2)
    assert manifest.source == "unit test"
    assert [(c.name, c.dtype, c.shape) for c in manifest.features] == [
        ("rowid", "float32", ()),
        ("x", "float32", ()),
        ("vec", "float32", (6,)),
    ]
    assert (manifest.label.name, manifest.label.dtype) == ("y", "int64")
    assert manifest.feature_shape == (8,)
    assert manifest.schema == {
        "rowid": "float",
        "x": "float",
        "vec": "fixed_size_list<item: float>[6]",
        "y": "int64",
    }
    assert manifest.rows("validation") == 20  # round(100 * 0.2)
    assert manifest.rows("train") == 80
    assert sorted(os.listdir(uri)) == [MANIFEST_NAME, "train", "validation"]
    # only the selected columns were written
    part = pq.read_table(Path(uri) / "train" / "part-00000.parquet")
    assert part.column_names == ["rowid", "x", "vec", "y"]

    parts = read_all(uri)
    seen: list[int] = []
    for split in SPLITS:
        sizes = [p.rows for p in parts[split]]
        assert max(sizes) - min(sizes) <= 1
        for info, data in zip(
            [manifest.partition(split, i) for i in range(3)], parts[split], strict=True
        ):
            assert data.features.dtype == np.float32
            assert data.features.shape == (info.rows, 8)
            assert data.labels.dtype == np.int64
            assert data.labels.shape == (info.rows,)
            assert data.bytes_read == info.bytes == os.path.getsize(Path(uri) / info.path)
            assert data.features.flags.writeable and data.features.flags.c_contiguous
            assert data.labels.flags.writeable
            rowids = data.features[:, 0].astype(np.int64)
            # each row kept its own values: x and vec and y travel with the row id
            np.testing.assert_array_equal(data.labels, rowids % 3)
            original = table.take(pa.array(rowids))
            np.testing.assert_array_equal(
                data.features[:, 1], original.column("x").to_numpy().astype(np.float32)
            )
            np.testing.assert_array_equal(
                data.features[:, 2:],
                np.stack(original.column("vec").to_pylist()).astype(np.float32),
            )
            seen.extend(rowids.tolist())
    assert sorted(seen) == list(range(100))  # every row exactly once


def test_rows_are_shuffled_and_seed_dependent(tmp_path: Path) -> None:
    table = make_table(200)
    one = write_dataset(table, str(tmp_path / "a"), **KW)
    two = write_dataset(table, str(tmp_path / "b"), **{**KW, "seed": 8})
    rows_a = read_partition(str(tmp_path / "a"), "train", 0).features[:, 0]
    rows_b = read_partition(str(tmp_path / "b"), "train", 0).features[:, 0]
    assert not np.array_equal(rows_a, np.sort(rows_a))  # not in input order
    assert not np.array_equal(rows_a[:20], rows_b[:20])
    assert one.dataset_id != two.dataset_id


def test_deterministic_bytes_and_id(tmp_path: Path) -> None:
    table = make_table(150)
    expected_id = dataset_id_for(table, **KW)
    first = write_dataset(table, str(tmp_path / "one"), **KW)
    second = write_dataset(table, str(tmp_path / "two"), **KW)
    assert first.dataset_id == second.dataset_id == expected_id
    assert first == second
    files_one = dataset_files(tmp_path / "one")
    assert files_one == dataset_files(tmp_path / "two")
    assert len(files_one) == 7
    # the Parquet footers carry no time stamp or random value
    metadata = pq.ParquetFile(tmp_path / "one" / "train" / "part-00000.parquet").metadata
    assert metadata.created_by.startswith("parquet-cpp-arrow version")
    assert metadata.row_group(0).column(0).compression == PARQUET_OPTIONS["compression"].upper()


def test_id_depends_on_content_and_parameters() -> None:
    table = make_table(60)
    base = dataset_id_for(table, **KW)
    changed = table.set_column(1, "x", pa.array(np.r_[[123.0], table.column("x").to_numpy()[1:]]))
    assert dataset_id_for(changed, **KW) != base
    reordered = table.take(pa.array(np.r_[1, 0, np.arange(2, 60)]))
    assert dataset_id_for(reordered, **KW) == base  # format 2: the rows as a multiset
    assert dataset_id_for(table, **{**KW, "num_partitions": 2}) != base
    assert dataset_id_for(table, **{**KW, "seed": 1}) != base
    assert dataset_id_for(table, **KW, validation_fraction=0.3) != base
    assert dataset_id_for(table, **KW, validation_column="is_val") != base
    assert dataset_id_for(table, **{**KW, "features": ["x", "rowid", "vec"]}) != base
    assert dataset_id_for(table, **KW, feature_shapes={"vec": (2, 3)}) != base
    # columns that are not selected do not matter
    assert dataset_id_for(table.drop_columns(["unused", "is_val"]), **KW) == base


def test_pandas_and_arrow_give_the_same_dataset(tmp_path: Path) -> None:
    table = make_table(90)
    frame = table.to_pandas()
    frame["vec"] = [np.asarray(v, dtype=np.float32) for v in frame["vec"]]
    assert dataset_id_for(frame, **KW) == dataset_id_for(table, **KW)
    write_dataset(frame, str(tmp_path / "pd"), **KW)
    write_dataset(table, str(tmp_path / "pa"), **KW)
    assert dataset_files(tmp_path / "pd") == dataset_files(tmp_path / "pa")


def test_pandas_2d_arrays_keep_their_shape(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    frame = pd.DataFrame(
        {
            "img": [rng.random((4, 3)) for _ in range(40)],
            "label": rng.integers(0, 2, 40),
        }
    )
    uri = str(tmp_path / "img")
    manifest = write_dataset(frame, uri, features=["img"], label="label", num_partitions=2, seed=0)
    assert manifest.features[0].shape == (4, 3)
    assert manifest.feature_shape == (4, 3)
    part = read_partition(uri, "train", 1)
    assert part.features.shape == (part.rows, 4, 3)
    first = int(np.flatnonzero([np.allclose(a, part.features[0]) for a in frame["img"]])[0])
    np.testing.assert_allclose(part.features[0], frame["img"][first], rtol=1e-6)


def test_nested_arrow_lists_and_shape_hint(tmp_path: Path) -> None:
    rows = 30
    nested = pa.array([[[float(i)] * 3, [float(-i)] * 3] for i in range(rows)])
    table = pa.table({"m": nested, "y": pa.array([i % 2 for i in range(rows)])})
    kw = {"features": ["m"], "label": "y", "num_partitions": 2, "seed": 0}
    manifest = write_dataset(table, str(tmp_path / "n"), **kw)
    assert manifest.features[0].shape == (2, 3)
    hinted = write_dataset(table, str(tmp_path / "h"), **kw, feature_shapes={"m": [1, 6]})
    assert hinted.feature_shape == (1, 6)
    data = read_partition(str(tmp_path / "h"), "validation", 0)
    assert data.features.shape == (data.rows, 1, 6)
    i = data.features[0, 0, 0]
    np.testing.assert_array_equal(data.features[0, 0], [i, i, i, -i, -i, -i])


def test_digits_like_shape_hint(tmp_path: Path) -> None:
    table = pa.table(
        {
            "image": pa.array([list(np.linspace(0, 1, 64, dtype=np.float32))] * 20),
            "label": pa.array(list(range(10)) * 2),
        }
    )
    uri = str(tmp_path / "d")
    m = write_dataset(
        table, uri, features=["image"], label="label", num_partitions=2, seed=3,
        feature_shapes={"image": (1, 8, 8)},
    )  # fmt: skip
    assert m.info.feature_shape == (1, 8, 8)
    assert m.info.num_classes == 10
    assert read_partition(uri, "train", 0).features.shape[1:] == (1, 8, 8)


def test_string_and_bool_labels_are_mapped_to_class_indices(tmp_path: Path) -> None:
    table = pa.table(
        {
            "f": pa.array(np.arange(40, dtype=np.float64)),
            "animal": pa.array(["dog", "cat", "emu", "cat"] * 10),
            "flag": pa.array([True, False] * 20),
        }
    )
    kw = {"features": ["f"], "num_partitions": 2, "seed": 0}
    manifest = write_dataset(table, str(tmp_path / "s"), label="animal", **kw)
    assert manifest.classes == ("cat", "dog", "emu")  # sorted, not first-seen order
    assert manifest.num_classes == 3
    for split in SPLITS:
        for i in range(2):
            part = read_partition(str(tmp_path / "s"), split, i)
            rowids = part.features[:, 0].astype(int)
            names = [["dog", "cat", "emu", "cat"][r % 4] for r in rowids]
            assert [manifest.classes[c] for c in part.labels] == names
            assert part.labels.dtype == np.int64
    flags = write_dataset(table, str(tmp_path / "b"), label="flag", **kw)
    assert flags.classes == (False, True)
    assert read_manifest(str(tmp_path / "b")).classes == (False, True)


def test_sparse_integer_labels(tmp_path: Path) -> None:
    table = pa.table({"f": pa.array(np.ones(20)), "y": pa.array([3, 7, 9, 7] * 5)})
    m = write_dataset(
        table, str(tmp_path / "d"), features=["f"], label="y", num_partitions=1, seed=0
    )
    assert m.classes == (3, 7, 9)
    labels = np.concatenate(
        [read_partition(str(tmp_path / "d"), split, 0).labels for split in SPLITS]
    )
    assert sorted(np.bincount(labels).tolist()) == [5, 5, 10]


def test_regression(tmp_path: Path) -> None:
    table = pa.table({"f": pa.array(np.arange(50.0)), "target": pa.array(np.arange(50.0) / 7)})
    uri = str(tmp_path / "r")
    m = write_dataset(table, uri, features=["f"], label="target", num_partitions=2, seed=0)
    assert (m.task, m.num_classes, m.classes) == ("regression", None, None)
    assert m.label.dtype == "float32"
    part = read_partition(uri, "train", 0)
    assert part.labels.dtype == np.float32
    np.testing.assert_allclose(part.labels, part.features[:, 0] / 7, rtol=1e-6)
    forced = write_dataset(
        pa.table({"f": pa.array(np.arange(20.0)), "n": pa.array(np.arange(20))}),
        str(tmp_path / "forced"), features=["f"], label="n", num_partitions=2, seed=0,
        task="regression",
    )  # fmt: skip
    assert forced.task == "regression"


def test_validation_column(tmp_path: Path) -> None:
    table = make_table(80)
    uri = str(tmp_path / "v")
    manifest = write_dataset(table, uri, **KW, validation_column="is_val")
    assert manifest.rows("validation") == 20
    assert manifest.rows("train") == 60
    for split in SPLITS:
        for i in range(3):
            rowids = read_partition(uri, split, i).features[:, 0].astype(int)
            assert np.all((rowids % 4 == 0) == (split == "validation"))


def test_partition_sizes_as_equal_as_possible(tmp_path: Path) -> None:
    table = make_table(23)
    m = write_dataset(
        table, str(tmp_path / "d"), **{**KW, "num_partitions": 4}, validation_fraction=0.5
    )
    sizes = {s: [m.partition(s, i).rows for i in range(4)] for s in SPLITS}
    assert sizes == {"train": [3, 3, 3, 2], "validation": [3, 3, 3, 3]}


# -- existing targets and prepare_dataset -----------------------------------------------------


def test_write_refuses_to_replace_a_dataset_unless_asked(tmp_path: Path) -> None:
    table = make_table(60)
    uri = str(tmp_path / "d")
    write_dataset(table, uri, **KW)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_dataset(table, uri, **KW)
    smaller = write_dataset(table, uri, **{**KW, "num_partitions": 2}, overwrite=True)
    assert sorted(open_store(uri).list()) == sorted(
        [MANIFEST_NAME] + [p.path for p in smaller.partitions]
    )  # the old third partitions are gone
    assert read_manifest(uri) == smaller


def test_write_refuses_a_directory_with_other_files(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match=r"notes\.txt"):
        write_dataset(make_table(30), str(tmp_path), **KW, overwrite=True)
    assert (tmp_path / "notes.txt").read_text() == "keep me"


def test_prepare_reuses_a_complete_dataset(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    table = make_table(60)
    store = str(tmp_path / "store")
    caplog.set_level(logging.INFO, logger="cerebro_spark.data")
    first = prepare_dataset(table, store, **KW)
    directory = tmp_path / "store" / "datasets" / first.dataset_id
    stats = {
        p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in directory.rglob("*") if p.is_file()
    }
    assert len(stats) == 7
    assert "writing dataset" in caplog.text
    caplog.clear()

    second = prepare_dataset(table, open_store(store), **KW)
    assert second == first
    assert "reusing" in caplog.text and "writing dataset" not in caplog.text
    after = {
        p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in directory.rglob("*") if p.is_file()
    }
    assert after == stats  # nothing was rewritten (put replaces files: new inodes)


def test_prepare_completes_an_incomplete_dataset(tmp_path: Path) -> None:
    table = make_table(60)
    store = open_store(str(tmp_path / "store"))
    first = prepare_dataset(table, store, **KW)
    ds = store.child(f"datasets/{first.dataset_id}")
    expected = dataset_files(tmp_path / "store")

    ds.delete(MANIFEST_NAME)  # a writer died before the manifest
    ds.delete("validation/part-00002.parquet")
    assert prepare_dataset(table, store, **KW) == first
    assert dataset_files(tmp_path / "store") == expected

    ds.delete("train/part-00001.parquet")  # manifest present, a partition gone
    assert prepare_dataset(table, store, **KW) == first
    assert dataset_files(tmp_path / "store") == expected


def test_prepare_different_parameters_make_different_datasets(tmp_path: Path) -> None:
    table = make_table(60)
    store = open_store(str(tmp_path))
    a = prepare_dataset(table, store, **KW)
    b = prepare_dataset(table, store, **{**KW, "seed": 99})
    assert a.dataset_id != b.dataset_id
    assert sorted(os.listdir(tmp_path / "datasets")) == sorted([a.dataset_id, b.dataset_id])


def test_manifest_json_is_canonical(tmp_path: Path) -> None:
    m = write_dataset(make_table(30), str(tmp_path / "d"), **KW)
    text = (tmp_path / "d" / MANIFEST_NAME).read_text()
    assert text == m.to_json()
    raw = json.loads(text)
    assert raw["classes"] == [0, 1, 2]
    assert raw["content_hash"] == m.content_hash
