"""The experiment clock procedures read, and where their deadlines count from.

A deadline (the ``deadline`` of HyperSched, SEER and ASHA) is seconds from ``run`` to the
end of the search, start-up included: the seconds the elastic planner and controller,
progress and the report count too. The driver hands every procedure an
:class:`ExperimentClock`: experiment time, 0 when ``run`` was called, not counting time the
driver was down before a ``resume``; its :attr:`~ExperimentClock.origin` says that its
zero is the start. Any other clock (``time.monotonic``, a test's fake clock, the
simulator's virtual time) has no origin: a deadline then counts from the procedure's
construction, so that where its zero lies does not matter.
"""

from __future__ import annotations

from cerebro_spark.search._base import Clock


class ExperimentClock:
    """Experiment time in seconds: 0 at ``run``, start-up included.

    Args:
        read: Returns the experiment time (the driver's ``Experiment.clock``).
    """

    origin = 0.0
    """The reading at which the experiment started (``run``): deadlines count from it."""

    def __init__(self, read: Clock) -> None:
        self._read = read

    def __call__(self) -> float:
        return float(self._read())


def deadline_start(clock: Clock) -> float:
    """The reading of ``clock`` from which a procedure's deadline counts.

    An :class:`ExperimentClock`'s origin (the ``run``: start-up counts against the
    deadline); for any other clock, its reading now (the procedure's construction).
    """
    origin = getattr(clock, "origin", None)
    return float(clock()) if origin is None else float(origin)
