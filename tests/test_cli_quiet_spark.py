"""The CLI and the jobs/ entry points keep Spark at WARN unless -v (issue 30, part 5).

``spark-submit jobs/run.py`` printed 126 of 142 lines of Spark INFO: its JVM is no
interpreter, so Spark's console threshold does not apply. :func:`quiet_spark` gives the
context Spark starts ``spark.log.level=WARN`` where the user gave none.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cerebro_spark import cli

ROOT = Path(__file__).resolve().parents[1]
SPARK_INFO = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d INFO ", re.MULTILINE)


@pytest.fixture
def no_submit_args(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process with no Spark: no submit args, no gateway, no context running here.

    The suite's own Spark session may run in this process; these cases are about one
    where none does, so the check for a running context is told there is none.
    """
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.setattr(cli, "_active_spark_context", lambda: None)


def test_a_context_running_here_is_left_alone(
    no_submit_args: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyspark", sys.modules.get("pyspark", sys))
    monkeypatch.setattr(cli, "_active_spark_context", object)  # a context runs
    with cli.quiet_spark():
        assert "PYSPARK_SUBMIT_ARGS" not in os.environ


def test_a_jvm_started_in_the_block_gets_warn_and_the_environment_is_restored(
    no_submit_args: None,
) -> None:
    with cli.quiet_spark():
        assert os.environ["PYSPARK_SUBMIT_ARGS"] == "--conf spark.log.level=WARN pyspark-shell"
    assert "PYSPARK_SUBMIT_ARGS" not in os.environ
    with pytest.raises(RuntimeError, match="boom"), cli.quiet_spark():
        raise RuntimeError("boom")
    assert "PYSPARK_SUBMIT_ARGS" not in os.environ  # restored when the command raised too


def test_verbose_and_the_users_own_submit_args_are_left_alone(
    no_submit_args: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with cli.quiet_spark(verbose=True):
        assert "PYSPARK_SUBMIT_ARGS" not in os.environ
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--conf spark.log.level=DEBUG pyspark-shell")
    with cli.quiet_spark():
        assert os.environ["PYSPARK_SUBMIT_ARGS"] == "--conf spark.log.level=DEBUG pyspark-shell"


@pytest.mark.spark
@pytest.mark.slow
def test_spark_submit_of_a_job_prints_no_spark_info_lines(tmp_path: Path) -> None:
    frame = pd.DataFrame({"a": [float(i) for i in range(40)], "label": [i % 2 for i in range(40)]})
    frame.to_csv(tmp_path / "tiny.csv", index=False)
    env = {
        **os.environ,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    completed = subprocess.run(
        [
            str(Path(sys.executable).with_name("spark-submit")),
            "--master",
            "local[1]",
            "--conf",
            "spark.ui.enabled=false",
            str(ROOT / "jobs/prepare.py"),
            "--input",
            str(tmp_path / "tiny.csv"),
            "--label",
            "label",
            "--partitions",
            "2",
            "--store",
            str(tmp_path / "store"),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert "32 train rows, 8 validation rows, 2 partitions" in completed.stdout
    assert 'Setting Spark log level to "WARN"' in completed.stderr
    # Only the lines SparkContext logs before it reads spark.log.level (its version, the
    # OS, Java): none from the jobs that prepared the data.
    info = SPARK_INFO.findall(completed.stderr)
    assert len(info) <= 5, completed.stderr[-4000:]
