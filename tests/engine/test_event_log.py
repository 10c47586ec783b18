"""The event log survives what a crash leaves (a torn last line) and refuses the rest."""

import json
import logging

import pytest

from cerebro_spark.engine import EventLog, read_events
from cerebro_spark.errors import EventLogError
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
    assert [e["event"] for e in read_events(store)] == ["a", "b", "c", "d"]
    data = store.get(KEY)
    assert data.endswith(b"\n") and len(data.splitlines()) == 4  # the torn bytes are gone


def test_a_whole_event_short_of_its_newline_is_kept(store):
    log_with(store, line(event="a"), b'{"event":"b","n":2}')
    assert [e["event"] for e in read_events(store)] == ["a", "b"]
    assert EventLog(store).repair() == 0
    EventLog(store).append("c")
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
