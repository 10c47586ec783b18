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


def restore_after(proxy: TcpProxy, seconds: float) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(seconds), proxy.restore()), daemon=True)
    thread.start()
    return thread


def test_a_put_and_a_get_wait_for_the_endpoint_to_come_back(s3_server, proxy, caplog):
    store = open_store(proxied_uri(s3_server, proxy, "wait"))
    store.put("a", b"before")
    proxy.cut()
    thread = restore_after(proxy, 10.0)  # longer than pyarrow's own retries
    with caplog.at_level(logging.WARNING, logger="cerebro_spark.store"):
        store.put("b", b"during")
        assert store.get("a") == b"before"
    thread.join()
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
    s3_server, proxy, monkeypatch, tmp_path, caplog
):
    monkeypatch.setenv(RETRY_SECONDS_ENV, "180")  # workers inherit it
    reference_store = tmp_path / "reference"
    run_experiment(parse_config(tiny_config(reference_store)), experiment_id="reference")
    reference = outcome(strict_events(str(reference_store), "reference")[1])

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
                    time.sleep(15.0)
                    proxy.restore()
                    return
            time.sleep(0.05)

    thread = threading.Thread(target=cut_mid_run, daemon=True)
    thread.start()
    with caplog.at_level(logging.WARNING, logger="cerebro_spark.store"):
        run_experiment(parse_config(tiny_config(uri)), experiment_id="outage")
    thread.join()
    assert outage["ends"] < 4 * 2 * 2 * 2, "the outage came after the run's last unit"
    assert "the store looks unreachable" in caplog.text
    events, state = strict_events(uri, "outage")
    assert state.finished and outcome(state) == reference
    ends = unit_ends(events)
    assert len(ends) == len(set(ends)) == 4 * 2 * 2 * 2
