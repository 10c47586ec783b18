"""The cyclic garbage collector: left off what predates a run, paused while a log is read.

CPython's full collections walk every object the collector tracks. A driver process holds
hundreds of thousands that live as long as it does -- the functions, classes and tables of
the modules it imported (torch, plotly, pyarrow, pyspark ...) -- and walking them again
and again is driver CPU that grows with nothing the run does (a fifth of the per-unit CPU
at |S| = 3,000 in ``benchmarks/driver_scale.py``). :func:`frozen_heap` moves what exists
when a run starts into the permanent generation (:func:`gc.freeze`), so the collector
walks only what the run itself creates, and gives it back at the run's end
(:func:`gc.unfreeze`), also when the run raises.

Nothing else changes: frozen objects are still freed when no reference to them is left;
only a reference cycle among them that becomes garbage during the run waits for the run's
end to be collected. A process that froze objects itself (``gc.get_freeze_count() > 0``,
e.g. a pre-fork server's policy) or turned the collector off is left as it is.

Reading and folding a whole event log (``resume``, ``leaderboard``, the report) builds
hundreds of thousands of dicts that hold no reference cycle, and each young collection
the allocations trigger walks them again: :func:`paused_collector` turns the collector
off for such a stretch (the fold's CPU per event then stays flat in the log's length)
and back on after it, so the cycles other threads make meanwhile wait that long.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def frozen_heap() -> Iterator[bool]:
    """Freeze the objects that exist now for the ``with`` block; yield whether it did.

    Does nothing (yields False) when the collector is disabled or something else already
    froze objects: their owner decides when they thaw.
    """
    if not gc.isenabled() or gc.get_freeze_count() > 0:
        yield False
        return
    gc.freeze()  # not gc.get_freeze_count() after it: that walks every frozen object
    try:
        yield True
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def paused_collector() -> Iterator[None]:
    """Turn the cyclic collector off for the ``with`` block (if it was on), then back on.

    For a stretch that allocates many objects and no reference cycle (reading and folding
    an event log): reference counting frees them as usual; the collector would only walk
    them over and over.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
