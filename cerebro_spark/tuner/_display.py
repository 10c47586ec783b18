"""Progress a person can see with no logging set up: a bar on terminals and notebooks.

:class:`ProgressDisplay` is a logging handler for the ``cerebro_spark.progress`` logger. On
a terminal or in a Jupyter/Databricks notebook it redraws one line in place (a bar with the
round's units, the epoch, the best trial so far, elapsed time and the round's ETA); where a
carriage return does not redraw (a file, a pipe, a job's log) it writes plain lines, at most
one every ``plain_interval`` seconds, so logs stay short.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable, Iterator
from typing import TextIO

from cerebro_spark.driver._progress import ProgressSnapshot, format_seconds

PROGRESS_LOGGER = "cerebro_spark.progress"
_BAR = 20


def _in_notebook() -> bool:
    """Whether we run in an IPython kernel (Jupyter, Databricks), whose output redraws lines."""
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    get = getattr(shell, "get_ipython", None)
    kernel = get() if get is not None else None
    return kernel is not None and getattr(kernel, "kernel", None) is not None


def render(snapshot: ProgressSnapshot, width: int = _BAR) -> str:
    """The bar line of ``snapshot``."""
    total = max(snapshot.units_total, 1)
    filled = min(width, round(width * snapshot.units_done / total))
    bar = "#" * filled + "-" * (width - filled)
    epoch = f"{snapshot.epoch}/{snapshot.epochs}" if snapshot.epochs else str(snapshot.epoch)
    eta = "-" if snapshot.eta is None else format_seconds(snapshot.eta)
    return (
        f"epoch {epoch} [{bar}] {snapshot.units_done}/{snapshot.units_total} units | "
        f"best {snapshot.best} | {format_seconds(snapshot.elapsed)} | ETA {eta}"
    )


class ProgressDisplay(logging.Handler):
    """Shows the records of ``cerebro_spark.progress`` as a live bar or plain lines.

    Args:
        stream: Where to write (default: ``sys.stdout`` when the display starts).
        live: Redraw one line in place (default: when ``stream`` is a terminal or the code
            runs in a notebook kernel).
        plain_interval: Seconds between plain lines when not ``live``.
        clock: Monotonic clock in seconds.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        live: bool | None = None,
        plain_interval: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(logging.INFO)
        self.stream = stream if stream is not None else sys.stdout
        if live is None:
            isatty = getattr(self.stream, "isatty", None)
            live = bool(isatty and isatty()) or _in_notebook()
        self.live = live
        self.plain_interval = plain_interval
        self.clock = clock
        self._last_plain: float | None = None
        self._unwritten: str | None = None  # the newest plain line not yet written
        self._width = 0

    def emit(self, record: logging.LogRecord) -> None:
        """Draw the record's snapshot (records without one are ignored)."""
        snapshot = getattr(record, "progress", None)
        if not isinstance(snapshot, ProgressSnapshot):
            return
        try:
            line = render(snapshot)
            if self.live:
                padding = " " * max(self._width - len(line), 0)
                self.stream.write(f"\r{line}{padding}")
                self._width = len(line)
            else:
                now = self.clock()
                if self._last_plain is not None and now - self._last_plain < self.plain_interval:
                    self._unwritten = line
                    return
                self._last_plain, self._unwritten = now, None
                self.stream.write(f"{line}\n")
            self.stream.flush()
        except Exception:
            self.handleError(record)

    def finish(self) -> None:
        """End the display: the live line ends, and plain output shows where the run ended."""
        if self.live and self._width:
            self.stream.write("\n")
            self._width = 0
        elif self._unwritten is not None:
            self.stream.write(f"{self._unwritten}\n")
            self._unwritten = None
        self.stream.flush()


@contextlib.contextmanager
def showing_progress(display: ProgressDisplay | None) -> Iterator[None]:
    """Attach ``display`` to the progress logger for the block (``None``: do nothing).

    The progress logger is set to INFO for the block (and restored), so the bar shows even
    when the application configured no logging; records the application did not ask for
    (its level above INFO) do not reach its own handlers.
    """
    if display is None:
        yield
        return
    progress = logging.getLogger(PROGRESS_LOGGER)
    level, propagate = progress.level, progress.propagate
    progress.addHandler(display)
    if progress.getEffectiveLevel() > logging.INFO:
        # The application did not ask for progress records: show the bar only, and keep
        # the records from handlers it set up for other levels.
        progress.setLevel(logging.INFO)
        progress.propagate = False
    try:
        yield
    finally:
        display.finish()
        progress.removeHandler(display)
        progress.setLevel(level)
        progress.propagate = propagate
