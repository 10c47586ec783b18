"""The digits experiment submitted with spark-submit to a local-cluster (2 executors)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cerebro_spark.engine import load_state, read_events
from cerebro_spark.store import open_store

pytestmark = [pytest.mark.spark, pytest.mark.torch, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def submit(tmp_path, store, extra_conf=()):
    config = {
        "name": "submitted",
        "seed": 2,
        "store": store,
        "data": {"source": "sklearn:digits", "partitions": 4},
        "epochs": 2,
        "workers": 2,
        "backend": "spark",
        "spark": {"conf": {"spark.ui.enabled": False}},
        "space": {
            "model": "cerebro_spark.training:MLPSpec",
            "hidden_units": {"grid": [[32], [64]]},
            "lr": 0.003,
        },
    }
    path = tmp_path / "submitted.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONUNBUFFERED": "1",
    }
    submit = Path(sys.executable).with_name("spark-submit")
    completed = subprocess.run(
        [
            str(submit),
            "--master",
            "local-cluster[2,1,1024]",
            "--conf",
            "spark.executor.memory=1g",
            *extra_conf,
            str(ROOT / "jobs/run.py"),
            str(path),
            "--experiment-id",
            "submitted",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]


def test_spark_submit_to_local_cluster(tmp_path):
    submit(tmp_path, str(tmp_path / "store"))
    _, state = load_state(str(tmp_path / "store"), "submitted")
    assert state.finished
    assert all(t.status == "completed" and t.epochs == 2 for t in state.trials.values())
    assert max(t.metrics["accuracy"] for t in state.trials.values()) > 0.85
    events = read_events(open_store(str(tmp_path / "store")).child("experiments/submitted"))
    joined = [e for e in events if e["event"] == "worker_joined"]
    assert len(joined) == 2
    assert len({e["host"] for e in joined}) >= 1
    ends = [
        (e["trial"], e["epoch"], e["kind"], e["partition"])
        for e in events
        if e["event"] == "unit_end"
    ]
    assert len(ends) == len(set(ends)) == 2 * 2 * 4 * 2
    # each worker read exactly the partitions it holds, once, over the whole run
    dataset = next(e for e in events if e["event"] == "dataset")
    manifest = json.loads(
        open_store(str(tmp_path / "store")).get(f"datasets/{dataset['dataset_id']}/manifest.json")
    )
    held = {e["worker"]: set(e["partitions"]) for e in events if e["event"] == "worker_ready"}
    assert len(held) == 2
    read = {e["worker"]: e["bytes_read"] for e in events if e["event"] == "worker_bytes"}
    for worker, partitions in held.items():
        expected = sum(p["bytes"] for p in manifest["partitions"] if p["index"] in partitions)
        assert read[worker] == expected


def test_spark_submit_with_dataset_and_checkpoints_on_s3(tmp_path, s3_server):
    store = s3_server.uri("lake")
    credentials = [
        f"spark.executorEnv.{name}={os.environ[name]}"
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    ]
    submit(tmp_path, store, [arg for pair in credentials for arg in ("--conf", pair)])
    _, state = load_state(store, "submitted")
    assert state.finished
    assert all(t.status == "completed" for t in state.trials.values())
    keys = [
        o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_server.bucket)["Contents"]
    ]
    assert any(
        k.startswith("lake/experiments/submitted/checkpoints/") and k.endswith(".pt") for k in keys
    )
    assert sum(k.startswith("lake/datasets/") and k.endswith(".parquet") for k in keys) == 8


def test_spark_submit_exits_non_zero_when_every_trial_failed(tmp_path):
    """A job whose every trial fails inside the Spark workers fails as a job (status 3)."""
    config = {
        "name": "doomed",
        "seed": 2,
        "store": str(tmp_path / "store"),
        "data": {"source": "sklearn:digits", "partitions": 2},
        "epochs": 1,
        "workers": 2,
        "backend": "spark",
        "spark": {"conf": {"spark.ui.enabled": False}},
        "model": "tests.engine.outcome_specs:FailsInTrainingSpec",
        "space": {"hidden_units": {"grid": [[8], [16]]}},
    }
    path = tmp_path / "doomed.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    completed = subprocess.run(
        [
            str(Path(sys.executable).with_name("spark-submit")),
            "--master",
            "local[2]",
            str(ROOT / "jobs/run.py"),
            str(path),
            "--experiment-id",
            "doomed",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=540,
    )
    output = completed.stdout + completed.stderr  # spark-submit merges Python's stderr
    assert completed.returncode == 3, output[-4000:]
    assert "every trial of experiment doomed failed (2 trials); the first failure: trial t000" in (
        output
    )
    assert "FailsInTrainingSpec refuses to take an optimizer step" in output
    _, state = load_state(str(tmp_path / "store"), "doomed")
    assert state.finished and all(t.status == "failed" for t in state.trials.values())
