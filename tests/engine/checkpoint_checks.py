"""Checks of an experiment's kept checkpoints, from its event log and its store alone."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from cerebro_spark.driver._layout import stored_key
from cerebro_spark.driver._state import epoch_key
from cerebro_spark.engine import ExperimentState, leaderboard_csv, read_events
from cerebro_spark.store import Store, open_store


def experiment(store: Path, name: str) -> tuple[Store, list[dict[str, Any]]]:
    """The root store and the event log of experiment ``name``."""
    root = open_store(str(store))
    return root, read_events(root.child(f"experiments/{name}"))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_checkpoints(store: Path, name: str, metric: str = "accuracy", mode: str = "max") -> Any:
    """Assert every invariant of kept checkpoints; return the state folded from the log.

    Exactly each trial's latest and best checkpoints are kept; the log's last word on each
    trial and ``experiment_end`` point at kept files whose bytes have the recorded
    SHA-256; each best epoch is the first best of its trial's history; ``best.pt`` is the
    best trial's best checkpoint; ``leaderboard.csv`` is rebuilt from the log alone.
    """
    root, events = experiment(store, name)
    prefix = f"experiments/{name}"
    state = ExperimentState.from_events(events)
    kept = set(root.list(f"{prefix}/checkpoints"))
    needed = {k for t in state.trials.values() for k in (t.checkpoint, t.best_checkpoint) if k}
    assert kept == needed, "exactly each trial's latest and best checkpoints are kept"
    epochs = [e for e in events if e["event"] == "trial_epoch"]
    last = {e["trial"]: e for e in epochs}
    for event in last.values():  # the log's last word on each trial points at kept files
        logged = event["best_checkpoint"]
        assert logged is None or not logged.startswith("experiments/")  # relative
        assert logged is None or stored_key(prefix, logged) in kept
    for trial in state.trials.values():
        if trial.best_epoch is None:
            assert all(epoch_key(m, metric, mode) is None for m in trial.history)
            continue
        (at_best,) = [
            e for e in epochs if e["trial"] == trial.trial_id and e["epoch"] == trial.best_epoch
        ]
        assert stored_key(prefix, at_best["checkpoint"]) == trial.best_checkpoint
        assert at_best["checkpoint_sha256"] == trial.best_checkpoint_sha256
        assert sha256(root.get(trial.best_checkpoint)) == trial.best_checkpoint_sha256
        assert trial.best_metrics == at_best["metrics"] == trial.history[trial.best_epoch - 1]
        keys = [epoch_key(m, metric, mode) for m in trial.history]
        best_key = keys[trial.best_epoch - 1]
        assert best_key is not None
        assert all(k is None or k >= best_key for k in keys)  # none better
        assert all(k is None or k > best_key for k in keys[: trial.best_epoch - 1])  # first
    (end,) = [e for e in events if e["event"] == "experiment_end"]
    if end["best_trial"] is not None:
        best = state.trials[end["best_trial"]]
        data = root.get(f"{prefix}/best.pt")
        assert stored_key(prefix, end["best_checkpoint"]) == best.best_checkpoint in kept
        assert sha256(data) == end["best_checkpoint_sha256"] == best.best_checkpoint_sha256
        assert end["best_epoch"] == best.best_epoch
    # The leaderboard is rebuilt from the log alone.
    board = root.get(f"{prefix}/leaderboard.csv").decode()
    assert board == leaderboard_csv(state.trials.values(), metric, mode)
    return state
