"""The Airflow DAG (schedulers/airflow/cerebro_nightly.py) under Airflow's own ``dag.test()``.

Airflow lives in a virtual environment of its own (``conftest.py``: installed with uv,
pinned, cached in pytest's cache directory, begun in the background once collection is
done). The DAG's tasks call the project's CLI through schedulers/steps.sh; the first try of
``run`` is killed like a dying driver once its experiment started, and the retry must
resume that experiment rather than start another.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from pipeline_helpers import (
    BIN,
    ROOT,
    Airflow,
    airflow_env,
    check_outputs,
    pipeline_env,
    requires_report,
    write_config,
)

pytestmark = [pytest.mark.spark, pytest.mark.torch, pytest.mark.slow, requires_report]

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


def test_dag_runs_every_step_and_its_retry_resumes_the_search(
    tmp_path: Path, airflow: Airflow
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
    home = tmp_path / "airflow"
    home.mkdir()
    shutil.copyfile(airflow.database, home / "airflow.db")  # `airflow db migrate`d
    env = {
        **airflow_env(home),
        "AIRFLOW_VAR_CEREBRO_SPARK": json.dumps(settings),
        "CEREBRO_RETRIES": "1",
        "CEREBRO_RETRY_DELAY_SECONDS": "0",
    }
    started = time.monotonic()
    result = subprocess.run(
        [str(airflow.python), str(RUNNER), str(DAG_FILE), "2026-11-24"],
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
