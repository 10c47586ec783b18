"""Live progress of a run: units done, round, epoch, best so far, elapsed time and an ETA.

:class:`Progress` logs a status line on the ``cerebro_spark.progress`` logger at most every
``interval`` seconds; each record carries the same facts as a :class:`ProgressSnapshot` in
its ``progress`` attribute, so a display (the notebook progress bar of
:mod:`cerebro_spark.tuner`) renders them without parsing text.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

logger = logging.getLogger("cerebro_spark.progress")


@dataclasses.dataclass(frozen=True)
class ProgressSnapshot:
    """Where a run stands.

    Attributes:
        round: The round being run, 1-based (one epoch of every live trial).
        epoch: The highest epoch (1-based) a trial of this round is training.
        epochs: The epochs a trial may train at most.
        units_done: Units of this round finished.
        units_total: Units in this round.
        best: The best trial so far, as text (``"-"`` before the first report).
        elapsed: Seconds since the clock's origin: for a run, experiment time -- seconds
            since ``run``, start-up included, a resumed run's earlier sessions counted and
            the driver's down-time not -- the clock of the deadline, the report's timeline
            and the plan-vs-actual table.
        eta: Estimated seconds left in this round, from its unit rate so far
            (``None`` before the first unit of the round finished).
    """

    round: int
    epoch: int
    epochs: int
    units_done: int
    units_total: int
    best: str
    elapsed: float
    eta: float | None

    def line(self) -> str:
        """The status as one line of text."""
        eta = "-" if self.eta is None else format_seconds(self.eta)
        epoch = f"{self.epoch}/{self.epochs}" if self.epochs else str(self.epoch)
        return (
            f"round {self.round} | epoch {epoch} | units {self.units_done}/{self.units_total} | "
            f"best {self.best} | elapsed {format_seconds(self.elapsed)} | round ETA {eta}"
        )


class Progress:
    """Logs a one-line status at most every ``interval`` seconds (and on demand).

    Args:
        interval: Fewest seconds between two status lines.
        clock: Seconds, monotonic; the driver passes its experiment clock.
        epochs: The epochs a trial may train at most.
        origin: The clock's reading that ``elapsed`` counts from (default: its reading
            now). The driver passes 0: its clock's zero is the ``run``.
    """

    def __init__(
        self,
        interval: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        epochs: int = 0,
        origin: float | None = None,
    ):
        self.interval = interval
        self.clock = clock
        self.epochs = epochs
        self.started = clock() if origin is None else origin
        self._last = -interval
        self._round_started = self.started
        self._round_units_at_start = 0
        self.round = 0
        self.epoch = 0
        self.units_done = 0
        self.units_total = 0
        self.best: str = "-"

    def start_round(
        self, number: int, units_total: int, units_done: int = 0, epoch: int | None = None
    ) -> None:
        """Reset the unit counters for a new round (0-based ``number``, 0-based ``epoch``)."""
        self.round = number
        self.epoch = number if epoch is None else epoch
        self.units_total = units_total
        self.units_done = units_done
        self._round_started = self.clock()
        self._round_units_at_start = units_done

    def unit_done(self) -> None:
        """Count one finished unit and maybe log."""
        self.units_done += 1
        self.maybe_log()

    def snapshot(self) -> ProgressSnapshot:
        """Return where the run stands now."""
        now = self.clock()
        done = self.units_done - self._round_units_at_start
        left = max(self.units_total - self.units_done, 0)
        eta = None
        if done > 0:
            eta = (now - self._round_started) / done * left
        elif left == 0:
            eta = 0.0
        return ProgressSnapshot(
            round=self.round + 1,
            epoch=self.epoch + 1,
            epochs=self.epochs,
            units_done=self.units_done,
            units_total=self.units_total,
            best=self.best,
            elapsed=now - self.started,
            eta=eta,
        )

    def maybe_log(self, force: bool = False) -> None:
        """Log the status line if ``interval`` has passed (or ``force``)."""
        now = self.clock()
        if force or now - self._last >= self.interval:
            self._last = now
            snapshot = self.snapshot()
            logger.info("%s", snapshot.line(), extra={"progress": snapshot})


def format_seconds(seconds: float) -> str:
    """``m:ss`` or ``h:mm:ss``."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
