"""The experiment's append-only event log, ``events.jsonl``.

One JSON object per line, each with ``"event"`` (its kind) and ``"time"`` (seconds since
the Unix epoch on the driver). The log is the experiment's source of truth: the
leaderboard, ``resume`` and ``replay`` are all rebuilt from it.

Event kinds and their fields:

* ``experiment_start``: ``experiment_id``, ``config``, ``resumed`` (bool), ``startup``
  (seconds from the ``run`` or ``resume`` call to this event: experiment time counts from
  there; absent in older logs, which count from the event)
* ``dataset``: ``dataset_id``, ``uri``, ``partitions``, ``rows``
* ``worker_joined``: ``worker``, ``host``, ``executor_id``, ``device`` (it registered)
* ``worker_ready``: those fields and ``partitions``, ``bytes_read`` (it loaded its
  partitions and takes units)
* ``worker_partitions``: ``worker``, ``partitions`` (what it holds now: re-homed ones
  were added)
* ``worker_retiring``: ``worker``, ``bytes_read`` (it takes no new unit)
* ``worker_retired``: ``worker``, ``bytes_read`` (it ended normally)
* ``worker_lost``: ``worker``, ``bytes_read``, ``reason``, ``unit`` (the one it ran, or
  null); a resumed run first logs every worker of the dead session as lost
* ``trial_added``: ``trial``, ``params``, ``seed``, ``spec``, ``clone_from``
* ``round_start``: ``round``, ``trials`` (live ids), ``epochs`` ({trial: its epoch}),
  ``visit_orders`` ({trial: [partitions]} or null when dynamic), ``resources`` ({trial:
  workers it asked for, ``SearchProcedure.resources``}), ``group_plans`` (null, or
  {trial: [group sizes]} imposed on a replay; trials not named train one unit at a
  time), ``procedure_state``; with packing on (``pack``, issue 27) also ``pack_size``
  (the most trials in one packed unit this round; absent: 1, off)
* ``unit_start``: ``round``, ``trial``, ``epoch``, ``kind``, ``partition``, ``step``,
  ``worker``; a member of a packed unit (``k`` trials trained in one pass on one worker)
  also ``pack``: the pack's trial ids in pack order (so are its ``unit_end`` and
  ``unit_failed``, each its own trial's, as an ordinary unit's)
* ``unit_end``: those fields and ``seconds``, ``io_seconds``, ``data_wait_seconds`` (the
  part of ``seconds`` the unit's loop waited for its batches; absent in older logs),
  ``rows``, ``metric_sums``
  (each metric's value over the unit's rows times ``rows``), ``checkpoint``,
  ``checkpoint_bytes``, ``checkpoint_sha256``; validation units also ``metric_states``
  (each metric's mergeable state, :mod:`cerebro_spark.metrics`; the trial's epoch metrics
  are the merge of its units' states, in partition order), packed: a metric whose state
  equals an earlier metric's has that metric's name instead (a string;
  :func:`~cerebro_spark.units.pack_states`). Logs written before packing carry every
  state whole; logs written before ``metric_states`` existed fold the row-weighted
  ``metric_sums`` instead. A train unit
  whose worker was freed before its checkpoint was durable also has ``trained_at`` (when
  the driver freed the worker; the event itself comes once the checkpoint is written).
* ``unit_failed``: those fields and ``error``, ``reason`` (``worker_lost`` |
  ``group_broken`` | ``io_error`` | ``trial_error``)

  A group unit (Cerebro §5.7: ``k`` partitions of one trial trained data-parallel by
  ``k`` workers) is logged as ``k`` of each, one per partition: rank ``r`` has ``step``
  ``base + r``, its own ``partition``, ``worker``, ``seconds``, ``io_seconds``, ``rows``
  and ``metric_sums``, and every rank the group's checkpoint (written by rank 0) and two
  more fields: ``group`` (an id unique to the attempt) and ``group_partitions`` (the
  partitions by rank). The ``k`` ``unit_end`` events are written after all ``k`` results
  are in and count only together (see :mod:`cerebro_spark.driver._state`).
* ``trial_failed``: ``trial``, ``error``
* ``trial_epoch``: ``round``, ``trial``, ``epoch``, ``metrics``, ``checkpoint``,
  ``checkpoint_sha256`` (the checkpoint trained through this epoch, which the metrics
  validated), ``best_epoch``, ``best_checkpoint``, ``best_checkpoint_sha256`` (the trial's
  best epoch so far, this one included, and its checkpoint, kept beside the latest; null
  while no epoch reported a finite metric; absent in logs written before they existed)
* ``decision``: ``round``, ``trial``, ``epoch``, ``decision``
* ``round_end``: ``round``, ``procedure_state``

  ``round_start`` and ``round_end`` carry the procedure's state as a snapshot,
  ``procedure_state``, or as ``procedure_state_delta``: what changed since the state the
  previous round event carried (:mod:`cerebro_spark.driver._state_delta`; logs written
  before it hold snapshots only)
* ``worker_bytes``: ``worker``, ``bytes_read`` (at the end of a run)
* ``experiment_end``: ``best_trial``, ``best_epoch``, ``best_checkpoint``,
  ``best_checkpoint_sha256`` (what ``best.pt`` was copied from), ``failed`` (trials that
  failed), ``seconds``

  Every ``checkpoint`` and ``best_checkpoint`` names a file relative to the experiment's
  folder (``checkpoints/<trial>/e0000-s0000.pt``), so a copied or moved experiment reads
  its own files; logs of older versions hold the whole store key
  (``experiments/<id>/checkpoints/...``), which readers take relative to the folder the
  log is in (:func:`~cerebro_spark.driver._layout.stored_key`).
* ``tracking``: ``backend`` (``mlflow``), ``trial`` (null for the experiment's own run),
  ``run_id`` and ``experiment`` (the MLflow experiment id), ``uri``: where a tracker
  logs this experiment, so that a resumed run continues the same runs
  (:mod:`cerebro_spark.tracking`)
* ``trial_resumed``, ``search_stopped`` and the elastic runs' ``elastic_plan``,
  ``stage_plan``, ``stage_actual``, ``resized``, ``resize_failed``, ``replanned``,
  ``replan_failed``, ``calibration``, ``elastic_summary``
  (:mod:`cerebro_spark.engine._elastic`)

**Counting.** The log keeps the numbering it always had, so that old logs fold and replay
as they did; users read rounds, epochs and stages counted from 1 (progress, ``plan``, the
cost table, the report, scoring, the leaderboard), and displays convert:

* from 0 (an index; shown + 1): ``round`` (every event that has it; ``round_start`` of the
  first round is round 0, shown as round 1), the ``epoch`` of ``unit_start``,
  ``unit_end`` and ``unit_failed`` (the epoch the unit trains: 0 is the first; a
  checkpoint's ``counters.epoch`` is the same number), ``step``, ``partition``, and the
  ``stage`` of ``stage_plan``, ``stage_actual``, ``resized``, ``resize_failed``,
  ``replanned`` and ``replan_failed`` (``elastic_plan.stage_rounds`` lists the round each
  stage starts at);
* from 1 (epochs completed, so the first epoch is 1, as shown): the ``epoch`` of
  ``trial_epoch`` and ``decision``, ``best_epoch`` (``trial_epoch``, ``experiment_end``);
  ``round_start.epochs`` counts the epochs each trial completed before the round (0:
  none), so the epoch it trains is that + 1.

Times: ``time`` is Unix seconds; every duration a user reads since the start
(``stage_plan``'s ``start``/``end``, ``stage_actual.end``, ``replanned.elapsed``,
``elastic_summary.seconds``) is experiment time: seconds since ``run``, start-up included,
time the driver was down before a ``resume`` not counted
(:attr:`~cerebro_spark.driver.ExperimentState.experiment_seconds`; each event's:
:func:`~cerebro_spark.driver._state.experiment_times`). Progress and the report's
timeline read the same clock.

**Standard JSON.** Every line is standard JSON (RFC 8259): a float that is not finite
(a loss that went ``NaN``) is written as the string ``"NaN"``, ``"Infinity"`` or
``"-Infinity"``, and the event lists where in a ``nonfinite`` field (paths of keys and
list indices, e.g. ``[["metrics", "loss"]]``). :func:`read_events` turns them back into
floats and drops ``nonfinite``, so readers see the floats that were logged. Logs written
before, with bare ``NaN`` tokens, still read.

**Where it is.** On a local disk, ``events.jsonl`` in the experiment's folder, appended to
in place. On an object store, which cannot append, ``events.jsonl`` and then segments
``events.jsonl.d/00000001.jsonl``, ``…/00000002.jsonl`` …, written in groups of events
(:class:`EventLog`); read them together with :func:`read_events`.

**What a reader accepts.** A crash can leave exactly one thing: a torn last line (no
newline after it), which readers ignore with a warning and the next append cuts off
(:meth:`EventLog.repair`). Anything else that is not an event, anywhere else, is refused
with :class:`~cerebro_spark.errors.EventLogError` naming the file and the line. Events
of a kind this version does not know (:data:`EVENT_KINDS`; a later version may add
kinds) are skipped by the fold with a warning; a known kind that lacks a field, or that
names a trial no ``trial_added`` event added, is refused (see
:meth:`cerebro_spark.driver.ExperimentState.from_events`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cerebro_spark.driver._heap import paused_collector
from cerebro_spark.errors import EventLogError
from cerebro_spark.store import FileSystemStore, Store

logger = logging.getLogger(__name__)

EventListener = Callable[[dict[str, Any]], None]
"""Called with each event appended, after it is written (:attr:`EventLog.listeners`)."""

EVENTS_NAME = "events.jsonl"

SEGMENTS_SUFFIX = ".d"
"""An object store's log goes on in segments in ``events.jsonl.d/`` (:class:`EventLog`)."""

SEGMENT_BYTES = 256 * 1024
"""An object store's log starts a new segment once the one it writes holds this much."""

_READ_THREADS = 8  # segments fetched at once by read_events

FLUSH_SECONDS = 1.0
"""The longest an event appended to an object store's log waits in the buffer while the
driver is busy (:class:`EventLog`)."""

EVENT_KINDS = frozenset(
    {
        "experiment_start",
        "dataset",
        "worker_joined",
        "worker_ready",
        "worker_partitions",
        "worker_retiring",
        "worker_retired",
        "worker_lost",
        "trial_added",
        "round_start",
        "unit_start",
        "unit_end",
        "unit_failed",
        "trial_failed",
        "trial_epoch",
        "trial_resumed",
        "decision",
        "round_end",
        "worker_bytes",
        "search_stopped",
        "experiment_end",
        "tracking",
        "elastic_plan",
        "stage_plan",
        "stage_actual",
        "resized",
        "resize_failed",
        "replanned",
        "replan_failed",
        "calibration",
        "elastic_summary",
    }
)
"""Every event kind this version writes; a reader skips others with a warning.

A new kind goes here (and in the module docstring) when it is added; the fold also knows
any kind it has a handler for."""

NONFINITE_FIELD = "nonfinite"
"""The field listing where an event's non-finite floats are (see the module docstring)."""

_NONFINITE_TEXT = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _compact_encoder() -> Callable[[Any], str]:
    """``json.dumps(value, separators=(",", ":"), allow_nan=False)``, built once.

    ``json.dumps`` builds an encoder (and its C encoder) on every call; the driver writes
    two events a unit, so the C encoder is built here once, without the check for
    circular references (an event is a tree of dicts, lists and scalars; a cycle would
    raise ``RecursionError`` instead of ``ValueError``): a quarter less CPU an event.
    """
    encoder = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
    make = getattr(json.encoder, "c_make_encoder", None)  # CPython's C accelerator
    if make is None:
        return encoder.encode
    chunks = make(
        None, encoder.default, json.encoder.encode_basestring_ascii, None, ":", ",",
        False, False, False,
    )  # fmt: skip

    def encode(value: Any) -> str:
        return "".join(chunks(value, 0))

    return encode


_ENCODE = _compact_encoder()


class EventList(list[dict[str, Any]]):
    """Events read from a log, with where each came from (for error messages).

    Attributes:
        where: URI of the log.
        lines: The line number of each event (1-based) in its segment.
        segments: The URI of the segment each event came from (all ``where`` for a log
            of one file).
    """

    def __init__(
        self,
        events: list[dict[str, Any]],
        where: str,
        lines: list[int],
        segments: list[str] | None = None,
    ) -> None:
        super().__init__(events)
        self.where = where
        self.lines = lines
        self.segments = segments if segments is not None else [where] * len(lines)

    def position(self, index: int) -> str:
        """``"<log or segment>, line N"`` for the event at ``index``."""
        if 0 <= index < len(self.lines):
            return f"{self.segments[index]}, line {self.lines[index]}"
        return f"{self.where}, line {index + 1}"


class EventLog:
    """Appends events to ``events.jsonl`` in an experiment's store.

    **On a local disk** every append writes its line in place at once. A driver killed in
    the middle of an append can leave a torn last line (no newline at its end): the first
    append of a session repairs that tail (:meth:`repair`) before it writes, so an event
    never lands behind half a line. Between two :meth:`flush` calls (the driver flushes
    whenever it waits) the file stays open, so a busy driver's appends cost one
    ``write`` each, not an open and a close (two events a unit); anything unusual (no
    file yet, a short or failed write) goes through :meth:`Store.append
    <cerebro_spark.store.Store.append>`, which makes the folder, writes all or nothing
    and raises the store's errors (``StoreFullError``).

    **On an object store** (S3), which cannot append, a log rewritten whole per event
    would cost time quadratic in its length. There the log is a series of segments,
    ``events.jsonl`` and then ``events.jsonl.d/00000001.jsonl``, ``…/00000002.jsonl`` …,
    each rewritten (atomically) only while it is under ``segment_bytes``; and appends
    are committed in groups: an appended event is buffered and written with the others
    at the next :meth:`flush`, which an append makes itself once the oldest buffered
    event waited ``flush_seconds`` (or the buffer holds ``segment_bytes``). The driver
    flushes whenever it has waited a moment for workers, at stage boundaries and at its
    end, so a log lags the run by at most ``flush_seconds`` of busy work; a crash loses at
    most that tail, which resume treats as never done (as it treats a crash just before it).
    Whatever must wait until the events before it are durable (deleting a checkpoint
    they superseded) goes through :meth:`after_flush`.

    Attributes:
        listeners: Called with each event once it is appended (trackers follow the run
            this way). A listener that raises is logged and does not fail the append.
        before_write: Called before buffered events are written; raises to stop the
            write (the driver checks it still holds the experiment's lease).
    """

    def __init__(
        self,
        store: Store,
        key: str = EVENTS_NAME,
        *,
        flush_seconds: float = FLUSH_SECONDS,
        segment_bytes: int = SEGMENT_BYTES,
    ) -> None:
        self.store = store
        self.key = key
        self.flush_seconds = flush_seconds
        self.segment_bytes = segment_bytes
        self.listeners: list[EventListener] = []
        self.before_write: Callable[[], None] | None = None
        self._in_place = isinstance(store, FileSystemStore) and store.appends_in_place
        # A plain local store: its file is written through a descriptor kept open (a
        # subclass may change append, so it keeps going through it).
        self._direct = self._in_place and type(store) is FileSystemStore
        self._file: _OpenFile | None = None
        self._repaired = False
        self._segment_number = 0  # object stores: the segment being written, its bytes
        self._segment = b""
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._pending_since = 0.0
        self._after_flush: list[Callable[[], None]] = []

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        """Append one event and return it (on an object store: buffered, see above)."""
        if not self._repaired:
            self.repair()
        record = {"event": event, "time": round(time.time(), 6), **fields}
        line = (encode_event(record) + "\n").encode()
        if self._in_place:
            try:
                if self._file is None or not self._file.write(line):
                    self._append_through_store(line)
            except BaseException:
                self._repaired = False  # a failed append may have torn the tail: repair first
                raise
        else:
            if not self._pending:
                self._pending_since = time.monotonic()
            self._pending.append(line)
            self._pending_bytes += len(line)
            if (
                self._pending_bytes >= self.segment_bytes
                or time.monotonic() - self._pending_since >= self.flush_seconds
            ):
                self.flush()
        for listener in list(self.listeners) if self.listeners else ():
            try:
                listener(record)
            except Exception as error:  # a listener must never fail the run
                logger.warning("event listener %r failed on %s: %s", listener, event, error)
        return record

    def _append_through_store(self, line: bytes) -> None:
        """Append ``line`` with the store's own append, then keep the file open for more."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self.store.append(self.key, line)
        if self._direct:
            assert isinstance(self.store, FileSystemStore)  # ok: _direct says so
            self._file = _OpenFile.of(self.store.path(self.key))

    def flush(self) -> None:
        """Write the buffered events, then run what waited for them (:meth:`after_flush`).

        On a local disk, where every event is written at once, this closes the log file
        the appends keep open (the driver flushes when it waits or ends).

        Raises:
            StoreUnavailableError: The store did not answer (the events stay buffered).
        """
        try:
            self._write_pending()
        finally:
            if self._file is not None:
                self._file.close()
                self._file = None

    def _write_pending(self) -> None:
        """Write the buffered events (object stores), then run what waited for them."""
        if self._pending:
            if self.before_write is not None:
                self.before_write()
            data = b"".join(self._pending)
            if self._segment and len(self._segment) + len(data) > self.segment_bytes:
                self._segment_number += 1
                self._segment = b""
            self.store.put(_segment_key(self.key, self._segment_number), self._segment + data)
            self._segment += data
            self._pending = []
            self._pending_bytes = 0
        while self._after_flush:
            self._after_flush.pop(0)()

    def after_flush(self, action: Callable[[], None]) -> None:
        """Run ``action`` once every event appended so far is durable (local: at once)."""
        self._after_flush.append(action)
        if self._in_place or not self._pending:
            self._write_pending()  # not flush(): a busy driver's log file stays open

    def read(self) -> list[dict[str, Any]]:
        """Return every event in order (see :func:`read_events`), buffered ones included."""
        if self._pending:
            self.flush()
        return read_events(self.store, self.key)

    def repair(self) -> int:
        """Make the log end at a line boundary; return the number of bytes dropped.

        A torn last line that is a whole event short of its newline gets the newline; any
        other torn tail is cut off (it was never acknowledged: the append did not return).
        On an object store this finds the last segment, which the next appends go on.
        """
        self._repaired = True
        segments = _segment_keys(self.store, self.key)
        if len(segments) > 1:  # written on an object store (then maybe copied here)
            self._in_place = False
        key = self.key if self._in_place else segments[-1]
        if not self.store.exists(key):
            return 0
        data = self.store.get(key)
        body, tail = _split_tail(data)
        if not self._in_place:
            self._segment_number, self._segment = _segment_number(self.key, key), body
        if not tail:
            return 0
        if _event_or_none(tail) is not None:
            if self._in_place:
                self.store.append(key, b"\n")
            else:
                self._segment = data + b"\n"
                self.store.put(key, self._segment)
            logger.warning("%s: ended without a newline; added it", self.store.url(key))
            return 0
        if isinstance(self.store, FileSystemStore) and self._in_place:
            self.store.truncate(key, len(body))  # in place: works on a full disk
        else:
            self.store.put(key, body)
        logger.warning(
            "%s: dropped a torn last line of %d bytes (a driver stopped mid-append)",
            self.store.url(key),
            len(tail),
        )
        return len(tail)


class _OpenFile:
    """A local file open for appending, closed by :meth:`close` or when dropped."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._closer = weakref.finalize(self, os.close, fd)

    @classmethod
    def of(cls, path: str) -> _OpenFile | None:
        """Open ``path`` to append to it; ``None`` if that fails (the store appends then)."""
        try:
            return cls(os.open(path, os.O_WRONLY | os.O_APPEND))
        except OSError:
            return None

    def write(self, data: bytes) -> bool:
        """Append ``data`` whole in one write; False (nothing appended) if it cannot.

        A short write (a disk about to fill) is cut off again, so the store's append can
        try the whole line and raise the store's error.
        """
        try:
            written = os.write(self._fd, data)
        except OSError:
            return False
        if written == len(data):
            return True
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, os.fstat(self._fd).st_size - written)
        return False

    def close(self) -> None:
        """Close the file (once)."""
        self._closer()


def _segment_keys(store: Store, key: str) -> list[str]:
    """The keys of a log's segments in order: ``key`` first, then those in ``key.d/``."""
    return [key, *store.list(f"{key}{SEGMENTS_SUFFIX}")]


def _segment_key(key: str, number: int) -> str:
    """The key of segment ``number`` of log ``key`` (0: ``key`` itself)."""
    return key if number == 0 else f"{key}{SEGMENTS_SUFFIX}/{number:08d}.jsonl"


def _segment_number(key: str, segment: str) -> int:
    """The number of segment ``segment`` of log ``key`` (the inverse of :func:`_segment_key`)."""
    return 0 if segment == key else int(segment.rsplit("/", 1)[1].split(".", 1)[0])


def read_events(
    store: Store, key: str = EVENTS_NAME, *, live: bool = False
) -> list[dict[str, Any]]:
    """Read an event log, tolerating exactly what a crash can leave.

    A crash can leave one torn last line (no newline after it): it is ignored, with a
    warning, unless it is a whole event. Anything else that is not an event (an invalid
    line that a newline ends, a JSON value that is not an event) was not written by a
    crash, and is refused. A log in segments (object stores, see :class:`EventLog`) is
    read segment by segment; only the last one can end torn. ``live``: the log's driver
    may be appending to it as it is read, so a torn last line is an append in flight,
    ignored without a warning.

    Raises:
        EventLogError: A line other than the torn tail is not an event (the message names
            the log or segment and the line).
    """
    where = store.url(key)
    keys = [k for k in _segment_keys(store, key) if k != key or store.exists(key)]
    events: list[dict[str, Any]] = []
    lines: list[int] = []
    segments: list[str] = []
    if len(keys) > 2:  # many objects: fetched side by side, parsed in order
        with ThreadPoolExecutor(min(_READ_THREADS, len(keys))) as pool:
            contents = list(pool.map(store.get, keys))
    else:
        contents = [store.get(k) for k in keys]
    with paused_collector():  # many dicts, no cycle: the collector would walk them again
        for index, (segment, data) in enumerate(zip(keys, contents, strict=True)):
            url = store.url(segment)
            last = index == len(keys) - 1
            for number, record in _parse(data, url, last=last, live=live):
                events.append(record)
                lines.append(number)
                segments.append(url)
    return EventList(events, where, lines, segments)


def encode_event(record: dict[str, Any]) -> str:
    """One event as a line of standard JSON (no newline; see the module docstring).

    Non-finite floats become ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` and are listed
    in the ``nonfinite`` field, which :func:`read_events` reads back.
    """
    try:
        return _ENCODE(record)
    except ValueError:  # a NaN or an infinity somewhere: rare, so walk only then
        pass
    found: list[list[str | int]] = []
    encoded = _mark_nonfinite(record, [], found)
    encoded[NONFINITE_FIELD] = found
    return _ENCODE(encoded)


def _mark_nonfinite(value: Any, path: list[str | int], found: list[list[str | int]]) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        found.append(path)
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, dict):
        return {k: _mark_nonfinite(v, [*path, str(k)], found) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_mark_nonfinite(v, [*path, i], found) for i, v in enumerate(value)]
    return value


def _restore_nonfinite(record: dict[str, Any], where: str, number: int) -> dict[str, Any]:
    """Turn the strings a ``nonfinite`` field lists back into floats."""
    paths = record.pop(NONFINITE_FIELD)
    problem = None if isinstance(paths, list) else "is not a list"
    for path in paths if problem is None else ():
        parent: Any = record
        steps = path if isinstance(path, list) and path else None
        try:
            if steps is None:
                raise LookupError
            for step in steps[:-1]:
                parent = parent[step]
            value = parent[steps[-1]]
        except (LookupError, TypeError):
            problem = f"names {path!r}, which the event does not have"
            break
        if not isinstance(value, str) or value not in _NONFINITE_TEXT:
            problem = f"names {path!r}, which holds {value!r}, not NaN or an infinity"
            break
        parent[steps[-1]] = _NONFINITE_TEXT[value]
    if problem is not None:
        raise EventLogError(
            f"{where}: line {number}: its {NONFINITE_FIELD!r} field {problem}; a crash cannot "
            "write that, so the log was changed by something else: restore it from a copy"
        )
    return record


def _split_tail(data: bytes) -> tuple[bytes, bytes]:
    """``(lines ended by a newline, the unterminated rest)``."""
    cut = data.rfind(b"\n") + 1
    return data[:cut], data[cut:]


def _event_or_none(line: bytes) -> dict[str, Any] | None:
    """The event on ``line``, or ``None`` if it is not one."""
    try:
        record = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if isinstance(record, dict) and isinstance(record.get("event"), str):
        return record
    return None


def _parse(
    data: bytes, where: str, last: bool = True, live: bool = False
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, event)`` of each event in ``data``.

    ``last``: it may end torn; ``live``: its tear is an append in flight (no warning).
    """
    body, tail = _split_tail(data)
    lines = body.split(b"\n")[:-1]
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        record = _event_or_none(line)
        if record is None:
            shown = line[:80].decode(errors="replace")
            raise EventLogError(
                f"{where}: line {number} of {len(lines)} is not an event ({shown!r}); a crash "
                "can only tear the last line, so the log was changed by something else: "
                "restore it from a copy or remove that line by hand"
            )
        yield number, _decoded(record, where, number)
    if tail.strip():
        record = _event_or_none(tail)
        if record is None and not last:
            raise EventLogError(
                f"{where}: its last line {len(lines) + 1} is torn, but a later segment "
                "follows it; a crash cannot leave that (segments are written whole): "
                "restore the log from a copy"
            )
        if record is None and not live:
            logger.warning(
                "%s: ignoring a torn last line %d (a driver stopped mid-append; the next "
                "append cuts it off)",
                where,
                len(lines) + 1,
            )
        elif record is not None:
            yield len(lines) + 1, _decoded(record, where, len(lines) + 1)


def _decoded(record: dict[str, Any], where: str, number: int) -> dict[str, Any]:
    if NONFINITE_FIELD in record:
        return _restore_nonfinite(record, where, number)
    return record
