"""Tuner.fit end to end: a pandas DataFrame on local workers, a Spark DataFrame on the
active session (never a new one), and the result as pandas and Spark tables."""

import io
import json
import logging

import pandas as pd
import pytest
from sklearn.datasets import load_digits

from cerebro_spark.engine import read_events
from cerebro_spark.search import Grid
from cerebro_spark.store import open_store
from cerebro_spark.tuner import Procedure, ProgressDisplay, Tuner, TuningResult

pytestmark = [pytest.mark.torch, pytest.mark.slow]

SPACE = {
    "model": "cerebro_spark.training:MLPSpec",
    "hidden_units": [32],
    "lr": Grid([0.003, 0.01]),
    "batch_size": 64,
}


def digits_frame():
    data = load_digits()
    frame = pd.DataFrame(data.data, columns=[f"p{i}" for i in range(64)])
    frame["digit"] = data.target
    return frame


def test_fit_on_a_pandas_frame_gives_leaderboard_history_and_reloads(tmp_path):
    tuner = Tuner(
        SPACE, epochs=2, workers=2, backend="local", store=str(tmp_path), seed=3, progress=False
    )
    result = tuner.fit(digits_frame(), label="digit", experiment_id="pandas")
    board = result.leaderboard()
    assert list(board["rank"]) == [1, 2]
    assert set(board["params.lr"]) == {0.003, 0.01}
    assert board["accuracy"].is_monotonic_decreasing
    assert board.loc[0, "trial_id"] == result.best.trial_id
    history = result.history()
    assert len(history) == 4 and set(history["epoch"]) == {1, 2}
    events = read_events(open_store(str(tmp_path)).child("experiments/pandas"))
    reported = {
        (e["trial"], e["epoch"]): e["metrics"]["accuracy"]
        for e in events
        if e["event"] == "trial_epoch"
    }
    assert {(r.trial_id, r.epoch): r.accuracy for r in history.itertuples()} == reported
    config = json.loads((tmp_path / "experiments" / "pandas" / "config.json").read_text())
    assert config["data"]["dataset"].endswith(result.state.dataset_id)
    again = TuningResult.load(str(tmp_path), "pandas")
    pd.testing.assert_frame_equal(again.leaderboard(), board)


def test_the_progress_bar_reports_units_and_the_best_trial(tmp_path):
    stream = io.StringIO()
    tuner = Tuner(
        SPACE,
        procedure=Procedure("grid"),
        epochs=1,
        workers=1,
        backend="local",
        store=str(tmp_path),
        progress=False,
    )
    from cerebro_spark.tuner._display import showing_progress

    with showing_progress(ProgressDisplay(stream, live=False, plain_interval=0)):
        tuner.fit(digits_frame(), label="digit")
    lines = stream.getvalue().splitlines()
    assert lines and lines[-1].startswith("epoch 1/1 [####################] 4/4 units")
    assert "best accuracy" in lines[-1]


@pytest.mark.spark
def test_fit_on_a_spark_frame_uses_the_active_session(spark, tmp_path, caplog):
    frame = spark.createDataFrame(digits_frame())
    context = spark.sparkContext
    jvm = context._jvm
    level_before = str(jvm.org.apache.logging.log4j.LogManager.getRootLogger().getLevel())
    tuner = Tuner(SPACE, epochs=1, workers=2, store=str(tmp_path), progress=False)
    with caplog.at_level(logging.WARNING):
        result = tuner.fit(frame, label="digit", experiment_id="spark-frame")
    assert result.config.backend == "spark"  # chosen because the data lives in Spark
    assert spark.sparkContext is context  # no new session, no new context
    assert str(jvm.org.apache.logging.log4j.LogManager.getRootLogger().getLevel()) == level_before
    assert not [r for r in caplog.records if "does not run group units" in r.getMessage()]
    board = result.to_spark()
    assert board.count() == 2
    rows = board.orderBy("rank").collect()
    assert rows[0]["trial_id"] == result.best.trial_id
    assert rows[0]["accuracy"] == pytest.approx(result.best.best_metrics["accuracy"])
    # the same rows prepared from the same seed: the second fit reuses the dataset
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cerebro_spark.driver._warm"):
        again = tuner.fit(frame, label="digit", experiment_id="spark-frame-2")
    assert again.state.dataset_id == result.state.dataset_id
    # preparing a frame is a Spark job: the warm workers were closed first, so the second
    # fit's workers read their partitions; a fit on the prepared dataset starts warm
    assert "a Spark job needs the executor slots" in caplog.text
    assert _bytes_read(tmp_path, "spark-frame-2") > 0
    uri = f"{tmp_path}/datasets/{result.state.dataset_id}"
    warm = tuner.fit(uri, experiment_id="spark-warm")
    assert _bytes_read(tmp_path, "spark-warm") == 0
    assert warm.best.best_metrics == again.best.best_metrics  # the same weights, warm or not


def _bytes_read(store, experiment_id):
    """Bytes the experiment's workers read for it (ready, and over the whole search)."""
    events = read_events(open_store(str(store)).child(f"experiments/{experiment_id}"))
    ready = sum(e["bytes_read"] for e in events if e["event"] == "worker_ready")
    total = sum(e["bytes_read"] for e in events if e["event"] == "worker_bytes")
    assert len([e for e in events if e["event"] == "worker_ready"]) == 2
    return ready + total
