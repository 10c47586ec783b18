"""Which store failures are retried, and for how long (no network: fake operations)."""

from __future__ import annotations

import errno
import logging

import pytest

from cerebro_spark.errors import StoreFullError, StoreUnavailableError
from cerebro_spark.store import RETRY_SECONDS_ENV, is_transient
from cerebro_spark.store import _filesystem as filesystem

CONNECTION = OSError(
    "When reading information for key 'k' in bucket 'b': AWS Error NETWORK_CONNECTION "
    "during HeadObject operation: curlCode: 7, Could not connect to server"
)


@pytest.mark.parametrize(
    "error",
    [
        CONNECTION,
        OSError("AWS Error SLOW_DOWN during PutObject operation: Please reduce your rate"),
        OSError("AWS Error SERVICE_UNAVAILABLE during GetObject operation"),
        ConnectionResetError("Connection reset by peer"),
        TimeoutError("timed out"),
    ],
)
def test_connection_level_failures_are_transient(error):
    assert is_transient(error)


@pytest.mark.parametrize(
    "error",
    [
        FileNotFoundError("no object"),
        PermissionError("denied"),
        OSError("AWS Error ACCESS_DENIED during GetObject operation: Access Denied"),
        OSError("AWS Error NO_SUCH_BUCKET during PutObject operation"),
        StoreFullError("no space left"),
        StoreUnavailableError("gave up: NETWORK_CONNECTION"),
        ValueError("NETWORK_CONNECTION"),  # not an OSError
    ],
)
def test_real_errors_are_not_transient(error):
    assert not is_transient(error)


class Flaky:
    def __init__(self, failures: int, error: BaseException = CONNECTION) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "done"


@pytest.fixture
def slept(monkeypatch):
    pauses: list[float] = []
    monkeypatch.setattr(filesystem.time, "sleep", pauses.append)
    return pauses


def test_retries_back_off_exponentially_and_log_each(slept, caplog):
    operation = Flaky(failures=4)
    with caplog.at_level(logging.WARNING, logger="cerebro_spark.store"):
        assert filesystem.with_retries("get", "s3://b/k", operation) == "done"
    assert operation.calls == 5
    assert slept == [0.5, 1.0, 2.0, 4.0]
    assert caplog.text.count("the store looks unreachable") == 4
    assert "get of s3://b/k succeeded after 4 retries" in caplog.text


def test_a_real_error_is_raised_at_once(slept):
    operation = Flaky(failures=1, error=PermissionError("denied"))
    with pytest.raises(PermissionError):
        filesystem.with_retries("put", "s3://b/k", operation)
    assert operation.calls == 1 and slept == []


def test_the_budget_bounds_the_total_wait(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(filesystem.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(filesystem.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    monkeypatch.setenv(RETRY_SECONDS_ENV, "10")
    with pytest.raises(StoreUnavailableError) as caught:
        filesystem.with_retries("get", "s3://b/k", Flaky(failures=10**6))
    assert clock[0] == 10.0  # the last pause is cut to the budget
    message = str(caught.value)
    assert message.startswith("get of s3://b/k failed: the store was unreachable for 10.0 s")
    assert f"{RETRY_SECONDS_ENV}=10" in message and "NETWORK_CONNECTION" in message
    assert isinstance(caught.value.__cause__, OSError)


def test_zero_budget_never_retries(monkeypatch, slept):
    monkeypatch.setenv(RETRY_SECONDS_ENV, "0")
    with pytest.raises(StoreUnavailableError):
        filesystem.with_retries("get", "s3://b/k", Flaky(failures=1))
    assert slept == []


def test_local_store_errors_are_not_retried_and_disk_full_is_named(tmp_path, monkeypatch):
    from cerebro_spark.store import open_store

    store = open_store(str(tmp_path))

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(filesystem.os, "fsync", full)
    with pytest.raises(StoreFullError, match=r"no space left on the disk of .*/k while writing"):
        store.put("k", b"v")
    assert store.list() == []  # no temporary file left behind
