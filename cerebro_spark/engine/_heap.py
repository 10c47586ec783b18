"""The cyclic garbage collector during a run: the objects from before it are left alone.

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
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Iterator

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def frozen_heap() -> Iterator[bool]:
    """Freeze the objects that exist now for the ``with`` block; yield whether it did.

    Does nothing (yields False) when the collector is disabled or something else already
    froze objects: their owner decides when they thaw.
    """
    if not gc.isenabled() or gc.get_freeze_count() > 0:
        yield False
        return
    gc.freeze()
    logger.debug("%d objects frozen for the run", gc.get_freeze_count())
    try:
        yield True
    finally:
        gc.unfreeze()
