"""A worker trains its next unit while the last one's checkpoint is written (issue 13, part 3).

The engine frees a worker when its train unit's pass is done (``UnitFuture.freed``), gives
it the next unit at once, and keeps the written unit's trial busy until its checkpoint is
durable: only then is the unit done (``unit_end``) and the trial's next unit may start.

The engine runs on a real WorkerPool over the in-memory fake transport
(``tests/backends/fake_transport.py``): real control channel, real partition reads, units
that "train" by hashing, and checkpoint writes that take ``Script.write_s``. No torch,
no Spark.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.backends import UnitFuture, WorkerChange
from cerebro_spark.engine import load_state, parse_config, read_events, run_experiment
from cerebro_spark.report import load_report_data
from cerebro_spark.store import open_store
from cerebro_spark.units import UnitKind, UnitResult, UnitTask
from tests.backends import fake_transport
from tests.backends.fake_transport import Died
from tests.driver.test_early_start import EPOCHS, PARTITIONS, TRIALS, config, pool

TRIALS_LOST = 8  # enough that some trial always has a unit for the lost worker


@pytest.fixture(autouse=True)
def script() -> Iterator[fake_transport.Script]:
    yield fake_transport.reset()
    fake_transport.reset()


def run(store: Path, experiment: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    run_experiment(config(store), experiment_id=experiment, backend_factory=pool)
    _, state = load_state(str(store), experiment)
    digests = {t: s.checkpoint_sha256 for t, s in state.trials.items()}
    return read_events(open_store(str(store)).child(f"experiments/{experiment}")), digests


def overlaps(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """(worker, unit, next unit) where the next unit started on the worker before the
    unit's end was logged (the unit's checkpoint still being written)."""
    open_units: dict[str, list[tuple[Any, ...]]] = {}
    found = []
    for e in events:
        if e["event"] not in ("unit_start", "unit_end"):
            continue
        unit = (e["trial"], e["epoch"], e["kind"], e["partition"])
        on = open_units.setdefault(e["worker"], [])
        if e["event"] == "unit_start":
            found += [(e["worker"], u, unit) for u in on]
            on.append(unit)
        else:
            on.remove(unit)
    return found


def test_the_next_unit_trains_while_a_checkpoint_is_written_and_results_are_the_same(
    tmp_path: Path, script: fake_transport.Script
) -> None:
    _, reference = run(tmp_path, "instant")
    script.write_s = 0.05
    events, digests = run(tmp_path, "slow-disk")
    found = overlaps(events)
    assert found, "no unit started on a worker while its last checkpoint was being written"
    assert all(unit[2] == "train" for _, unit, _ in found)  # only a train unit writes
    # Isolation: a trial's next unit never starts before its checkpoint is durable.
    assert all(unit[0] != nxt[0] for _, unit, nxt in found)
    ends = Counter(
        (e["trial"], e["epoch"], e["kind"], e["partition"])
        for e in events
        if e["event"] == "unit_end"
    )
    assert len(ends) == TRIALS * EPOCHS * 2 * PARTITIONS and set(ends.values()) == {1}
    assert not any(e["event"] == "unit_failed" for e in events)
    # The same trained checkpoints (the visit orders are seeded; the writes only moved).
    assert digests == reference and all(digests.values())
    # unit_end says when the worker was freed; the report's bars end there, so a worker's
    # bars never overlap though its units did (the write after the pass).
    trained = [e for e in events if e["event"] == "unit_end" and "trained_at" in e]
    assert trained and all(e["trained_at"] <= e["time"] for e in trained)
    spans: dict[str, list[tuple[float, float]]] = {}
    for bar in load_report_data(str(tmp_path), "slow-disk").units:
        spans.setdefault(bar.worker, []).append((bar.start, bar.end))
    for worker_spans in spans.values():
        worker_spans.sort()
        assert all(a[1] <= b[0] + 1e-6 for a, b in itertools.pairwise(worker_spans))


def test_a_worker_lost_while_writing_leaves_the_schedule_and_its_unit_runs_again(
    tmp_path: Path, script: fake_transport.Script
) -> None:
    """The lost worker was freed (idle in the schedule) when its loss came: it must leave
    the schedule then, not be handed the next unit (which the backend would refuse).

    The first train unit on w1 writes its checkpoint until w1 is killed, which happens as
    the driver next asks for membership changes: after the pool freed w1, before the
    driver hands it other work.
    """
    cfg = parse_config(
        {
            "name": "lost-writing",
            "seed": 3,
            "store": str(tmp_path),
            "data": {"source": "sklearn:digits", "partitions": 4},
            "procedure": "grid",
            "epochs": 2,
            "workers": 2,
            "model": "tests.engine.free_spec:FreeSpec",
            "space": {"hidden": {"grid": list(range(TRIALS_LOST))}},
        }
    )
    backend = pool(cfg)
    lost: list[UnitTask] = []  # w1's first train unit
    writing: list[Future[UnitResult]] = []  # its future
    submit, changes = backend.submit, backend.changes

    def submit_and_note(worker_id: str, task: UnitTask) -> Future[UnitResult]:
        first = worker_id == "w1" and task.kind is UnitKind.TRAIN and not lost
        if first:
            lost.append(task)
        future = submit(worker_id, task)
        if first:
            writing.append(future)
        return future

    def changes_after_the_loss() -> list[WorkerChange]:
        if writing and "w1" not in script.killed:
            future = writing[0]
            assert isinstance(future, UnitFuture) and not future.done()
            if future.freed.done():
                backend.kill_worker("w1")  # the changes now hold its loss
        return changes()

    def write_until_killed(worker: str, task: UnitTask, stage: str) -> None:
        if stage == "write" and worker == "w1" and lost and task == lost[0]:
            deadline = time.monotonic() + 60.0
            while worker not in script.killed:
                assert time.monotonic() < deadline, "w1 was never killed"
                time.sleep(0.01)
            raise Died(worker)

    backend.submit = submit_and_note  # type: ignore[method-assign]
    backend.changes = changes_after_the_loss  # type: ignore[method-assign]
    script.hook = write_until_killed
    result = run_experiment(cfg, experiment_id="lost", backend_factory=lambda c: backend)
    events = read_events(open_store(str(tmp_path)).child("experiments/lost"))
    assert lost
    failed = [e for e in events if e["event"] == "unit_failed"]
    assert [(e["trial"], e["partition"], e["reason"]) for e in failed] == [
        (lost[0].trial_id, lost[0].partition, "worker_lost")
    ]
    gone = next(i for i, e in enumerate(events) if e["event"] == "worker_lost")
    assert events[gone]["worker"] == "w1"
    assert not [e for e in events[gone:] if e["event"] == "unit_start" and e["worker"] == "w1"]
    ends = Counter(
        (e["trial"], e["epoch"], e["kind"], e["partition"])
        for e in events
        if e["event"] == "unit_end"
    )
    assert len(ends) == TRIALS_LOST * 2 * 2 * 4 and set(ends.values()) == {1}
    assert all(t.status == "completed" for t in result.trials)


def test_a_busy_driver_does_not_flush_its_log_between_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: fake_transport.Script
) -> None:
    """On an object store a flush is a PUT in the driver's loop: the driver flushes when it
    has waited a moment for a report, not whenever none was queued (about once a unit)."""
    from cerebro_spark.engine import EventLog

    flushes: list[float] = []
    original = EventLog.flush

    def counted(self: EventLog) -> None:
        flushes.append(0.0)
        original(self)

    monkeypatch.setattr(EventLog, "flush", counted)
    script.write_s = 0.002  # units end a few ms apart, as on a busy cluster
    events, _ = run(tmp_path, "busy")
    units = sum(e["event"] == "unit_end" for e in events)
    assert units == TRIALS * EPOCHS * 2 * PARTITIONS
    assert len(flushes) < units / 2, f"{len(flushes)} flushes for {units} units"  # was 41 for 48
