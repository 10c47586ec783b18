"""Best checkpoints kept and recorded by the engine; a search that produced nothing fails.

The engine runs on the real WorkerPool over the in-memory fake transport
(``tests/backends/fake_transport.py``), whose workers "train" by hashing the input
checkpoint read from the store, so a deleted checkpoint that is still needed fails the
run; validation reads the checkpoint too and reports a scripted learning curve: param
``curve`` holds the accuracy after each epoch (``None``: NaN). A test's
:data:`~tests.driver.test_group_failures.Script` says what else a unit does. No torch, no
Spark. Real training is in ``test_best_checkpoints_torch.py``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.backends import WorkerPool
from cerebro_spark.engine import (
    Experiment,
    load_state,
    parse_config,
    replay_experiment,
    resume_experiment,
    run_experiment,
)
from cerebro_spark.errors import SearchFailedError, StoreError, TrialError
from cerebro_spark.search import GridSearch
from cerebro_spark.search._registry import PROCEDURES
from cerebro_spark.store import open_store
from cerebro_spark.units import UnitKind, UnitResult, UnitTask
from tests.backends import fake_transport
from tests.backends.fake_transport import FakeWorker, ThreadTransport
from tests.driver.test_group_failures import Outcome, Script, hook
from tests.engine.checkpoint_checks import check_checkpoints, experiment

CURVES = {"falls": [0.5, 0.9, 0.7], "rises": [0.6, 0.8, 0.85]}


class CurveWorker(FakeWorker):
    """Validation reports ``params["curve"][epoch]`` as accuracy and ``1 - it`` as loss."""

    def metric_sums(self, task: UnitTask) -> dict[str, float]:
        if task.kind is not UnitKind.VALIDATE:
            return super().metric_sums(task)
        curve = task.params["curve"]
        value = curve[min(task.epoch, len(curve) - 1)]
        accuracy = math.nan if value is None else float(value)
        return {"loss": (1.0 - accuracy) * 10, "accuracy": accuracy * 10}  # 10 rows


def curve_pool(script: Script | None = None) -> WorkerPool:
    """Two curve workers on the real pool, whose units play ``script``."""
    fake_transport.SCRIPT.hook = None if script is None else hook(script)
    return WorkerPool(ThreadTransport(CurveWorker), 2, heartbeat_s=0.2, heartbeat_timeout_s=5.0)


@pytest.fixture(autouse=True)
def script() -> Iterator[fake_transport.Script]:
    yield fake_transport.reset()
    fake_transport.reset()


class _DriverKilled(BaseException):
    """Ends the driver as a crash would (after the log lines written so far)."""


class PairedGrid(GridSearch):
    """Grid search whose trials train as data-parallel groups of two (group units)."""

    def resources(self, trial_id: str) -> int:
        return 2


@pytest.fixture(scope="module", autouse=True)
def paired_procedure() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(PROCEDURES, "paired-grid", PairedGrid)
        yield


def config(store: Path, **changes: Any) -> Any:
    raw: dict[str, Any] = {
        "name": "curves",
        "seed": 11,
        "store": str(store),
        "data": {"source": "sklearn:digits", "partitions": 4},
        "procedure": "grid",
        "epochs": 3,
        "workers": 2,
        "model": "tests.engine.free_spec:FreeSpec",  # built once by the pre-flight
        "space": {"curve": {"grid": [CURVES["falls"], CURVES["rises"]]}},
    }
    raw.update(changes)
    return parse_config(raw)


def run(store: Path, name: str, backend: WorkerPool | None = None, **changes: Any) -> Any:
    backend = backend or curve_pool()
    return run_experiment(
        config(store, **changes), experiment_id=name, backend_factory=lambda c: backend
    )


def test_each_trial_keeps_its_best_and_latest_and_best_pt_is_the_best_epoch(
    tmp_path: Path,
) -> None:
    result = run(tmp_path, "curves")
    state = check_checkpoints(tmp_path, "curves")
    falls, rises = state.trials["t0000"], state.trials["t0001"]
    assert (falls.best_epoch, falls.epochs, falls.best_metrics["accuracy"]) == (2, 3, 0.9)
    assert falls.best_checkpoint == "experiments/curves/checkpoints/t0000/e0001-s0003.pt"
    assert falls.checkpoint == "experiments/curves/checkpoints/t0000/e0002-s0003.pt"
    assert (rises.best_epoch, rises.best_checkpoint) == (3, rises.checkpoint)
    assert result.best is falls or result.best.trial_id == "t0000"
    assert [t.trial_id for t in result.trials] == ["t0000", "t0001"]
    root, _ = experiment(tmp_path, "curves")
    assert root.get("experiments/curves/best.pt") == root.get(falls.best_checkpoint)
    assert result.best_checkpoint_url == root.url("experiments/curves/best.pt")
    assert not result.failed
    board = root.get("experiments/curves/leaderboard.csv").decode().splitlines()
    assert board[0].startswith("trial_id,status,epochs,best_epoch,accuracy,last_accuracy,loss,")
    assert board[1].startswith("t0000,completed,3,2,0.9,0.7,")


def test_equal_runs_give_byte_identical_leaderboards(tmp_path: Path) -> None:
    run(tmp_path, "one")
    run(tmp_path, "two")
    root = open_store(str(tmp_path))
    one = root.get("experiments/one/leaderboard.csv")
    assert one == root.get("experiments/two/leaderboard.csv")
    assert b"checkpoints/t0000/e0001-s0003.pt" in one


@pytest.mark.parametrize(
    ("procedure", "space"),
    [
        ("paired-grid", {"curve": {"grid": [CURVES["falls"], CURVES["rises"]]}}),
        (
            {"name": "sha", "num_trials": 4, "eta": 2},
            {"curve": {"choice": [[0.3, 0.6, 0.5], [0.7, 0.2, 0.1], [0.4, 0.5, 0.9]]}},
        ),
        (
            {
                "name": "pbt",
                "population": 4,
                "hyperparam_mutations": {"lr": {"loguniform": [0.001, 0.1]}},
                "quantile": 0.5,
            },
            {
                "lr": {"loguniform": [0.001, 0.1]},
                "curve": {"choice": [[0.3, 0.6, 0.5, 0.2], [0.7, 0.2, 0.1, 0.8], [0.4, None, 0.9]]},
            },
        ),
        (
            {"name": "asha", "num_trials": 6, "eta": 2},
            {"curve": {"choice": [[0.3, 0.6, 0.5], [0.7, 0.2, 0.1], [0.4, 0.5, 0.9]]}},
        ),
        (
            {"name": "hyperband", "eta": 2},
            {"curve": {"choice": [[0.3, 0.6, 0.5], [0.7, 0.2, 0.1], [0.4, 0.5, 0.9]]}},
        ),
    ],
    ids=["groups", "sha-pauses", "pbt-clones", "asha-pauses", "hyperband"],
)
def test_checkpoints_stay_consistent(tmp_path: Path, procedure: Any, space: Any) -> None:
    epochs = 4 if isinstance(procedure, dict) and procedure["name"] == "pbt" else 3
    run(tmp_path, "p", procedure=procedure, space=space, epochs=epochs)
    state = check_checkpoints(tmp_path, "p")
    _, events = experiment(tmp_path, "p")
    if procedure == "paired-grid":
        assert any("group" in e for e in events if e["event"] == "unit_end")
    if isinstance(procedure, dict) and procedure["name"] == "pbt":
        clones = [e for e in events if e["event"] == "trial_added" and e["clone_from"]]
        assert clones, "PBT cloned no trial"
    if isinstance(procedure, dict) and procedure["name"] in ("sha", "asha", "hyperband"):
        assert any(t.status == "stopped" for t in state.trials.values())
        paused = {e["trial"] for e in events if e.get("decision") == "pause"}
        resumed = {e["trial"] for e in events if e["event"] == "trial_resumed"}
        assert paused & resumed, "no trial continued after a pause"


def test_a_killed_driver_resumes_with_its_best_checkpoints(tmp_path: Path) -> None:
    run(tmp_path, "clean")

    backend = curve_pool()
    submit = backend.submit

    def submit_or_die(worker: str, task: UnitTask) -> Future[UnitResult]:
        if task.trial_id == "t0000" and task.epoch == 2 and task.kind is UnitKind.TRAIN:
            raise _DriverKilled  # t0000's best (epoch 2) is older than its latest now
        return submit(worker, task)

    backend.submit = submit_or_die  # type: ignore[method-assign]
    with pytest.raises(_DriverKilled):
        run(tmp_path, "killed", backend)
    _, state = load_state(str(tmp_path), "killed")
    assert state.trials["t0000"].best_epoch == 2 and not state.finished
    resume_experiment(str(tmp_path), "killed", backend_factory=lambda c: curve_pool())
    check_checkpoints(tmp_path, "killed")
    root = open_store(str(tmp_path))
    assert root.get("experiments/killed/leaderboard.csv") == root.get(
        "experiments/clean/leaderboard.csv"
    )
    assert root.get("experiments/killed/best.pt") == root.get("experiments/clean/best.pt")


def strip_best_fields(store: Path, name: str) -> None:
    """Rewrite a log as the engine before best checkpoints wrote it."""
    path = store / "experiments" / name / "events.jsonl"
    lines = []
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if event["event"] in ("trial_epoch", "experiment_end"):
            for field in ("best_epoch", "best_checkpoint", "best_checkpoint_sha256", "failed"):
                event.pop(field, None)
        lines.append(json.dumps(event, separators=(",", ":")))
    path.write_text("\n".join(lines) + "\n")


def test_a_log_written_before_best_checkpoints_folds_resumes_and_replays(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    run(tmp_path, "new")
    strip_best_fields(tmp_path, "new")
    _, old = load_state(str(tmp_path), "new")
    # The best epochs come back from the history; that of t0000 (epoch 2, not its latest)
    # is unknown to such a log's engine, which kept the latest only.
    assert {t: (s.best_epoch, s.best_metrics["accuracy"]) for t, s in old.trials.items()} == {
        "t0000": (2, 0.9),
        "t0001": (3, 0.85),
    }
    assert old.trials["t0000"].best_checkpoint is None
    assert old.trials["t0001"].best_checkpoint == old.trials["t0001"].checkpoint

    emit = Experiment._emit
    third_epoch: set[str] = set()

    def emit_then_die(self: Experiment, event: str, **fields: Any) -> None:
        emit(self, event, **fields)
        if event == "unit_end" and fields["kind"] == "train" and fields["epoch"] == 2:
            third_epoch.add(fields["trial"])
            if len(third_epoch) == 2:
                raise _DriverKilled  # both trials have trained past their 2nd epoch

    with monkeypatch.context() as patch:
        patch.setattr(Experiment, "_emit", emit_then_die)
        with pytest.raises(_DriverKilled):
            run(tmp_path, "old")
    strip_best_fields(tmp_path, "old")
    # The old engine deleted t0000's best (epoch 2) checkpoint when it trained past it.
    _, killed = load_state(str(tmp_path), "old")
    assert killed.trials["t0000"].best_epoch == 2
    assert killed.trials["t0000"].best_checkpoint is None
    assert killed.trials["t0001"].best_checkpoint is None  # epoch 2, also trained past
    caplog.set_level(logging.WARNING, "cerebro_spark")
    result = resume_experiment(str(tmp_path), "old", backend_factory=lambda c: curve_pool())
    best = result.best
    assert best is not None and (best.trial_id, best.best_epoch) == ("t0000", 2)
    assert best.best_checkpoint is None  # lost before the resume: best.pt is the latest
    root = open_store(str(tmp_path))
    assert root.get("experiments/old/best.pt") == root.get(best.checkpoint or "")
    assert "was not kept" in caplog.text
    report = replay_experiment(str(tmp_path), "old", backend_factory=lambda c: curve_pool())
    assert report.identical, report.rows


def fail_every_train_unit(worker: str, task: UnitTask) -> Outcome:
    if task.kind is UnitKind.TRAIN:
        return Outcome(TrialError(f"trial {task.trial_id}: build_model raised ValueError: bad"))
    return Outcome()


def test_a_search_whose_every_trial_failed_raises_after_writing_everything(
    tmp_path: Path,
) -> None:
    with pytest.raises(SearchFailedError) as caught:
        run(tmp_path, "doomed", curve_pool(fail_every_train_unit))
    error = caught.value
    root, events = experiment(tmp_path, "doomed")
    failed = [e["trial"] for e in events if e["event"] == "trial_failed"]
    assert sorted(failed) == ["t0000", "t0001"]
    first = failed[0]
    assert str(error).startswith("every trial of experiment doomed failed (2 trials); ")
    assert f"the first failure: trial {first}: trial {first}: build_model raised" in str(error)
    assert error.experiment_id == "doomed" and error.url == root.url("experiments/doomed")
    assert [f[0] for f in error.failures] == failed
    assert {t.trial_id for t in error.trials} == {"t0000", "t0001"}
    # Nothing is lost: the log ends, the leaderboard shows the errors; there is no best.
    end = events[-1]
    assert end["event"] == "experiment_end" and end["best_trial"] is None and end["failed"] == 2
    board = root.get("experiments/doomed/leaderboard.csv").decode().splitlines()
    assert len(board) == 3 and all(",failed,0,,,," in line for line in board[1:])
    assert all("build_model raised ValueError: bad" in line for line in board[1:])
    assert not root.exists("experiments/doomed/best.pt")
    with pytest.raises(SearchFailedError, match="every trial of experiment doomed failed"):
        resume_experiment(str(tmp_path), "doomed", backend_factory=lambda c: curve_pool())


def test_some_failed_trials_leave_a_result_and_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def fail_one(worker: str, task: UnitTask) -> Outcome:
        if task.trial_id == "t0001" and task.epoch == 1 and task.kind is UnitKind.TRAIN:
            return Outcome(TrialError("diverged"))
        return Outcome()

    caplog.set_level(logging.WARNING, "cerebro_spark")
    result = run(tmp_path, "partial", curve_pool(fail_one))
    assert [t.trial_id for t in result.failed] == ["t0001"]
    assert result.best is not None and result.best.trial_id == "t0000"
    assert "1 of 2 trials failed (the first: trial t0001: diverged)" in caplog.text
    state = check_checkpoints(tmp_path, "partial")
    failed = state.trials["t0001"]
    assert failed.status == "failed" and failed.best_epoch == 1  # its best checkpoint stays


def test_a_search_in_which_no_trial_reported_a_finite_metric_fails(tmp_path: Path) -> None:
    space = {"curve": {"grid": [[None, None, None]]}}
    with pytest.raises(SearchFailedError, match="no trial of experiment nan reported a finite acc"):
        run(tmp_path, "nan", space=space)
    check_checkpoints(tmp_path, "nan")


def test_a_failure_in_a_round_the_driver_died_in_is_told_again_on_resume(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    procedure = {"name": "sha", "num_trials": 4, "eta": 2}
    space = {"curve": {"choice": [[0.3, 0.6, 0.5], [0.7, 0.2, 0.1], [0.4, 0.5, 0.9]]}}

    def fail(worker: str, task: UnitTask) -> Outcome:
        if task.trial_id == "t0001" and task.kind is UnitKind.TRAIN:
            return Outcome(TrialError("boom"))
        return Outcome()

    fail_trial = Experiment._fail_trial

    def fail_then_die(self: Experiment, *args: Any) -> None:
        fail_trial(self, *args)
        raise _DriverKilled  # the failure is logged; the round is not over

    with monkeypatch.context() as patch:
        patch.setattr(Experiment, "_fail_trial", fail_then_die)
        with pytest.raises(_DriverKilled):
            run(tmp_path, "sha", curve_pool(fail), procedure=procedure, space=space)
    _, state = load_state(str(tmp_path), "sha")
    assert state.round_open and state.trials["t0001"].status == "failed"
    caplog.set_level(logging.WARNING, "cerebro_spark")
    result = resume_experiment(str(tmp_path), "sha", backend_factory=lambda c: curve_pool())
    assert "suggested no trial" not in caplog.text  # the rung was decided without t0001
    assert any(t.status == "completed" and t.epochs == 3 for t in result.trials)
    assert "1 of 4 trials failed (the first: trial t0001: boom)" in caplog.text
    check_checkpoints(tmp_path, "sha")


def test_a_best_checkpoint_changed_after_it_was_written_is_refused(tmp_path: Path) -> None:
    best_key = "experiments/tampered/checkpoints/t0000/e0001-s0003.pt"
    root = open_store(str(tmp_path))

    def tamper(worker: str, task: UnitTask) -> Outcome:
        if task.epoch == 2 and task.kind is UnitKind.VALIDATE:
            root.put(best_key, b"not the bytes the log recorded")
        return Outcome()

    with pytest.raises(StoreError, match=r"but the event log recorded [0-9a-f]{64} for it"):
        run(tmp_path, "tampered", curve_pool(tamper))
    assert root.exists("experiments/tampered/leaderboard.csv")  # written before the check
    assert not root.exists("experiments/tampered/best.pt")
