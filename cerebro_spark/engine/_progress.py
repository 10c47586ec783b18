"""Live progress of a run: units done, round, best so far, elapsed time."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

logger = logging.getLogger("cerebro_spark.progress")


class Progress:
    """Logs a one-line status at most every ``interval`` seconds (and on demand)."""

    def __init__(self, interval: float = 2.0, clock: Callable[[], float] = time.monotonic):
        self.interval = interval
        self.clock = clock
        self.started = clock()
        self._last = -interval
        self.round = 0
        self.units_done = 0
        self.units_total = 0
        self.best: str = "-"

    def start_round(self, number: int, units_total: int, units_done: int = 0) -> None:
        """Reset the unit counters for a new round."""
        self.round = number
        self.units_total = units_total
        self.units_done = units_done

    def unit_done(self) -> None:
        """Count one finished unit and maybe log."""
        self.units_done += 1
        self.maybe_log()

    def maybe_log(self, force: bool = False) -> None:
        """Log the status line if ``interval`` has passed (or ``force``)."""
        now = self.clock()
        if force or now - self._last >= self.interval:
            self._last = now
            logger.info(
                "round %d | units %d/%d | best %s | elapsed %s",
                self.round + 1,
                self.units_done,
                self.units_total,
                self.best,
                _elapsed(now - self.started),
            )


def _elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
