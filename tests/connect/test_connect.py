"""Spark Connect (issue 28), run where it can run: a process of its own.

PySpark refuses a Spark Connect session in a process where a classic session runs
(``SESSION_ALREADY_EXIST``), and once it made one it switches the process's
``pyspark.sql`` functions to Connect (``SPARK_CONNECT_MODE_ENABLED``). So the Connect
cases (``tests/connect/connect_*.py``: the backend contract and what Connect changes, a
search through an ``sc://`` master, the notebook path, the elastic managers) run in a
child pytest against a real Spark Connect server, and this test checks that all of them
ran and passed; then it runs the notebook on the classic session and compares what the
user would see.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from tests.connect.notebook import notebook

pytestmark = [pytest.mark.spark, pytest.mark.torch, pytest.mark.slow]

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
CHILD_TIMEOUT_S = 1500


@pytest.fixture(scope="module")
def connect_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the Connect cases in a child pytest; return its counts, output and report."""
    out = tmp_path_factory.mktemp("connect-run")
    junit = out / "junit.xml"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "python_files=connect_*.py",
            f"--junitxml={junit}",
            f"--basetemp={out / 'tmp'}",
            str(HERE),
        ],
        cwd=ROOT,
        env={**os.environ, "CEREBRO_CONNECT_REPORT": str(out), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )
    suite = ET.parse(junit).getroot().find("testsuite") if junit.exists() else None
    counts = (
        {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        if (suite is not None)
        else {}
    )
    report = out / "notebook.json"
    return {
        "returncode": done.returncode,
        "output": (done.stdout + done.stderr)[-6000:],
        "counts": counts,
        "notebook": json.loads(report.read_text()) if report.exists() else None,
    }


def test_every_connect_case_ran_and_passed(connect_run: dict[str, Any]) -> None:
    counts = connect_run["counts"]
    assert connect_run["returncode"] == 0, connect_run["output"]
    # the backend contract (16), what Connect changes (8), a search, HyperSched's group
    # units, the notebook, the prepare/run/score jobs, the elastic managers (10: refusals,
    # databricks through the REST API, an elastic run growing it, serverless at the
    # capacity as given, run and plan), an executor killed mid-unit on local-cluster (2:
    # the search loses no unit; a retried task of the lost worker is refused and ends)
    assert counts["tests"] >= 40 and counts["failures"] == counts["errors"] == 0, counts
    assert counts["skipped"] == 0, connect_run["output"]


def test_the_notebook_on_connect_sees_what_it_sees_on_classic_spark(
    connect_run: dict[str, Any], spark: Any, tmp_path: Path
) -> None:
    on_connect = connect_run["notebook"]
    assert on_connect is not None, connect_run["output"]
    on_classic = notebook(spark, tmp_path, "classic")
    assert on_classic["backend"] == on_connect["backend"] == "spark"
    for key in ("dataset", "board", "best", "prediction"):
        assert on_connect[key] == on_classic[key], key
