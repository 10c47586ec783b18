"""A whole experiment with its dataset, checkpoints and logs on an S3 server (moto)."""

import pytest

from cerebro_spark.engine import parse_config, read_events, replay_experiment, run_experiment
from cerebro_spark.store import open_store

pytestmark = [pytest.mark.torch, pytest.mark.slow]


def test_experiment_on_s3(s3_server, tmp_path):
    store_uri = s3_server.uri("lake")
    config = parse_config(
        {
            "name": "s3",
            "seed": 3,
            "store": store_uri,
            "data": {"source": "sklearn:digits", "partitions": 2},
            "epochs": 2,
            "workers": 2,
            "model": "cerebro_spark.training:MLPSpec",
            "space": {"hidden_units": {"grid": [[32], [64]]}, "lr": 0.003},
        }
    )
    result = run_experiment(config, experiment_id="on-s3")
    assert all(t.status == "completed" for t in result.trials)
    assert result.best.metrics["accuracy"] > 0.8
    keys = {
        obj["Key"]
        for obj in s3_server.client().list_objects_v2(Bucket=s3_server.bucket)["Contents"]
    }
    assert "lake/experiments/on-s3/leaderboard.csv" in keys
    assert "lake/experiments/on-s3/best.pt" in keys
    assert sum(k.startswith("lake/datasets/") and k.endswith(".parquet") for k in keys) == 4
    checkpoints = sorted(k for k in keys if k.startswith("lake/experiments/on-s3/checkpoints/"))
    assert len([k for k in checkpoints if k.endswith(".pt")]) == 2, checkpoints
    events = read_events(open_store(store_uri).child("experiments/on-s3"))
    bytes_read = {e["worker"]: e["bytes_read"] for e in events if e["event"] == "worker_bytes"}
    manifest_bytes = sum(
        e["bytes"]
        for e in __import__("json").loads(
            open_store(store_uri).get(f"datasets/{events[1]['dataset_id']}/manifest.json")
        )["partitions"]
    )
    # each worker read its own partitions once: together, the dataset exactly once
    assert sum(bytes_read.values()) == manifest_bytes
    assert replay_experiment(store_uri, "on-s3", workers=1).identical
