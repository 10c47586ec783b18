from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from cerebro_spark.data import SOURCES, load_source, read_partition, read_table, write_dataset
from cerebro_spark.errors import DataError


def test_digits() -> None:
    table, meta = load_source("sklearn:digits")
    assert table.num_rows == 1797
    assert table.schema.field("image").type == pa.list_(pa.float32(), 64)
    assert table.schema.field("label").type == pa.int64()
    images = np.stack(table.column("image").to_numpy(zero_copy_only=False))
    assert images.min() == 0.0 and images.max() == 1.0
    assert set(np.unique(images * 16)) <= set(range(17))  # pixel / 16
    assert sorted(set(table.column("label").to_pylist())) == list(range(10))
    assert meta == {
        "features": ["image"],
        "label": "label",
        "feature_shapes": {"image": (1, 8, 8)},
        "task": "classification",
        "source": "sklearn:digits",
    }


def test_digits_meta_is_write_dataset_kwargs(tmp_path: Path) -> None:
    table, meta = load_source("sklearn:digits")
    manifest = write_dataset(table, str(tmp_path / "d"), num_partitions=2, seed=0, **meta)
    assert manifest.info.feature_shape == (1, 8, 8)
    assert manifest.num_classes == 10
    assert manifest.rows("train") + manifest.rows("validation") == 1797
    assert read_partition(str(tmp_path / "d"), "validation", 1).features.shape[1:] == (1, 8, 8)


@pytest.mark.parametrize(
    ("name", "rows", "columns", "task"),
    [
        ("sklearn:iris", 150, 4, "classification"),
        ("sklearn:breast_cancer", 569, 30, "classification"),
        ("sklearn:wine", 178, 13, "classification"),
        ("sklearn:diabetes", 442, 10, "regression"),
    ],
)
def test_tabular_sources(name: str, rows: int, columns: int, task: str) -> None:
    table, meta = load_source(name)
    assert name in SOURCES
    assert table.num_rows == rows
    assert len(meta["features"]) == columns
    assert table.column_names == [*meta["features"], "label"]
    assert all(table.schema.field(f).type == pa.float32() for f in meta["features"])
    assert meta["task"] == task
    assert all(name.isidentifier() for name in meta["features"])


def test_unknown_source() -> None:
    with pytest.raises(DataError, match=r"unknown data source 'sklearn:mnist'; known sources: "):
        load_source("sklearn:mnist")


def small_table() -> pa.Table:
    return pa.table({"a": [1.5, 2.5, 3.5], "b": [1, 2, 3], "label": ["x", "y", "x"]})


def test_read_table_files(tmp_path: Path) -> None:
    table = small_table()
    pq.write_table(table, tmp_path / "t.parquet")
    pacsv.write_csv(table, tmp_path / "t.csv")
    rows = table.to_pylist()
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    for name in ["t.parquet", "t.csv", "t.jsonl"]:
        assert read_table(str(tmp_path / name)).to_pydict() == table.to_pydict(), name
    (tmp_path / "t.data").write_bytes((tmp_path / "t.csv").read_bytes())
    assert read_table(str(tmp_path / "t.data"), format="csv").num_rows == 3
    with pytest.raises(DataError, match=r"cannot tell the format of .*t\.data"):
        read_table(str(tmp_path / "t.data"))
    with pytest.raises(DataError, match=r"format must be 'parquet', 'csv' or 'json', got 'xls'"):
        read_table(str(tmp_path / "t.data"), format="xls")


def test_read_table_directory(tmp_path: Path) -> None:
    table = small_table()
    out = tmp_path / "dir"
    out.mkdir()
    pq.write_table(table.slice(0, 2), out / "part-0.parquet")
    pq.write_table(table.slice(2), out / "part-1.parquet")
    (out / "_SUCCESS").write_bytes(b"")
    read = read_table(str(out))
    assert sorted(read.column("b").to_pylist()) == [1, 2, 3]
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="holds no data files"):
        read_table(str(tmp_path / "empty"))


def test_read_table_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.parquet"):
        read_table(str(tmp_path / "nope.parquet"))
