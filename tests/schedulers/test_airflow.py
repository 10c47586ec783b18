"""The Airflow DAG (schedulers/airflow/cerebro_nightly.py) under Airflow's own ``dag.test()``.

Airflow lives in a virtual environment of its own that this test builds with pip (pinned,
cached in pytest's cache directory, so one CI run builds it once: ~1 minute on a shared
2-core machine). The DAG's tasks call the project's CLI through schedulers/steps.sh; the
first try of ``run`` is killed like a dying driver once its experiment started, and the
retry must resume that experiment rather than start another.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pipeline_helpers import (
    BIN,
    ROOT,
    check_outputs,
    pipeline_env,
    requires_report,
    write_config,
)

pytestmark = [pytest.mark.spark, pytest.mark.torch, pytest.mark.slow, requires_report]

AIRFLOW_VERSION = "3.3.2"
DAG_FILE = ROOT / "schedulers" / "airflow" / "cerebro_nightly.py"
RUNNER = Path(__file__).with_name("airflow_runner.py")
EXPERIMENT = "nightly-20261124"
EPOCHS = 2
logger = logging.getLogger(__name__)

# Stands in for a driver that dies: the first `run` is SIGKILLed (with its workers, its
# whole process group) as soon as its first training unit ended; everything else, and
# every later call, is the real CLI.
# A model slow enough (50 ms a batch) that the kill lands mid-search.
SLOW_SPEC = """import time

from cerebro_spark.training import MLPSpec


class SlowMLP(MLPSpec):
    def transform(self, features, labels):
        time.sleep(0.05)
        return features, labels
"""
CRASHING_CLI = """#!/usr/bin/env bash
if [[ $1 == run && ! -e {marker} ]]; then
    touch {marker}
    setsid {real} "$@" &
    pid=$!
    for _ in $(seq 1 2400); do
        grep -q '"unit_end"' {events} 2>/dev/null && break
        sleep 0.05
    done
    kill -KILL -- -$pid
    wait $pid
    exit $?
fi
exec {real} "$@"
"""


def _airflow_python(venv: Path) -> Path | None:
    python = venv / "bin" / "python"
    if not python.exists():
        return None
    probe = subprocess.run(
        [str(python), "-c", "import airflow; print(airflow.__version__)"],
        capture_output=True,
        text=True,
    )
    return python if probe.stdout.strip() == AIRFLOW_VERSION else None


@pytest.fixture(scope="session")
def airflow_python(request: pytest.FixtureRequest) -> Path:
    """Python of a virtual environment with apache-airflow, built once per CI run."""
    venv = Path(request.config.cache.mkdir(f"airflow-{AIRFLOW_VERSION}-venv"))
    python = _airflow_python(venv)
    if python is not None:
        return python
    shutil.rmtree(venv, ignore_errors=True)
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    install = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", f"apache-airflow=={AIRFLOW_VERSION}"],
        capture_output=True,
        text=True,
    )
    if install.returncode != 0:
        pytest.fail(f"pip could not install apache-airflow=={AIRFLOW_VERSION}:\n{install.stderr}")
    logger.warning("built the Airflow venv in %.0f s", time.monotonic() - started)
    python = _airflow_python(venv)
    assert python is not None, "apache-airflow installed but not importable"
    return python


def test_dag_runs_every_step_and_its_retry_resumes_the_search(
    tmp_path: Path, airflow_python: Path
) -> None:
    store = tmp_path / "store"
    cli = tmp_path / "crashing-cerebro-spark"
    cli.write_text(
        CRASHING_CLI.format(
            marker=tmp_path / "crashed-once",
            real=BIN / "cerebro-spark",
            events=store / "experiments" / EXPERIMENT / "events.jsonl",
        )
    )
    cli.chmod(0o755)
    # the steps' settings come through the Airflow Variable, as in production; Airflow's
    # own process sees nothing of the project (no PYTHONPATH, no CEREBRO_*)
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "slow_spec.py").write_text(SLOW_SPEC)
    settings = {
        **{k: v for k, v in pipeline_env(tmp_path).items() if k.startswith("CEREBRO_")},
        "CEREBRO_CLI": str(cli),
        "PYTHONPATH": f"{ROOT}:{specs}",
    }
    space = {"model": "slow_spec:SlowMLP", "hidden_units": [16], "lr": {"grid": [0.003, 0.01]}}
    write_config(tmp_path, epochs=EPOCHS, space={**space, "batch_size": 16})
    env = {
        **{
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("CEREBRO_", "AIRFLOW")) and k != "PYTHONPATH"
        },
        "SPARK_LOCAL_IP": "127.0.0.1",
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAG_FILE.parent),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_VAR_CEREBRO_SPARK": json.dumps(settings),
        "CEREBRO_RETRIES": "1",
        "CEREBRO_RETRY_DELAY_SECONDS": "0",
    }
    subprocess.run(
        [str(airflow_python.parent / "airflow"), "db", "migrate"],
        env=env,
        check=True,
        capture_output=True,
    )
    started = time.monotonic()
    result = subprocess.run(
        [str(airflow_python), str(RUNNER), str(DAG_FILE), "2026-11-24"],
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    logger.warning("dag.test() took %.0f s", time.monotonic() - started)
    assert result.returncode == 0, result.stderr[-5000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    tasks = outcome["tasks"]
    assert outcome["state"] == "success", (outcome, result.stderr[-5000:])
    steps = ("experiment_id", "etl", "prepare", "plan", "run", "report", "score")
    assert {task: tasks[task]["state"] for task in steps} == dict.fromkeys(steps, "success")
    assert tasks["run"]["try_number"] == 2  # killed once, retried
    assert tasks["etl"]["try_number"] == 1
    # the id went from task to task by XCom
    assert outcome["xcom"]["experiment_id"] == EXPERIMENT
    assert outcome["xcom"]["run"] == EXPERIMENT
    assert outcome["xcom"]["report"].endswith(f"experiments/{EXPERIMENT}/report.html")
    check_outputs(tmp_path, EXPERIMENT, epochs=EPOCHS)

    # one experiment, started once and resumed once: the retry did not restart the search
    assert [path.name for path in (store / "experiments").iterdir()] == [EXPERIMENT]
    events = [
        json.loads(line)
        for line in (store / "experiments" / EXPERIMENT / "events.jsonl").read_text().splitlines()
    ]
    starts = [event for event in events if event["event"] == "experiment_start"]
    assert [start.get("resumed") for start in starts] == [False, True]
    assert [e["trial"] for e in events if e["event"] == "trial_added"] == ["t0000", "t0001"]
    # every finished training unit was kept: none ended twice
    trained = [
        (e["trial"], e["epoch"], e["partition"])
        for e in events
        if e["event"] == "unit_end" and e["kind"] == "train"
    ]
    assert len(trained) == len(set(trained)) == 2 * EPOCHS * 2  # trials x epochs x partitions
    assert "already started: resuming it" in result.stderr + result.stdout
