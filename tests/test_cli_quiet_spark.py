"""The CLI and the jobs/ entry points keep Spark at WARN unless -v (issue 30, part 5).

``spark-submit jobs/run.py`` printed 126 of 142 lines of Spark INFO: its JVM is no
interpreter, so Spark's console threshold does not apply. :func:`quiet_spark` gives the
context Spark starts ``spark.log.level=WARN`` where the user gave none. A real
``spark-submit jobs/score.py`` printing no Spark INFO line: tests/scoring/test_score_job.py.
"""

from __future__ import annotations

import os
import sys

import pytest

from cerebro_spark import cli


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
