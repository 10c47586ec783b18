"""Real ``VectorAssembler`` output (local Spark): one dataset whichever way it is prepared.

Spark's Parquet (``VectorUDT`` to Spark, a struct to pyarrow) as a config ``source``
(plain Python), through ``prepare_with_spark`` and ``prepare --engine spark --name``;
Spark's JSON (a struct to Spark too) and the DataFrame itself: the same rows give the
same dataset id everywhere.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cerebro_spark.data import prepare_with_spark, read_partition
from cerebro_spark.data._names import read_dataset_name
from cerebro_spark.data._prepare_cli import add_prepare_arguments, run_prepare
from cerebro_spark.driver._dataset import resolve_dataset
from cerebro_spark.engine import parse_config
from cerebro_spark.store import open_store

pytestmark = pytest.mark.spark

KW: dict[str, Any] = {"features": ["features"], "label": "label", "num_partitions": 2, "seed": 5}


@pytest.fixture(scope="module")
def assembled(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """VectorAssembler output (dense and sparse rows) written as Parquet and as JSON."""
    from pyspark.ml.feature import VectorAssembler
    from pyspark.ml.linalg import SparseVector

    rng = np.random.default_rng(3)
    matrix = np.where(rng.random((300, 6)) < 0.7, 0.0, rng.standard_normal((300, 6)))
    labels = (matrix.sum(axis=1) > 0).astype(int)
    rows = [(*map(float, row), int(y)) for row, y in zip(matrix, labels, strict=True)]
    frame = spark.createDataFrame(rows, [*"abcdef", "label"]).repartition(3)
    vectors = VectorAssembler(inputCols=list("abcdef"), outputCol="features").transform(frame)
    vectors = vectors.select("features", "label")
    kinds = {type(row["features"]).__name__ for row in vectors.collect()}
    assert kinds == {"DenseVector", "SparseVector"}, kinds
    tmp = tmp_path_factory.mktemp("assembled")
    vectors.write.parquet(str(tmp / "va.parquet"))
    vectors.write.json(str(tmp / "va.json"))
    written = spark.read.parquet(str(tmp / "va.parquet"))
    assert type(written.schema["features"].dataType).__name__ == "VectorUDT"
    as_json = spark.read.json(str(tmp / "va.json"))
    assert as_json.schema["features"].dataType.typeName() == "struct"
    expected = {
        (tuple(np.asarray(row["features"].toArray(), np.float32).tolist()), row["label"])
        for row in written.collect()
    }
    assert any(isinstance(row["features"], SparseVector) for row in written.collect())
    return {"tmp": tmp, "frame": vectors, "expected": expected}


def rows_of(uri: str) -> set[tuple[tuple[float, ...], int]]:
    found = set()
    for split in ("train", "validation"):
        for index in range(2):
            part = read_partition(uri, split, index)
            for features, label in zip(part.features.tolist(), part.labels.tolist(), strict=True):
                found.add((tuple(features), int(label)))
    return found


def test_one_dataset_from_every_form(spark: Any, assembled: dict[str, Any]) -> None:
    tmp: Path = assembled["tmp"]
    store = str(tmp / "runs")
    config = parse_config(
        {
            "name": "va",
            "store": store,
            "data": {"source": str(tmp / "va.parquet"), "partitions": 2, "seed": 5},
            "space": {},
        }
    )
    uri, plain = resolve_dataset(config, open_store(store))  # plain Python, no Spark
    assert [(c.name, c.shape) for c in plain.features] == [("features", (6,))]
    assert rows_of(uri) == assembled["expected"]

    parquet = prepare_with_spark(str(tmp / "va.parquet"), store, spark=spark, **KW)
    assert parquet.dataset_id == plain.dataset_id  # Spark and Python agree, bit for bit

    as_json = prepare_with_spark(str(tmp / "va.json"), store, spark=spark, **KW)
    json_uri = open_store(store).url(f"datasets/{as_json.dataset_id}")
    assert rows_of(json_uri) == assembled["expected"]  # struct vectors decoded in Spark

    direct = prepare_with_spark(assembled["frame"], store, spark=spark, order="sorted", **KW)
    assert rows_of(open_store(store).url(f"datasets/{direct.dataset_id}")) == rows_of(uri)


def test_prepare_cli_names_the_dataset_and_hints_at_the_python_engine(
    spark: Any, assembled: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    tmp: Path = assembled["tmp"]
    store = str(tmp / "cli")
    parser = argparse.ArgumentParser()
    add_prepare_arguments(parser)
    argv = ["--input", str(tmp / "va.parquet"), "--store", store, "--partitions", "2"]
    caplog.set_level(logging.INFO, logger="cerebro_spark.data")
    assert run_prepare(parser.parse_args([*argv, "--engine", "spark", "--name", "va-1"])) == 0
    assert "faster with --engine python" in caplog.text
    record = read_dataset_name(store, "va-1")
    caplog.clear()
    assert run_prepare(parser.parse_args([*argv, "--engine", "python", "--name", "va-1"])) == 0
    assert "faster with --engine python" not in caplog.text
    assert read_dataset_name(store, "va-1").dataset_id == record.dataset_id  # same data, same id
