"""Datasets written to and read from S3 (moto's server on 127.0.0.1) through s3:// URIs."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from dataset_helpers import dataset_files, make_table

from cerebro_spark.data import (
    MANIFEST_NAME,
    SPLITS,
    prepare_dataset,
    read_manifest,
    read_partition,
    read_table,
    write_dataset,
)
from cerebro_spark.errors import DataError
from cerebro_spark.store import open_store

KW: dict[str, Any] = {"features": ["x", "vec"], "label": "y", "num_partitions": 2, "seed": 3}


def test_write_and_read_on_s3(s3_server: Any, tmp_path: Path) -> None:
    table = make_table(50)
    uri = s3_server.uri("datasets/one")
    manifest = write_dataset(table, uri, **KW)
    assert read_manifest(uri) == manifest

    keys = sorted(
        obj["Key"]
        for obj in s3_server.client().list_objects_v2(Bucket=s3_server.bucket)["Contents"]
    )
    assert keys == sorted(
        [f"datasets/one/{MANIFEST_NAME}"] + [f"datasets/one/{p.path}" for p in manifest.partitions]
    )
    local = write_dataset(table, str(tmp_path / "local"), **KW)
    assert local == manifest
    store = open_store(uri)
    for path, data in dataset_files(tmp_path / "local").items():
        assert store.get(path) == data  # byte-identical to the local copy

    for split in SPLITS:
        for index in range(2):
            remote = read_partition(uri, split, index, manifest=manifest)
            here = read_partition(str(tmp_path / "local"), split, index)
            np.testing.assert_array_equal(remote.features, here.features)
            np.testing.assert_array_equal(remote.labels, here.labels)
            assert remote.bytes_read == manifest.partition(split, index).bytes


def test_prepare_on_s3_reuses(s3_server: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="cerebro_spark.data")
    store = open_store(s3_server.uri("store"))
    first = prepare_dataset(make_table(40), store, **KW)
    client = s3_server.client()
    key = f"store/datasets/{first.dataset_id}/{MANIFEST_NAME}"
    before = client.head_object(Bucket=s3_server.bucket, Key=key)["ETag"]
    caplog.clear()
    again = prepare_dataset(make_table(40), s3_server.uri("store"), **KW)
    assert again == first
    assert "reusing" in caplog.text
    assert client.head_object(Bucket=s3_server.bucket, Key=key)["ETag"] == before
    part = read_partition(store.child(f"datasets/{first.dataset_id}"), "train", 1)
    assert part.rows == first.partition("train", 1).rows


def test_missing_dataset_on_s3(s3_server: Any) -> None:
    with pytest.raises(DataError, match=r"no manifest\.json at s3://"):
        read_manifest(s3_server.uri("nothing/here"))


def test_read_table_from_s3(s3_server: Any) -> None:
    table = make_table(12).select(["x", "y"])
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    s3_server.client().put_object(
        Bucket=s3_server.bucket, Key="raw/input.parquet", Body=buffer.getvalue()
    )
    assert read_table(s3_server.uri("raw/input.parquet")).equals(table)
    assert read_table(s3_server.uri("raw")).equals(table)
