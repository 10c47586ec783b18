"""Per-unit overheads read from an event log (fast: synthetic logs, no Spark, no torch)."""

from __future__ import annotations

from typing import Any

import pytest

from cerebro_spark.errors import ConfigError
from cerebro_spark.simulate import UnitOverheads, measure_overheads, round_makespans


def unit(
    kind: str, when: float, worker: str, trial: str, what: str, **fields: Any
) -> dict[str, Any]:
    base = {"round": 0, "trial": trial, "epoch": 0, "kind": what, "partition": 0, "step": 0}
    return {"event": kind, "time": when, **base, "worker": worker, **fields}


def log() -> list[dict[str, Any]]:
    """Two workers, one round: w0 trains t0 then validates t1, w1 trains t1 then validates t0."""
    end = {"rows": 1, "metric_sums": {}}
    return [
        {"event": "experiment_start", "time": 0.0},
        {"event": "dataset", "time": 1.0},
        {"event": "worker_ready", "time": 5.0, "worker": "w0"},
        {"event": "worker_ready", "time": 8.0, "worker": "w1"},
        {"event": "round_start", "time": 10.0, "round": 0},
        unit("unit_start", 10.1, "w0", "t0", "train"),
        unit("unit_start", 10.2, "w1", "t1", "train"),
        # occupancy 0.6 = 0.5 s + 0.1 outside; the next start 0.05 later
        unit("unit_end", 10.7, "w0", "t0", "train", seconds=0.5, io_seconds=0.1, **end),
        # occupancy 1.0 = 0.9 s + 0.1 outside; the next start 0.1 later
        unit("unit_end", 11.2, "w1", "t1", "train", seconds=0.9, io_seconds=0.3, **end),
        unit("unit_start", 10.75, "w0", "t1", "validate"),  # written late: times order it
        unit("unit_start", 11.3, "w1", "t0", "validate"),
        unit("unit_end", 11.0, "w0", "t1", "validate", seconds=0.2, io_seconds=0.05, **end),
        unit("unit_end", 11.6, "w1", "t0", "validate", seconds=0.2, io_seconds=0.15, **end),
        {"event": "round_end", "time": 11.9, "round": 0},
        {"event": "round_start", "time": 12.4, "round": 1},
        {"event": "worker_lost", "time": 20.0, "worker": "w1"},
        {"event": "worker_partitions", "time": 21.5, "worker": "w0", "partitions": [0, 1]},
    ]


def test_a_write_done_after_the_worker_was_freed_is_not_the_workers_time() -> None:
    # w0's train unit: freed at 10.65 (trained_at), its checkpoint durable at 10.75, and w0
    # starting its next unit at 10.70 meanwhile (the write overlaps it: issue 13 part 3).
    events = log()
    end = {"rows": 1, "metric_sums": {}}
    events[7] = unit(
        "unit_end",
        10.75,
        "w0",
        "t0",
        "train",
        seconds=0.5,
        io_seconds=0.1,
        trained_at=10.65,
        **end,
    )
    events[9] = unit("unit_start", 10.70, "w0", "t1", "validate")
    found = measure_overheads(events)
    assert found.hop_seconds == pytest.approx((0.0 + 0.3) / 2)  # w0's 0.1 s written after
    assert found.train_seconds == pytest.approx((0.4 + 0.6) / 2)  # compute unchanged
    # outside: w0's train 0.55 span - 0.4 on the worker, then 0.1, 0.1, 0.1; between: 0.05
    # (10.65 -> 10.70, not a negative gap from its unit_end) and 0.1
    assert found.dispatch_seconds == pytest.approx((0.15 + 0.1 + 0.1 + 0.1) / 4 + 0.075)


def test_each_overhead_is_measured_as_documented() -> None:
    found = measure_overheads(log())
    assert found.train_seconds == pytest.approx((0.4 + 0.6) / 2)  # seconds - io_seconds
    assert found.hop_seconds == pytest.approx((0.1 + 0.3) / 2)
    assert found.validate_seconds == pytest.approx((0.15 + 0.05) / 2)
    assert found.validate_hop_seconds == pytest.approx(0.1)
    # outside the units: mean of 0.1, 0.1, 0.05, 0.1; between them: median of 0.05, 0.1
    assert found.dispatch_seconds == pytest.approx(0.0875 + 0.075)
    assert found.startup_seconds == pytest.approx(5.5)  # median ready 6.5 - dataset 1.0
    assert found.round_seconds == pytest.approx(0.1 + 0.3)  # to the first start, from the last end
    assert found.between_rounds_seconds == pytest.approx(0.5)
    assert found.worker_spread == pytest.approx(0.1 / 0.5)  # train compute 0.4 and 0.6
    assert found.rehome_seconds == pytest.approx(1.5)
    assert found.units == 4
    assert found.unit_seconds("train") == pytest.approx(0.7)
    assert found.unit_seconds("validate") == pytest.approx(0.2)
    assert "dispatch 162.5 ms" in found.describe() and "re-homing 1.50 s" in found.describe()


def test_round_makespans_and_a_run_that_lost_no_worker() -> None:
    events = log()[:-2]  # no loss
    assert round_makespans(events) == {0: pytest.approx(1.9)}
    assert measure_overheads(events).rehome_seconds is None
    with_more = measure_overheads(events, rounds=[0])
    assert with_more.units == 4


def test_a_log_without_what_the_model_needs_is_refused() -> None:
    events = log()
    with pytest.raises(ConfigError, match=r"has 2 finished train and 0 validation units"):
        measure_overheads([e for e in events if e.get("kind") != "validate"])
    with pytest.raises(ConfigError, match=r"in rounds \[3\]"):
        measure_overheads(events, rounds=[3])
    with pytest.raises(ConfigError, match="no 'dataset' event or no worker_ready"):
        measure_overheads([e for e in events if e["event"] != "worker_ready"])


def test_overheads_are_checked_and_rescaled() -> None:
    with pytest.raises(ConfigError, match=r"hop_seconds must be a finite number >= 0, got -1"):
        UnitOverheads(1.0, 0.5, -1, 0.0, 0.0, 0.0)
    with pytest.raises(ConfigError, match="kind must be 'train' or 'validate', got 'x'"):
        UnitOverheads(1.0, 0.5, 0.1, 0.0, 0.0, 0.0).unit_seconds("x")
    bigger = UnitOverheads(0.01, 0.005, 0.1, 0.02, 0.03, 4.0).with_compute(2.0, 0.5)
    assert (bigger.train_seconds, bigger.validate_seconds, bigger.hop_seconds) == (2.0, 0.5, 0.1)


def test_a_slower_machine_scales_every_per_unit_time() -> None:
    base = UnitOverheads(0.1, 0.05, 0.02, 0.01, 0.004, 9.0, 0.002, 0.3, rehome_seconds=2.0)
    slow = base.slower(2.0)
    assert (slow.train_seconds, slow.hop_seconds, slow.dispatch_seconds) == (0.2, 0.04, 0.008)
    assert (slow.round_seconds, slow.between_rounds_seconds) == (0.004, 0.6)
    assert (slow.startup_seconds, slow.rehome_seconds) == (9.0, 2.0)  # once a run
    with pytest.raises(ConfigError, match="factor must be a finite number > 0, got 0"):
        base.slower(0)
