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
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.backends import UnitFuture
from cerebro_spark.engine import load_state, parse_config, read_events, run_experiment
from cerebro_spark.errors import WorkerLostError
from cerebro_spark.report import load_report_data
from cerebro_spark.store import open_store
from cerebro_spark.units import UnitKind, UnitResult, UnitTask
from tests.backends import fake_transport
from tests.driver.test_early_start import EPOCHS, PARTITIONS, TRIALS, config, pool
from tests.driver.test_group_failures import ScriptedBackend

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


class FreeingBackend(ScriptedBackend):
    """Frees the worker of every ordinary train unit before its result (a
    :class:`UnitFuture`), as a pool whose worker writes the checkpoint; the first train unit
    on ``victim`` loses its worker at the moment it is freed: its result is then a loss."""

    def __init__(self, num_workers: int, victim: str) -> None:
        super().__init__(num_workers)
        self.victim = victim
        self.lost_unit: UnitTask | None = None

    def submit(self, worker_id: str, task: UnitTask) -> Future[UnitResult]:
        if task.kind is not UnitKind.TRAIN:
            return super().submit(worker_id, task)
        with self.lock:
            self._check(worker_id, task)
            self.busy.add(worker_id)
            lose = worker_id == self.victim and self.lost_unit is None
            if lose:
                self.lost_unit = task
        self.log.append((worker_id, "train", str(task.partition), ""))
        future = UnitFuture()

        def trained() -> None:
            with self.lock:
                self.busy.discard(worker_id)
                if lose:
                    self._kill_locked(worker_id)  # lost while writing the checkpoint
            future.free()
            threading.Timer(0.05, durable).start()

        def durable() -> None:
            if lose:
                future.set_exception(WorkerLostError(f"worker {worker_id} died writing"))
            else:
                future.set_result(self._result(worker_id, task))

        threading.Timer(0.01, trained).start()
        return future


def test_a_worker_lost_while_writing_leaves_the_schedule_and_its_unit_runs_again(
    tmp_path: Path,
) -> None:
    """The lost worker was freed (idle in the schedule) when its loss came: it must leave
    the schedule then, not be handed the next unit (which the backend would refuse)."""
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
    backend = FreeingBackend(2, victim="w1")
    result = run_experiment(cfg, experiment_id="lost", backend_factory=lambda c: backend)
    events = read_events(open_store(str(tmp_path)).child("experiments/lost"))
    lost = backend.lost_unit
    assert lost is not None
    failed = [e for e in events if e["event"] == "unit_failed"]
    assert [(e["trial"], e["partition"], e["reason"]) for e in failed] == [
        (lost.trial_id, lost.partition, "worker_lost")
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
