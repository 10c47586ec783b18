"""The stage seam: where a cluster manager may change the workers between rounds.

Between "the procedure decided the next round" and "visit orders are drawn for the workers
that exist" lies the stage boundary: the driver calls a :data:`StageHook` with the
:class:`Stage` about to start; the hook may add or retire workers and answers with a
:class:`StageDirective` (events to log, or a reason to stop). The elastic controller
(:mod:`cerebro_spark.engine._elastic`) is the hook the front door installs; the driver
knows only this seam.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from cerebro_spark.backends import Backend


@dataclasses.dataclass(frozen=True)
class Stage:
    """The round about to start, as the stage boundary shows it.

    Attributes:
        round: Its number (0-based); after the last round, the number the next would have.
        trials: The live trials it trains, in id order (empty when ``final``).
        resources: Workers each trial asked for (``SearchProcedure.resources``).
        seconds: Experiment time: seconds since ``run``, start-up included (the clock of
            the deadline, progress and the report).
        final: The search has ended: no round follows (the hook's last call, before the
            workers are stopped).
    """

    round: int
    trials: tuple[str, ...]
    resources: Mapping[str, int]
    seconds: float = 0.0
    final: bool = False


@dataclasses.dataclass(frozen=True)
class StageDirective:
    """What a stage hook tells the engine.

    Attributes:
        events: Events to log, ``(name, fields)``, in order (``stage_plan`` ...).
        stop: Why the search must admit no more work (a budget would be overrun); the
            round does not start, the live trials are stopped. ``None``: go on.
    """

    events: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    stop: str | None = None


StageHook = Callable[[Stage, Backend], "StageDirective | None"]
"""Called at each stage boundary with the next round and the backend, and once more after
the last round (``Stage.final``). It may add or retire workers (and should wait until they
are ready or gone); the round uses the membership that results. At the first boundary
some initial workers may still be starting (``Backend.starting``; ``wait_started`` waits).
Its directive's events are logged and its ``stop`` ends the search."""
