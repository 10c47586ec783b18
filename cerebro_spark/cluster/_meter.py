"""CostMeter: what the executors a search held really cost.

The meter samples a :class:`~._base.ClusterManager`'s executors (a background thread every
``interval_s``, and whenever asked) and keeps, per billed instance
(:attr:`Executor.billed_as`), when it was requested (``Executor.since``) and when it was
last seen serving. An instance that disappears from a snapshot is released at that moment.
Dollars follow the price catalog's per-instance billing (RubberBand §3: per
``granularity_seconds``, at least ``minimum_seconds`` per instance), at the instance
type's hourly price; an executor billed as itself costs its share of an instance
(``executors`` per instance in the catalog). :meth:`CostMeter.usd` is the bill as it would
stand at any moment, so a stage's cost is the difference of the bill at its two ends.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from cerebro_spark.cluster._base import ClusterManager
from cerebro_spark.elastic import PriceCatalog
from cerebro_spark.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Held:
    """One billed instance.

    Attributes:
        key: What it is billed as.
        since: When it was requested (Unix seconds).
        until: When it was released (``None``: still held).
        share: Share of an instance's price it costs (``1/executors`` for an executor
            billed as itself).
    """

    key: str
    since: float
    until: float | None
    share: float


class CostMeter:
    """Integrates executor (instance) seconds into dollars (see the module docstring).

    Args:
        manager: Whose executors are billed.
        catalog: Prices and billing rules.
        instance_type: The instance type the executors run on.
        interval_s: Seconds between samples of the background thread.
        clock: Unix time (for tests).

    Raises:
        ConfigError: The catalog does not list ``instance_type`` or does not bill per
            instance (per-function billing is a planning model: it cannot be metered from
            executors).
    """

    def __init__(
        self,
        manager: ClusterManager,
        catalog: PriceCatalog,
        instance_type: str,
        *,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if catalog.billing != "per_instance":
            raise ConfigError(
                f"price catalog {catalog.name} bills {catalog.billing}; the cost meter bills "
                "the instances a run holds and needs billing.model: per_instance"
            )
        self.price = catalog.price(instance_type)
        self.catalog = catalog
        self._manager = manager
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._held: dict[str, Held] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Sample now, then every ``interval_s`` in a background thread until :meth:`stop`."""
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="cerebro-cost-meter", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Take a last sample and stop sampling (idempotent)."""
        if not self._stop.is_set():
            self._stop.set()
            if self._thread is not None:
                self._thread.join(timeout=10)
            self.sample()

    def release_all(self, at: float | None = None) -> None:
        """Mark every held instance released (the cluster was closed)."""
        now = self._clock() if at is None else at
        with self._lock:
            for held in self._held.values():
                if held.until is None:
                    held.until = now

    def sample(self) -> int:
        """Record the executors serving now; return how many."""
        try:
            executors = self._manager.executors()
        except Exception:
            logger.warning("the cost meter could not list executors", exc_info=True)
            return -1
        now = self._clock()
        seen: set[str] = set()
        with self._lock:
            for executor in executors:
                key = executor.billed_as
                seen.add(key)
                held = self._held.get(key)
                if held is None or held.until is not None:
                    share = 1.0 if executor.instance is not None else 1.0 / self.price.executors
                    since = min(executor.since or now, now)
                    if held is not None:  # a snapshot missed it (listener lag): one bill
                        since = held.since
                    self._held[key] = Held(key, since, None, share)
            for held in self._held.values():
                if held.until is None and held.key not in seen:
                    held.until = now
        return len(executors)

    def held(self) -> list[Held]:
        """Every instance billed so far."""
        with self._lock:
            return [dataclasses.replace(h) for h in self._held.values()]

    def usd(self, at: float | None = None) -> float:
        """The bill as it would stand at ``at`` (default: now), minimums included."""
        now = self._clock() if at is None else at
        total = 0.0
        with self._lock:
            for held in self._held.values():
                if held.since > now:
                    continue
                end = now if held.until is None else min(held.until, now)
                seconds = self.catalog.billed_seconds(end - held.since)
                total += seconds * self.price.usd_per_hour / 3600.0 * held.share
        return total

    def instance_seconds(self, at: float | None = None) -> float:
        """Instance-seconds held up to ``at`` (no minimums)."""
        now = self._clock() if at is None else at
        with self._lock:
            return sum(
                max(0.0, (now if h.until is None else min(h.until, now)) - h.since) * h.share
                for h in self._held.values()
            )

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.sample()
