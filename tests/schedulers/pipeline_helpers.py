"""What the pipeline tests share: a tiny nightly setting and the checks of what it left.

The pipelines run the real steps (schedulers/steps.sh): Spark for the ETL and scoring,
the plain-Python prepare engine (Spark's start-up would double the test for no new
coverage: the Spark engine has its own tests), and a two-trial, one-epoch search on the
local backend, on scikit-learn's wine data (178 rows).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from cerebro_spark.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
"""The project's virtual environment's scripts (cerebro-spark, python)."""

DATASET = "nightly-test"


def _has_report_command() -> bool:
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    return "report" in commands


requires_report = pytest.mark.skipif(
    not _has_report_command(),
    reason="the pipelines' report step needs 'cerebro-spark report' (issue 11, part 3)",
)
"""Marks a test that runs the report step: until the report command is merged, skipped."""


def write_config(directory: Path, **changes: object) -> Path:
    """A two-trial, one-epoch experiment on the dataset the pipeline names."""
    config: dict[str, object] = {
        "name": "nightly",
        "seed": 0,
        "store": str(directory / "unused-store"),  # the pipelines pass --store
        "data": {"dataset": DATASET},
        "procedure": "grid",
        "epochs": 1,
        "workers": 1,
        "backend": "local",
        "space": {
            "model": "cerebro_spark.training:MLPSpec",
            "hidden_units": [16],
            "lr": {"grid": [0.003, 0.01]},
            "batch_size": 16,
        },
    }
    config.update(changes)
    path = directory / "nightly.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def pipeline_env(directory: Path, **overrides: str) -> dict[str, str]:
    """The environment of schedulers/steps.sh for a pipeline under ``directory``."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "CEREBRO_HOME": str(ROOT),
        "CEREBRO_CLI": str(BIN / "cerebro-spark"),
        "CEREBRO_PYTHON": sys.executable,
        "CEREBRO_CONFIG": str(write_config(directory)),
        "CEREBRO_STORE": str(directory / "store"),
        "CEREBRO_SOURCE": "sklearn:wine",
        "CEREBRO_TABLE": str(directory / "lake" / "wine"),
        "CEREBRO_SCORED": str(directory / "lake" / "wine_scored"),
        "CEREBRO_DATASET": DATASET,
        "CEREBRO_PARTITIONS": "2",
        "CEREBRO_ENGINE": "python",
        "CEREBRO_MASTER": "local[2]",
        "CEREBRO_PROFILE": str(ROOT / "conf" / "profiles" / "digits-local.yaml"),
        "CEREBRO_PRICES": str(ROOT / "conf" / "prices" / "local.yaml"),
        "CEREBRO_DEADLINE": "600",
    }
    env.update(overrides)
    return env


def check_outputs(directory: Path, experiment_id: str, epochs: int = 1) -> None:
    """Every step left its mark: the table, the named dataset, the search, report, scores."""
    from cerebro_spark.data import read_dataset_name
    from cerebro_spark.engine import load_state

    store = str(directory / "store")
    table = pq.read_table(directory / "lake" / "wine")
    assert table.num_rows == 178
    assert "label" in table.column_names
    assert "od280_od315_of_diluted_wines" in table.column_names  # names cleaned
    assert read_dataset_name(store, DATASET).dataset_id  # prepare --name
    _, state = load_state(store, experiment_id)
    assert len(state.trials) == 2
    assert all(trial.epochs == epochs for trial in state.trials.values())
    experiment = directory / "store" / "experiments" / experiment_id
    assert (experiment / "best.pt").stat().st_size > 0
    assert (experiment / "report.html").stat().st_size > 0
    scored = pq.read_table(directory / "lake" / "wine_scored")
    assert scored.num_rows == 178
    predictions = set(scored.column("prediction").to_pylist())
    assert predictions <= {0, 1, 2} and predictions
    assert "probability" in scored.column_names


@dataclasses.dataclass(frozen=True)
class Airflow:
    """Python of Airflow's venv, and a database to copy to ``AIRFLOW_HOME/airflow.db``."""

    python: Path
    database: Path


def airflow_env(home: Path) -> dict[str, str]:
    """Airflow's environment: nothing of the project (no PYTHONPATH, no CEREBRO_*)."""
    return {
        **{
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("CEREBRO_", "AIRFLOW")) and k != "PYTHONPATH"
        },
        "SPARK_LOCAL_IP": "127.0.0.1",
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "schedulers" / "airflow"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }
