"""The cron recipe (schedulers/cron/nightly.sh): twice at once, logs rotated, failing fast."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from pipeline_helpers import ROOT, check_outputs, pipeline_env, requires_report

SCRIPT = ROOT / "schedulers" / "cron" / "nightly.sh"
STEPS = ROOT / "schedulers" / "steps.sh"
EXIT_LOCKED = 75


def _wait_for_lock_holder(lock: Path, process: subprocess.Popen[str], timeout: float) -> str:
    """The first run's line in the lock file, once it holds the lock."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if lock.exists() and lock.read_text().startswith("pid "):
            return lock.read_text()
        if process.poll() is not None:
            raise AssertionError(f"the first run ended early: {process.communicate()}")
        time.sleep(0.05)
    raise AssertionError(f"the first run did not take {lock} in {timeout} s")


@pytest.mark.spark
@pytest.mark.torch
@pytest.mark.slow
@requires_report
def test_two_nights_at_once_one_runs_the_pipeline_the_other_exits_75(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    old = [logs / f"nightly-2026010{day}T020000Z.log" for day in range(1, 6)]
    for path in old:
        path.write_text("an old night\n")
    env = pipeline_env(
        tmp_path,
        CEREBRO_LOG_DIR=str(logs),
        CEREBRO_KEEP_LOGS="3",
        CEREBRO_EXPERIMENT_ID="nightly-20261124",
    )
    first = subprocess.Popen(
        ["bash", str(SCRIPT)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group: a failed test stops every step it started
    )
    try:
        holder = _wait_for_lock_holder(logs / "nightly.lock", first, timeout=60)
        assert f"pid {first.pid} " in holder
        second = subprocess.run(
            ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60
        )
        assert first.poll() is None, "the second run must have overlapped the first"
        assert second.returncode == EXIT_LOCKED, second
        assert "another nightly run holds" in second.stderr
        assert f"pid {first.pid}" in second.stderr  # says who holds it
        assert second.stdout == ""
        out, err = first.communicate(timeout=540)
    finally:
        if first.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(first.pid, signal.SIGKILL)
            first.communicate()
    assert first.returncode == 0, (out, err)
    for step in ("etl", "prepare", "plan", "run", "report", "score"):
        assert f"nightly.sh: {step} done in" in out
    check_outputs(tmp_path, "nightly-20261124")

    # rotation: the newest 3 logs stay (this night's included); the refused run wrote none
    kept = sorted(path.name for path in logs.glob("nightly-*.log"))
    assert len(kept) == 3
    assert kept[:2] == [old[3].name, old[4].name]
    latest = logs / "latest.log"
    assert latest.is_symlink() and os.readlink(latest) == kept[2]
    text = latest.read_text()
    assert "=== " in text and "dataset " in text and '"feasible": true' in text

    # a second try the same night resumes the experiment instead of refusing its id
    again = subprocess.run(
        ["bash", str(STEPS), "run"], env=env, capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, again
    assert again.stdout.strip().splitlines()[-1] == "nightly-20261124"
    assert "already started: resuming it" in again.stderr
    assert "already finished" in again.stderr


def test_a_failing_step_stops_the_night_with_its_status(tmp_path: Path) -> None:
    env = pipeline_env(tmp_path, CEREBRO_LOG_DIR=str(tmp_path / "logs"))
    env["CEREBRO_SOURCE"] = "sklearn:no_such_data"
    result = subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result
    assert "nightly.sh: step etl failed with status 2" in result.stdout
    assert "prepare" not in result.stdout
    log = (tmp_path / "logs" / "latest.log").read_text()
    assert "unknown source 'sklearn:no_such_data'" in log
    assert not (tmp_path / "store").exists()
    # the lock is free again: flock is released with the process
    relock = subprocess.run(["flock", "-n", str(tmp_path / "logs" / "nightly.lock"), "true"])
    assert relock.returncode == 0


def test_plan_stops_the_pipeline_when_the_deadline_cannot_be_met(tmp_path: Path) -> None:
    env = pipeline_env(tmp_path, CEREBRO_DEADLINE="1")
    result = subprocess.run(
        ["bash", str(STEPS), "plan"], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result
    assert '"feasible": false' in result.stdout
    assert "deadline" in result.stderr


def test_bad_settings_are_refused_by_name(tmp_path: Path) -> None:
    env = pipeline_env(tmp_path, CEREBRO_KEEP_LOGS="none", CEREBRO_LOG_DIR=str(tmp_path))
    result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True)
    assert result.returncode == 2
    assert "CEREBRO_KEEP_LOGS must be a whole number >= 1, got 'none'" in result.stderr
    step = subprocess.run(["bash", str(STEPS), "train"], env=env, capture_output=True, text=True)
    assert step.returncode == 2
    assert "unknown step 'train'" in step.stderr
