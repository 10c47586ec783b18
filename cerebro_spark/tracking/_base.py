"""Trackers follow the event log from a background thread (:class:`TrackingThread`).

The event log is the source of truth: a tracker sees every event the driver appends
(:attr:`~cerebro_spark.driver.EventLog.listeners`) and turns it into calls to a tracking
service. Those calls run on one background thread fed by a bounded queue, so a slow or
unreachable service never slows the search: when the queue is full events are dropped
(with a warning), a tracker that keeps failing is switched off (with a warning), and the
end of the run waits for what is in flight only up to a timeout.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cerebro_spark.driver import EventLog, ExperimentConfig
from cerebro_spark.store import Store

logger = logging.getLogger(__name__)

MAX_CONSECUTIVE_FAILURES = 3
"""Failures in a row after which a tracker is switched off for the rest of the session."""


@dataclasses.dataclass(frozen=True)
class TrackingContext:
    """What a tracker knows of the experiment it follows.

    Attributes:
        experiment_id: The experiment's id.
        config: Its config (metric and mode resolved).
        store: The root store (checkpoints are read from it by key).
        prefix: The experiment's folder in ``store`` (``experiments/<id>``).
        record: Logs a ``tracking`` event (thread-safe: the event is written by the
            driver's thread at its next append, or at the end of the run).
    """

    experiment_id: str
    config: ExperimentConfig
    store: Store
    prefix: str
    record: Callable[..., None]


class TrackerUnavailable(Exception):
    """A tracker cannot reach its service: it is switched off at once (not retried)."""


class Tracker(abc.ABC):
    """Turns events into a tracking service's calls (run on the tracking thread)."""

    name: str = "tracker"

    def reachable(self) -> bool:
        """Whether its service answers now (quick; asked from the driver's thread)."""
        return True

    @abc.abstractmethod
    def catch_up(self, events: Sequence[Mapping[str, Any]]) -> None:
        """Take in the events of earlier sessions (a resumed run) before any new one."""

    @abc.abstractmethod
    def handle(self, event: Mapping[str, Any]) -> None:
        """Track one event (raising is a failure of this tracker, not of the run)."""

    def close(self, error: BaseException | None) -> None:
        """Finish (the run ended, with ``error`` when it raised); flush what is open."""
        del error


_STOP = object()


class TrackingThread:
    """Feeds events from an :class:`EventLog` to trackers on a background thread.

    Args:
        trackers: The trackers, each called in order for each event.
        log: The experiment's event log (events are taken from its listeners; the
            ``tracking`` events trackers record are appended to it).
        queue_size: Events held at most; more are dropped with a warning.
        flush_timeout: Seconds :meth:`close` waits for the thread to finish.
    """

    def __init__(
        self,
        trackers: Sequence[Tracker],
        log: EventLog,
        *,
        queue_size: int = 10000,
        flush_timeout: float = 30.0,
    ) -> None:
        self.trackers = list(trackers)
        self.log = log
        self.flush_timeout = flush_timeout
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._outbox: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self._failures: dict[str, int] = {}
        self._off: set[str] = set()
        self._dropped = 0
        self._busy: Tracker | None = None
        self._thread = threading.Thread(target=self._loop, name="cerebro-tracking", daemon=True)

    def record(self, **fields: Any) -> None:
        """Queue a ``tracking`` event to log (callable from any thread)."""
        self._outbox.put(fields)

    def start(self, past_events: Sequence[Mapping[str, Any]]) -> None:
        """Start the thread: first the past events (catch-up), then each new one."""
        self._queue.put(("catch_up", list(past_events)))
        self.log.listeners.append(self._on_event)
        self._thread.start()

    def close(self, error: BaseException | None = None, timeout: float | None = None) -> bool:
        """Stop following the log and wait for the trackers.

        Args:
            error: What the run raised, if it did (trackers mark their runs failed).
            timeout: Seconds to wait at most (default: the flush timeout).

        Returns:
            Whether every queued event was handled in time.
        """
        if self._on_event in self.log.listeners:
            self.log.listeners.remove(self._on_event)
        timeout = self.flush_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        try:
            self._queue.put(("close", error), timeout=timeout)
            self._queue.put(_STOP, timeout=max(0.0, deadline - time.monotonic()))
        except queue.Full:
            pass
        while self._thread.is_alive() and time.monotonic() < deadline:
            self._thread.join(min(1.0, max(0.0, deadline - time.monotonic())))
            busy = self._busy
            if self._thread.is_alive() and busy is not None and not busy.reachable():
                logger.warning(
                    "%s tracking: its service does not answer; not waiting for it", busy.name
                )
                break
        self._write_outbox()
        done = not self._thread.is_alive()
        if not done:
            logger.warning(
                "tracking did not finish within %.0f s (tracking.flush_timeout); about %d "
                "events were not tracked (the run itself is complete: see its event log)",
                timeout,
                self._queue.qsize(),
            )
        if self._dropped:
            logger.warning(
                "%d events were not tracked: the tracking queue was full (tracking.queue_size)",
                self._dropped,
            )
        return done

    # -- the driver's thread ----------------------------------------------------------------

    def _on_event(self, event: dict[str, Any]) -> None:
        if event["event"] == "tracking":
            return
        try:
            self._queue.put_nowait(("event", event))
        except queue.Full:
            self._dropped += 1
            if self._dropped == 1:
                logger.warning(
                    "the tracking queue is full (%d events): events are dropped from "
                    "tracking until it drains; the event log keeps them all",
                    self._queue.maxsize,
                )
        self._write_outbox()

    def _write_outbox(self) -> None:
        while True:
            try:
                fields = self._outbox.get_nowait()
            except queue.Empty:
                return
            try:
                self.log.append("tracking", **fields)
            except Exception as error:  # tracking must never fail the run
                logger.warning("could not log a tracking event %s: %s", fields, error)

    # -- the tracking thread ----------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            kind, payload = item
            for tracker in self.trackers:
                if tracker.name in self._off:
                    continue
                if kind == "catch_up":
                    self._call(tracker, "catching up", tracker.catch_up, payload)
                elif kind == "event":
                    self._call(tracker, f"tracking {payload['event']}", tracker.handle, payload)
                else:
                    self._call(tracker, "closing", tracker.close, payload)

    def _call(self, tracker: Tracker, what: str, method: Callable[[Any], None], arg: Any) -> None:
        self._busy = tracker
        try:
            method(arg)
        except TrackerUnavailable as error:
            self._off.add(tracker.name)
            logger.warning(
                "%s tracking is off for this run: %s (the search goes on; its event log is "
                "complete)",
                tracker.name,
                error,
            )
        except Exception as error:
            failures = self._failures.get(tracker.name, 0) + 1
            self._failures[tracker.name] = failures
            if failures >= MAX_CONSECUTIVE_FAILURES:
                self._off.add(tracker.name)
                logger.warning(
                    "%s tracking failed %d times in a row (last while %s: %s); it is off for "
                    "the rest of this run (the search goes on; its event log is complete)",
                    tracker.name,
                    failures,
                    what,
                    error,
                )
            else:
                logger.warning("%s tracking failed while %s: %s", tracker.name, what, error)
        else:
            self._failures[tracker.name] = 0
        finally:
            self._busy = None
