"""A bounded, in-order prefetching iterator: the next batches are built while one trains.

:class:`Prefetcher` computes ``make(0) .. make(count - 1)`` on a few worker threads, at
most ``depth`` items ahead of the consumer, and yields them in order. Batch building
(decode, augment, copy to a tensor) mostly runs outside the GIL (PIL's decoders, numpy's
and torch's kernels), so the threads overlap it with each other and with training.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Generic, TypeVar

from cerebro_spark.errors import ConfigError

T = TypeVar("T")


class _Shared(Generic[T]):
    """State shared by a prefetcher and its threads.

    The threads never hold the prefetcher, so an abandoned prefetcher is collected and its
    finalizer stops them.
    """

    def __init__(self, make: Callable[[int], T], count: int, depth: int) -> None:
        self.make = make
        self.count = count
        self.depth = depth
        self.condition = threading.Condition()
        self.next_index = 0  # the next item a thread takes
        self.consumed = 0  # items handed to the consumer
        self.results: dict[int, tuple[bool, T | BaseException]] = {}
        self.stopped = False

    def work(self) -> None:
        """A worker thread: take the next index within the window, compute it, store it."""
        while True:
            with self.condition:
                while not self.stopped and (
                    self.next_index < self.count and self.next_index >= self.consumed + self.depth
                ):
                    self.condition.wait()
                if self.stopped or self.next_index >= self.count:
                    return
                index = self.next_index
                self.next_index += 1
            try:
                result: tuple[bool, T | BaseException] = (True, self.make(index))
            except BaseException as exc:  # handed to the consumer at item ``index``
                result = (False, exc)
            with self.condition:
                if self.stopped:
                    return
                self.results[index] = result
                self.condition.notify_all()


class Prefetcher(Generic[T]):
    """Iterate over ``make(0) .. make(count - 1)``, computed ahead by worker threads.

    ``threads`` worker threads take indices in increasing order; an index is taken only
    while fewer than ``depth`` items are computed or being computed but not yet yielded,
    so at most ``depth`` results are held at once (fewer than ``threads`` threads run when
    ``depth < threads``). Items are yielded in index order. With ``threads == 0`` each item
    is computed inline, in :meth:`__next__`, and no thread is started.

    An exception raised by ``make(i)`` is raised, the same exception object with its
    traceback, when the consumer asks for item ``i`` (items before it are yielded first);
    the prefetcher is then closed.

    Closing (:meth:`close`, leaving a ``with`` block, the last item, or an abandoned
    prefetcher being garbage collected) stops the threads: a thread running ``make``
    finishes that item and exits; :meth:`close` waits for that, so no thread is left
    running once it returns. An abandoned prefetcher is collected only when nothing the
    threads hold (``make``, its closure, a bound method's object) refers back to it: use it
    as a context manager or close it. Use one from a single consumer thread.

    Attributes:
        count: Number of items.
        threads: Number of worker threads (0: inline).
        depth: Most items computed ahead of the consumer.
        items: Items yielded so far.
        wait_seconds: Time the consumer spent in :meth:`__next__` waiting for an item;
            with ``threads == 0`` that is the inline ``make`` time.
    """

    def __init__(
        self,
        make: Callable[[int], T],
        count: int,
        *,
        threads: int = 1,
        depth: int | None = None,
        name: str = "cerebro-prefetch",
    ) -> None:
        """Start the threads (none when ``threads == 0``).

        Args:
            make: Computes item ``i``; called from the worker threads.
            count: Number of items (>= 0).
            threads: Worker threads (>= 0; 0 computes inline).
            depth: Most items computed ahead (>= 1); default ``2 * threads`` (1 inline).
            name: Prefix of the threads' names.

        Raises:
            ConfigError: ``count``, ``threads`` or ``depth`` is out of range.
        """
        for field, value, least in (("count", count, 0), ("threads", threads, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(
                    f"prefetcher {field} must be an integer >= {least}, got {value!r}"
                )
        if depth is None:
            depth = max(2 * threads, 1)
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ConfigError(f"prefetcher depth must be an integer >= 1, got {depth!r}")
        self.count = count
        self.threads = threads
        self.depth = depth
        self.items = 0
        self.wait_seconds = 0.0
        self._make = make
        self._closed = False
        self._shared: _Shared[T] = _Shared(make, count, depth)
        self._threads: list[threading.Thread] = []
        for k in range(min(threads, count)):
            thread = threading.Thread(target=self._shared.work, name=f"{name}-{k}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        index = self.items
        if self._closed or index >= self.count:
            self.close()
            raise StopIteration
        start = time.perf_counter()
        if self.threads == 0:
            try:
                value = self._make(index)
            except BaseException:
                self.wait_seconds += time.perf_counter() - start
                self.close()
                raise
            self.wait_seconds += time.perf_counter() - start
            self.items += 1
            return value
        shared = self._shared
        with shared.condition:
            while index not in shared.results and not shared.stopped:
                shared.condition.wait()
            if index not in shared.results:  # closed from another thread meanwhile
                raise StopIteration
            ok, result = shared.results.pop(index)
            shared.consumed = index + 1
            shared.condition.notify_all()
        self.wait_seconds += time.perf_counter() - start
        if not ok:
            self.close()
            assert isinstance(result, BaseException)
            raise result
        self.items += 1
        if self.items == self.count:
            self.close()
        return result  # type: ignore[return-value]

    def close(self) -> None:
        """Stop the threads and wait for them (a running ``make`` finishes first)."""
        if self._closed:
            return
        self._closed = True
        shared = self._shared
        with shared.condition:
            shared.stopped = True
            shared.results.clear()
            shared.condition.notify_all()
        current = threading.current_thread()
        for thread in self._threads:
            if thread is not current:
                thread.join()

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        # An abandoned prefetcher: its threads hold only ``_shared``, so it is collected.
        if not getattr(self, "_closed", True):
            self.close()
