"""``data: {dataset: <uri>}`` in another store than the experiment's: the workers read that
URI (not ``<experiment store>/datasets/<id>``), on local files and on S3 (moto)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.backends import WorkerPool
from cerebro_spark.data import load_source, prepare_dataset
from cerebro_spark.engine import ExperimentConfig, parse_config, read_events, run_experiment
from cerebro_spark.store import open_store
from tests.backends import fake_transport
from tests.backends.fake_transport import ThreadTransport


@pytest.fixture(autouse=True)
def script() -> Iterator[fake_transport.Script]:
    yield fake_transport.reset()
    fake_transport.reset()


def prepared(store_uri: str) -> str:
    """Prepare digits in ``store_uri``; return the dataset's URI."""
    table, meta = load_source("sklearn:digits")
    manifest = prepare_dataset(table, store_uri, num_partitions=2, seed=9, **meta)
    return open_store(store_uri).url(f"datasets/{manifest.dataset_id}")


def config(store: str, dataset: str, **changes: Any) -> ExperimentConfig:
    return parse_config(
        {
            "name": "elsewhere",
            "seed": 1,
            "store": store,
            "data": {"dataset": dataset},
            "epochs": 2,
            "workers": 2,
            "model": "tests.engine.free_spec:FreeSpec",  # built once by the pre-flight
            "space": {"hidden": {"grid": [1, 2]}},
            **changes,
        }
    )


def partition_bytes(dataset_uri: str) -> int:
    manifest = json.loads(open_store(dataset_uri).get("manifest.json"))
    return sum(int(part["bytes"]) for part in manifest["partitions"])


def test_workers_read_a_dataset_from_another_local_store(tmp_path: Path) -> None:
    dataset = prepared(str(tmp_path / "lake"))
    experiments = tmp_path / "experiments"
    result = run_experiment(
        config(str(experiments), dataset),
        experiment_id="e",
        backend_factory=lambda c: WorkerPool(ThreadTransport(), c.workers),
    )
    assert all(t.status == "completed" for t in result.trials)
    events = read_events(open_store(str(experiments)).child("experiments/e"))
    (logged,) = [e for e in events if e["event"] == "dataset"]
    assert logged["uri"] == dataset
    assert {job.dataset_uri for job in fake_transport.SCRIPT.jobs.values()} == {dataset}
    read = sum(e["bytes_read"] for e in events if e["event"] == "worker_bytes")
    assert read == partition_bytes(dataset)  # each partition read once, from the lake
    assert not (experiments / "datasets").exists()


@pytest.mark.torch
@pytest.mark.slow
def test_training_reads_a_dataset_from_another_s3_prefix(s3_server: Any) -> None:
    """Real worker processes train on a dataset in one S3 prefix and log in another."""
    dataset = prepared(s3_server.uri("lake-a"))
    store = s3_server.uri("lake-b")
    cfg = config(
        store,
        dataset,
        model="cerebro_spark.training:MLPSpec",
        space={"hidden_units": {"grid": [[32], [64]]}, "lr": 0.003},
    )
    result = run_experiment(cfg, experiment_id="s3")
    assert all(t.status == "completed" for t in result.trials)
    assert result.best is not None and result.best.metrics["accuracy"] > 0.8
    events = read_events(open_store(store).child("experiments/s3"))
    assert next(e for e in events if e["event"] == "dataset")["uri"] == dataset
    read = sum(e["bytes_read"] for e in events if e["event"] == "worker_bytes")
    assert read == partition_bytes(dataset)
    keys = {
        o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_server.bucket)["Contents"]
    }
    assert not any(k.startswith("lake-b/datasets/") for k in keys)
    assert any(k.startswith("lake-b/experiments/s3/checkpoints/") for k in keys)
