"""jobs/score.py through a real spark-submit on local-cluster[2,1,1024], into a table:
every held-out row scored as load_model predicts it, and no Spark INFO line printed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cerebro_spark.engine import read_events
from cerebro_spark.scoring import load_model
from cerebro_spark.store import open_store

pytestmark = [pytest.mark.spark, pytest.mark.torch, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SPARK_INFO = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d INFO ", re.MULTILINE)


def environment() -> dict[str, str]:
    """The job's environment: no PYSPARK_SUBMIT_ARGS left over (the job sets its own)."""
    inherited = {k: v for k, v in os.environ.items() if k != "PYSPARK_SUBMIT_ARGS"}
    return {
        **inherited,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
    }


def submit(master: str, arguments: list[str], cwd: Path, conf: dict[str, str]):
    command = [str(Path(sys.executable).with_name("spark-submit")), "--master", master]
    for key, value in {"spark.ui.enabled": "false", **conf}.items():
        command += ["--conf", f"{key}={value}"]
    return subprocess.run(
        [*command, str(ROOT / "jobs/score.py"), *arguments],
        env=environment(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=540,
    )


def test_score_job_scores_every_row_as_load_model_does(trained, tmp_path):
    """On executors of their own (local-cluster), into a table of the session's warehouse;
    the pipelines' score step (tests/schedulers) writes Parquet with ``--output``."""
    master = "local-cluster[2,1,1024]"
    model_args = ["--store", trained.store, "--experiment", trained.experiment_id]
    conf = {
        "spark.sql.warehouse.dir": str(tmp_path / "warehouse"),
        "spark.executor.memory": "1g",
        "spark.executorEnv.PYTHONPATH": str(ROOT),
    }
    output = ["--output-table", "scored"]
    completed = submit(
        master, [*model_args, "--input", trained.held_out_path, *output], tmp_path, conf
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    # Spark at WARN (cli.quiet_spark): only the lines SparkContext logs before it reads
    # spark.log.level (its version, the OS, Java), none from the jobs that scored.
    assert 'Setting Spark log level to "WARN"' in completed.stderr
    assert len(SPARK_INFO.findall(completed.stderr)) <= 5, completed.stderr[-4000:]
    metadata = load_model(trained.experiment_uri).metadata
    assert f"with trial {metadata.trial_id} (epoch {metadata.epoch})" in completed.stdout
    best = [e for e in read_events(open_store(trained.experiment_uri)) if "best_epoch" in e]
    assert metadata.epoch == best[-1]["best_epoch"] >= 1  # as the leaderboard counts
    written = tmp_path / "warehouse/scored"
    scored = pd.read_parquet(written).sort_values("row_id").reset_index(drop=True)
    held_out = trained.held_out.sort_values("row_id").reset_index(drop=True)
    assert list(scored["row_id"]) == list(held_out["row_id"])
    model = load_model(trained.experiment_uri)
    assert list(scored["prediction"]) == list(model.predict(held_out))
    np.testing.assert_allclose(
        np.stack(scored["probability"].to_numpy()), model.predict_proba(held_out), rtol=1e-6
    )
    assert list(scored.columns) == [*held_out.columns, "prediction", "probability"]


def test_a_missing_experiment_fails_fast_with_exit_status_2(trained, tmp_path):
    score = [sys.executable, str(ROOT / "jobs/score.py"), "--store", trained.store]
    missing = ["--experiment", "nope", "--input", trained.held_out_path]
    # two independent processes (each mostly Python's and torch's imports): run side by side
    running = [
        subprocess.Popen(
            command,
            env=environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for command in ([*score, *missing, "--output", str(tmp_path / "out")], score)
    ]
    try:
        (_, no_experiment), (_, no_source) = [p.communicate(timeout=120) for p in running]
    finally:
        for process in running:
            process.kill()
            process.wait()
    assert running[0].returncode == 2
    assert "score: error: no experiment at" in no_experiment
    assert running[1].returncode == 2
    assert "exactly one of --experiment" in no_source
