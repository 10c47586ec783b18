"""TensorBoard event files, read back with TensorBoard's own ``EventAccumulator``."""

from __future__ import annotations

import pytest

from cerebro_spark.engine import parse_config, read_events, run_experiment
from cerebro_spark.engine._api import load_experiment_config
from cerebro_spark.store import open_store
from cerebro_spark.tracking import TrackingContext
from tests.tracking.helpers import tiny_config

pytestmark = [pytest.mark.torch, pytest.mark.slow]

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.plugins.hparams import plugin_data_pb2  # noqa: E402

ID = "tb"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("tensorboard-run")
    config = parse_config(tiny_config(root / "store", {"tensorboard": str(root / "tb")}))
    result = run_experiment(config, experiment_id=ID)
    store = open_store(str(root / "store"))
    events = read_events(store.child(f"experiments/{ID}"))
    return {"root": root, "result": result, "events": events, "store": store}


def accumulator(folder):
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def scalars(acc, tag):
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_one_directory_per_trial_with_a_scalar_per_epoch(run):
    folder = run["root"] / "tb" / ID
    assert sorted(p.name for p in folder.iterdir()) == ["t0000", "t0001"]
    for trial in run["result"].trials:
        acc = accumulator(folder / trial.trial_id)
        epochs = [
            e for e in run["events"] if e["event"] == "trial_epoch" and e["trial"] == trial.trial_id
        ]
        for metric in epochs[0]["metrics"]:
            assert scalars(acc, f"validation/{metric}") == [
                (e["epoch"], pytest.approx(e["metrics"][metric], rel=1e-6)) for e in epochs
            ]
        assert scalars(acc, "hparams/accuracy") == [
            (trial.epochs, pytest.approx(trial.best_metrics["accuracy"], rel=1e-6))
        ]


def test_hparams_plugin_sees_each_trials_params_and_metrics(run):
    folder = run["root"] / "tb" / ID
    for trial in run["result"].trials:
        acc = accumulator(folder / trial.trial_id)
        content = acc.PluginTagToContent("hparams")
        assert set(content) == {
            "_hparams_/experiment",
            "_hparams_/session_start_info",
            "_hparams_/session_end_info",
        }
        start = plugin_data_pb2.HParamsPluginData.FromString(
            content["_hparams_/session_start_info"]
        ).session_start_info
        assert start.hparams["hidden_units"].string_value == str(trial.params["hidden_units"])
        assert start.hparams["lr"].number_value == pytest.approx(0.003)
        assert start.hparams["spec"].string_value == trial.spec
        experiment = plugin_data_pb2.HParamsPluginData.FromString(
            content["_hparams_/experiment"]
        ).experiment
        names = {m.name.tag for m in experiment.metric_infos}
        assert "hparams/accuracy" in names


def test_a_resumed_tracker_rewrites_the_scalars_without_duplicates(run, tmp_path):
    from cerebro_spark.tracking import TensorBoardTracker

    config = load_experiment_config(run["store"], ID)
    context = TrackingContext(ID, config, run["store"], f"experiments/{ID}", lambda **_: None)
    events = run["events"]
    first_round = next(i for i, e in enumerate(events) if e["event"] == "round_end")
    session = TensorBoardTracker(context, tmp_path)
    session.catch_up([])
    for event in events[: first_round + 1]:  # the driver died after round 0
        session.handle(event)
    session.close(None)
    resumed = TensorBoardTracker(context, tmp_path)
    resumed.catch_up(events[: first_round + 1])
    for event in events[first_round + 1 :]:
        resumed.handle(event)
    resumed.close(None)
    for trial in run["result"].trials:
        acc = accumulator(tmp_path / ID / trial.trial_id)
        assert [step for step, _ in scalars(acc, "validation/accuracy")] == [1, 2]
        assert [step for step, _ in scalars(acc, "validation/accuracy")] == [
            step
            for step, _ in scalars(
                accumulator(run["root"] / "tb" / ID / trial.trial_id), "validation/accuracy"
            )
        ]
