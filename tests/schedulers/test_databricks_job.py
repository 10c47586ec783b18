"""The Databricks job (schedulers/databricks/): its settings and its tasks, run locally.

The bundle's job is loaded with databricks-sdk's ``JobSettings``; then every task runs here
in dependency order against a local SparkSession standing in for the job cluster's
``spark``: the Spark Python task and the wheel tasks through the same entry points the
wheel's ``cerebro-spark`` console script and ``etl.py`` are, the notebooks cell by cell
with a small stand-in for ``dbutils`` (widgets from the task's ``base_parameters``, task
values handed from ``tune`` to ``report`` and ``score``).
"""

from __future__ import annotations

import itertools
import logging
import re
import runpy
import uuid
from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml
from pipeline_helpers import requires_report

from cerebro_spark.cli import build_parser
from cerebro_spark.cli import main as cerebro_spark_main

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "schedulers" / "databricks"
JOB = "cerebro_nightly"
NOTEBOOK_HEADER = "# Databricks notebook source"
CELL = "# COMMAND ----------"
logger = logging.getLogger(__name__)


class Widgets:
    """``dbutils.widgets``: values a job passes win over the defaults a notebook declares."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = dict(values)
        self.declared: dict[str, str] = {}

    def text(self, name: str, default_value: str, label: str | None = None) -> None:
        self.declared[name] = default_value

    def get(self, name: str) -> str:
        if name not in self.declared and name not in self.values:
            raise ValueError(f"no widget named {name!r}")  # as Databricks refuses it
        return self.values.get(name, self.declared.get(name, ""))


class TaskValues:
    """``dbutils.jobs.taskValues``, shared by the tasks of one job run."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, str], Any] = {}
        self.task = ""

    def set(self, key: str, value: Any) -> None:
        self.values[(self.task, key)] = value


class DBUtils:
    def __init__(self, widgets: dict[str, str], task_values: TaskValues) -> None:
        self.widgets = Widgets(widgets)
        self.jobs = type("Jobs", (), {"taskValues": task_values})()


def load_bundle(variables: dict[str, str]) -> dict[str, Any]:
    """The bundle's YAML with ``${var.NAME}`` replaced by ``variables`` or the default."""
    text = (BUNDLE / "databricks.yml").read_text()
    bundle = yaml.safe_load(text)
    defaults = {name: spec.get("default") for name, spec in bundle["variables"].items()}
    unknown = set(variables) - set(defaults)
    assert not unknown, f"not bundle variables: {unknown}"
    values = {**defaults, **variables}

    def resolve(match: re.Match[str]) -> str:
        name = match.group(1)
        assert name in values, f"${{var.{name}}} is not declared in the bundle's variables"
        return str(values[name])

    return yaml.safe_load(re.sub(r"\$\{var\.([A-Za-z_]+)\}", resolve, text))


def job_settings(variables: dict[str, str]) -> Any:
    from databricks.sdk.service.jobs import JobSettings

    job = load_bundle(variables)["resources"]["jobs"][JOB]
    return JobSettings.from_dict(job)


def dynamic(value: str, run: dict[str, str]) -> str:
    """Databricks' dynamic value references (``{{job.start_time.iso_date}}`` ...)."""
    return re.sub(r"\{\{\s*([^}]+?)\s*\}\}", lambda m: run[m.group(1)], value)


def run_notebook(path: Path, spark: Any, dbutils: DBUtils) -> dict[str, Any]:
    """Execute a Databricks notebook source file cell by cell; return its namespace."""
    source = path.read_text()
    assert source.startswith(NOTEBOOK_HEADER + "\n"), f"{path} is not a notebook source"
    namespace: dict[str, Any] = {"spark": spark, "dbutils": dbutils, "__name__": "__main__"}
    for number, cell in enumerate(source.split(CELL)):
        exec(compile(cell, f"{path.name}[cell {number}]", "exec"), namespace)
    return namespace


def test_job_settings_load_with_the_sdk_and_name_real_commands() -> None:
    settings = job_settings({})
    assert settings.name == "cerebro-nightly"
    assert settings.max_concurrent_runs == 1
    assert settings.schedule.quartz_cron_expression == "0 0 2 * * ?"
    (cluster,) = settings.job_clusters
    assert cluster.new_cluster.num_workers == 4
    assert cluster.new_cluster.node_type_id == "m5.xlarge"
    conf = cluster.new_cluster.spark_conf
    assert conf["spark.dynamicAllocation.enabled"] == "false"  # cerebro-spark's rule
    assert conf["spark.task.cpus"] == conf["spark.executor.cores"]  # one worker per executor
    tasks = {task.task_key: task for task in settings.tasks}
    assert list(tasks) == ["etl", "prepare", "plan", "tune", "report", "score"]
    order = list(tasks)
    for before, task in itertools.pairwise(order):
        assert [d.task_key for d in tasks[task].depends_on] == [before]
    assert all(task.job_cluster_key == cluster.job_cluster_key for task in tasks.values())
    assert tasks["tune"].max_retries == 2  # a retry resumes the search (the notebook)

    script = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    parser = build_parser()
    for key in ("prepare", "plan", "report"):
        wheel = tasks[key].python_wheel_task
        assert wheel is not None, key
        assert wheel.package_name == "cerebro_spark"
        assert all(isinstance(value, str) for value in wheel.parameters)
        assert wheel.entry_point in script  # the wheel's console script
        if key == "report" and "report" not in parser._subparsers._group_actions[0].choices:
            continue  # the report command lands with the report work (issue 11, part 3)
        parser.parse_args(wheel.parameters)  # real arguments of the real command
    assert tasks["etl"].spark_python_task.python_file == "../etl.py"
    assert (BUNDLE / "../etl.py").is_file()
    for key in ("tune", "score"):
        notebook = BUNDLE / tasks[key].notebook_task.notebook_path
        assert notebook.read_text().startswith(NOTEBOOK_HEADER)
        parameters = tasks[key].notebook_task.base_parameters
        assert all(isinstance(value, str) for value in parameters.values())  # as widgets get
    # every variable the job uses is declared, with a default the SDK accepts
    assert "${var." not in str(load_bundle({}))


@pytest.mark.spark
@pytest.mark.torch
@requires_report
def test_every_task_runs_locally_in_order(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = f"cerebro_job_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE DATABASE {database} LOCATION '{tmp_path / 'warehouse'}'")
    store = tmp_path / "store"
    variables = {
        "table": f"{database}.wine",
        "scored_table": f"{database}.wine_scored",
        "store": str(store),
        "partitions": "2",
        "workers": "1",  # one SparkBackend worker: its start (torch, partitions) is the cost
        "trials": "2",
        "eta": "2",
        "epochs": "2",
        "profile": str(ROOT / "conf" / "profiles" / "digits-local.yaml"),
        "prices": str(ROOT / "conf" / "prices" / "local.yaml"),
        "instance_type": "local-core",
        "deadline": "600",
        "budget": "1",
    }
    tasks = {task.task_key: task for task in job_settings(variables).tasks}
    task_values = TaskValues()
    run = {"job.start_time.iso_date": "2026-11-24"}
    monkeypatch.chdir(tmp_path)

    def notebook(key: str) -> Path:
        return BUNDLE / tasks[key].notebook_task.notebook_path

    try:
        # etl: the Spark Python task, as spark-submit would run it
        etl = tasks["etl"].spark_python_task
        monkeypatch.setattr("sys.argv", [str(BUNDLE / etl.python_file), *etl.parameters])
        with pytest.raises(SystemExit) as etl_exit:
            runpy.run_path(str(BUNDLE / etl.python_file), run_name="__main__")
        assert etl_exit.value.code == 0
        assert spark.table(variables["table"]).count() == 178

        # prepare and plan: the wheel's console script with the task's parameters
        for key in ("prepare", "plan"):
            assert cerebro_spark_main(tasks[key].python_wheel_task.parameters) == 0, key

        # tune: the notebook; a second run (a retry) resumes the same experiment
        for attempt in range(2):
            task_values.task = "tune"
            widgets = {
                k: dynamic(v, run) for k, v in tasks["tune"].notebook_task.base_parameters.items()
            }
            namespace = run_notebook(
                BUNDLE / tasks["tune"].notebook_task.notebook_path,
                spark,
                DBUtils(widgets, task_values),
            )
            assert namespace["started"] is bool(attempt)
        experiment = task_values.values[("tune", "experiment_id")]
        assert experiment == "nightly-20261124"
        run["tasks.tune.values.experiment_id"] = experiment
        leaderboard = namespace["leaderboard"]
        assert len(leaderboard) == 2 and leaderboard["status"].notna().all()

        # report: a wheel task taking tune's task value
        report = [dynamic(p, run) for p in tasks["report"].python_wheel_task.parameters]
        assert report[-1] == f"{store}/experiments/{experiment}"
        assert cerebro_spark_main(report) == 0
        assert (store / "experiments" / experiment / "report.html").stat().st_size > 0

        # score: the notebook, with the best model as a Transformer
        widgets = {
            k: dynamic(v, run) for k, v in tasks["score"].notebook_task.base_parameters.items()
        }
        run_notebook(
            BUNDLE / tasks["score"].notebook_task.notebook_path,
            spark,
            DBUtils(widgets, task_values),
        )
        scored = spark.table(variables["scored_table"]).toPandas()
        assert len(scored) == 178
        assert set(scored["prediction"]) <= {0, 1, 2}
        assert {"prediction", "probability"} <= set(scored.columns)

        # the experiment trained on the dataset prepare named (the same rows, reused)
        from cerebro_spark.data import read_dataset_name
        from cerebro_spark.engine import load_state

        _, state = load_state(str(store), experiment)
        assert state.dataset_id == read_dataset_name(str(store), "nightly").dataset_id
    finally:
        spark.sql(f"DROP DATABASE IF EXISTS {database} CASCADE")
