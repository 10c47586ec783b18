"""Every rule of the writer and the reader, with the message it must give."""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from dataset_helpers import make_table, replace_partition

from cerebro_spark.data import (
    MANIFEST_NAME,
    Manifest,
    dataset_id_for,
    read_manifest,
    read_partition,
    write_dataset,
)
from cerebro_spark.errors import DataError

KW: dict[str, Any] = {"features": ["x", "vec"], "label": "y", "num_partitions": 2, "seed": 0}


def write_error(data: Any, tmp_path: Path, **overrides: Any) -> str:
    """Run the writer, expect a DataError, check nothing was written, return the message."""
    with pytest.raises(DataError) as info:
        write_dataset(data, str(tmp_path / "ds"), **{**KW, **overrides})
    assert not (tmp_path / "ds").exists()
    # dataset_id_for applies the same checks
    with pytest.raises(DataError):
        dataset_id_for(data, **{**KW, **overrides})
    return str(info.value)


# -- writer: parameters -----------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_num_partitions(tmp_path: Path, bad: Any) -> None:
    message = write_error(make_table(20), tmp_path, num_partitions=bad)
    assert "num_partitions must be an integer >= 1" in message
    assert repr(bad) in message or str(bad) in message


@pytest.mark.parametrize("bad", [0, 1, 0.0, 1.0, -0.1, 1.5, float("nan"), "0.2"])
def test_validation_fraction(tmp_path: Path, bad: Any) -> None:
    message = write_error(make_table(20), tmp_path, validation_fraction=bad)
    assert "validation_fraction must be" in message and "(0, 1)" in message
    assert repr(bad) in message


@pytest.mark.parametrize("bad", [-1, 1.5, None, True])
def test_seed(tmp_path: Path, bad: Any) -> None:
    assert "seed must be a non-negative integer" in write_error(make_table(20), tmp_path, seed=bad)


def test_task_value(tmp_path: Path) -> None:
    assert "'clustering'" in write_error(make_table(20), tmp_path, task="clustering")


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"features": []}, "at least one column"),
        ({"features": "x"}, "sequence of column names"),
        ({"features": ["x", "x"]}, "'x' is listed twice"),
        ({"features": ["x", "y"]}, "'y' cannot be both a feature and the label"),
        ({"validation_column": "x"}, "validation_column 'x' cannot also be a feature"),
        ({"feature_shapes": {"rowid": (1,)}}, "feature_shapes names 'rowid'"),
    ],
)
def test_roles(tmp_path: Path, overrides: dict[str, Any], expected: str) -> None:
    assert expected in write_error(make_table(20), tmp_path, **overrides)


def test_wrong_data_type(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"pyarrow\.Table or a pandas\.DataFrame, got dict"):
        write_dataset({"x": [1]}, str(tmp_path / "ds"), **KW)  # type: ignore[arg-type]


# -- writer: columns and values ---------------------------------------------------------------


def test_missing_columns_list_what_exists(tmp_path: Path) -> None:
    message = write_error(make_table(20), tmp_path, features=["x", "nope", "gone"])
    assert "columns 'nope', 'gone' not found" in message
    assert "the data has columns: rowid, x, vec, y, is_val, unused" in message
    frame = make_table(20).to_pandas()
    assert "column 'label' not found" in write_error(frame, tmp_path, label="label")


def test_non_numeric_feature_names_the_type(tmp_path: Path) -> None:
    dates = make_table(20).append_column(
        "day", pa.array([datetime.date(2026, 1, 1 + i) for i in range(20)])
    )
    message = write_error(dates, tmp_path, features=["x", "day"])
    assert "feature column 'day' has type date32[day]" in message
    lists_of_strings = make_table(20).append_column("tags", pa.array([["a", "b"]] * 20))
    assert "'tags' has type list<item: string>" in write_error(
        lists_of_strings, tmp_path, features=["tags"]
    )


def test_nulls_are_counted(tmp_path: Path) -> None:
    table = make_table(20)
    x = table.column("x").to_pylist()
    x[3] = x[5] = None
    message = write_error(table.set_column(1, "x", pa.array(x)), tmp_path)
    assert "feature column 'x' has 2 null values of 20 rows" in message

    frame = make_table(20).to_pandas()
    frame["y"] = frame["y"].astype("Int64")
    frame.loc[[1, 2, 3], "y"] = pd.NA
    assert "label column 'y' has 3 null values" in write_error(frame, tmp_path)

    vec = [list(v) for v in table.column("vec").to_pylist()]
    vec[0][2] = None
    with_null_element = table.set_column(2, "vec", pa.array(vec))
    assert "'vec' has 1 null array elements" in write_error(with_null_element, tmp_path)

    rows = [list(v) for v in table.column("vec").to_pylist()]
    rows[4] = None
    assert "'vec' has 1 null values" in write_error(
        table.set_column(2, "vec", pa.array(rows)), tmp_path
    )


def test_nan_and_inf_are_counted(tmp_path: Path) -> None:
    table = make_table(20)
    x = table.column("x").to_numpy().copy()
    x[[0, 1, 2]] = np.nan
    x[3] = np.inf
    message = write_error(table.set_column(1, "x", pa.array(x)), tmp_path)
    assert "feature column 'x' has 3 NaN and 1 infinite values" in message

    frame = table.to_pandas()  # pandas NaN stays NaN, it does not become a null
    frame["x"] = x
    assert "'x' has 3 NaN and 1 infinite" in write_error(frame, tmp_path)

    huge = table.set_column(1, "x", pa.array(np.full(20, 1e300)))  # overflows float32
    assert "'x' has 0 NaN and 20 infinite values" in write_error(huge, tmp_path)

    target = np.arange(20.0)
    target[7] = -np.inf
    regression = table.set_column(3, "y", pa.array(target))
    assert "label column 'y' has 0 NaN and 1 infinite values" in write_error(regression, tmp_path)
    target[7] = np.nan
    classification = table.set_column(3, "y", pa.array(target))
    assert "label column 'y' has 1 NaN and 0 infinite" in write_error(
        classification, tmp_path, task="classification"
    )


def test_ragged_arrays_name_the_lengths(tmp_path: Path) -> None:
    table = make_table(20)
    rows = [list(v) for v in table.column("vec").to_pylist()]
    rows[2] = rows[2][:4]
    rows[9] = [*rows[9], 1.0, 2.0]
    message = write_error(table.set_column(2, "vec", pa.array(rows)), tmp_path)
    assert "feature column 'vec' has arrays of different lengths: 4, 6, 8" in message

    frame = table.to_pandas()
    frame["vec"] = [np.zeros((2, 3))] * 19 + [np.zeros((3, 2))]
    assert "arrays of different shapes: (2, 3), (3, 2)" in write_error(frame, tmp_path)


def test_shape_hint_must_match(tmp_path: Path) -> None:
    message = write_error(make_table(20), tmp_path, feature_shapes={"vec": (4, 2)})
    assert "shape hint (4, 2) for feature column 'vec' has 8 values" in message
    assert "shape (6,)" in message
    assert "holds scalars" in write_error(make_table(20), tmp_path, feature_shapes={"x": (2,)})


def test_one_class(tmp_path: Path) -> None:
    table = make_table(20).set_column(3, "y", pa.array(np.full(20, 4)))
    message = write_error(table, tmp_path)
    assert "classification label 'y' has only one class (4)" in message


def test_label_types(tmp_path: Path) -> None:
    table = make_table(20)
    message = write_error(table, tmp_path, label="unused", task="regression")
    assert "label column 'unused' has type string; regression needs numbers" in message
    listy = table.append_column("l", pa.array([[1]] * 20))
    assert "label column 'l' has type list<item: int64>" in write_error(listy, tmp_path, label="l")


def test_validation_column_must_be_boolean(tmp_path: Path) -> None:
    message = write_error(make_table(20), tmp_path, validation_column="rowid")
    assert "validation_column 'rowid' has type int64; it must be boolean" in message


def test_too_few_rows(tmp_path: Path) -> None:
    message = write_error(make_table(7), tmp_path, num_partitions=4)
    assert "the data has 7 rows, fewer than 2 * num_partitions = 8" in message


def test_split_would_leave_a_partition_empty(tmp_path: Path) -> None:
    message = write_error(make_table(20), tmp_path, num_partitions=3, validation_fraction=0.1)
    assert "the validation split has 2 rows (20 rows, validation_fraction=0.1)" in message
    assert "a validation partition would be empty" in message

    table = make_table(20).set_column(4, "is_val", pa.array([True] * 19 + [False]))
    message = write_error(table, tmp_path, validation_column="is_val")
    assert "the train split has 1 rows (20 rows, by the validation column)" in message


def test_empty_table(tmp_path: Path) -> None:
    assert "the data has 0 rows" in write_error(make_table(20).slice(0, 0), tmp_path)


# -- reader -----------------------------------------------------------------------------------


@pytest.fixture
def dataset(tmp_path: Path) -> str:
    uri = str(tmp_path / "ready")
    write_dataset(make_table(40), uri, **KW)
    return uri


def read_error(uri: str, split: str = "train", index: int = 0, **kwargs: Any) -> str:
    with pytest.raises(DataError) as info:
        read_partition(uri, split, index, **kwargs)
    return str(info.value)


def test_manifest_missing(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"no manifest\.json at .*nothing.*not completely written"):
        read_manifest(str(tmp_path / "nothing"))


def test_manifest_corrupt(dataset: str) -> None:
    path = Path(dataset) / MANIFEST_NAME
    good = path.read_text()
    path.write_text(good[:50])
    with pytest.raises(DataError, match="is not valid JSON"):
        read_manifest(dataset)
    path.write_text("[1, 2]")
    with pytest.raises(DataError, match="holds a JSON list, not an object"):
        read_manifest(dataset)
    raw = json.loads(good)
    del raw["partitions"]
    path.write_text(json.dumps(raw))
    with pytest.raises(DataError, match="missing or malformed field 'partitions'"):
        read_manifest(dataset)


def test_manifest_wrong_format_version(dataset: str) -> None:
    path = Path(dataset) / MANIFEST_NAME
    raw = json.loads(path.read_text())
    raw["format_version"] = 99
    path.write_text(json.dumps(raw))
    with pytest.raises(DataError, match=r"format_version 99; .* reads format_version 1"):
        read_manifest(dataset)


def test_manifest_inconsistent(dataset: str) -> None:
    path = Path(dataset) / MANIFEST_NAME
    manifest = Manifest.from_json(path.read_text())
    path.write_text(dataclasses.replace(manifest, partitions=manifest.partitions[1:]).to_json())
    with pytest.raises(DataError, match=r"expected partitions 0\.\.1 of each of"):
        read_manifest(dataset)
    empty = dataclasses.replace(manifest.partitions[0], rows=0)
    path.write_text(
        dataclasses.replace(manifest, partitions=(empty, *manifest.partitions[1:])).to_json()
    )
    with pytest.raises(DataError, match="train partition 0 is empty"):
        read_manifest(dataset)
    path.write_text(dataclasses.replace(manifest, num_classes=1).to_json())
    with pytest.raises(DataError, match="num_classes=1"):
        read_manifest(dataset)


def test_bad_split_and_index(dataset: str) -> None:
    assert "split must be one of ('train', 'validation'), got 'test'" in read_error(dataset, "test")
    assert "partition index 2 is out of range" in read_error(dataset, "train", 2)
    assert "partitions 0..1" in read_error(dataset, "train", -1)


def test_partition_file_missing_resized_or_changed(dataset: str) -> None:
    path = Path(dataset) / "train" / "part-00001.parquet"
    data = path.read_bytes()
    path.unlink()
    assert re.search(
        r"train partition 1 file .*part-00001\.parquet is missing", read_error(dataset, index=1)
    )
    path.write_bytes(data + b"x")
    assert f"has {len(data) + 1} bytes, the manifest says {len(data)}" in read_error(
        dataset, index=1
    )
    changed = bytearray(data)
    changed[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(changed))
    assert "does not match its SHA-256" in read_error(dataset, index=1)


def test_partition_not_parquet(dataset: str) -> None:
    replace_partition(dataset, "train", 0, make_table(5))  # fix manifest bookkeeping first
    path = Path(dataset) / "train" / "part-00000.parquet"
    size = path.stat().st_size
    path.write_bytes(b"\0" * size)
    assert "is not valid Parquet" in read_error(dataset, verify=False)


def test_partition_missing_column(dataset: str) -> None:
    replace_partition(dataset, "train", 0, make_table(10).select(["x", "y"]))
    message = read_error(dataset)
    assert "column 'vec' not found; the data has columns: x, y" in message


def test_partition_rows_disagree(dataset: str) -> None:
    manifest = replace_partition(dataset, "validation", 1, make_table(10).select(["x", "vec", "y"]))
    path = Path(dataset) / MANIFEST_NAME
    parts = [
        dataclasses.replace(p, rows=11) if (p.split, p.index) == ("validation", 1) else p
        for p in manifest.partitions
    ]
    path.write_text(dataclasses.replace(manifest, partitions=tuple(parts)).to_json())
    assert "has 10 rows, the manifest says 11" in read_error(dataset, "validation", 1)


def test_partition_values(dataset: str) -> None:
    base = make_table(10).select(["x", "vec", "y"])
    x = base.column("x").to_numpy().copy()
    x[[1, 2]] = np.nan
    replace_partition(dataset, "train", 0, base.set_column(0, "x", pa.array(x, pa.float32())))
    assert "feature column 'x' has 2 NaN and 0 infinite values" in read_error(dataset)

    nulls = base.set_column(0, "x", pa.array([None, *x[1:].tolist()], pa.float32()))
    replace_partition(dataset, "train", 0, nulls)
    assert "feature column 'x' has 1 null values" in read_error(dataset)

    ragged = [list(v) for v in base.column("vec").to_pylist()]
    ragged[0] = ragged[0][:5]
    replace_partition(dataset, "train", 0, base.set_column(1, "vec", pa.array(ragged)))
    assert "'vec' has arrays of different lengths: 5, 6" in read_error(dataset)

    short = pa.array([list(v)[:5] for v in base.column("vec").to_pylist()])
    replace_partition(dataset, "train", 0, base.set_column(1, "vec", short))
    assert "'vec' has 5 values per row (shape (5,)), but the manifest says shape (6,)" in (
        read_error(dataset)
    )

    out_of_range = base.set_column(2, "y", pa.array([0, 1, 2, 3, 7, 0, 1, 2, -1, 0]))
    replace_partition(dataset, "train", 0, out_of_range)
    assert "label column 'y' has 3 values outside 0..2" in read_error(dataset)

    floats = base.set_column(2, "y", pa.array(np.zeros(10)))
    replace_partition(dataset, "train", 0, floats)
    assert "label column 'y' has type double; a classification dataset stores integer" in (
        read_error(dataset)
    )

    text = base.set_column(0, "x", pa.array(["a"] * 10))
    replace_partition(dataset, "train", 0, text)
    assert "feature column 'x' has type string" in read_error(dataset)


def test_reader_accepts_spark_style_variable_lists(dataset: str) -> None:
    base = make_table(10).select(["x", "vec", "y"])
    as_list = base.set_column(
        1, "vec", pa.array(base.column("vec").to_pylist(), pa.list_(pa.float64()))
    )
    replace_partition(dataset, "train", 0, as_list)
    part = read_partition(dataset, "train", 0)
    assert part.features.shape == (10, 7)
    np.testing.assert_allclose(
        part.features[:, 1:], np.stack(base.column("vec").to_pylist()), rtol=1e-6
    )
