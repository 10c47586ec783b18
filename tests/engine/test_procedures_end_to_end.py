"""Early-stopping procedures through the real engine: decisions, pauses, resume mid-search."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from cerebro_spark.cli import main
from cerebro_spark.engine import load_state, parse_config, read_events, run_experiment
from cerebro_spark.store import open_store

pytestmark = [pytest.mark.torch, pytest.mark.slow]

SPACE = {
    "model": "cerebro_spark.training:MLPSpec",
    "hidden_units": {"choice": [[16], [32], [64]]},
    "lr": {"loguniform": [1.0e-3, 1.0e-2]},
    "batch_size": 64,
}


def asha_config(store, **changes):
    raw = {
        "name": "asha",
        "seed": 5,
        "store": str(store),
        "data": {"source": "sklearn:digits", "partitions": 2},
        "procedure": {"name": "asha", "num_trials": 6, "eta": 3},
        "epochs": 3,
        "workers": 2,
        "space": SPACE,
    }
    raw.update(changes)
    return raw


def test_asha_promotes_the_top_third_and_stops_the_rest(tmp_path):
    result = run_experiment(parse_config(asha_config(tmp_path)), experiment_id="asha")
    epochs = sorted(t.epochs for t in result.trials)
    assert len(result.trials) == 6
    assert epochs.count(3) >= 1 and epochs.count(1) >= 3
    assert all(t.status in ("completed", "stopped") for t in result.trials)
    events = read_events(open_store(str(tmp_path)).child("experiments/asha"))
    assert {e["decision"] for e in events if e["event"] == "decision"} >= {
        "continue",
        "pause",
        "stop",
    }


def test_resume_mid_search_matches_an_uninterrupted_run(tmp_path):
    reference = run_experiment(parse_config(asha_config(tmp_path)), experiment_id="whole")
    path = tmp_path / "asha.yaml"
    path.write_text(yaml.safe_dump(asha_config(tmp_path)))
    process = subprocess.Popen(
        [sys.executable, "-m", "cerebro_spark.cli", "run", str(path), "--experiment-id", "cut"],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    )
    events_file = Path(tmp_path) / "experiments/cut/events.jsonl"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            text = events_file.read_text() if events_file.exists() else ""
            if text.count('"round_end"') >= 2 and text.count('"unit_end"') >= 30:
                break
            assert process.poll() is None, "the run ended before it could be killed"
            time.sleep(0.02)
        else:
            pytest.fail("the run never got far enough to be killed")
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert main(["resume", str(Path(tmp_path) / "experiments/cut")]) == 0
    _, state = load_state(str(tmp_path), "cut")
    assert state.finished
    # the procedure's state went into the log as snapshots and deltas; resumed from both
    assert '"procedure_state_delta"' in events_file.read_text()
    expected = {t.trial_id: (t.status, t.epochs, t.checkpoint_sha256) for t in reference.trials}
    got = {t: (s.status, s.epochs, s.checkpoint_sha256) for t, s in state.trials.items()}
    assert got == expected
