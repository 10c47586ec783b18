"""The event log on an object store: cost per event as the log grows (issue 13, part 1).

S3 cannot append. The log used to be one object that every event rewrote whole (read it,
put it back one line longer): the cost of an event grew with the log, quadratic over a
run, so a long run's driver spent most of its time re-uploading its own log. Now the log
goes on in segments of at most ``SEGMENT_BYTES`` and appends are committed in groups
(:class:`~cerebro_spark.engine.EventLog`): the driver flushes whenever it waits for its
workers, and an append flushes once the oldest buffered event waited ``FLUSH_SECONDS``.

Appends ``--events`` events the size of a real ``unit_end`` (about 600 bytes) to a moto
S3 server on 127.0.0.1 and prints, per block of events, the driver's wall milliseconds
per event and the bytes uploaded per event, for

* **rewrite**: the old append (``Store.append``: get the object, put it back longer);
* **segments, flush each**: the new log flushed after every event (the worst case: a
  driver idle between any two events, as with one slow worker);
* **segments, flush per 16**: flushed after every 16th event (a busy driver: several
  units report at once and their events go in one write).

    python benchmarks/event_log.py [--events 2000] [--block 500]
"""

from __future__ import annotations

import argparse
import collections.abc
import logging
import time
from typing import Any

from mop_execution import moto_store

from cerebro_spark.driver._events import encode_event
from cerebro_spark.engine import EventLog
from cerebro_spark.store import FileSystemStore, Store, open_store

UNIT_END: dict[str, Any] = {
    "round": 3,
    "trial": "t0042",
    "epoch": 4,
    "kind": "train",
    "partition": 17,
    "step": 9,
    "worker": "w12",
    "seconds": 12.345678,
    "io_seconds": 0.123456,
    "rows": 40960,
    "metric_sums": {"loss": 12345.678901, "accuracy": 34567.0, "top5_accuracy": 40001.0},
    "checkpoint": "experiments/e/checkpoints/t0042/00000009-3f2a9c1b.pt",
    "checkpoint_bytes": 1234567,
    "checkpoint_sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "checkpoint_read_bytes": 1234567,
    "checkpoint_cache_hit": False,
}


class CountingStore(FileSystemStore):
    """A store that counts the bytes it uploads."""

    uploaded = 0

    def put(self, key: str, data: bytes) -> None:
        CountingStore.uploaded += len(data)
        super().put(key, data)


def rewrite(store: Store, n: int) -> None:
    """The old append: the whole object rewritten one line longer."""
    store.append("events.jsonl", (encode_event({"event": "unit_end", **UNIT_END}) + "\n").encode())


def measure(
    name: str, store: Store, events: int, block: int, append: collections.abc.Callable[[int], None]
) -> list[tuple[str, int, float, float]]:
    rows = []
    for start in range(0, events, block):
        before_bytes, started = CountingStore.uploaded, time.perf_counter()
        for n in range(start, start + block):
            append(n)
        seconds = time.perf_counter() - started
        uploaded = CountingStore.uploaded - before_bytes
        rows.append((name, start + block, 1000 * seconds / block, uploaded / block))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--block", type=int, default=500)
    args = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's request log
    rows: list[tuple[str, int, float, float]] = []
    with moto_store() as uri:
        plain = open_store(uri)
        for name, every in (
            ("rewrite", 0),
            ("segments, flush each", 1),
            ("segments, flush per 16", 16),
        ):
            store = CountingStore(plain.child(name.replace(" ", "-").replace(",", "")).uri)
            if every == 0:
                rows += measure(
                    name, store, args.events, args.block, lambda n, s=store: rewrite(s, n)
                )
                continue
            log = EventLog(store, flush_seconds=3600)

            def append(n: int, log: EventLog = log, every: int = every) -> None:
                log.append("unit_end", **UNIT_END)
                if (n + 1) % every == 0:
                    log.flush()

            rows += measure(name, store, args.events, args.block, append)
            log.flush()
    print(
        f"{args.events} events of {len(encode_event({'event': 'unit_end', **UNIT_END})) + 1} bytes"
        " on a moto S3 server (127.0.0.1)\n"
    )
    print("| log | events so far | driver ms / event | bytes uploaded / event |")
    print("|---|--:|--:|--:|")
    for name, upto, ms, uploaded in rows:
        print(f"| {name} | {upto} | {ms:.2f} | {uploaded:,.0f} |")


if __name__ == "__main__":
    main()
