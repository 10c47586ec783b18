"""The event log against what a crash can and cannot leave (issue 12, part 1).

A crash can leave one thing: a torn last line. Readers ignore it and the next append cuts
it off, on local files and on S3. Anything else (an invalid line in the middle, an event
naming an unknown trial, a known event missing a field) is refused naming the file and
the line. Events are standard JSON even when a metric is NaN.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cerebro_spark.engine import EventLog, ExperimentState, read_events
from cerebro_spark.errors import EventLogError, StoreFullError
from cerebro_spark.store import open_store
from tests.reliability.conftest import fill_disk, strict_lines

TRIAL = {"trial": "t0", "params": {"lr": 0.1}, "seed": 1, "spec": "m:S"}


def small_log(store_dir: Path) -> EventLog:
    log = EventLog(open_store(str(store_dir)))
    log.append("experiment_start", experiment_id="e", config={}, resumed=False)
    log.append("trial_added", **TRIAL, clone_from=None)
    log.append("decision", round=0, trial="t0", epoch=1, decision="continue", status="running")
    return log


def test_a_torn_tail_is_ignored_then_cut_before_the_next_append(tmp_path, caplog):
    log = small_log(tmp_path)
    path = tmp_path / "events.jsonl"
    path.write_bytes(path.read_bytes() + b'{"event":"unit_end","tri')  # killed mid-append
    with caplog.at_level(logging.WARNING):
        assert [e["event"] for e in log.read()] == ["experiment_start", "trial_added", "decision"]
    assert "torn last line 4" in caplog.text
    reopened = EventLog(open_store(str(tmp_path)))
    reopened.append("round_end", round=0, procedure_state=None)
    events = strict_lines(path.read_bytes())
    assert [e["event"] for e in events][-2:] == ["decision", "round_end"]
    assert path.read_bytes().endswith(b"}\n")


def test_a_whole_last_event_without_its_newline_is_kept(tmp_path):
    log = small_log(tmp_path)
    path = tmp_path / "events.jsonl"
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    EventLog(open_store(str(tmp_path))).append("round_end", round=0, procedure_state=None)
    assert [e["event"] for e in log.read()][-2:] == ["decision", "round_end"]


def test_a_torn_tail_on_s3_is_repaired_before_the_next_append(s3_server):
    store = open_store(s3_server.uri("exp"))
    small_log_store = EventLog(store)
    small_log_store.append("experiment_start", experiment_id="e", config={}, resumed=False)
    small_log_store.flush()
    store.put("events.jsonl", store.get("events.jsonl") + b'{"event":"trial_ad')
    assert [e["event"] for e in read_events(store)] == ["experiment_start"]
    log = EventLog(store)
    log.append("trial_added", **TRIAL, clone_from=None)
    log.flush()
    data = store.get("events.jsonl")
    assert [e["event"] for e in strict_lines(data)] == ["experiment_start", "trial_added"]
    assert data.endswith(b"\n")


APPENDER = textwrap.dedent(
    """
    import sys
    from cerebro_spark.engine import EventLog
    from cerebro_spark.store import open_store
    log = EventLog(open_store(sys.argv[1]), segment_bytes=2048)
    for i in range(100000):
        log.append("tracking", backend="x", trial=None, run_id=str(i) * 50, experiment="e",
                   uri="u")
        log.flush()  # acknowledged: written
        print(i, flush=True)
    """
)


def test_a_driver_killed_while_s3_rewrites_the_log_loses_no_acknowledged_event(s3_server):
    """On S3 a flush rewrites the log's last segment whole; a kill mid-rewrite leaves the old
    object, and segments are written in order."""
    uri = s3_server.uri("killed")
    child = subprocess.Popen(
        [sys.executable, "-c", APPENDER, uri],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert child.stdout is not None
    acknowledged = -1
    while acknowledged < 40:
        line = child.stdout.readline()
        assert line, "the appender ended early"
        acknowledged = int(line)
    time.sleep(0.13)  # somewhere inside a later rewrite
    child.send_signal(signal.SIGKILL)
    child.wait()
    events = read_events(open_store(uri))
    runs = [int(e["run_id"][: len(e["run_id"]) // 50]) for e in events]
    assert runs == list(range(len(runs)))  # no gap, no duplicate: earlier events all kept
    assert len(runs) >= acknowledged + 1
    store = open_store(uri)
    segments = store.list("events.jsonl.d")
    assert segments, "the log never reached a second segment"
    for key in ["events.jsonl", *segments]:
        strict_lines(store.get(key))


def test_an_invalid_line_in_the_middle_is_refused_naming_file_and_line(tmp_path):
    small_log(tmp_path)
    path = tmp_path / "events.jsonl"
    lines = path.read_bytes().split(b"\n")
    lines[1] = lines[1][:20]  # what an append behind a torn line used to leave
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(EventLogError) as caught:
        read_events(open_store(str(tmp_path)))
    message = str(caught.value)
    assert f"{path}: line 2 of 3 is not an event" in message
    assert "restore it from a copy" in message


def test_an_event_naming_an_unknown_trial_is_refused_naming_the_line(tmp_path):
    log = small_log(tmp_path)
    log.append("trial_failed", trial="t9", error="boom")
    with pytest.raises(EventLogError) as caught:
        ExperimentState.from_events(log.read())
    message = str(caught.value)
    assert f"{tmp_path / 'events.jsonl'}, line 4:" in message
    assert "trial_failed event names trial 't9', which no earlier trial_added" in message
    assert "cut it just before this line" in message


def test_a_clone_of_an_unknown_trial_is_refused(tmp_path):
    log = small_log(tmp_path)
    log.append("trial_added", **{**TRIAL, "trial": "t1"}, clone_from="ghost")
    with pytest.raises(EventLogError, match="trial_added event names trial 'ghost'"):
        ExperimentState.from_events(log.read())


def test_a_known_event_missing_a_field_is_refused_naming_it(tmp_path):
    log = small_log(tmp_path)
    log.append("round_end", round=0)  # no procedure_state
    with pytest.raises(EventLogError) as caught:
        ExperimentState.from_events(log.read())
    assert "line 4: the round_end event lacks its field 'procedure_state'" in str(caught.value)


def test_a_known_event_with_a_malformed_field_is_refused(tmp_path):
    log = small_log(tmp_path)
    log.append("dataset", dataset_id="d", uri="u", partitions=2, rows=3, time="yesterday")
    with pytest.raises(EventLogError, match="line 4: the dataset event has a malformed field"):
        ExperimentState.from_events(log.read())


def test_an_unknown_kind_is_skipped_with_one_warning(tmp_path, caplog):
    log = small_log(tmp_path)
    log.append("hologram", trial="nobody")
    log.append("hologram", trial="nobody")
    with caplog.at_level(logging.WARNING):
        state = ExperimentState.from_events(log.read())
    assert list(state.trials) == ["t0"]
    assert caplog.text.count("'hologram', which this version does not know") == 1


def test_non_finite_metrics_are_standard_json_and_read_back(tmp_path):
    log = small_log(tmp_path)
    written = log.append(
        "trial_epoch",
        round=0,
        trial="t0",
        epoch=1,
        metrics={"loss": math.nan, "accuracy": 0.5, "up": math.inf, "down": -math.inf},
        checkpoint=None,
        checkpoint_sha256=None,
        best_epoch=None,
        best_checkpoint=None,
        best_checkpoint_sha256=None,
    )
    raw = strict_lines((tmp_path / "events.jsonl").read_bytes())[-1]
    assert raw["metrics"] == {"loss": "NaN", "accuracy": 0.5, "up": "Infinity", "down": "-Infinity"}
    assert sorted(raw["nonfinite"]) == [["metrics", p] for p in ("down", "loss", "up")]
    event = log.read()[-1]
    assert "nonfinite" not in event
    assert math.isnan(event["metrics"]["loss"]) and math.isnan(written["metrics"]["loss"])
    assert event["metrics"]["up"] == math.inf and event["metrics"]["down"] == -math.inf
    state = ExperimentState.from_events(log.read())
    assert math.isnan(state.trials["t0"].metrics["loss"])
    assert state.trials["t0"].best_epoch is None


def test_a_string_metric_named_nan_stays_a_string(tmp_path):
    log = small_log(tmp_path)
    log.append("tracking", backend="x", trial="t0", run_id="NaN", experiment="e", uri="u")
    assert log.read()[-1]["run_id"] == "NaN"


def test_an_old_log_with_bare_nan_still_reads(tmp_path):
    small_log(tmp_path)
    path = tmp_path / "events.jsonl"
    old = (
        '{"event":"trial_epoch","time":1.0,"round":0,"trial":"t0","epoch":1,'
        '"metrics":{"loss":NaN,"accuracy":0.5},"checkpoint":null,"checkpoint_sha256":null}\n'
    )
    path.write_bytes(path.read_bytes() + old.encode())
    state = ExperimentState.from_events(read_events(open_store(str(tmp_path))))
    assert math.isnan(state.trials["t0"].metrics["loss"])


def test_a_forged_nonfinite_field_is_refused(tmp_path):
    small_log(tmp_path)
    path = tmp_path / "events.jsonl"
    forged = {
        "event": "decision",
        "time": 1.0,
        "metrics": {"x": 1.0},
        "nonfinite": [["metrics", "x"]],
    }
    path.write_bytes(path.read_bytes() + json.dumps(forged).encode() + b"\n")
    with pytest.raises(
        EventLogError, match=r"line 4: its 'nonfinite' field names \['metrics', 'x'\]"
    ):
        read_events(open_store(str(tmp_path)))


def test_an_append_that_finds_the_disk_full_leaves_the_log_whole(tmpfs):
    disk = tmpfs("1m")
    log = small_log(disk)
    before = (disk / "events.jsonl").read_bytes()
    fill_disk(disk, leave=0)
    with pytest.raises(StoreFullError) as caught:
        log.append(
            "tracking", backend="x", trial=None, run_id="r" * 100_000, experiment="e", uri="u"
        )
    assert f"no space left on the disk of {disk / 'events.jsonl'}" in str(caught.value)
    assert "cerebro-spark resume" in str(caught.value)
    assert (disk / "events.jsonl").read_bytes() == before  # all or nothing


def test_a_torn_tail_is_repaired_on_a_full_disk(tmpfs):
    disk = tmpfs("1m")
    small_log(disk)
    path = disk / "events.jsonl"
    path.write_bytes(path.read_bytes() + b'{"event":"unit_e')
    fill_disk(disk, leave=0)
    assert EventLog(open_store(str(disk))).repair() == len(b'{"event":"unit_e')
    assert [e["event"] for e in strict_lines(path.read_bytes())][-1] == "decision"


def test_every_kind_this_version_writes_is_known(tmp_path, caplog):
    log = small_log(tmp_path)
    for kind in ("unit_start", "unit_failed", "elastic_plan", "resized", "replanned"):
        fields = {"trial": "t0"} if kind.startswith("unit") else {}
        log.append(kind, **fields)
    with caplog.at_level(logging.WARNING):
        ExperimentState.from_events(log.read())
    assert "does not know" not in caplog.text
