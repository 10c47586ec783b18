"""Every checkpoint a unit writes (single or group) carries its dataset's metadata."""

from __future__ import annotations

import dataclasses

import pytest
from test_group_unit import RankProcesses, ranks_of
from training_fixtures import BLOBS_INFO, blobs, train_task

from cerebro_spark.data import ColumnInfo, FeatureStatistics
from cerebro_spark.store import open_store
from cerebro_spark.training import dataset_metadata, decode_checkpoint, run_unit

pytestmark = pytest.mark.torch

STATS = FeatureStatistics(
    400, (0.1, -0.2, 0.0, 0.3), (1.5, 1.6, 1.4, 1.5), (-5.0,) * 4, (5.0, 5.0, 5.0, 4.5)
)
INFO = dataclasses.replace(
    BLOBS_INFO,
    statistics=STATS,
    dataset_id="abc123",
    features=(ColumnInfo("a", "float32"), ColumnInfo("v", "float32", (3,))),
    label="kind",
    classes=("cat", "dog"),
)


def test_a_unit_checkpoint_carries_the_dataset_metadata(tmp_path):
    store = open_store(str(tmp_path))
    run_unit(train_task(checkpoint_out="one.pt"), blobs(0), store, INFO)
    checkpoint = decode_checkpoint(store.get("one.pt"))
    assert checkpoint["data"] == dataset_metadata(INFO)
    assert checkpoint["data"] == {
        "dataset_id": "abc123",
        "task": "classification",
        "num_classes": 2,
        "classes": ["cat", "dog"],
        "features": [
            {"name": "a", "dtype": "float32", "shape": []},
            {"name": "v", "dtype": "float32", "shape": [3]},
        ],
        "feature_shape": [4],
        "label": "kind",
        "statistics": STATS.to_dict(),
    }
    assert "0.mean" in checkpoint["model"]  # the built-in MLP standardizes with STATS


def test_a_group_unit_checkpoint_carries_the_dataset_metadata(tmp_path):
    store = open_store(str(tmp_path))
    parts = {0: blobs(0, rows=120), 1: blobs(1, rows=100)}
    tasks = ranks_of(train_task(epoch_units=2, checkpoint_out="group.pt"), (0, 1))
    processes = RankProcesses()
    try:
        replies = processes.run(tasks, parts, store, INFO)
    finally:
        processes.close()
    assert not [reply for reply in replies if isinstance(reply, Exception)], replies
    assert decode_checkpoint(store.get("group.pt"))["data"] == dataset_metadata(INFO)
