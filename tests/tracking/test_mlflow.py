"""MLflow tracking against a real tracking server (SQLite store, local artifacts).

One experiment is run with MLflow and TensorBoard on, crashed by its stage hook after its
first round and resumed: the runs it leaves are read back with ``MlflowClient``.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import pytest

from cerebro_spark.engine import (
    default_backend,
    parse_config,
    read_events,
    resume_experiment,
    run_experiment,
)
from cerebro_spark.store import open_store
from tests.tracking.conftest import free_port
from tests.tracking.helpers import tiny_config

pytestmark = [pytest.mark.torch, pytest.mark.slow]

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

EXPERIMENT = "cerebro-tracked"
ID = "crashed"


class Crash(RuntimeError):
    """The driver dies at the start of round 1 (after round 0 was tracked)."""


def crash_at_round_one(stage, backend):
    del backend
    if stage.round == 1:
        raise Crash("driver died")
    return None


@pytest.fixture(scope="module")
def run(mlflow_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow-run")
    tracking = {
        "mlflow": {"uri": mlflow_server, "experiment": EXPERIMENT},
        "tensorboard": str(root / "tb"),
    }
    config = parse_config(tiny_config(root / "store", tracking))
    with pytest.raises(Crash):
        run_experiment(config, experiment_id=ID, on_stage=crash_at_round_one)
    store = open_store(str(root / "store"))
    before = read_events(store.child(f"experiments/{ID}"))
    result = resume_experiment(str(root / "store"), ID, backend_factory=default_backend)
    events = read_events(store.child(f"experiments/{ID}"))
    return {
        "uri": mlflow_server,
        "client": MlflowClient(tracking_uri=mlflow_server),
        "result": result,
        "store": store,
        "before": before,
        "events": events,
        "root": root,
    }


def runs_of(run):
    client = run["client"]
    experiment = client.get_experiment_by_name(EXPERIMENT)
    return client.search_runs([experiment.experiment_id], max_results=100)


def parent_and_trials(run):
    runs = runs_of(run)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1
    trials = {r.data.tags["cerebro.trial"]: r for r in runs if r is not parents[0]}
    return parents[0], trials


def test_the_resumed_run_continued_the_same_mlflow_runs(run):
    tracked = [e for e in run["events"] if e["event"] == "tracking"]
    tracked_before = [e for e in run["before"] if e["event"] == "tracking"]
    # one run per experiment and trial, all opened by the first session, none by the resume
    assert sorted(str(e["trial"]) for e in tracked) == ["None", "t0000", "t0001"]
    assert tracked == tracked_before
    parent, trials = parent_and_trials(run)
    assert len(runs_of(run)) == 3
    ids = {e["trial"]: e["run_id"] for e in tracked}
    assert parent.info.run_id == ids[None]
    assert {t: r.info.run_id for t, r in trials.items()} == {
        "t0000": ids["t0000"],
        "t0001": ids["t0001"],
    }
    assert parent.info.status == "FINISHED"
    assert all(r.info.status == "FINISHED" for r in trials.values())
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in trials.values())


def test_parent_run_has_config_dataset_totals_and_leaderboard(run, tmp_path):
    parent, _ = parent_and_trials(run)
    client, store = run["client"], run["store"]
    params, tags, metrics = parent.data.params, parent.data.tags, parent.data.metrics
    assert params["procedure.name"] == "grid"
    assert params["seed"] == "3"
    assert params["epochs"] == "2"
    dataset = next(e for e in run["events"] if e["event"] == "dataset")
    assert params["dataset.id"] == dataset["dataset_id"]
    assert tags["cerebro.experiment_id"] == ID
    assert tags["cerebro.procedure"] == "grid"
    assert tags["cerebro.dataset.task"] == "classification"
    assert tags["cerebro.best_trial"] == run["result"].best.trial_id
    assert metrics["seconds"] > 0
    assert metrics["best.accuracy"] == pytest.approx(run["result"].best.best_metrics["accuracy"])
    files = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"config.json", "dataset.json", "leaderboard.csv"} <= files
    local = Path(client.download_artifacts(parent.info.run_id, "leaderboard.csv", str(tmp_path)))
    assert local.read_bytes() == store.get(f"experiments/{ID}/leaderboard.csv")
    summary = json.loads(
        Path(
            client.download_artifacts(parent.info.run_id, "dataset.json", str(tmp_path))
        ).read_text()
    )
    assert summary["dataset_id"] == dataset["dataset_id"]
    assert summary["rows"] == dataset["rows"]


def test_each_trial_run_has_params_every_epoch_once_status_and_decisions(run, tmp_path):
    _, trials = parent_and_trials(run)
    client = run["client"]
    epochs = [e for e in run["events"] if e["event"] == "trial_epoch"]
    for trial_id, mlrun in trials.items():
        assert mlrun.data.params["hidden_units"] in ("[16]", "[32]")
        assert mlrun.data.params["lr"] == "0.003"
        assert mlrun.data.tags["cerebro.status"] == "completed"
        logged = [e for e in epochs if e["trial"] == trial_id]
        for metric in logged[0]["metrics"]:
            history = client.get_metric_history(mlrun.info.run_id, metric)
            # epoch 1 came from the first session, epoch 2 from the resumed one: once each
            assert sorted(m.step for m in history) == [1, 2]
            assert {m.step: m.value for m in history} == pytest.approx(
                {e["epoch"]: e["metrics"][metric] for e in logged}
            )
        decisions = json.loads(
            Path(
                client.download_artifacts(mlrun.info.run_id, "decisions.json", str(tmp_path))
            ).read_text()
        )
        assert [d["decision"] for d in decisions] == ["continue", "stop"]


def test_best_checkpoints_are_artifacts_and_the_best_model_registers(run, tmp_path):
    from cerebro_spark import load_model

    _, trials = parent_and_trials(run)
    client, store, result = run["client"], run["store"], run["result"]
    for trial in result.trials:
        mlrun = trials[trial.trial_id]
        local = client.download_artifacts(mlrun.info.run_id, "checkpoints/best.pt", str(tmp_path))
        assert Path(local).read_bytes() == store.get(trial.best_checkpoint)
    best_run = trials[result.best.trial_id]
    parent, _ = parent_and_trials(run)
    model_uri = f"runs:/{best_run.info.run_id}/model"
    assert parent.data.tags["cerebro.best_model_uri"] == model_uri
    mlflow.set_tracking_uri(run["uri"])
    try:
        version = mlflow.register_model(model_uri, "cerebro-best")
        loaded = mlflow.pyfunc.load_model(f"models:/cerebro-best/{version.version}")
    finally:
        mlflow.set_tracking_uri(None)
    from sklearn.datasets import load_digits

    features = load_digits().data[:50].astype(np.float32)
    expected = load_model(result.best_checkpoint_url, device="cpu").predict(features)
    assert np.array_equal(np.asarray(loaded.predict(features)), expected)


def test_tensorboard_ran_beside_mlflow(run):
    folders = sorted(p.name for p in (run["root"] / "tb" / ID).iterdir())
    assert folders == ["t0000", "t0001"]


def test_a_server_that_is_down_neither_fails_nor_slows_the_run(tmp_path, caplog):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    raw = tiny_config(
        tmp_path / "store",
        {"mlflow": {"uri": uri}, "flush_timeout": 60},
        epochs=1,
        workers=1,
        space={"model": "cerebro_spark.training:MLPSpec", "hidden_units": [16], "batch_size": 64},
    )
    with caplog.at_level(logging.WARNING, logger="cerebro_spark.tracking"):
        result = run_experiment(parse_config(raw), experiment_id="down")
        returned = time.time()
    assert result.best is not None
    events = read_events(open_store(str(tmp_path / "store")).child("experiments/down"))
    end = next(e for e in events if e["event"] == "experiment_end")
    assert returned - end["time"] < 5  # the flush did not wait for the dead server
    assert not [e for e in events if e["event"] == "tracking"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(uri in w and "does not answer" in w for w in warnings), warnings


def test_a_logged_run_replays_into_mlflow_with_its_plan_cost_and_a_registered_model(run):
    """The tracker only needs the log: a finished run's events (with an elastic run's plan,
    stages and cost added) tracked into a new MLflow experiment by two sessions, the first
    dying before it sent all it saw (its driver was killed), the best model registered."""
    from cerebro_spark.engine._api import load_experiment_config
    from cerebro_spark.tracking import MlflowTracker, TrackingContext

    store, client = run["store"], run["client"]
    recorded: list[dict] = []

    def tracker():
        context = TrackingContext(
            ID,
            load_experiment_config(store, ID),
            store,
            f"experiments/{ID}",
            lambda **fields: recorded.append({"event": "tracking", **fields}),
        )
        return MlflowTracker(context, run["uri"], "cerebro-replayed", register_model="best-digits")

    events = [e for e in run["events"] if e["event"] != "tracking"]
    at = next(i for i, e in enumerate(events) if e["event"] == "dataset") + 1
    now = events[at - 1]["time"]
    stages = [
        {
            "event": "elastic_plan",
            "time": now,
            "deadline": 600,
            "budget": 1.0,
            "seconds": 400.0,
            "usd": 0.5,
            "workers": [2, 1],
        },
        *[
            {
                "event": "stage_plan",
                "time": now,
                "stage": s,
                "trials": 2,
                "epochs": 1,
                "workers": 2 - s,
                "start": 200.0 * s,
                "end": 200.0 * (s + 1),
                "usd": 0.25,
                "begin": 200.0 * s,
                "replan": 0,
            }
            for s in (0, 1)
        ],
        *[
            {
                "event": "stage_actual",
                "time": now,
                "stage": s,
                "seconds": 210.0 + s,
                "planned_seconds": 200.0,
                "usd": 0.3 + s / 100,
                "planned_usd": 0.25,
            }
            for s in (0, 1)
        ],
    ]
    summary = {
        "event": "elastic_summary",
        "time": now,
        "seconds": 421.0,
        "planned_seconds": 400.0,
        "usd": 0.61,
        "planned_usd": 0.5,
        "stopped": None,
        "deadline": 400.0,
        "deadline_met": False,
        "budget": None,
        "budget_met": True,
        "first_plan": {"seconds": 380.0, "usd": 0.45},
        "last_plan": {"seconds": 400.0, "usd": 0.5},
        "replans": [{"stage": 1, "reason": "drift"}],
        "misses": ["deadline missed: 421.0 s against 400.0 s (21.0 s over)"],
    }
    end = next(i for i, e in enumerate(events) if e["event"] == "experiment_end")
    sequence = [*events[:at], *stages, *events[at:end], summary, *events[end:]]
    # session 1 saw the log up to the first round's end but sent only up to t0001's epoch 1
    seen = next(i for i, e in enumerate(sequence) if e["event"] == "round_end") + 1
    sent = next(
        i for i, e in enumerate(sequence) if e["event"] == "trial_epoch" and e["trial"] == "t0001"
    )
    first = tracker()
    first.catch_up([])
    for event in sequence[:sent]:
        first.handle(event)
    opened = list(recorded)
    second = tracker()  # the resumed session
    second.catch_up([*sequence[:seen], *opened])
    for event in sequence[seen:]:
        second.handle(event)
    second.close(None)

    assert recorded == opened  # the resumed session opened no run
    assert sorted(str(r["trial"]) for r in recorded) == ["None", "t0000", "t0001"]
    for trial in ("t0000", "t0001"):
        trial_run = next(r["run_id"] for r in recorded if r["trial"] == trial)
        history = client.get_metric_history(trial_run, "accuracy")
        assert sorted(m.step for m in history) == [1, 2]  # the missed epoch 1 once, no repeat
    parent = client.get_run(next(r["run_id"] for r in recorded if r["trial"] is None))
    history = client.get_metric_history(parent.info.run_id, "stage_actual.seconds")
    assert sorted((m.step, m.value) for m in history) == [(1, 210.0), (2, 211.0)]  # from 1
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics["stage_plan.usd"] == 0.25
    assert parent.data.metrics["plan.usd"] == 0.5
    assert parent.data.metrics["cost.usd"] == 0.61
    assert parent.data.metrics["usd"] == 0.61
    assert parent.data.metrics["planned_usd"] == 0.5
    # against the first plan and the last, met or missed, and why
    assert parent.data.metrics["deadline_met"] == 0.0 and parent.data.metrics["budget_met"] == 1
    assert parent.data.metrics["first_plan.seconds"] == 380.0
    assert parent.data.metrics["last_plan.usd"] == 0.5 and parent.data.metrics["replans"] == 1
    assert parent.data.tags["cerebro.deadline_met"] == "false"
    assert parent.data.tags["cerebro.misses"].startswith("deadline missed: 421.0 s")
    files = {a.path for a in client.list_artifacts(parent.info.run_id, "elastic")}
    assert files == {
        f"elastic/{k}.json"
        for k in ("elastic_plan", "stage_plan", "stage_actual", "elastic_summary")
    }
    assert parent.data.tags["cerebro.registered_model"] == "best-digits/1"
    version = client.get_model_version("best-digits", "1")
    best_run = next(r["run_id"] for r in recorded if r["trial"] == run["result"].best.trial_id)
    assert version.run_id == best_run
