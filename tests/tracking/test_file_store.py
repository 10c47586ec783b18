"""MLflow at a folder (``MLFLOW_TRACKING_URI=./mlruns``), and a store MLflow cannot open:
the run is tracked where the user asked, or goes on untracked with one warning (issue 29)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.engine import parse_config, run_experiment

pytestmark = pytest.mark.torch


def tiny(store: Path) -> Any:
    return parse_config(
        {
            "name": "filed",
            "seed": 3,
            "store": str(store),
            "data": {"source": "sklearn:iris", "partitions": 2},
            "procedure": "grid",
            "epochs": 1,
            "workers": 2,
            "space": {
                "model": "cerebro_spark.training:MLPSpec",
                "hidden_units": [8],
                "lr": {"grid": [0.01, 0.03]},
                "batch_size": 16,
            },
        }
    )


def test_a_folder_uri_is_tracked_in_that_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from mlflow.tracking import MlflowClient

    folder = tmp_path / "mlruns"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", str(folder))
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with caplog.at_level(logging.INFO, logger="cerebro_spark.tracking"):
        result = run_experiment(tiny(tmp_path / "runs"), experiment_id="filed")
    assert len(result.trials) == 2
    assert f"tracking into the file store {folder}" in caplog.text
    client = MlflowClient(tracking_uri=str(folder))
    experiment = client.get_experiment_by_name("filed")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 3  # the experiment's run and one per trial
    assert all(run.info.status == "FINISHED" for run in runs)


def test_a_store_mlflow_cannot_open_leaves_the_run_untracked_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", str(tmp_path / "mlruns"))
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "false")  # the user's own refusal stands
    with caplog.at_level(logging.WARNING):
        result = run_experiment(tiny(tmp_path / "runs"), experiment_id="untracked")
    assert len(result.trials) == 2 and result.best is not None
    warnings = [r for r in caplog.records if "could not start" in r.getMessage()]
    assert len(warnings) == 1
    assert "this run is not tracked in MLflow" in warnings[0].getMessage()
    assert "Traceback" not in caplog.text
