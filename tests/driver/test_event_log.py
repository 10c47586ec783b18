"""The event log survives what a crash leaves (a torn last line) and refuses the rest."""

import errno
import json
import logging
import math
import os

import pytest

from cerebro_spark.driver._events import encode_event
from cerebro_spark.engine import EventLog, read_events
from cerebro_spark.errors import EventLogError, StoreFullError
from cerebro_spark.store import open_store

KEY = "events.jsonl"


def log_with(store, *lines: bytes) -> None:
    store.put(KEY, b"".join(lines))


def line(**record) -> bytes:
    return json.dumps(record).encode() + b"\n"


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return open_store(str(tmp_path))
    return open_store(request.getfixturevalue("s3_server").uri("exp"))


@pytest.mark.parametrize(
    "torn",
    [b'{"event":"unit_end","tri', b'{"event":"x"', '{"event":"é'.encode()[:-1], b"  "],
    ids=["mid-field", "unclosed", "mid-utf8", "blanks"],
)
def test_a_torn_tail_is_ignored_then_cut_before_the_next_append(store, torn, caplog):
    log_with(store, line(event="a", n=1), line(event="b", n=2), torn)
    with caplog.at_level(logging.WARNING):
        assert [e["event"] for e in read_events(store)] == ["a", "b"]
    assert torn.strip() == b"" or "torn last line 3" in caplog.text
    log = EventLog(store)
    log.append("c", n=3)
    log.append("d", n=4)
    log.flush()  # an object store's log commits appends in groups
    assert [e["event"] for e in read_events(store)] == ["a", "b", "c", "d"]
    data = store.get(KEY)
    assert data.endswith(b"\n") and len(data.splitlines()) == 4  # the torn bytes are gone


def test_a_whole_event_short_of_its_newline_is_kept(store):
    log_with(store, line(event="a"), b'{"event":"b","n":2}')
    assert [e["event"] for e in read_events(store)] == ["a", "b"]
    assert EventLog(store).repair() == 0
    log = EventLog(store)
    log.append("c")
    log.flush()
    assert [e["event"] for e in read_events(store)] == ["a", "b", "c"]


def test_what_no_crash_can_leave_is_refused_naming_the_line(store):
    log_with(store, line(event="a"), b'{"event":"b",\n', line(event="c"))
    with pytest.raises(EventLogError, match=r"line 2 of 3 is not an event"):
        read_events(store)
    log_with(store, line(event="a"), b"[1, 2]\n")
    with pytest.raises(EventLogError, match=r"line 2 of 2 is not an event \('\[1, 2\]'\)"):
        read_events(store)


def test_repair_reports_what_it_dropped(tmp_path):
    store = open_store(str(tmp_path))
    log = EventLog(store)
    assert log.repair() == 0  # no log yet
    log_with(store, line(event="a"), b'{"ev')
    assert EventLog(store).repair() == 4
    assert read_events(store) == [{"event": "a"}]


# -- object stores: segments and group commit ----------------------------------------------


@pytest.fixture
def s3(s3_server):
    return open_store(s3_server.uri("exp"))


def names(events) -> list[str]:
    return [e["event"] for e in events]


def test_an_object_store_log_goes_on_in_segments_read_back_in_order(s3):
    log = EventLog(s3, segment_bytes=400, flush_seconds=0)  # every append is written
    for n in range(30):
        log.append("e", n=n)
    segments = s3.list("events.jsonl.d")
    assert len(segments) >= 2 and segments == sorted(segments)
    assert segments[0] == "events.jsonl.d/00000001.jsonl"
    line_bytes = len(s3.get("events.jsonl").splitlines()[0]) + 1
    for key in ["events.jsonl", *segments[:-1]]:
        assert len(s3.get(key)) <= 400 + line_bytes  # each rewrite stays small
    assert [e["n"] for e in read_events(s3)] == list(range(30))
    before = {key: s3.get(key) for key in ["events.jsonl", *segments[:-1]]}
    reopened = EventLog(s3, segment_bytes=400, flush_seconds=0)
    reopened.append("e", n=30)  # goes on the last segment; earlier ones are left as they are
    assert {key: s3.get(key) for key in before} == before
    assert [e["n"] for e in read_events(s3)] == list(range(31))


def test_appends_to_an_object_store_are_written_at_the_next_flush(s3):
    log = EventLog(s3, flush_seconds=3600)
    done: list[int] = []
    log.append("a")
    log.append("b")
    log.after_flush(lambda: done.append(len(read_events(s3))))
    assert read_events(s3) == [] and done == []  # buffered: nothing written yet
    log.flush()
    assert names(read_events(s3)) == ["a", "b"] and done == [2]  # after the events it waited for
    log.after_flush(lambda: done.append(-1))  # nothing buffered: at once
    assert done == [2, -1]
    log.append("c")
    assert names(log.read()) == ["a", "b", "c"]  # the log's own read includes the buffer


def test_an_append_flushes_once_the_oldest_buffered_event_waited_long_enough(s3, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr("cerebro_spark.driver._events.time.monotonic", lambda: now[0])
    log = EventLog(s3, flush_seconds=1.0)
    log.append("a")
    now[0] += 0.6
    log.append("b")
    assert read_events(s3) == []
    now[0] += 0.5  # "a" waited 1.1 s
    log.append("c")
    assert names(read_events(s3)) == ["a", "b", "c"]


def test_a_refused_write_keeps_the_events_buffered(s3):
    from cerebro_spark.errors import LeaseError

    log = EventLog(s3, flush_seconds=3600)
    log.before_write = lambda: (_ for _ in ()).throw(LeaseError("another driver took over"))
    log.append("a")
    with pytest.raises(LeaseError, match="took over"):
        log.flush()
    assert read_events(s3) == []
    log.before_write = None
    log.flush()
    assert names(read_events(s3)) == ["a"]


def test_a_torn_segment_with_one_after_it_is_refused_naming_the_segment(s3):
    s3.put(KEY, line(event="a") + b'{"event":"b",')
    s3.put("events.jsonl.d/00000001.jsonl", line(event="c"))
    with pytest.raises(EventLogError, match=r"events\.jsonl.*: its last line 2 is torn"):
        read_events(s3)


def test_errors_name_the_segment_and_its_line(s3):
    s3.put(KEY, line(event="a"))
    s3.put("events.jsonl.d/00000001.jsonl", line(event="b") + b"[1]\n")
    with pytest.raises(EventLogError, match=r"00000001\.jsonl.*: line 2 of 2 is not an event"):
        read_events(s3)


def test_a_torn_last_segment_is_repaired_and_the_log_goes_on(s3):
    s3.put(KEY, line(event="a"))
    s3.put("events.jsonl.d/00000001.jsonl", line(event="b") + b'{"event":"c","x')
    assert names(read_events(s3)) == ["a", "b"]
    log = EventLog(s3)
    assert log.repair() == len(b'{"event":"c","x')
    log.append("d")
    log.flush()
    assert names(read_events(s3)) == ["a", "b", "d"]
    assert s3.get("events.jsonl.d/00000001.jsonl").endswith(b"\n")


def test_a_log_in_segments_copied_to_a_local_disk_goes_on_in_segments(tmp_path):
    store = open_store(str(tmp_path))
    store.put(KEY, line(event="a"))
    store.put("events.jsonl.d/00000001.jsonl", line(event="b"))
    log = EventLog(store)
    log.append("c")
    log.flush()
    assert names(read_events(store)) == ["a", "b", "c"]
    assert store.get(KEY) == line(event="a")


def test_a_local_log_is_whole_on_disk_after_every_append_and_across_flushes(tmp_path):
    """Appends between flushes go through one open file; each is on disk as it returns."""
    store = open_store(str(tmp_path))
    log = EventLog(store)
    for round_ in range(3):
        for n in range(4):
            log.append("unit_end", round=round_, n=n)
            lines = store.get(KEY).splitlines()
            last = json.loads(lines[-1])
            assert (len(lines), last["round"], last["n"]) == (4 * round_ + n + 1, round_, n)
        log.flush()  # closes the file; the next append opens it again
    assert [(e["round"], e["n"]) for e in read_events(store)] == [
        (r, n) for r in range(3) for n in range(4)
    ]


def test_a_short_write_is_cut_off_and_the_event_appended_whole(tmp_path, monkeypatch):
    store = open_store(str(tmp_path))
    log = EventLog(store)
    log.append("a")  # the log file is open now
    write = os.write
    calls = []

    def short_once(fd: int, data: bytes) -> int:  # a disk about to fill: a partial write
        calls.append(len(data))
        return write(fd, data[:5]) if len(calls) == 1 else write(fd, data)

    monkeypatch.setattr(os, "write", short_once)
    log.append("b", n=2)
    log.append("c", n=3)
    monkeypatch.undo()
    log.flush()
    assert [e["event"] for e in read_events(store)] == ["a", "b", "c"]
    assert len(calls) >= 3  # the short write, the store's whole append, then "c"


def test_a_full_disk_raises_store_full_and_the_log_goes_on_once_freed(tmp_path, monkeypatch):
    store = open_store(str(tmp_path))
    log = EventLog(store)
    log.append("a")
    write = os.write

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(StoreFullError, match="no space left on the disk of"):
        log.append("b")
    monkeypatch.setattr(os, "write", write)
    log.append("c")
    log.flush()
    assert [e["event"] for e in read_events(store)] == ["a", "c"]


@pytest.mark.parametrize(
    "record",
    [
        {"event": "unit_end", "time": 1795527213.45124, "trial": "t1", "partition": 3},
        {"event": "x", "nested": {"a": [1, 2.5, None, True, False, 'é\n"q"']}, "n": -0.0},
        {"event": "trial_epoch", "metrics": {"loss": 0.1, "acc": 1e-300}, "big": 10**30},
        {"event": "decision", "tuple": (1, "two"), "empty": {}, "list": []},
    ],
)
def test_an_event_is_encoded_as_json_dumps_writes_it(record) -> None:
    expected = json.dumps(record, separators=(",", ":"), allow_nan=False)
    assert encode_event(record) == expected


def test_a_non_finite_float_is_written_as_a_string_and_read_back(tmp_path) -> None:
    record = {"event": "trial_epoch", "metrics": {"loss": float("nan"), "acc": float("inf")}}
    line = encode_event(record)
    assert json.loads(line)["nonfinite"] == [["metrics", "loss"], ["metrics", "acc"]]
    store = open_store(str(tmp_path))
    store.put(KEY, line.encode() + b"\n")
    (event,) = read_events(store)
    assert math.isnan(event["metrics"]["loss"]) and event["metrics"]["acc"] == math.inf
