"""The digits experiment submitted with spark-submit to a local-cluster (2 executors).

It is submitted once, with its dataset and checkpoints on S3 (moto's server, as the
``s3_server`` fixture runs it), and two tests check that one run: what the local-cluster
did (every unit once, each worker read its partitions once) and what landed on S3. A
submission costs three JVMs (the driver and two executors); one proves both.
"""

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cerebro_spark.engine import load_state, read_events
from cerebro_spark.store import open_store

pytestmark = [pytest.mark.spark, pytest.mark.torch, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
REGION = "us-east-1"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": REGION,
}


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


class Submitted:
    """The one submission: its store's URI, and the bucket holding it (a boto3 client)."""

    def __init__(self, store: str, bucket: str, client: Any) -> None:
        self.store = store
        self.bucket = bucket
        self.client = client


@pytest.fixture(scope="module")
def submitted(_moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Submitted]:
    """The experiment submitted to local-cluster[2,1,1024] with its store on S3.

    The fake credentials are in this process's environment while the module's tests read
    the store, and reach the executors through ``spark.executorEnv``.
    """
    import boto3

    with pytest.MonkeyPatch.context() as patch:
        for name, value in {
            **CREDENTIALS,
            "AWS_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
        }.items():
            patch.setenv(name, value)
        patch.delenv("AWS_SESSION_TOKEN", raising=False)
        patch.delenv("AWS_PROFILE", raising=False)
        bucket = f"test-{uuid.uuid4().hex[:16]}"
        client = boto3.client(
            "s3",
            endpoint_url=f"http://{_moto_endpoint}",
            region_name=REGION,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        client.create_bucket(Bucket=bucket)
        store = f"s3://{bucket}/lake?endpoint_override={_moto_endpoint}&scheme=http&region={REGION}"
        credentials = [f"spark.executorEnv.{name}={value}" for name, value in CREDENTIALS.items()]
        tmp_path = tmp_path_factory.mktemp("submitted")
        submit(tmp_path, store, [arg for pair in credentials for arg in ("--conf", pair)])
        yield Submitted(store, bucket, client)


def test_spark_submit_to_local_cluster(submitted):
    store = submitted.store
    _, state = load_state(store, "submitted")
    assert state.finished
    assert all(t.status == "completed" and t.epochs == 2 for t in state.trials.values())
    assert max(t.metrics["accuracy"] for t in state.trials.values()) > 0.85
    events = read_events(open_store(store).child("experiments/submitted"))
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
    manifest = json.loads(open_store(store).get(f"datasets/{dataset['dataset_id']}/manifest.json"))
    held = {e["worker"]: set(e["partitions"]) for e in events if e["event"] == "worker_ready"}
    assert len(held) == 2
    read = {e["worker"]: e["bytes_read"] for e in events if e["event"] == "worker_bytes"}
    for worker, partitions in held.items():
        expected = sum(p["bytes"] for p in manifest["partitions"] if p["index"] in partitions)
        assert read[worker] == expected


def test_spark_submit_with_dataset_and_checkpoints_on_s3(submitted):
    _, state = load_state(submitted.store, "submitted")
    assert state.finished
    assert all(t.status == "completed" for t in state.trials.values())
    listed = submitted.client.list_objects_v2(Bucket=submitted.bucket)
    keys = [o["Key"] for o in listed["Contents"]]
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
