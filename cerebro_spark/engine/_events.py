"""The experiment's append-only event log, ``events.jsonl``.

One JSON object per line, each with ``"event"`` (its kind) and ``"time"`` (seconds since
the Unix epoch on the driver). The log is the experiment's source of truth: the
leaderboard, ``resume`` and ``replay`` are all rebuilt from it.

Event kinds and their fields:

* ``experiment_start``: ``experiment_id``, ``config``, ``resumed`` (bool)
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
  time), ``procedure_state``
* ``unit_start``: ``round``, ``trial``, ``epoch``, ``kind``, ``partition``, ``step``, ``worker``
* ``unit_end``: those fields and ``seconds``, ``io_seconds``, ``rows``, ``metric_sums``
  (each metric's value over the unit's rows times ``rows``), ``checkpoint``,
  ``checkpoint_bytes``, ``checkpoint_sha256``; validation units also ``metric_states``
  (each metric's mergeable state, :mod:`cerebro_spark.metrics`; the trial's epoch metrics
  are the merge of its units' states, in partition order). Logs written before
  ``metric_states`` existed fold the row-weighted ``metric_sums`` instead.
* ``unit_failed``: those fields and ``error``, ``reason`` (``worker_lost`` |
  ``group_broken`` | ``io_error`` | ``trial_error``)

  A group unit (Cerebro §5.7: ``k`` partitions of one trial trained data-parallel by
  ``k`` workers) is logged as ``k`` of each, one per partition: rank ``r`` has ``step``
  ``base + r``, its own ``partition``, ``worker``, ``seconds``, ``io_seconds``, ``rows``
  and ``metric_sums``, and every rank the group's checkpoint (written by rank 0) and two
  more fields: ``group`` (an id unique to the attempt) and ``group_partitions`` (the
  partitions by rank). The ``k`` ``unit_end`` events are written after all ``k`` results
  are in and count only together (see :mod:`cerebro_spark.engine._state`).
* ``trial_failed``: ``trial``, ``error``
* ``trial_epoch``: ``round``, ``trial``, ``epoch``, ``metrics``, ``checkpoint``,
  ``checkpoint_sha256``
* ``decision``: ``round``, ``trial``, ``epoch``, ``decision``
* ``round_end``: ``round``, ``procedure_state``
* ``worker_bytes``: ``worker``, ``bytes_read`` (at the end of a run)
* ``experiment_end``: ``best_trial``, ``seconds``
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any

from cerebro_spark.store import Store

logger = logging.getLogger(__name__)

EVENTS_NAME = "events.jsonl"


class EventLog:
    """Appends events to ``events.jsonl`` in an experiment's store."""

    def __init__(self, store: Store, key: str = EVENTS_NAME) -> None:
        self.store = store
        self.key = key

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        """Append one event and return it."""
        record = {"event": event, "time": round(time.time(), 6), **fields}
        line = json.dumps(record, separators=(",", ":")) + "\n"
        self.store.append(self.key, line.encode())
        return record

    def read(self) -> list[dict[str, Any]]:
        """Return every event in order (see :func:`read_events`)."""
        return read_events(self.store, self.key)


def read_events(store: Store, key: str = EVENTS_NAME) -> list[dict[str, Any]]:
    """Read an event log, tolerating a torn last line (a driver killed mid-write)."""
    if not store.exists(key):
        return []
    return list(_parse(store.get(key).decode(), store.url(key)))


def _parse(text: str, where: str) -> Iterator[dict[str, Any]]:
    lines = text.split("\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            if number >= len(lines) - 1:
                logger.warning("ignoring a torn last line %d of %s", number, where)
                return
            raise ValueError(f"{where}: line {number} is not valid JSON") from None
