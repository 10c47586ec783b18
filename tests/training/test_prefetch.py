"""Prefetcher: in order, bounded ahead, errors at their item, no thread left behind."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable

import pytest

from cerebro_spark.errors import ConfigError
from cerebro_spark.training._prefetch import Prefetcher


def prefetch_threads(prefix: str = "cerebro-prefetch") -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


@pytest.fixture(autouse=True)
def no_thread_left() -> object:
    assert prefetch_threads() == []
    yield
    assert prefetch_threads() == []


@pytest.mark.parametrize(("threads", "depth"), [(0, None), (1, None), (3, None), (4, 2), (2, 9)])
def test_items_come_in_order_each_made_once(threads: int, depth: int | None) -> None:
    calls: list[int] = []
    lock = threading.Lock()

    def make(i: int) -> int:
        time.sleep(0.001 * ((7 * i) % 5))  # later items often finish first
        with lock:
            calls.append(i)
        return i * i

    prefetcher = Prefetcher(make, 20, threads=threads, depth=depth)
    assert list(prefetcher) == [i * i for i in range(20)]
    assert sorted(calls) == list(range(20))
    assert prefetcher.items == 20
    assert list(prefetcher) == []  # exhausted, and closed at the last item
    if threads == 0:
        assert calls == list(range(20))


def test_inline_starts_no_thread_and_counts_make_time_as_wait() -> None:
    before = set(threading.enumerate())

    def make(i: int) -> int:
        assert set(threading.enumerate()) == before
        time.sleep(0.02)
        return i

    prefetcher = Prefetcher(make, 3, threads=0)
    assert prefetcher.depth == 1
    assert list(prefetcher) == [0, 1, 2]
    assert prefetcher.wait_seconds >= 0.06


def test_wait_seconds_is_time_blocked_on_the_next_item() -> None:
    ready = threading.Event()
    prefetcher = Prefetcher(lambda i: ready.wait(10) and i, 2, threads=2)
    with prefetcher:
        threading.Timer(0.1, ready.set).start()
        assert next(prefetcher) == 0
        blocked = prefetcher.wait_seconds
        assert blocked >= 0.05
        assert next(prefetcher) == 1
        assert prefetcher.wait_seconds - blocked < 5  # item 1 was ready or nearly
    assert prefetcher.items == 2


def test_at_most_depth_items_are_computed_ahead() -> None:
    started: list[int] = []
    lock = threading.Lock()

    def make(i: int) -> int:
        with lock:
            started.append(i)
        return i

    with Prefetcher(make, 50, threads=4, depth=3) as prefetcher:
        assert wait_for(lambda: len(started) == 3)
        time.sleep(0.1)  # given the time, no thread takes a fourth item
        assert sorted(started) == [0, 1, 2]
        assert next(prefetcher) == 0
        assert wait_for(lambda: len(started) == 4)
        time.sleep(0.1)
        assert sorted(started) == [0, 1, 2, 3]
        assert [next(prefetcher) for _ in range(5)] == [1, 2, 3, 4, 5]
        assert wait_for(lambda: len(started) == 9)
        time.sleep(0.05)
        assert len(started) == 9


def test_an_error_reaches_the_consumer_at_its_item() -> None:
    error = KeyError("row 7")
    made: list[int] = []

    def make(i: int) -> int:
        made.append(i)
        if i == 2:
            raise error
        return i

    for threads in (0, 2):
        made.clear()
        prefetcher = Prefetcher(make, 10, threads=threads, depth=4)
        assert next(prefetcher) == 0
        if threads:
            assert wait_for(lambda: 2 in made)  # computed (and failed) ahead: not raised yet
        assert next(prefetcher) == 1
        with pytest.raises(KeyError) as raised:
            next(prefetcher)
        assert raised.value is error
        assert any(frame.name == "make" for frame in raised.traceback)
        assert prefetch_threads() == []  # closed on the error
        assert list(prefetcher) == []
        assert prefetcher.items == 2


def test_close_stops_the_threads_after_the_running_item() -> None:
    release = threading.Event()
    finished: list[int] = []

    def make(i: int) -> int:
        if i == 1:
            release.wait(10)
        finished.append(i)
        return i

    prefetcher = Prefetcher(make, 100, threads=3, depth=6)
    assert next(prefetcher) == 0
    assert wait_for(lambda: len(finished) >= 5)  # 0, 2..5 done; 1 is blocked
    threading.Timer(0.05, release.set).start()
    prefetcher.close()
    assert prefetch_threads() == []
    assert release.is_set() and 1 in finished
    assert len(finished) <= 7  # nothing beyond the window was made
    with pytest.raises(StopIteration):
        next(prefetcher)


def test_leaving_a_with_block_early_stops_the_threads() -> None:
    with Prefetcher(lambda i: i, 1000, threads=2, depth=8, name="pf-with") as prefetcher:
        for item in prefetcher:
            if item == 3:
                break
        assert len(prefetch_threads("pf-with")) == 2
    assert prefetch_threads("pf-with") == []


def test_an_abandoned_prefetcher_stops_its_threads() -> None:
    def consume_a_few() -> None:
        for item in Prefetcher(lambda i: i, 1000, threads=2, name="pf-abandoned"):
            if item == 2:
                break

    consume_a_few()
    gc.collect()
    assert prefetch_threads("pf-abandoned") == []


def test_nothing_to_make() -> None:
    prefetcher = Prefetcher(lambda i: i, 0, threads=4)
    assert prefetch_threads() == []
    assert list(prefetcher) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"count": -1}, "count must be an integer >= 0, got -1"),
        ({"threads": -1}, "threads must be an integer >= 0, got -1"),
        ({"threads": 1.5}, "threads must be an integer >= 0, got 1.5"),
        ({"depth": 0}, "depth must be an integer >= 1, got 0"),
    ],
)
def test_arguments_are_validated(kwargs: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {"count": 3, "threads": 1, **kwargs}
    count = arguments.pop("count")
    with pytest.raises(ConfigError, match=message):
        Prefetcher(lambda i: i, count, **arguments)  # type: ignore[arg-type]
