"""End to end on real data: digits, real PyTorch, worker processes, the CLI."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from cerebro_spark.backends import LocalBackend
from cerebro_spark.cli import main
from cerebro_spark.engine import (
    load_state,
    parse_config,
    read_events,
    replay_experiment,
    resume_experiment,
    run_experiment,
)
from cerebro_spark.store import open_store
from tests.engine.checkpoint_checks import check_checkpoints

pytestmark = [pytest.mark.torch, pytest.mark.slow]

SPACE = {
    "choice": [
        {
            "model": "cerebro_spark.training:MLPSpec",
            "hidden_units": {"grid": [[32], [64]]},
            "lr": {"grid": [0.003]},
            "dropout": 0.1,
            "batch_size": 32,
        },
        {
            "model": "cerebro_spark.training:CNNSpec",
            "channels": {"grid": [[8, 16]]},
            "batch_size": 32,
        },
    ]
}


def config_dict(store, **changes):
    raw = {
        "name": "tiny",
        "seed": 7,
        "store": str(store),
        "data": {"source": "sklearn:digits", "partitions": 4},
        "procedure": "grid",
        "epochs": 2,
        "workers": 2,
        "space": SPACE,
    }
    raw.update(changes)
    return raw


def final_digests(result):
    return {t.trial_id: t.checkpoint_sha256 for t in result.trials}


def leaderboard(result):
    return result.store.get(f"experiments/{result.experiment_id}/leaderboard.csv")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tmp_path_factory.mktemp("store")


@pytest.fixture(scope="module")
def reference(store):
    return run_experiment(parse_config(config_dict(store)), experiment_id="reference")


def test_run_produces_leaderboard_events_and_best_checkpoint(reference, store):
    assert len(reference.trials) == 3
    assert all(t.status == "completed" and t.epochs == 2 for t in reference.trials)
    assert reference.best.metrics["accuracy"] > 0.8
    board = leaderboard(reference).decode().splitlines()
    header = board[0].split(",")
    assert header[:6] == ["trial_id", "status", "epochs", "best_epoch", "accuracy", "last_accuracy"]
    assert header[-3:] == ["best_checkpoint", "params", "error"]
    assert {"loss", "f1_macro", "roc_auc", "log_loss", "top5_accuracy"} <= set(header[6:-3])
    assert len(board) == 4
    events = read_events(open_store(str(store)).child("experiments/reference"))
    kinds = [e["event"] for e in events]
    assert kinds[0] == "experiment_start" and kinds[-1] == "experiment_end"
    ends = [e for e in events if e["event"] == "unit_end"]
    # completeness: each trial trains and validates on each partition exactly once per epoch
    assert len(ends) == 3 * 2 * 4 * 2
    keys = {(e["trial"], e["epoch"], e["kind"], e["partition"]) for e in ends}
    assert len(keys) == len(ends)
    assert all(e["seconds"] > 0 and e["rows"] > 0 for e in ends)
    assert all(e["checkpoint_bytes"] > 0 for e in ends if e["kind"] == "train")
    assert open_store(str(store)).exists("experiments/reference/best.pt")
    # only each trial's latest and best checkpoints are kept; best.pt is the best epoch
    state = check_checkpoints(store, "reference")
    kept = open_store(str(store)).list("experiments/reference/checkpoints")
    assert 3 <= len(kept) <= 6 and all(t.best_epoch for t in state.trials.values())


def test_second_run_is_identical(reference, store):
    again = run_experiment(parse_config(config_dict(store)), experiment_id="again")
    assert leaderboard(again) == leaderboard(reference)
    assert final_digests(again) == final_digests(reference)


def test_stored_config_keeps_the_space_order(reference, store):
    from cerebro_spark.engine._api import load_experiment_config

    stored = load_experiment_config(open_store(str(store)), "reference")
    original = parse_config(config_dict(store))
    # the run stores the metric and mode its pre-flight resolved (digits: classification)
    assert (original.metric, original.mode) == (None, None)
    resolved = original.replace(metric="accuracy", mode="max")
    assert json.dumps(stored.to_dict()) == json.dumps(resolved.to_dict())


def test_replay_with_other_worker_count_is_bit_identical(reference, store):
    report = replay_experiment(str(store), "reference", workers=1)
    assert report.identical, report.rows
    assert len(report.rows) == 3


def test_dynamic_visit_order_is_reproduced_by_replay(store):
    config = parse_config(config_dict(store, visit_order="dynamic", epochs=1))
    run_experiment(config, experiment_id="dynamic")
    report = replay_experiment(str(store), "dynamic", workers=3)
    assert report.identical, report.rows


def test_worker_killed_mid_epoch_loses_no_unit(reference, store):
    backends = []

    def factory(config):
        backend = LocalBackend(config.workers)
        backends.append(backend)
        return backend

    def killer():
        events_key = "experiments/killed/events.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            text = (
                open_store(str(store)).get(events_key).decode()
                if open_store(str(store)).exists(events_key)
                else ""
            )
            if text.count('"unit_end"') >= 6 and "w1" in backends[0].workers():  # ready
                backends[0].kill_worker("w1")
                return
            time.sleep(0.05)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    result = run_experiment(
        parse_config(config_dict(store)), experiment_id="killed", backend_factory=factory
    )
    thread.join()
    events = read_events(open_store(str(store)).child("experiments/killed"))
    assert any(e["event"] == "worker_lost" for e in events)
    assert final_digests(result) == final_digests(reference)
    assert leaderboard(result) == leaderboard(reference)


def test_cli_sigkill_then_resume_matches_uninterrupted_run(reference, store, tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(config_dict(store)))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "cerebro_spark.cli", "run", str(path), "--experiment-id", "crashed"],
        env=env,
        start_new_session=True,
    )
    events_file = Path(store) / "experiments/crashed/events.jsonl"
    deadline = time.monotonic() + 180
    try:
        while time.monotonic() < deadline:
            text = events_file.read_text() if events_file.exists() else ""
            if '"round_start"' in text and text.count('"unit_end"') >= 30:
                break
            assert process.poll() is None, "the run ended before it could be killed"
            time.sleep(0.02)
        else:
            pytest.fail("the run never got far enough to be killed")
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    before = [
        json.loads(line)
        for line in events_file.read_text().splitlines()
        if line.strip()[-1:] == "}"
    ]
    finished_before = {
        (e["trial"], e["epoch"], e["kind"], e["partition"])
        for e in before
        if e["event"] == "unit_end"
    }
    assert not any(e["event"] == "experiment_end" for e in before)

    assert main(["resume", str(Path(store) / "experiments/crashed")]) == 0

    _, state = load_state(str(store), "crashed")
    assert state.finished
    after = read_events(open_store(str(store)).child("experiments/crashed"))
    ends = [
        (e["trial"], e["epoch"], e["kind"], e["partition"])
        for e in after
        if e["event"] == "unit_end"
    ]
    assert len(ends) == len(set(ends)) == 3 * 2 * 4 * 2  # no unit redone, none lost
    assert finished_before <= set(ends)
    assert {t: s.checkpoint_sha256 for t, s in state.trials.items()} == final_digests(reference)
    result = resume_experiment(str(store), "crashed")  # a finished experiment stays finished
    assert leaderboard(result) == leaderboard(reference)


def test_a_torn_log_resumes_twice(reference, store):
    """A driver killed mid-append tears the log's last line; before the log repaired its
    tail, the next append landed behind the torn half and every later read failed."""
    shutil.copytree(Path(store) / "experiments/reference", Path(store) / "experiments/torn")
    events_file = Path(store) / "experiments/torn/events.jsonl"
    data = events_file.read_bytes()
    last = data.rstrip(b"\n").rfind(b"\n") + 1
    events_file.write_bytes(data[: last + (len(data) - last) // 2])  # experiment_end, torn
    for _ in range(2):
        result = resume_experiment(str(store), "torn")
        assert leaderboard(result) == leaderboard(reference)
    events = read_events(open_store(str(store)).child("experiments/torn"))
    assert [e["event"] for e in events].count("experiment_end") == 1
    assert all(line.endswith(b"}") for line in events_file.read_bytes().splitlines())
