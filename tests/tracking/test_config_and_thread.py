"""The ``tracking:`` section and the tracking thread (no Spark, no torch, no server)."""

from __future__ import annotations

import logging
import re
import threading
import time

import pytest

from cerebro_spark.driver._config import MlflowConfig, TrackingConfig
from cerebro_spark.engine import EventLog, parse_config
from cerebro_spark.errors import ConfigError
from cerebro_spark.store import open_store
from cerebro_spark.tracking import Tracker, TrackerUnavailable, TrackingThread, mlflow_settings


def config(**tracking):
    raw = {"name": "n", "data": {"source": "sklearn:digits"}, "space": {}}
    if tracking:
        raw["tracking"] = tracking
    return parse_config(raw)


# -- config ---------------------------------------------------------------------------------


def test_tracking_section_parses_and_round_trips():
    parsed = config(
        mlflow={"uri": "http://h:5000", "experiment": "e", "register_model": "m"},
        tensorboard="tb",
        flush_timeout=5,
    )
    assert parsed.tracking == TrackingConfig(
        mlflow=MlflowConfig(uri="http://h:5000", experiment="e", register_model="m"),
        tensorboard="tb",
        flush_timeout=5.0,
    )
    assert parse_config(parsed.to_dict(), stored=True) == parsed
    assert parsed.to_dict()["tracking"] == {
        "mlflow": {"uri": "http://h:5000", "experiment": "e", "register_model": "m"},
        "tensorboard": "tb",
        "flush_timeout": 5.0,
    }


def test_no_tracking_section_is_left_out_of_the_stored_config():
    assert "tracking" not in config().to_dict()
    off = config(mlflow=False)
    assert off.tracking.mlflow == MlflowConfig(enabled=False)
    assert parse_config(off.to_dict(), stored=True) == off


@pytest.mark.parametrize(
    ("tracking", "message"),
    [
        ({"mlflow": {"url": "x"}}, "unknown field(s) url in tracking.mlflow"),
        ({"mlflow": "http://x"}, "tracking.mlflow must be of type dict or bool"),
        ({"tensorboard": ""}, "tracking.tensorboard must be a directory"),
        ({"flush_timeout": 0}, "tracking.flush_timeout must be a finite number > 0"),
        ({"queue_size": 0}, "tracking.queue_size must be an int ≥ 1"),
        ({"mlflow": {"uri": ""}}, "tracking.mlflow.uri must not be empty"),
        ({"wandb": {}}, "unknown field(s) wandb in tracking"),
    ],
)
def test_bad_tracking_sections_are_refused_by_name(tracking, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        config(**tracking)


def test_mlflow_follows_the_environment_variable_unless_told_otherwise():
    env = {"MLFLOW_TRACKING_URI": "databricks"}
    assert mlflow_settings(config(), {}) is None
    assert mlflow_settings(config(), env) == ("databricks", "n", None)
    assert mlflow_settings(config(mlflow=False), env) is None
    assert mlflow_settings(config(mlflow={"experiment": "/Users/me/x"}), env) == (
        "databricks",
        "/Users/me/x",
        None,
    )
    assert mlflow_settings(config(mlflow={"uri": "http://h"}), env) == ("http://h", "n", None)
    named = {**env, "MLFLOW_EXPERIMENT_NAME": "/Shared/x"}
    assert mlflow_settings(config(), named) == ("databricks", "/Shared/x", None)
    assert mlflow_settings(config(mlflow={"experiment": "y"}), named) == ("databricks", "y", None)
    with pytest.raises(ConfigError, match=r"tracking.mlflow has no uri and MLFLOW_TRACKING_URI"):
        mlflow_settings(config(mlflow={}), {})


# -- the thread -----------------------------------------------------------------------------


class Recorder(Tracker):
    name = "recorder"

    def __init__(self, record=None, fail=None, block=None):
        self.seen: list[str] = []
        self.caught_up: list[str] = []
        self.closed: list[object] = []
        self.record, self.fail, self.block = record, fail, block

    def catch_up(self, events):
        self.caught_up = [e["event"] for e in events]

    def handle(self, event):
        if self.block is not None:
            self.block.wait()
        if self.fail is not None:
            raise self.fail
        self.seen.append(event["event"])
        if self.record is not None and event["event"] == "trial_added":
            self.record(backend="test", trial=event["trial"], run_id="r-" + event["trial"])

    def close(self, error):
        self.closed.append(error)


@pytest.fixture
def log(tmp_path):
    return EventLog(open_store(str(tmp_path)))


def test_trackers_see_past_events_then_each_new_one_and_record_run_ids(log):
    log.append("experiment_start", resumed=False)
    thread = TrackingThread([], log)
    tracker = Recorder(record=thread.record)
    thread.trackers.append(tracker)
    thread.start(log.read())
    log.append("trial_added", trial="t0")
    log.append("round_start", round=0)
    assert thread.close() is True
    assert tracker.caught_up == ["experiment_start"]
    assert tracker.seen == ["trial_added", "round_start"]
    assert tracker.closed == [None]
    kinds = [(e["event"], e.get("run_id")) for e in log.read()]
    assert ("tracking", "r-t0") in kinds  # logged by the driver's thread
    log.append("experiment_end")
    assert tracker.seen == ["trial_added", "round_start"]  # closed: no longer listening


def test_a_failing_tracker_is_warned_about_and_switched_off(log, caplog):
    broken = Recorder(fail=ConnectionError("refused"))
    thread = TrackingThread([broken], log)
    thread.start([])
    with caplog.at_level(logging.WARNING, logger="cerebro_spark.tracking"):
        for n in range(5):
            log.append("unit_end", n=n)
        assert thread.close() is True
    messages = [r.getMessage() for r in caplog.records]
    assert sum("failed while tracking unit_end: refused" in m for m in messages) == 2
    assert any("failed 3 times in a row" in m and "off for the rest" in m for m in messages)
    assert broken.closed == []  # off: not even closed


def test_an_unavailable_tracker_is_off_at_once(log, caplog):
    class Down(Recorder):
        def catch_up(self, events):
            raise TrackerUnavailable("the server does not answer")

    down = Down()
    thread = TrackingThread([down], log)
    thread.start([])
    with caplog.at_level(logging.WARNING, logger="cerebro_spark.tracking"):
        log.append("unit_end")
        thread.close()
    assert down.seen == []
    assert any(
        "off for this run: the server does not answer" in r.getMessage() for r in caplog.records
    )


def test_a_full_queue_drops_events_instead_of_blocking_the_driver(log, caplog):
    gate = threading.Event()
    slow = Recorder(block=gate)
    thread = TrackingThread([slow], log, queue_size=3, flush_timeout=5)
    thread.start([])
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="cerebro_spark.tracking"):
        for n in range(20):
            log.append("unit_end", n=n)
        assert time.monotonic() - started < 2
        gate.set()
        assert thread.close() is True
    assert 1 <= len(slow.seen) < 20
    assert any(
        "events were not tracked: the tracking queue was full" in r.getMessage()
        for r in caplog.records
    )


def test_close_gives_up_after_the_flush_timeout(log, caplog):
    stuck = Recorder(block=threading.Event())  # never set
    thread = TrackingThread([stuck], log, flush_timeout=1.5)
    thread.start([])
    log.append("unit_end")
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="cerebro_spark.tracking"):
        assert thread.close() is False
    assert time.monotonic() - started < 3
    assert any("did not finish within 2 s" in r.getMessage() for r in caplog.records)


def test_close_does_not_wait_for_an_unreachable_service(log):
    class Unreachable(Recorder):
        def reachable(self):
            return False

    stuck = Unreachable(block=threading.Event())
    thread = TrackingThread([stuck], log, flush_timeout=30)
    thread.start([])
    log.append("unit_end")
    started = time.monotonic()
    assert thread.close() is False
    assert time.monotonic() - started < 3


def test_a_listener_that_raises_does_not_fail_the_append(log, caplog):
    def broken(event):
        raise ValueError("boom")

    log.listeners.append(broken)
    with caplog.at_level(logging.WARNING, logger="cerebro_spark.engine"):
        record = log.append("round_start", round=0)
    assert record["event"] == "round_start"
    assert [e["event"] for e in log.read()] == ["round_start"]
    assert any("boom" in r.getMessage() for r in caplog.records)


def test_params_flatten_to_dotted_keys_mlflow_accepts():
    from cerebro_spark.tracking._mlflow import flatten

    assert flatten({"procedure": {"name": "asha", "eta": 3}, "space": {"lr:x": [1, 2]}}) == {
        "procedure.name": "asha",
        "procedure.eta": "3",
        "space.lr_x": "[1, 2]",
    }
    assert flatten({"long": "v" * 7000})["long"] == "v" * 6000
