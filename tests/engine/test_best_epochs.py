"""Best epochs: which epoch is best, how the log records and folds it (old logs too), and
the leaderboard built from it. Pure: synthetic events, no backend, no torch."""

from __future__ import annotations

import math
import pickle
from typing import Any

import pytest

from cerebro_spark.driver._state import epoch_key, improves
from cerebro_spark.engine import (
    ExperimentState,
    best_trial,
    format_table,
    leaderboard_csv,
    leaderboard_rows,
    rank,
)
from cerebro_spark.errors import CerebroError, SearchFailedError

CK = "experiments/e/checkpoints"


def added(trial: str, **params: Any) -> dict[str, Any]:
    return {
        "event": "trial_added",
        "trial": trial,
        "params": params,
        "seed": 1,
        "spec": "pkg.models:MLPSpec",
        "clone_from": None,
    }


def epoch(trial: str, number: int, metrics: dict[str, float], **best: Any) -> dict[str, Any]:
    """A ``trial_epoch``; ``best`` holds the ``best_*`` fields (none: an old log's event)."""
    return {
        "event": "trial_epoch",
        "round": number - 1,
        "trial": trial,
        "epoch": number,
        "metrics": metrics,
        "checkpoint": f"{CK}/{trial}/e{number - 1:04d}-s0001.pt",
        "checkpoint_sha256": f"sha-{trial}-{number}",
        **best,
    }


def recorded(trial: str, number: int, metrics: dict[str, float], best: int) -> dict[str, Any]:
    return epoch(
        trial,
        number,
        metrics,
        best_epoch=best,
        best_checkpoint=f"{CK}/{trial}/e{best - 1:04d}-s0001.pt",
        best_checkpoint_sha256=f"sha-{trial}-{best}",
    )


def trained(trial: str, number: int) -> dict[str, Any]:
    """The ``unit_end`` of the last train unit of a trial's epoch ``number``."""
    return {
        "event": "unit_end",
        "trial": trial,
        "partition": 1,
        "kind": "train",
        "step": 1,
        "checkpoint": f"{CK}/{trial}/e{number - 1:04d}-s0001.pt",
        "checkpoint_sha256": f"sha-{trial}-{number}",
        "metric_sums": {"loss": 1.0},
        "rows": 1,
    }


def old_epochs(trial: str, *values: float) -> list[dict[str, Any]]:
    """An old log's events of a trial's epochs with these accuracies."""
    return [
        event
        for number, value in enumerate(values, start=1)
        for event in (trained(trial, number), epoch(trial, number, {"accuracy": value}))
    ]


def start(metric: str = "accuracy", mode: str = "max") -> dict[str, Any]:
    return {"event": "experiment_start", "config": {"metric": metric, "mode": mode}}


# -- which epoch is best ------------------------------------------------------------------


def test_epoch_key_orders_by_metric_then_loss() -> None:
    assert epoch_key({"accuracy": 0.9, "loss": 0.3}, "accuracy", "max") == (-0.9, 0.3)
    assert epoch_key({"rmse": 2.0}, "rmse", "min") == (2.0, math.inf)
    assert epoch_key({"accuracy": math.nan}, "accuracy", "max") is None
    assert epoch_key({"loss": 1.0}, "accuracy", "max") is None
    assert epoch_key({"accuracy": 0.5, "loss": math.nan}, "accuracy", "max") == (-0.5, math.inf)


@pytest.mark.parametrize(
    ("new", "old", "mode", "expected"),
    [
        ({"a": 0.9}, None, "max", True),
        ({"a": 0.9}, {"a": 0.8}, "max", True),
        ({"a": 0.7}, {"a": 0.8}, "max", False),
        ({"a": 0.7}, {"a": 0.8}, "min", True),
        ({"a": 0.8, "loss": 0.1}, {"a": 0.8, "loss": 0.2}, "max", True),  # tie: lower loss
        ({"a": 0.8, "loss": 0.2}, {"a": 0.8, "loss": 0.2}, "max", False),  # tie: earlier
        ({"a": 0.8}, {"a": 0.8, "loss": 0.2}, "max", False),  # no loss ranks after a loss
        ({"a": math.nan}, None, "max", False),  # never a best
        ({"a": math.inf}, None, "max", False),
        ({"a": 0.1}, {"a": math.nan}, "max", True),
    ],
)
def test_improves(new: dict[str, float], old: Any, mode: str, expected: bool) -> None:
    assert improves(new, old, "a", mode) is expected


# -- folding ------------------------------------------------------------------------------


def test_recorded_best_is_folded_with_its_metrics_from_the_history() -> None:
    log = [
        added("t0"),
        recorded("t0", 1, {"accuracy": 0.5}, best=1),
        recorded("t0", 2, {"accuracy": 0.9, "loss": 0.2}, best=2),
        recorded("t0", 3, {"accuracy": 0.7, "loss": 0.4}, best=2),
    ]
    trial = ExperimentState.from_events(log).trials["t0"]
    assert trial.epochs == 3 and trial.metrics == {"accuracy": 0.7, "loss": 0.4}
    assert trial.best_epoch == 2
    assert trial.best_metrics == {"accuracy": 0.9, "loss": 0.2}
    assert trial.best_checkpoint == f"{CK}/t0/e0001-s0001.pt"
    assert trial.best_checkpoint_sha256 == "sha-t0-2"
    assert trial.needs(f"{CK}/t0/e0001-s0001.pt")  # the best is kept
    assert not trial.needs(f"{CK}/t0/e0000-s0001.pt")


def test_a_recorded_null_best_means_no_finite_metric_yet() -> None:
    log = [added("t0"), epoch("t0", 1, {"accuracy": math.nan}, best_epoch=None)]
    trial = ExperimentState.from_events(log).trials["t0"]
    assert trial.best_epoch is None and trial.best_metrics == {} and trial.best_checkpoint is None


def test_an_old_log_derives_the_best_from_the_history() -> None:
    # Written before trial_epoch recorded the best: its engine kept only the latest
    # checkpoint, so a best epoch that is not the latest has no checkpoint any more.
    log = [
        start("accuracy", "max"),
        added("t0"),
        added("t1"),
        *old_epochs("t0", 0.5, 0.9, 0.7),
        *old_epochs("t1", 0.4, 0.6),
        trained("t1", 3),  # a unit of its 3rd epoch: it moved past its best
        added("t2"),
        *old_epochs("t2", 0.3, 0.8),
    ]
    state = ExperimentState.from_events(log)
    t0, t1, t2 = state.trials["t0"], state.trials["t1"], state.trials["t2"]
    assert (t0.best_epoch, t0.best_metrics, t0.best_checkpoint) == (2, {"accuracy": 0.9}, None)
    assert t0.best_checkpoint_sha256 is None
    assert (t1.best_epoch, t1.best_metrics, t1.best_checkpoint) == (2, {"accuracy": 0.6}, None)
    assert (t2.best_epoch, t2.best_checkpoint) == (2, f"{CK}/t2/e0001-s0001.pt")
    assert t2.best_checkpoint_sha256 == "sha-t2-2"
    ranked = rank(state.trials.values(), "accuracy", "max")
    assert [t.trial_id for t in ranked] == ["t0", "t2", "t1"]


def test_an_old_log_uses_its_own_mode() -> None:
    log = [
        start("loss", "min"),
        added("t0"),
        trained("t0", 1),
        epoch("t0", 1, {"loss": 0.5}),
        trained("t0", 2),
        epoch("t0", 2, {"loss": 0.9}),
    ]
    trial = ExperimentState.from_events(log).trials["t0"]
    assert trial.best_epoch == 1 and trial.best_checkpoint is None


def test_a_resumed_old_log_goes_on_with_recorded_fields() -> None:
    log = [
        start(),
        added("t0"),
        epoch("t0", 1, {"accuracy": 0.5}),  # old engine
        start(),  # resumed by this one
        recorded("t0", 2, {"accuracy": 0.8}, best=2),
    ]
    trial = ExperimentState.from_events(log).trials["t0"]
    assert trial.best_epoch == 2 and trial.best_metrics == {"accuracy": 0.8}


def test_failures_keep_their_order() -> None:
    log = [
        added("t0"),
        added("t1"),
        {"event": "trial_failed", "trial": "t1", "error": "second-born, first to fail"},
        {"event": "trial_failed", "trial": "t0", "error": "boom"},
    ]
    assert ExperimentState.from_events(log).failures == ["t1", "t0"]


# -- the leaderboard ----------------------------------------------------------------------


def board_state() -> ExperimentState:
    return ExperimentState.from_events(
        [
            added("t3", lr=0.3),
            added("t2", lr=0.2),
            added("t1", lr=0.1),
            added("t0", lr=0.0),
            added("t4", lr=0.4),
            added("t5", lr=0.5),
            # t1 and t2 tie on accuracy: t2's lower loss wins; t3 ties t2 entirely: id.
            recorded("t1", 1, {"accuracy": 0.9, "loss": 0.3, "f1": 0.8}, best=1),
            recorded("t1", 2, {"accuracy": 0.6, "loss": 0.9, "f1": 0.5}, best=1),
            recorded("t2", 1, {"accuracy": 0.9, "loss": 0.2, "f1": 0.7}, best=1),
            recorded("t3", 1, {"accuracy": 0.9, "loss": 0.2, "f1": 0.7}, best=1),
            recorded("t0", 1, {"accuracy": 0.95, "loss": 0.1, "f1": 0.9}, best=1),
            {"event": "trial_failed", "trial": "t0", "error": "CUDA out of\nmemory"},
            epoch("t4", 1, {"accuracy": math.nan, "loss": math.nan}, best_epoch=None),
        ]
    )


def test_rank_best_first_ties_by_loss_then_id_failed_last() -> None:
    state = board_state()
    ranked = rank(state.trials.values(), "accuracy", "max")
    # t0 has the best value but failed: last. t4 (NaN) and t5 (no epoch) have no value.
    assert [t.trial_id for t in ranked] == ["t2", "t3", "t1", "t4", "t5", "t0"]
    best = best_trial(ranked)
    assert best is not None and best.trial_id == "t2"


def test_leaderboard_rows_show_best_last_other_metrics_and_errors() -> None:
    rows = leaderboard_rows(board_state().trials.values(), "accuracy", "max")
    assert list(rows[0]) == [
        "trial_id",
        "status",
        "epochs",
        "best_epoch",
        "accuracy",
        "last_accuracy",
        "f1",
        "loss",
        "best_checkpoint",
        "params",
        "error",
    ]
    t1 = rows[2]
    assert t1["trial_id"] == "t1" and (t1["best_epoch"], t1["epochs"]) == (1, 2)
    assert (t1["accuracy"], t1["last_accuracy"], t1["loss"], t1["f1"]) == (0.9, 0.6, 0.3, 0.8)
    assert t1["best_checkpoint"] == "checkpoints/t1/e0000-s0001.pt"
    assert t1["params"] == {"lr": 0.1} and t1["error"] is None
    failed = rows[-1]
    assert failed["trial_id"] == "t0" and failed["status"] == "failed"
    assert failed["error"] == "CUDA out of\nmemory"
    assert rows[4]["trial_id"] == "t5" and rows[4]["accuracy"] is None


def test_leaderboard_csv_is_deterministic_whatever_the_fold_order() -> None:
    state = board_state()
    text = leaderboard_csv(state.trials.values(), "accuracy", "max")
    assert text == leaderboard_csv(reversed(list(state.trials.values())), "accuracy", "max")
    lines = text.splitlines()
    assert lines[0] == (
        "trial_id,status,epochs,best_epoch,accuracy,last_accuracy,f1,loss,best_checkpoint,"
        "params,error"
    )
    assert lines[3] == (
        't1,running,2,1,0.9,0.6,0.8,0.3,checkpoints/t1/e0000-s0001.pt,"{""lr"": 0.1}",'
    )
    assert lines[4].startswith("t4,running,1,,,nan,,,,")
    assert text.endswith('"CUDA out of\nmemory"\n')


def test_a_metric_named_like_a_column_gets_its_own_column() -> None:
    state = ExperimentState.from_events(
        [added("t0"), recorded("t0", 1, {"accuracy": 0.5, "error": 0.5}, best=1)]
    )
    header = leaderboard_csv(state.trials.values(), "accuracy", "max").splitlines()[0]
    assert header.split(",")[6] == "metric_error" and header.endswith(",error")
    (row,) = leaderboard_rows(state.trials.values(), "accuracy", "max")
    assert row["metric_error"] == 0.5 and row["error"] is None


def test_the_terminal_table_shows_best_last_best_epoch_and_errors() -> None:
    table = format_table(board_state().trials.values(), "accuracy", "max").splitlines()
    header = table[0].split()
    assert header[:8] == ["#", "trial", "status", "epochs", "best", "epoch", "accuracy", "last"]
    assert header[8:12] == ["accuracy", "loss", "f1", "model"]
    t1 = table[3].split()
    assert t1[:9] == ["3", "t1", "running", "2", "1", "0.9000", "0.6000", "0.3000", "0.8000"]
    assert t1[9] == "MLPSpec" and t1[10] == '{"lr":'
    assert table[-1].split()[1] == "t0"
    assert table[-1].endswith("error: CUDA out of memory")  # one line
    assert len(format_table(board_state().trials.values(), "accuracy", "max", 2).splitlines()) == 4


def test_search_failed_error_keeps_its_fields_through_pickle() -> None:
    error = SearchFailedError(
        "every trial failed", experiment_id="e", url="file:///x", failures=[("t0", "boom")]
    )
    again = pickle.loads(pickle.dumps(error))
    assert isinstance(again, CerebroError) and isinstance(again, RuntimeError)
    assert str(again) == "every trial failed"
    assert (again.experiment_id, again.url, again.failures) == ("e", "file:///x", [("t0", "boom")])
