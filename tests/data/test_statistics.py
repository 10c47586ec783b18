"""Per-feature statistics of the train split in the manifest (no Spark, no torch).

That the Spark writer records bit-identical statistics is checked by
``test_spark_prepare.py``, which compares every file of both writers, manifest included.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow as pa
import pytest
from dataset_helpers import make_table

from cerebro_spark.data import (
    MANIFEST_NAME,
    ColumnInfo,
    FeatureStatistics,
    Manifest,
    prepare_dataset,
    read_manifest,
    read_partition,
)
from cerebro_spark.data import _format as data_format
from cerebro_spark.data import _statistics as st
from cerebro_spark.errors import DataError
from cerebro_spark.store import open_store

KW = {"features": ["x", "vec"], "label": "y", "num_partitions": 3, "seed": 7}


def prepared(tmp_path, rows=200, **changes):
    manifest = prepare_dataset(make_table(rows), str(tmp_path), **{**KW, **changes})
    return manifest, f"{tmp_path}/datasets/{manifest.dataset_id}"


def train_matrix(uri, manifest, split="train"):
    parts = [
        read_partition(uri, split, i, manifest=manifest) for i in range(manifest.num_partitions)
    ]
    return np.concatenate([p.features.reshape(p.rows, -1) for p in parts]).astype(np.float64)


def test_statistics_describe_every_feature_element_of_the_train_split(tmp_path):
    manifest, uri = prepared(tmp_path)
    stats = manifest.statistics
    assert stats is not None and stats.size == 7  # x, then the 6 values of vec
    train = train_matrix(uri, manifest)
    assert stats.count == len(train) == manifest.rows("train")
    np.testing.assert_allclose(stats.mean, train.mean(axis=0), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(stats.std, train.std(axis=0), rtol=1e-12)
    np.testing.assert_array_equal(stats.min, train.min(axis=0))
    np.testing.assert_array_equal(stats.max, train.max(axis=0))
    validation = train_matrix(uri, manifest, "validation")
    assert not np.allclose(stats.mean, validation.mean(axis=0))  # validation is not counted


def test_statistics_round_trip_exactly_and_reused_datasets_keep_them(tmp_path):
    manifest, uri = prepared(tmp_path)
    assert read_manifest(uri).statistics == manifest.statistics
    again = prepare_dataset(make_table(200), str(tmp_path), **KW)  # reused, not rewritten
    assert again.statistics == manifest.statistics
    assert manifest.info.statistics == manifest.statistics
    assert manifest.info.features == manifest.features and manifest.info.label == "y"
    assert manifest.info.dataset_id == manifest.dataset_id
    assert manifest.info.classes == (0, 1, 2)


def test_a_constant_feature_has_zero_std(tmp_path):
    table = make_table(60)
    table = table.set_column(1, "x", [np.full(60, 2.5)])
    manifest = prepare_dataset(table, str(tmp_path), **KW)
    assert manifest.statistics.std[0] == 0.0 and manifest.statistics.mean[0] == 2.5


def test_combining_partitions_equals_one_pass_over_all_rows():
    rng = np.random.default_rng(3)
    values = (rng.normal(size=(1000, 5)) * [1, 10, 1e3, 1e-3, 1]).astype(np.float32)
    columns = [ColumnInfo("f", "float32", (5,))]

    def table(rows):
        return pa.table({"f": pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1)), 5)})

    whole = st.combine([st.partition_moments(table(values), columns)])
    parts = st.combine(
        [st.partition_moments(table(chunk), columns) for chunk in np.array_split(values, 7)]
    )
    np.testing.assert_allclose(parts.mean, whole.mean, rtol=1e-12)
    np.testing.assert_allclose(parts.std, whole.std, rtol=1e-10)
    assert parts.min == whole.min and parts.max == whole.max
    moments = st.partition_moments(table(values), columns)
    again = st.Moments.from_bytes(moments.to_bytes())
    assert again.count == moments.count
    np.testing.assert_array_equal(again.m2, moments.m2)


def test_a_manifest_without_statistics_still_loads(tmp_path):
    manifest, uri = prepared(tmp_path)
    store = open_store(uri)
    raw = json.loads(store.get(MANIFEST_NAME))
    del raw["statistics"]  # written before statistics existed
    store.put(MANIFEST_NAME, json.dumps(raw).encode())
    old = read_manifest(uri)
    assert old.statistics is None and old.info.statistics is None
    assert dataclasses.replace(old, statistics=manifest.statistics) == manifest


def test_statistics_that_do_not_match_the_features_are_refused(tmp_path):
    manifest, uri = prepared(tmp_path)
    short = dataclasses.replace(
        manifest.statistics, **{k: (1.0,) for k in ("mean", "std", "min", "max")}
    )
    broken = dataclasses.replace(manifest, statistics=short)
    open_store(uri).put(MANIFEST_NAME, broken.to_json().encode())
    with pytest.raises(DataError, match="statistics for 1 elements"):
        read_manifest(uri)
    with pytest.raises(DataError, match="different lengths"):
        FeatureStatistics.from_dict({"count": 1, "mean": [0], "std": [], "min": [0], "max": [0]})
    with pytest.raises(DataError, match="must hold"):
        Manifest.from_json(broken.to_json().replace('"count"', '"rows"'))


def test_wide_features_are_not_described(tmp_path, monkeypatch):
    monkeypatch.setattr(data_format, "MAX_STATISTICS_ELEMENTS", 6)
    monkeypatch.setattr(st, "MAX_STATISTICS_ELEMENTS", 6)
    manifest, _ = prepared(tmp_path)
    assert manifest.statistics is None
