"""Airflow 3 DAG: the nightly ETL-then-train pipeline, one task per step.

    experiment_id ─┐
    etl >> prepare >> plan >> run >> report >> score

Every task runs ``schedulers/steps.sh STEP`` of a cerebro-spark checkout, which calls the
``cerebro-spark`` CLI and the Spark jobs of *the project's* virtual environment: nothing of
cerebro-spark (torch, pyspark) is imported into Airflow's, and Airflow's dependencies never
meet the project's.

Deploy: link or copy this file into the DAGs folder. Settings are the environment
variables of ``schedulers/steps.sh`` (``CEREBRO_HOME``, ``CEREBRO_CLI``, ``CEREBRO_CONFIG``,
``CEREBRO_STORE``, ``CEREBRO_SOURCE``, ``CEREBRO_PROFILE``, ``CEREBRO_DEADLINE`` ...), taken
from the worker's environment, overridden by the Airflow Variable ``cerebro_spark``: a
JSON object of the same names, e.g.
``{"CEREBRO_HOME": "/srv/cerebro-spark", "CEREBRO_STORE": "s3://lake/cerebro",
"CEREBRO_DEADLINE": "3600", "CEREBRO_BUDGET": "20"}``. ``CEREBRO_HOME`` defaults to the
checkout this file lies in (when the DAGs folder links it).

- The experiment id is ``nightly-{{ ds_nodash }}`` (task ``experiment_id``, passed to
  ``run`` by XCom): a DAG run always names the same experiment.
- ``run`` starts it, or, when the experiment already started (a retry after the driver or
  the worker died, a cleared task), resumes it from its event log instead of restarting the
  search (``cerebro-spark run --experiment-id ID --if-exists resume``). It pushes the id,
  which ``report`` and ``score`` pull.
- ``plan`` fails the DAG run before anything is spent when the deadline or budget cannot
  be met (exit status 2); ``run`` fails with status 3 when every trial failed.
- Retries: ``CEREBRO_RETRIES`` (default 2) with ``CEREBRO_RETRY_DELAY_SECONDS`` (default
  300) between tries, read from the environment when the DAG is parsed.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
from pathlib import Path

import pendulum
from airflow.sdk import DAG, Variable, task

SETTINGS_VARIABLE = "cerebro_spark"
"""The Airflow Variable holding the steps' settings (a JSON object)."""

CHECKOUT = Path(__file__).resolve().parents[2]
"""The cerebro-spark checkout this file lies in (``CEREBRO_HOME``'s default)."""


def _settings() -> dict[str, str]:
    """The worker's CEREBRO_* environment, overridden by the ``cerebro_spark`` Variable."""
    settings = {key: value for key, value in os.environ.items() if key.startswith("CEREBRO_")}
    variable = Variable.get(SETTINGS_VARIABLE, default=None)
    if variable:
        overrides = json.loads(variable) if isinstance(variable, str) else variable
        if not isinstance(overrides, dict):
            raise ValueError(
                f"the Airflow Variable {SETTINGS_VARIABLE!r} must be a JSON object of "
                f"CEREBRO_* settings, got {variable!r}"
            )
        settings.update({str(key): str(value) for key, value in overrides.items()})
    settings.setdefault("CEREBRO_HOME", str(CHECKOUT))
    return settings


def step_command(step: str, **extra: str) -> str:
    """The bash command of one step: ``steps.sh STEP`` with the settings in its environment."""
    settings = {**_settings(), **extra}
    steps = Path(settings["CEREBRO_HOME"]) / "schedulers" / "steps.sh"
    assignments = " ".join(f"{key}={shlex.quote(value)}" for key, value in sorted(settings.items()))
    return f"env {assignments} bash {shlex.quote(str(steps))} {step}"


with DAG(
    dag_id="cerebro_nightly",
    description="ETL, prepare, plan, run (resumed on retry), report and score with cerebro-spark",
    schedule="0 2 * * *",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # two nights never train at once
    default_args={
        "retries": int(os.environ.get("CEREBRO_RETRIES", "2")),
        "retry_delay": datetime.timedelta(
            seconds=float(os.environ.get("CEREBRO_RETRY_DELAY_SECONDS", "300"))
        ),
    },
    tags=["cerebro-spark"],
) as dag:

    @task
    def experiment_id(ds_nodash: str | None = None) -> str:
        """The experiment this DAG run trains: ``nightly-<logical date>``."""
        return f"nightly-{ds_nodash}"

    @task.bash
    def etl() -> str:
        """A Spark job (re)writes the table from the source."""
        return step_command("etl")

    @task.bash
    def prepare() -> str:
        """Shuffle, split and partition the table; name the dataset for the config."""
        return step_command("prepare")

    @task.bash
    def plan() -> str:
        """Fail before anything is spent when the deadline or budget cannot be met."""
        return step_command("plan")

    @task.bash
    def run(experiment: str) -> str:
        """Start the search, or resume it when a try before this one started it."""
        return step_command("run", CEREBRO_EXPERIMENT_ID=experiment)

    @task.bash
    def report(experiment: str) -> str:
        """The experiment's HTML report (its path is this task's XCom)."""
        return step_command("report", CEREBRO_EXPERIMENT_ID=experiment)

    @task.bash
    def score(experiment: str) -> str:
        """Score the table with the best model."""
        return step_command("score", CEREBRO_EXPERIMENT_ID=experiment)

    trained = run(experiment_id())
    etl() >> prepare() >> plan() >> trained
    report(trained) >> score(trained)
