"""SparkBackend on ``local-cluster[2,1,1024]``: group units across executors, a rank's
executor killed mid-group, and a retire after which releasing the executor re-runs nothing.

The driver runs in a child process (this module, run with ``python -m``): a process has one
SparkContext, and the test process may already hold a local one. The scenarios are in
``cluster_scenarios.py`` (shared with the standalone-cluster tests); executors are killed
through Spark (``killAndReplaceExecutor``: local-cluster starts a replacement).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.backends.cluster_scenarios import (
    check_engine_group,
    check_group_across_executors,
    check_retire,
)

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ["group", "engine_group", "retire"]
CHILD_TIMEOUT_S = 900

pytestmark = [pytest.mark.spark, pytest.mark.torch, pytest.mark.slow]


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("local-cluster")
    report = tmp / "report.json"
    child = subprocess.run(
        [sys.executable, "-m", "tests.backends.test_local_cluster", str(tmp), str(report)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=False,
    )
    output = child.stdout + child.stderr
    tail = "\n".join(line for line in output.splitlines() if " WARN " not in line)[-8000:]
    assert child.returncode == 0 and report.exists(), f"driver failed ({child.returncode}):\n{tail}"
    result: dict[str, Any] = json.loads(report.read_text())
    logging.getLogger(__name__).info("reports: %s", result)
    return result


def scenario(reports: dict[str, Any], name: str) -> dict[str, Any]:
    report: dict[str, Any] = reports[name]
    if "error" in report:
        pytest.fail(f"scenario {name} failed in the driver:\n{report['error']}")
    return report


def test_a_group_unit_spans_two_executors(reports: dict[str, Any]) -> None:
    check_group_across_executors(scenario(reports, "group"))


def test_a_rank_executor_killed_mid_group_fails_the_group_whole(reports: dict[str, Any]) -> None:
    check_engine_group(scenario(reports, "engine_group"))


def test_a_retired_worker_ends_normally_and_its_executor_is_released(
    reports: dict[str, Any],
) -> None:
    check_retire(scenario(reports, "retire"))


# -- the child driver --------------------------------------------------------------------------


def _child_main(tmp: str, report: str) -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(threadName)s %(name)s: %(message)s"
    )
    from cerebro_spark.spark_session import spark_session
    from tests.backends.cluster_scenarios import run_scenarios

    session = spark_session(
        "local-cluster[2,1,1024]",
        "cerebro-local-cluster",
        {
            "spark.ui.enabled": "false",
            "spark.executor.memory": "1g",
            "spark.executor.cores": "1",
            "spark.task.cpus": "1",
            "spark.dynamicAllocation.enabled": "false",
            "spark.executorEnv.PYTHONPATH": str(ROOT),
        },
        preload_torch=True,
    )

    def kill(backend: Any, executor: str) -> None:
        backend._spark_transport.kill_executor(executor)

    try:
        run_scenarios(session, Path(tmp), SCENARIOS, kill, Path(report))
    finally:
        session.stop()


if __name__ == "__main__":
    _child_main(sys.argv[1], sys.argv[2])
