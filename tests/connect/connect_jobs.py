"""The ``jobs/`` entry points on a Spark Connect server (issue 28 part 2): each is a process
of its own given the server's ``sc://`` URL as ``--master`` (or the config's
``spark.master``), as a Databricks job on a Standard-access or serverless cluster runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from cerebro_spark.data import load_source

pytestmark = [pytest.mark.spark, pytest.mark.torch]

ROOT = Path(__file__).resolve().parents[2]
JOB_TIMEOUT_S = 300


def job(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``jobs/<name>.py`` with ``args`` in a fresh Python (no Spark session in it)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(ROOT / "jobs" / f"{name}.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
    )


def dataset_id(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr[-3000:]
    (found,) = set(re.findall(r"\b[0-9a-f]{24}\b", done.stdout))
    return str(found)


def test_prepare_run_and_score_jobs_on_spark_connect(connect_server: Any, tmp_path: Path) -> None:
    store = tmp_path / "store"
    common = ["--input", "sklearn:iris", "--partitions", "2", "--store", str(store)]
    on_connect = job("prepare", *common, "--engine", "spark", "--master", connect_server.url)
    plain = job("prepare", *common, "--engine", "python")
    assert dataset_id(on_connect) == dataset_id(plain)  # the same dataset, the same id

    config = tmp_path / "iris.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "jobs",
                "seed": 2,
                "store": str(store),
                "data": {"dataset": dataset_id(plain)},
                "epochs": 1,
                "workers": 2,
                "backend": "spark",
                "spark": {"master": connect_server.url},
                "model": "cerebro_spark.training:MLPSpec",
                "space": {"hidden_units": [8], "lr": {"grid": [0.01, 0.05]}, "batch_size": 16},
            }
        )
    )
    ran = job("run", str(config), "--experiment-id", "on-connect")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert (store / "experiments" / "on-connect" / "best.pt").is_file()
    assert "Spark Connect" in ran.stderr

    table, _ = load_source("sklearn:iris")
    rows = tmp_path / "rows.parquet"
    pq.write_table(table.drop(["label"]), rows)
    out = tmp_path / "scored"
    scored = job(
        "score",
        "--store",
        str(store),
        "--experiment",
        "on-connect",
        "--input",
        str(rows),
        "--output",
        str(out),
        "--master",
        connect_server.url,
    )
    assert scored.returncode == 0, scored.stderr[-3000:]
    result = pq.read_table(out)
    assert result.num_rows == table.num_rows
    assert {"prediction", "probability", "petal_width_cm"} <= set(result.column_names)
    assert set(result.column("prediction").to_pylist()) <= {0, 1, 2}
