"""The S3 store unreachable for a while (issue 12, part 6's case).

A :class:`~tests.reliability.conftest.TcpProxy` stands between the store and the moto
server: cutting it refuses new connections and resets open ones (the real S3 protocol,
a real outage of the endpoint), while moto keeps its objects, as S3 would. The store
retries connection failures with backoff (warnings), for up to
``CEREBRO_STORE_RETRY_SECONDS``; errors that retrying cannot fix are raised at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest

from cerebro_spark.engine import parse_config, run_experiment
from cerebro_spark.errors import ConfigError, StoreUnavailableError
from cerebro_spark.store import RETRY_SECONDS_ENV, open_store, retry_seconds
from tests.conftest import REGION
from tests.reliability.conftest import TcpProxy, outcome, strict_events, tiny_config, unit_ends


@pytest.fixture
def proxy(s3_server):
    proxy = TcpProxy(s3_server.endpoint)
    yield proxy
    proxy.close()


def proxied_uri(s3_server, proxy: TcpProxy, prefix: str) -> str:
    return (
        f"s3://{s3_server.bucket}/{prefix}?endpoint_override={proxy.endpoint}"
        f"&scheme=http&region={REGION}"
    )


class Noticed(logging.Handler):
    """Set once the store has logged that it looks unreachable (in any thread)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "the store looks unreachable" in record.getMessage():
            self.event.set()


@pytest.fixture
def noticed() -> Iterator[threading.Event]:
    """An event set when ``cerebro_spark.store`` first warns that it is retrying: the store
    has given up on pyarrow's own retries and waits for the endpoint (its level is the
    test's, e.g. ``caplog.at_level(logging.WARNING, ...)``)."""
    handler = Noticed()
    logger = logging.getLogger("cerebro_spark.store")
    logger.addHandler(handler)
    yield handler.event
    logger.removeHandler(handler)


def restore_when(proxy: TcpProxy, noticed: threading.Event, least_s: float) -> threading.Thread:
    """Restore the endpoint once the store noticed the outage, and not before ``least_s``."""

    def restore() -> None:
        begun = time.monotonic()
        noticed.wait(OUTAGE_LIMIT_S)
        time.sleep(max(0.0, least_s - (time.monotonic() - begun)))
        proxy.restore()

    thread = threading.Thread(target=restore, daemon=True)
    thread.start()
    return thread


# The longest an outage lasts when the store never notices it (the test then fails on the
# missing warning): generous, for a loaded machine.
OUTAGE_LIMIT_S = 120.0


def test_a_put_and_a_get_wait_for_the_endpoint_to_come_back(s3_server, proxy, caplog, noticed):
    store = open_store(proxied_uri(s3_server, proxy, "wait"))
    store.put("a", b"before")
    proxy.cut()
    # Back once the store found it gone and waits for it (pyarrow's own retries given up,
    # its first warning logged), and not before a second.
    thread = restore_when(proxy, noticed, least_s=1.0)
    with caplog.at_level(logging.WARNING, logger="cerebro_spark.store"):
        store.put("b", b"during")
        assert store.get("a") == b"before"
    thread.join()
    assert noticed.is_set()
    assert store.get("b") == b"during"
    assert "the store looks unreachable" in caplog.text
    assert "succeeded after" in caplog.text


def test_an_outage_longer_than_the_budget_ends_in_store_unavailable(s3_server, proxy, monkeypatch):
    monkeypatch.setenv(RETRY_SECONDS_ENV, "1")
    store = open_store(proxied_uri(s3_server, proxy, "budget"))
    proxy.cut()
    begun = time.monotonic()
    with pytest.raises(StoreUnavailableError) as caught:
        store.get("events.jsonl")
    message = str(caught.value)
    assert "get of s3://" in message and "events.jsonl" in message
    assert f"{RETRY_SECONDS_ENV}=1" in message and "NETWORK_CONNECTION" in message
    assert time.monotonic() - begun < 60


def test_a_missing_key_is_not_retried(s3_server, proxy, caplog):
    store = open_store(proxied_uri(s3_server, proxy, "missing"))
    with (
        caplog.at_level(logging.WARNING, logger="cerebro_spark.store"),
        pytest.raises(FileNotFoundError, match="no object in store at s3://"),
    ):
        store.get("nothing-here")
    assert "unreachable" not in caplog.text


def test_a_missing_bucket_is_not_retried(s3_server, proxy, caplog):
    uri = f"s3://no-such-bucket-{s3_server.bucket}/x?endpoint_override={proxy.endpoint}"
    store = open_store(uri + f"&scheme=http&region={REGION}")
    begun = time.monotonic()
    with (
        caplog.at_level(logging.WARNING, logger="cerebro_spark.store"),
        pytest.raises(OSError) as caught,
    ):
        store.put("k", b"v")
    assert not isinstance(caught.value, StoreUnavailableError)
    assert "unreachable" not in caplog.text
    assert time.monotonic() - begun < 30


@pytest.mark.parametrize("value", ["-1", "soon", "nan"])
def test_a_bad_retry_budget_is_refused_by_name(monkeypatch, value):
    monkeypatch.setenv(RETRY_SECONDS_ENV, value)
    with pytest.raises(ConfigError, match=f"{RETRY_SECONDS_ENV}='{value}' must be a number"):
        retry_seconds()


@pytest.mark.torch
@pytest.mark.slow
def test_the_s3_endpoint_lost_mid_run_the_run_waits_and_goes_on(
    s3_server, proxy, monkeypatch, tiny_reference, caplog, noticed
):
    monkeypatch.setenv(RETRY_SECONDS_ENV, "180")  # workers inherit it
    reference = tiny_reference.outcome  # the uninterrupted run (local disk)

    uri = proxied_uri(s3_server, proxy, "lake")
    direct = open_store(s3_server.uri("lake")).child("experiments/outage")  # not via proxy
    outage: dict[str, float] = {}

    def cut_mid_run() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if direct.exists("events.jsonl"):
                ends = direct.get("events.jsonl").count(b'"event":"unit_end"')
                if ends >= 6:
                    proxy.cut()
                    outage["ends"] = ends
                    # Back once the driver has found the store gone and waits for it (it
                    # writes an event per unit), and not before a few seconds.
                    begun = time.monotonic()
                    noticed.wait(OUTAGE_LIMIT_S)
                    time.sleep(max(0.0, 3.0 - (time.monotonic() - begun)))
                    outage["noticed"] = noticed.is_set()
                    proxy.restore()
                    return
            time.sleep(0.05)

    thread = threading.Thread(target=cut_mid_run, daemon=True)
    thread.start()
    with caplog.at_level(logging.WARNING, logger="cerebro_spark.store"):
        run_experiment(parse_config(tiny_config(uri)), experiment_id="outage")
    thread.join()
    assert outage["ends"] < 4 * 2 * 2 * 2, "the outage came after the run's last unit"
    assert outage["noticed"] and "the store looks unreachable" in caplog.text
    events, state = strict_events(uri, "outage")
    assert state.finished and outcome(state) == reference
    ends = unit_ends(events)
    assert len(ends) == len(set(ends)) == 4 * 2 * 2 * 2
