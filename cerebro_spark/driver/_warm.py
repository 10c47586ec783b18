"""Warm workers between searches of one process (issue 30, part 6).

Starting a search's workers (a Spark job, a Python process per worker, torch imported, the
partitions read) costs seconds that a notebook pays at every ``Tuner.fit``. With
``warm_workers: S`` (seconds; the default 0 keeps nothing), a search that ended normally
*parks* its started backend instead of closing it, and the next search of this process
whose workers would be the same -- the same backend factory, number of workers, device,
dataset, store, torch threads and ``worker_memory`` setting, on the same Spark application -- takes
it: its workers hold their partitions already, and it starts training at once. Anything
else closes the parked backend first: one backend is parked at a time, closed after ``S``
idle seconds, by :func:`release_workers`, or when the process exits.

While parked, a Spark backend's workers keep their executor slots: other Spark jobs of
the session wait for slots the workers hold until the backend is closed. ``Tuner.fit``
closes them before it prepares a DataFrame or table with Spark
(:func:`release_for_spark_job`); a prepared dataset (its URI or name), a pandas frame or a
file needs no Spark job and starts warm.

A taken backend is checked first: every worker of the search before must still be live
and none starting (a worker lost while parked closes it: the new search starts afresh);
the membership changes it queued since are dropped, and the new search logs its workers
as joined and ready, with the bytes they read for it alone.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import threading
from collections.abc import Hashable

from cerebro_spark.backends import Backend

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class WarmKey:
    """What a search's workers are: a parked backend serves a search with an equal key.

    Attributes:
        factory: The backend factory (searches built by another never share workers).
        backend: ``local`` or ``spark``.
        workers: The number of workers.
        device: The config's device.
        application: The running Spark application's id, if any.
        job: The job's dataset URI, store URI and torch threads, and the config's worker
            memory (``None`` where the workers derived it).
    """

    factory: Hashable
    backend: str
    workers: int
    device: str
    application: str | None
    job: tuple[str, str, int, int | None]


@dataclasses.dataclass
class _Parked:
    key: WarmKey
    backend: Backend
    timer: threading.Timer


_lock = threading.Lock()
_parked: _Parked | None = None


def take_warm(key: WarmKey) -> Backend | None:
    """The parked backend if it serves ``key`` and is whole, else ``None`` (it is closed)."""
    parked = _unpark()
    if parked is None:
        return None
    backend = parked.backend
    if parked.key != key:
        logger.info("closing the warm workers of another search (they do not serve this one)")
        _close(backend)
        return None
    backend.changes()  # those of the search before, and of the time parked: not this one's
    live = backend.workers()
    if len(live) != key.workers or backend.starting():
        logger.info(
            "closing the warm workers: %d of %d are live; starting afresh", len(live), key.workers
        )
        _close(backend)
        return None
    logger.info("using %d warm workers of the search before (their partitions loaded)", len(live))
    return backend


def park(key: WarmKey, backend: Backend, seconds: float) -> None:
    """Keep ``backend`` started for the next search for up to ``seconds`` idle seconds."""
    global _parked
    release_workers()
    timer = threading.Timer(seconds, _expire, args=(backend,))
    timer.daemon = True
    with _lock:
        _parked = _Parked(key, backend, timer)
    timer.start()
    logger.info(
        "keeping %d workers warm for %g s for the next search (release_workers() frees them now)",
        key.workers,
        seconds,
    )


def release_workers() -> bool:
    """Close the workers kept warm between searches, if any; return whether there were.

    A Spark backend's workers hold their executor slots while warm: call this before
    running other Spark jobs in the session sooner than ``warm_workers`` seconds after a
    search.
    """
    parked = _unpark()
    if parked is None:
        return False
    _close(parked.backend)
    return True


def _unpark() -> _Parked | None:
    """Take the parked backend out of the registry (its idle timer stopped), if any."""
    global _parked
    with _lock:
        parked, _parked = _parked, None
    if parked is not None:
        parked.timer.cancel()
    return parked


def release_for_spark_job(application: str | None) -> bool:
    """Close warm workers that hold ``application``'s executor slots; return whether any did.

    For code about to run a Spark job of its own on that application (``Tuner.fit``
    preparing a DataFrame): the job would wait for slots until the workers' idle time ran
    out. ``None`` (the application is not known): any warm Spark workers.
    """
    with _lock:
        holding = (
            _parked is not None
            and _parked.key.backend == "spark"
            and application in (None, _parked.key.application)
        )
    if holding:
        logger.info(
            "closing the warm workers: a Spark job needs the executor slots they hold (pass "
            "a prepared dataset to fit to start warm)"
        )
        return release_workers()
    return False


def _expire(backend: Backend) -> None:
    global _parked
    with _lock:
        if _parked is None or _parked.backend is not backend:
            return  # taken or released meanwhile
        _parked = None
    logger.info("closing the warm workers: idle for warm_workers seconds")
    _close(backend)


def _close(backend: Backend) -> None:
    """Close a parked backend; a failure (its Spark session was stopped meanwhile) is logged."""
    try:
        backend.close()
    except Exception as error:  # nothing of a search depends on it any more
        logger.warning("closing the warm workers failed: %s: %s", type(error).__name__, error)


atexit.register(release_workers)
