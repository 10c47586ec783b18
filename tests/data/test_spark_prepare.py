"""The Spark prepare path against the plain-Python writer, on real local Spark.

Every happy-path test prepares the same rows with both writers and compares the dataset id
and the SHA-256 of every file (manifest included). ``jobs/prepare.py`` runs under
``spark-submit`` in the background while the other tests run (it starts its own JVM).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import logging
import os
import re
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from dataset_helpers import make_table

from cerebro_spark.data import (
    dataset_id_for,
    load_source,
    prepare_dataset,
    prepare_with_spark,
    read_manifest,
    read_partition,
    read_table,
)
from cerebro_spark.data._prepare_cli import add_prepare_arguments, run_prepare
from cerebro_spark.errors import ConfigError, DataError, StoreError
from cerebro_spark.store import open_store

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parents[2]
KW: dict[str, Any] = {"features": ["x", "vec"], "label": "y", "num_partitions": 3, "seed": 7}
DIGITS_ARGS = ["--features", "image", "--label", "label", "--feature-shape", "image=1,8,8"]


# -- helpers ----------------------------------------------------------------------------------


def sha_tree(root: Path) -> dict[str, str]:
    """SHA-256 of every file below ``root``, by relative path."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def mtimes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def leftovers(root: Path) -> list[str]:
    """Paths below ``root`` of the temporary files and directories of a prepare."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".prepare-" in str(p))


def read_all(uri: str) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """Features (flattened per row) and labels of every partition, and rows per split."""
    manifest = read_manifest(uri)
    features, labels, rows = [], [], {"train": 0, "validation": 0}
    for part in manifest.partitions:
        data = read_partition(uri, part.split, part.index, manifest=manifest)
        features.append(data.features.reshape(data.rows, -1))
        labels.append(data.labels)
        rows[part.split] += data.rows
    return np.concatenate(features), np.concatenate(labels), rows


def as_multiset(features: np.ndarray, labels: np.ndarray) -> list[tuple[bytes, float]]:
    return sorted(
        (row.tobytes(), float(label)) for row, label in zip(features, labels, strict=True)
    )


def input_features(table: pa.Table, features: list[str]) -> np.ndarray:
    """The features the writers should store for ``table``: float32, one flat row per row."""
    blocks = []
    for name in features:
        column = table.column(name).combine_chunks()
        if pa.types.is_list(column.type) or pa.types.is_fixed_size_list(column.type):
            column = column.flatten()
        blocks.append(np.asarray(column, dtype=np.float32).reshape(table.num_rows, -1))
    return np.concatenate(blocks, axis=1)


def spark_frame(spark: Any, table: pa.Table) -> Any:
    """A DataFrame with the table's rows in order (fixed-size lists become arrays)."""
    columns = [
        c.cast(pa.list_(c.type.value_type)) if pa.types.is_fixed_size_list(c.type) else c
        for c in table.columns
    ]
    return spark.createDataFrame(pa.table(columns, names=table.column_names))


def digits_table() -> pa.Table:
    table, _ = load_source("sklearn:digits")
    return table


def cli(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_prepare_arguments(parser)
    return parser.parse_args(argv)


# -- spark-submit, started first and checked last ---------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def spark_submit_job(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """Start ``spark-submit jobs/prepare.py`` in the background if its test is selected."""
    wanted = any(item.name == "test_spark_submit_job" for item in request.session.items)
    if not wanted:
        yield {}
        return
    work = tmp_path_factory.mktemp("spark_submit")
    data = work / "digits.parquet"
    pq.write_table(digits_table(), data)
    env = dict(os.environ)
    env.update(
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
    )
    command = [
        str(REPO / ".venv" / "bin" / "spark-submit"),
        "--master",
        "local[2]",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.sql.shuffle.partitions=4",
        str(REPO / "jobs" / "prepare.py"),
        "--input",
        str(data),
        *DIGITS_ARGS,
        "--partitions",
        "4",
        "--seed",
        "0",
        "--store",
        str(work / "store"),
    ]
    with (work / "stdout.log").open("w") as out, (work / "stderr.log").open("w") as err:
        process = subprocess.Popen(command, cwd=work, env=env, stdout=out, stderr=err)
        try:
            yield {"process": process, "work": work, "data": data}
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


# -- happy paths ------------------------------------------------------------------------------


def test_parquet_path_equals_plain_writer_is_deterministic_and_reused(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    table = make_table(200)
    data = tmp_path / "in"
    data.mkdir()
    # Sizes chosen so that Spark's split order (largest first) differs from path order.
    start = 0
    for index, count in enumerate((30, 120, 50)):
        pq.write_table(table.slice(start, count), data / f"part-{index}.parquet", row_group_size=16)
        start += count
    plain = prepare_dataset(read_table(str(data)), str(tmp_path / "py"), source=str(data), **KW)

    manifest = prepare_with_spark(str(data), str(tmp_path / "sp"), spark=spark, **KW)
    assert manifest.dataset_id == plain.dataset_id
    assert sha_tree(tmp_path / "sp") == sha_tree(tmp_path / "py")  # manifest included
    assert leftovers(tmp_path / "sp") == []

    before = mtimes(tmp_path / "sp")
    again = prepare_with_spark(str(data), str(tmp_path / "sp"), spark=spark, **KW)
    assert again == manifest
    assert mtimes(tmp_path / "sp") == before  # reused, not rewritten

    # A rerun elsewhere, with the largest file cut into several Spark splits: same bytes.
    largest = max(path.stat().st_size for path in data.iterdir())
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(largest // 3))
    spark.conf.set("spark.sql.files.openCostInBytes", "0")
    caplog.clear()
    try:
        with caplog.at_level(logging.INFO, logger="cerebro_spark.data._spark_prepare"):
            rerun = prepare_with_spark(str(data), str(tmp_path / "sp2"), spark=spark, **KW)
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
        spark.conf.unset("spark.sql.files.openCostInBytes")
    assert rerun.dataset_id == plain.dataset_id
    chunks = re.search(r"staged 200 rows in (\d+) chunks", caplog.text)
    assert chunks is not None and int(chunks.group(1)) > 3  # more splits than files
    assert sha_tree(tmp_path / "sp2") == sha_tree(tmp_path / "py")

    uri = str(tmp_path / "sp" / "datasets" / manifest.dataset_id)
    features, labels, rows = read_all(uri)
    assert rows == {"train": 160, "validation": 40}
    assert as_multiset(features, labels) == as_multiset(
        input_features(table, ["x", "vec"]), table.column("y").to_numpy()
    )


def test_csv_with_validation_column_through_the_cli(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(3)
    rows = 90
    table = pa.table(
        {
            "rowid": pa.array(np.arange(rows, dtype=np.int64)),
            "x": pa.array(np.round(rng.normal(size=rows), 6)),
            "z": pa.array(np.round(rng.normal(size=rows), 6)),
            "y": pa.array(np.arange(rows, dtype=np.int64) % 2),
            "is_val": pa.array(np.arange(rows) % 3 == 0),
        }
    )
    path = tmp_path / "data.csv"
    pacsv.write_csv(table, path)
    common = ["--input", str(path), "--label", "y", "--validation-column", "is_val"]
    common += ["--partitions", "2", "--seed", "5"]
    assert run_prepare(cli([*common, "--engine", "python", "--store", str(tmp_path / "py")])) == 0
    plain_line = capsys.readouterr().out
    spark_args = [*common, "--engine", "spark", "--master", "local[2]"]
    assert run_prepare(cli([*spark_args, "--store", str(tmp_path / "sp")])) == 0
    spark_line = capsys.readouterr().out
    assert plain_line.split(" at ")[0] == spark_line.split(" at ")[0]
    assert "60 train rows, 30 validation rows, 2 partitions" in spark_line
    assert sha_tree(tmp_path / "sp") == sha_tree(tmp_path / "py")

    dataset_id = spark_line.split()[1].rstrip(":")
    manifest = read_manifest(str(tmp_path / "sp" / "datasets" / dataset_id))
    assert [c.name for c in manifest.features] == ["rowid", "x", "z"]  # all but label and flag
    uri = str(tmp_path / "sp" / "datasets" / dataset_id)
    validation = [read_partition(uri, "validation", i).features[:, 0] for i in range(2)]
    assert sorted(np.concatenate(validation).astype(int)) == list(range(0, rows, 3))


def test_json_lines_with_arrays_and_string_labels(spark: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    path = tmp_path / "data.jsonl"
    names = ["emu", "cat", "dog"]
    with path.open("w") as out:
        for i in range(60):
            row = {
                "arr": rng.normal(size=3).round(4).tolist(),
                "k": i,
                "mat": rng.normal(size=(2, 2)).round(4).tolist(),
                "label": names[i % 3],
            }
            out.write(json.dumps(row) + "\n")
    kwargs: dict[str, Any] = {
        "features": ["arr", "k", "mat"],
        "label": "label",
        "num_partitions": 2,
    }
    plain = prepare_dataset(read_table(str(path)), str(tmp_path / "py"), seed=1, **kwargs)
    manifest = prepare_with_spark(
        str(path), str(tmp_path / "sp"), seed=1, source="", spark=spark, **kwargs
    )
    assert manifest.dataset_id == plain.dataset_id
    assert manifest.classes == ("cat", "dog", "emu")
    assert manifest.features[2].shape == (2, 2)
    assert manifest.feature_shape == (3 + 1 + 4,)
    assert sha_tree(tmp_path / "sp") == sha_tree(tmp_path / "py")


def test_registered_table(spark: Any, tmp_path: Path) -> None:
    # A database of its own under tmp_path; the catalog still makes the (empty) default
    # warehouse directory, which is removed again if this test made it.
    warehouse = Path(urllib.parse.urlsplit(spark.conf.get("spark.sql.warehouse.dir")).path)
    had_warehouse = warehouse.exists()
    spark.sql(f"CREATE DATABASE cerebro_prepare_db LOCATION '{tmp_path / 'db'}'")
    try:
        spark_frame(spark, make_table(80)).repartition(3).write.saveAsTable(
            "cerebro_prepare_db.rows"
        )
        location = tmp_path / "db" / "rows"
        plain = prepare_dataset(read_table(str(location)), str(tmp_path / "py"), **KW)
        manifest = prepare_with_spark(
            "cerebro_prepare_db.rows", str(tmp_path / "sp"), source="", spark=spark, **KW
        )
    finally:
        spark.sql("DROP DATABASE IF EXISTS cerebro_prepare_db CASCADE")
        if not had_warehouse and warehouse.is_dir() and not any(warehouse.iterdir()):
            warehouse.rmdir()
    assert manifest.dataset_id == plain.dataset_id
    assert sha_tree(tmp_path / "sp") == sha_tree(tmp_path / "py")


def test_dataframe_with_ml_vectors(spark: Any, tmp_path: Path) -> None:
    from pyspark.ml.linalg import Vectors

    table = make_table(50)
    vectors = np.array(table.column("vec").combine_chunks().flatten()).reshape(50, 6)
    labels = table.column("y").to_pylist()
    rows = [
        (Vectors.sparse(6, {0: float(v[0])}) if i == 0 else Vectors.dense(v.tolist()), labels[i])
        for i, v in enumerate(vectors.astype(np.float64))
    ]
    vectors[0, 1:] = 0.0  # the sparse row, densified
    frame = spark.createDataFrame(rows, ["features", "label"])
    pandas_frame = pd.DataFrame({"features": list(vectors.astype(np.float64)), "label": labels})
    kwargs: dict[str, Any] = {"features": ["features"], "label": "label", "num_partitions": 2}
    plain = prepare_dataset(pandas_frame, str(tmp_path / "py"), seed=3, **kwargs)
    manifest = prepare_with_spark(frame, str(tmp_path / "sp"), seed=3, source="", **kwargs)
    assert manifest.dataset_id == plain.dataset_id
    assert manifest.feature_shape == (6,)
    assert sha_tree(tmp_path / "sp") == sha_tree(tmp_path / "py")


def test_digits_array_column_with_feature_shape(spark: Any, tmp_path: Path) -> None:
    table = digits_table()
    kwargs: dict[str, Any] = {
        "features": ["image"],
        "label": "label",
        "feature_shapes": {"image": (1, 8, 8)},
        "num_partitions": 4,
        "seed": 0,
        "source": "digits",
    }
    plain = prepare_dataset(table, str(tmp_path / "py"), **kwargs)
    manifest = prepare_with_spark(
        spark_frame(spark, table), str(tmp_path / "sp"), spark=spark, **kwargs
    )
    assert manifest.dataset_id == plain.dataset_id
    assert manifest.feature_shape == (1, 8, 8)
    assert sha_tree(tmp_path / "sp") == sha_tree(tmp_path / "py")
    uri = str(tmp_path / "sp" / "datasets" / manifest.dataset_id)
    part = read_partition(uri, "train", 0)
    assert part.features.shape[1:] == (1, 8, 8)
    features, labels, rows = read_all(uri)
    assert sum(rows.values()) == table.num_rows
    assert as_multiset(features, labels) == as_multiset(
        input_features(table, ["image"]), table.column("label").to_numpy()
    )


def test_row_order_and_partitioning_do_not_matter(spark: Any, tmp_path: Path) -> None:
    table = make_table(60)
    shuffled = table.take(pa.array(np.random.default_rng(0).permutation(60)))
    first = prepare_with_spark(
        spark_frame(spark, table).repartition(3), str(tmp_path / "a"), order="sorted", **KW
    )
    second = prepare_with_spark(spark_frame(spark, shuffled).coalesce(1), str(tmp_path / "b"), **KW)
    assert first.dataset_id == second.dataset_id
    assert sha_tree(tmp_path / "a") == sha_tree(tmp_path / "b")
    assert first.dataset_id == dataset_id_for(shuffled, **KW) == dataset_id_for(table, **KW)
    prepare_dataset(shuffled, str(tmp_path / "py"), source="spark DataFrame", **KW)
    assert sha_tree(tmp_path / "py") == sha_tree(tmp_path / "a")


def test_s3_end_to_end(spark: Any, s3_server: Any) -> None:
    table = make_table(120)
    root = s3_server.uri("runs")
    plain = prepare_dataset(table, s3_server.uri("plain"), **KW)
    manifest = prepare_with_spark(spark_frame(spark, table), root, spark=spark, **KW)
    assert manifest.dataset_id == plain.dataset_id
    assert [p.sha256 for p in manifest.partitions] == [p.sha256 for p in plain.partitions]
    uri = open_store(root).child(f"datasets/{manifest.dataset_id}").uri
    features, labels, rows = read_all(uri)
    assert rows == {"train": 96, "validation": 24}
    assert as_multiset(features, labels) == as_multiset(
        input_features(table, ["x", "vec"]), table.column("y").to_numpy()
    )
    client = s3_server.client()

    def objects() -> dict[str, Any]:
        listing = client.list_objects_v2(Bucket=s3_server.bucket, Prefix="runs/")
        return {  # pyarrow leaves empty "directory/" markers when it deletes: not objects
            o["Key"]: (o["ETag"], o["LastModified"])
            for o in listing["Contents"]
            if not o["Key"].endswith("/")
        }

    before = objects()
    assert not [key for key in before if ".prepare-" in key]
    assert len(before) == 2 * 3 + 1
    assert prepare_with_spark(spark_frame(spark, table), root, spark=spark, **KW) == manifest
    assert objects() == before


# -- bad input --------------------------------------------------------------------------------

ROWS = 12


@pytest.fixture(scope="module")
def bad_table() -> pa.Table:
    x = np.arange(ROWS, dtype=np.float64)
    with_nan = x.copy()
    with_nan[[1, 4]] = np.nan
    with_nan[5] = np.inf
    with_nan[6] = 1e39  # finite as float64, infinite as float32
    return pa.table(
        {
            "x": pa.array(x),
            "s": pa.array([f"v{i}" for i in range(ROWS)]),
            "d": pa.array(np.arange(ROWS).astype("datetime64[D]")),
            "s_null": pa.array([None if i in (3, 8) else f"v{i % 3}" for i in range(ROWS)]),
            "x_null": pa.array([None if i in (2, 3, 7) else 1.0 for i in range(ROWS)]),
            "el_null": pa.array([[1.0, None] if i == 0 else [1.0, 2.0] for i in range(ROWS)]),
            "x_bad": pa.array(with_nan),
            "ragged": pa.array([[1.0, 2.0, 3.0] if i % 4 else [1.0, 2.0] for i in range(ROWS)]),
            "empty": pa.array([[] for _ in range(ROWS)], pa.list_(pa.float64())),
            "ragged2": pa.array(
                [[[1.0, 2.0], [3.0] if i == 5 else [3.0, 4.0]] for i in range(ROWS)]
            ),
            "y": pa.array(np.arange(ROWS) % 2),
            "one": pa.array(np.ones(ROWS, dtype=np.int64)),
            "y_null": pa.array([None if i == 0 else i % 2 for i in range(ROWS)], pa.int64()),
            "few_val": pa.array([i == 0 for i in range(ROWS)]),
        }
    )


@pytest.fixture(scope="module")
def bad_frame(spark: Any, bad_table: pa.Table) -> Any:
    return spark_frame(spark, bad_table).cache()


BAD_CASES = [
    ({"features": ["x", "nope"]}, "column 'nope' not found; the data has columns: x, s,"),
    ({"features": ["d"]}, "feature column 'd' has type date32[day]; features must be numbers"),
    ({"features": ["s_null"]}, "categorical column 's_null' has 2 null values of 12 rows"),
    (
        {"features": ["s"], "feature_shapes": {"s": (1,)}},
        "feature_shapes gives a shape for categorical column 's'",
    ),
    ({"features": ["x_null"]}, "feature column 'x_null' has 3 null values of 12 rows"),
    ({"features": ["el_null"]}, "has 1 null array elements (at nesting depth 1)"),
    ({"features": ["x_bad"]}, "feature column 'x_bad' has 2 NaN and 2 infinite values (of 12"),
    ({"features": ["ragged"]}, "has arrays of different lengths: 2, 3; every row"),
    ({"features": ["empty"]}, "feature column 'empty' holds empty arrays"),
    ({"features": ["ragged2"]}, "has arrays of different lengths at nesting depth 1: 1, 2;"),
    ({"label": "one"}, "classification label 'one' has only one class (1)"),
    ({"label": "y_null"}, "label column 'y_null' has 1 null values of 12 rows"),
    ({"num_partitions": 7}, "the data has 12 rows, fewer than 2 * num_partitions = 14"),
    (
        {"validation_column": "x_null"},
        "validation_column 'x_null' has type double; it must be boolean",
    ),
    (
        {"validation_column": "few_val", "num_partitions": 2},
        "the validation split has 1 rows (12 rows, by the validation column), fewer than",
    ),
]


@pytest.mark.parametrize(("change", "message"), BAD_CASES, ids=[m[:30] for _, m in BAD_CASES])
def test_bad_input_is_refused_with_the_plain_writers_message(
    bad_table: pa.Table, bad_frame: Any, tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    kwargs: dict[str, Any] = {"features": ["x"], "label": "y", "num_partitions": 2, "seed": 0}
    kwargs.update(change)
    with pytest.raises(DataError) as plain:
        dataset_id_for(bad_table, **kwargs)
    with pytest.raises(DataError) as spark_error:
        prepare_with_spark(bad_frame, str(tmp_path / "store"), **kwargs)
    assert message in str(spark_error.value)
    assert str(spark_error.value) == str(plain.value)
    assert not (tmp_path / "store" / "datasets").exists()  # refused before writing


def test_delta_without_delta_spark_is_a_clear_error(spark: Any, tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    if __import__("importlib").util.find_spec("delta") is not None:
        pytest.skip("delta-spark is installed")
    (tmp_path / "t" / "_delta_log").mkdir(parents=True)
    for fmt in ("delta", None):
        with pytest.raises(ConfigError, match="needs the delta-spark package"):
            prepare_with_spark(str(tmp_path / "t"), str(tmp_path / "s"), format=fmt, **KW)


def test_missing_input_and_bad_arguments(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no file or directory at"):
        prepare_with_spark(str(tmp_path / "nothing.parquet"), str(tmp_path / "s"), **KW)
    with pytest.raises(ConfigError, match="cannot tell the format"):
        (tmp_path / "data.txt").write_text("x\n")
        prepare_with_spark(str(tmp_path / "data.txt"), str(tmp_path / "s"), **KW)
    with pytest.raises(ConfigError, match="order must be"):
        prepare_with_spark(str(tmp_path), str(tmp_path / "s"), order="random", **KW)  # type: ignore[arg-type]
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        cli(["--input", "x", "--feature-shape", "image=1,0"])
    assert cli(["--table", "t", "--feature-shape", "image=1,8,8"]).feature_shape == [
        ("image", (1, 8, 8))
    ]


# -- failures leave nothing visible -----------------------------------------------------------


def test_failing_task_write_leaves_nothing(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "datasets").write_text("not a directory")  # every task write fails
    with pytest.raises(StoreError, match="failed in Spark"):
        prepare_with_spark(spark_frame(spark, make_table(40)), str(tmp_path), **KW)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["datasets"]


def test_failing_commit_leaves_nothing(spark: Any, tmp_path: Path) -> None:
    table = make_table(40)
    dataset_id = dataset_id_for(table, **KW)
    (tmp_path / "datasets").mkdir()
    (tmp_path / "datasets" / dataset_id).write_text("in the way")
    with pytest.raises(StoreError, match=f"committing dataset {dataset_id}"):
        prepare_with_spark(spark_frame(spark, table), str(tmp_path), **KW)
    assert [p.name for p in (tmp_path / "datasets").iterdir()] == [dataset_id]
    assert leftovers(tmp_path) == []


def test_failing_s3_write_leaves_nothing(spark: Any, s3_server: Any) -> None:
    missing = s3_server.uri("runs").replace(s3_server.bucket, s3_server.bucket + "-missing")
    with pytest.raises(StoreError, match="failed in Spark"):
        prepare_with_spark(spark_frame(spark, make_table(40)), missing, **KW)
    assert "Contents" not in s3_server.client().list_objects_v2(Bucket=s3_server.bucket)


# -- packaging --------------------------------------------------------------------------------


def test_data_package_imports_without_pyspark() -> None:
    code = (
        "import sys, cerebro_spark.data as d; d.prepare_with_spark; print('pyspark' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"


def test_spark_submit_job(spark_submit_job: dict[str, Any]) -> None:
    process = spark_submit_job["process"]
    try:
        process.wait(timeout=540)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail("spark-submit jobs/prepare.py did not finish in 9 minutes")
    work = spark_submit_job["work"]
    out = (work / "stdout.log").read_text()
    assert process.returncode == 0, (work / "stderr.log").read_text()[-3000:] + out[-3000:]
    expected = dataset_id_for(
        digits_table(),
        features=["image"],
        label="label",
        feature_shapes={"image": (1, 8, 8)},
        num_partitions=4,
        seed=0,
    )
    # spark-submit merges the Python driver's stderr (the logging) into its stdout.
    lines = [line for line in out.splitlines() if line.startswith("dataset ")]
    assert lines, out[-3000:]
    assert lines[0].startswith(f"dataset {expected}: 1438 train rows, 359 validation rows")
    manifest = read_manifest(str(work / "store" / "datasets" / expected))
    assert manifest.feature_shape == (1, 8, 8)
    assert manifest.source == str(spark_submit_job["data"])


# -- feature kinds ----------------------------------------------------------------------------


def encoded_image(rng: np.random.Generator, size: tuple[int, int], mode: str, fmt: str) -> bytes:
    """A real PNG or JPEG (PIL) of ``size`` (height, width) in ``mode`` ``L`` or ``RGB``."""
    from PIL import Image

    shape = size if mode == "L" else (*size, 3)
    image = Image.fromarray(rng.integers(0, 256, size=shape, dtype=np.uint8), mode=mode)
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def kinds_table(rows: int) -> pa.Table:
    """Images (PNG and JPEG, two sizes, gray and RGB), categories, sequences, uint8 arrays."""
    rng = np.random.default_rng(11)
    images = [
        encoded_image(
            rng,
            (8, 8) if i % 3 else (10, 12),
            "L" if i % 2 else "RGB",
            "PNG" if i % 4 else "JPEG",
        )
        for i in range(rows)
    ]
    words = ["a", "b", "b", "c", "c", "c", "d", "é", "ü", "zz"]
    return pa.table(
        {
            "img": pa.array(images, pa.binary()),
            "word": pa.array([words[int(k)] for k in rng.integers(0, 10, rows)]),
            "code": pa.array(rng.integers(100, 106, rows), pa.int64()),
            "seq": pa.array(
                [rng.integers(0, 50, int(rng.integers(0, 7))).tolist() for _ in range(rows)],
                pa.list_(pa.int64()),
            ),
            "u8": pa.array(
                [rng.integers(0, 256, 3).tolist() for _ in range(rows)], pa.list_(pa.uint8())
            ),
            "x": pa.array(rng.normal(size=rows)),
            "y": pa.array(np.arange(rows) % 2),
        }
    )


KINDS_KW: dict[str, Any] = {
    "features": ["img", "word", "code", "seq", "u8", "x"],
    "label": "y",
    "num_partitions": 2,
    "seed": 3,
}


def test_feature_kinds_equal_the_plain_writer(spark: Any, tmp_path: Path) -> None:
    from cerebro_spark.data import KindOptions

    table = kinds_table(48)
    data = tmp_path / "in"
    data.mkdir()
    for index, (start, rows) in enumerate(((0, 20), (20, 28))):
        pq.write_table(table.slice(start, rows), data / f"part-{index}.parquet")
    kinds = KindOptions(
        categorical=("code",),
        image_size=(8, 8),
        vocabulary_limit=3,
        hash_buckets=4,
        max_length=4,
    )
    plain = prepare_dataset(
        read_table(str(data)), str(tmp_path / "py"), source=str(data), kinds=kinds, **KINDS_KW
    )
    # The Spark side through the CLI: its kind flags reach prepare_with_spark.
    argv = ["--input", str(data), "--features", ",".join(KINDS_KW["features"]), "--label", "y"]
    argv += ["--partitions", "2", "--seed", "3", "--categorical", "code", "--image-size", "8"]
    argv += ["8", "--vocabulary-limit", "3", "--hash-buckets", "4", "--max-length", "4"]
    argv += ["--engine", "spark", "--master", "local[2]", "--store", str(tmp_path / "sp")]
    assert run_prepare(cli(argv)) == 0
    manifest = read_manifest(str(tmp_path / "sp" / "datasets" / plain.dataset_id))
    assert manifest.dataset_id == plain.dataset_id
    assert manifest.to_json() == plain.to_json()
    assert sha_tree(tmp_path / "sp") == sha_tree(tmp_path / "py")
    by_name = {info.name: info for info in manifest.features}
    assert [by_name[n].feature_kind for n in KINDS_KW["features"]] == [
        "image",
        "categorical",
        "categorical",
        "sequence",
        "array",
        "number",
    ]
    assert by_name["img"].shape == (3, 8, 8) and by_name["img"].encoding == "mixed"
    assert by_name["img"].statistics is not None
    assert by_name["word"].hash_buckets == 4 and len(by_name["word"].vocabulary or ()) == 3
    assert by_name["u8"].dtype == "uint8" and by_name["x"].dtype == "float32"
    assert by_name["seq"].max_length == 4 and by_name["seq"].statistics is not None


def test_image_size_mismatch_and_binary_that_is_not_images(spark: Any, tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    rows = 40
    # Row 13 changes the size inside a Spark partition (not at its start), rows 30- too.
    sizes = [(10, 10) if i == 13 or i >= 30 else (8, 8) for i in range(rows)]
    table = pa.table(
        {
            "img": pa.array([encoded_image(rng, s, "L", "PNG") for s in sizes], pa.binary()),
            "blob": pa.array([b"not an image %d" % i for i in range(rows)], pa.binary()),
            "y": pa.array(np.arange(rows) % 2),
        }
    )
    frame = spark.createDataFrame(table).repartition(1).cache()
    spread = spark.createDataFrame(table)  # partitions in row order
    assert spread.rdd.getNumPartitions() > 1
    for features, source, message in (
        (["img"], spread, "'img' holds images of different sizes (height x width): 8x8 first"),
        (["blob"], frame, "feature column 'blob' has type binary but its values are not JPEG"),
    ):
        kwargs: dict[str, Any] = {"features": features, "label": "y", "num_partitions": 2}
        with pytest.raises(DataError) as plain:
            dataset_id_for(table, seed=0, **kwargs)
        with pytest.raises(DataError) as spark_error:
            prepare_with_spark(source, str(tmp_path / "store"), seed=0, **kwargs)
        assert message in str(spark_error.value)
        assert str(spark_error.value) == str(plain.value)
        assert not (tmp_path / "store" / "datasets").exists() or not any(
            (tmp_path / "store" / "datasets").iterdir()
        )
    frame.unpersist()
