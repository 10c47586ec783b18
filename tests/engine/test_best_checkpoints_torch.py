"""Best checkpoints and failed searches with real training: digits, PyTorch, worker
processes, the CLI and ``jobs/run.py``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from cerebro_spark.data import read_manifest, read_partition
from cerebro_spark.engine import parse_config, run_experiment
from cerebro_spark.errors import SearchFailedError
from cerebro_spark.training import decode_checkpoint
from tests.engine.checkpoint_checks import check_checkpoints, experiment
from tests.engine.outcome_specs import TRAINING_FAILURE, DivergingSpec

pytestmark = [pytest.mark.torch, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DIVERGING = "tests.engine.outcome_specs:DivergingSpec"
FAILING = "tests.engine.outcome_specs:FailsInTrainingSpec"


def config_dict(store: Path, model: str | None, **changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "name": "best",
        "seed": 3,
        "store": str(store),
        "data": {"source": "sklearn:digits", "partitions": 2},
        "procedure": "grid",
        "epochs": 3,
        "workers": 2,
        "model": model,
        # raw inputs: the jump in lr wrecks the model (standardized, it survives the jump)
        "space": {
            "hidden_units": {"grid": [[32], [64]]},
            "lr": 0.003,
            "batch_size": 32,
            "standardize": False,
        },
    }
    raw.update(changes)
    return {k: v for k, v in raw.items() if v is not None}


def evaluate(store: Path, name: str, key: str, params: dict[str, Any]) -> float:
    """Accuracy of a checkpoint on the whole validation split, computed here."""
    root, events = experiment(store, name)
    (dataset,) = [e for e in events if e["event"] == "dataset"]
    manifest = read_manifest(dataset["uri"])
    spec = DivergingSpec()
    model = spec.build_model(params, manifest.info)
    model.load_state_dict(decode_checkpoint(root.get(key))["model"])
    model.eval()
    correct = rows = 0
    for index in range(manifest.num_partitions):
        data = read_partition(dataset["uri"], "validation", index, manifest=manifest)
        features, labels = spec.transform(*data.tensors())  # as the units do
        with torch.no_grad():
            predicted = model(features).argmax(dim=1)
        correct += int((predicted == labels).sum())
        rows += len(labels)
    return correct / rows


def test_best_pt_is_the_best_epoch_not_the_last(tmp_path: Path) -> None:
    result = run_experiment(parse_config(config_dict(tmp_path, DIVERGING)), experiment_id="lr")
    state = check_checkpoints(tmp_path, "lr")
    for trial in state.trials.values():  # it learned, then the jump in lr wrecked it
        assert trial.epochs == 3 and trial.best_epoch == 1
        assert trial.best_metrics["accuracy"] > trial.metrics["accuracy"] + 0.2
    best = result.best
    assert best is not None and best.best_checkpoint is not None
    root, _ = experiment(tmp_path, "lr")
    params = {k: v for k, v in best.params.items() if k != "model"}
    # best.pt is the best epoch: evaluated here, it scores what that epoch reported (to
    # float32 rounding of batch means, far below one row in 359).
    assert evaluate(tmp_path, "lr", "experiments/lr/best.pt", params) == pytest.approx(
        best.best_metrics["accuracy"], abs=1e-6
    )
    assert best.checkpoint is not None
    assert evaluate(tmp_path, "lr", best.checkpoint, params) == pytest.approx(
        best.metrics["accuracy"], abs=1e-6
    )
    assert len(root.list("experiments/lr/checkpoints")) == 4  # 2 trials x (best, latest)


def write_config(tmp_path: Path, model: str | None, **changes: Any) -> Path:
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(config_dict(tmp_path / "store", model, **changes)))
    return path


def start(*args: str, script: str = "-m cerebro_spark.cli") -> subprocess.Popen[str]:
    """Start the CLI (or ``script``) in ``ROOT`` with ``args``; its output piped."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.Popen(
        [sys.executable, *script.split(), *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    """Wait at most 300 s for a process from :func:`start`; kill it if it still runs."""
    try:
        stdout, stderr = process.communicate(timeout=300)
    finally:
        process.kill()
        process.wait()
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def cli(*args: str, script: str = "-m cerebro_spark.cli") -> subprocess.CompletedProcess[str]:
    return finish(start(*args, script=script))


def test_every_trial_failing_raises_from_the_python_api(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(SearchFailedError) as caught:
        run_experiment(parse_config(config_dict(tmp_path, FAILING)), experiment_id="doomed")
    message = str(caught.value)
    assert message.startswith("every trial of experiment doomed failed (2 trials); ")
    first = caught.value.failures[0][0]
    assert f"the first failure: trial {first}: " in message and TRAINING_FAILURE in message
    assert time.monotonic() - started < 120
    root, events = experiment(tmp_path, "doomed")
    assert events[-1]["event"] == "experiment_end"
    board = root.get("experiments/doomed/leaderboard.csv").decode()
    assert board.count(TRAINING_FAILURE) == 2


def test_the_cli_and_the_job_exit_non_zero_when_every_trial_failed(tmp_path: Path) -> None:
    path = write_config(tmp_path, FAILING)
    (tmp_path / "job").mkdir()
    job_path = write_config(tmp_path / "job", FAILING)  # its own store: the two run at once
    running = start("run", str(path), "--experiment-id", "cli")
    job_running = start(str(job_path), "--experiment-id", "job", script=str(ROOT / "jobs/run.py"))
    try:
        run = finish(running)
        assert run.returncode == 3, run.stderr[-3000:]
        assert "every trial of experiment cli failed (2 trials); the first failure: trial t000" in (
            run.stderr
        )
        assert TRAINING_FAILURE in run.stderr
        assert run.stdout.count("error: ") == 2  # the table shows each trial's error
        resumed = cli("resume", str(tmp_path / "store" / "experiments" / "cli"))
        assert resumed.returncode == 3 and "every trial of experiment cli failed" in resumed.stderr
        job = finish(job_running)
    finally:
        job_running.kill()
        job_running.wait()
    assert job.returncode == 3, job.stderr[-3000:]
    assert "every trial of experiment job failed" in job.stderr


def test_some_failed_trials_exit_zero_and_say_so(tmp_path: Path) -> None:
    space = {
        "model": {"choice": ["cerebro_spark.training:MLPSpec", FAILING]},
        "hidden_units": [32],
        "batch_size": 32,
    }
    path = write_config(tmp_path, None, space=space, epochs=1, procedure="grid")
    run = cli("run", str(path), "--experiment-id", "half")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "1 of 2 trials failed" in run.stdout and "1 of 2 trials failed" in run.stderr
    assert "best: trial t0000, epoch 1, accuracy " in run.stdout
    state = check_checkpoints(tmp_path / "store", "half")
    assert {t.trial_id: t.status for t in state.trials.values()} == {
        "t0000": "completed",
        "t0001": "failed",
    }
    assert np.isfinite(state.trials["t0000"].best_metrics["accuracy"])
