"""A full disk mid-run (issue 12, part 1), on a real tmpfs that fills up.

Whatever write finds the disk full (an event, a worker's checkpoint), the run ends with
:class:`~cerebro_spark.errors.StoreFullError` (the CLI: one line, exit status 2, no
traceback), its log whole; once space is freed, ``resume`` finishes the run with the
results of an uninterrupted one.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.cli import main
from cerebro_spark.engine import EventLog, parse_config, resume_experiment, run_experiment
from tests.reliability.conftest import (
    fill_disk,
    outcome,
    strict_events,
    tiny_config,
    unit_ends,
    write_config,
)

pytestmark = [pytest.mark.torch, pytest.mark.slow]

BIG = {**tiny_config("."), "space": {**tiny_config(".")["space"], "hidden_units": [512, 512]}}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_reference):
    """The outcomes of uninterrupted runs: ``tiny`` (the session's) and ``big``."""
    store = tmp_path_factory.mktemp("reference")
    result = run_experiment(parse_config({**BIG, "store": str(store)}), experiment_id="big")
    assert len(result.trials) == 2
    return {"tiny": tiny_reference.outcome, "big": outcome(strict_events(str(store), "big")[1])}


def filler(monkeypatch: pytest.MonkeyPatch, disk: Path, units: int, leave: int) -> list[Path]:
    """Fill the disk right after the driver logs its ``units``-th unit_end.

    In the driver's own thread, as the append returns: the run's next writes find the
    disk full, however fast the units go (a thread polling the log can come too late).
    """
    made: list[Path] = []
    seen = [0]
    append = EventLog.append

    def append_then_fill(log: EventLog, event: str, **fields: Any) -> dict[str, Any]:
        record = append(log, event, **fields)
        if event == "unit_end" and not made:
            seen[0] += 1
            if seen[0] >= units:
                made.append(fill_disk(disk, leave=leave))
        return record

    monkeypatch.setattr(EventLog, "append", append_then_fill)
    return made


def test_a_disk_full_mid_run_ends_it_clearly_and_resume_finishes_it(
    reference, tmpfs, tmp_path, caplog, monkeypatch
):
    disk = tmpfs("32m")
    config = write_config(tmp_path / "tiny.yaml", tiny_config(disk))
    made = filler(monkeypatch, disk, units=6, leave=0)
    with caplog.at_level(logging.ERROR):
        status = main(["run", str(config), "--experiment-id", "full"])
    monkeypatch.undo()
    assert status == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("no space left on the disk of" in m for m in errors), errors
    assert not any(r.exc_info for r in caplog.records if r.levelno >= logging.ERROR)
    events, state = strict_events(str(disk), "full")  # whole, standard, folds
    assert not state.finished and len(unit_ends(events)) >= 6
    for path in made:
        path.unlink()
    resume_experiment(str(disk), "full")
    events, state = strict_events(str(disk), "full")
    assert state.finished
    assert outcome(state) == reference["tiny"]
    ends = unit_ends(events)
    assert len(ends) == len(set(ends)) == 4 * 2 * 2 * 2  # none lost, none done twice


def test_a_checkpoint_that_finds_the_disk_full_ends_the_run_not_the_trial(
    reference, tmpfs, tmp_path, monkeypatch
):
    """Room for events but not for a checkpoint: the worker's write fails; the unit is
    logged failed as an I/O error (not the trial's fault), and the run stops at once.

    The checkpoints have a disk of their own (a tmpfs mounted at the experiment's
    ``checkpoints/``), filled after the 4th ``unit_end``; the log, leaderboard and report
    stay on a disk with room. On one shared disk, a checkpoint (or the report) that fails
    half written holds the last free bytes until it is removed, and a driver write at that
    moment (the ``unit_failed`` of the other worker) found the disk full first.
    """
    store = tmp_path / "store"
    disk = tmpfs("64m", at=store / "experiments" / "ckpt" / "checkpoints")
    made = filler(monkeypatch, disk, units=4, leave=0)
    with pytest.raises(Exception) as caught:
        run_experiment(parse_config({**BIG, "store": str(store)}), experiment_id="ckpt")
    monkeypatch.undo()
    assert type(caught.value).__name__ == "StoreFullError"
    assert "could not write its checkpoint" in str(caught.value)
    assert "no space left on the disk of" in str(caught.value)
    events, state = strict_events(str(store), "ckpt")
    failed = [e for e in events if e["event"] == "unit_failed"]
    assert failed and all(e["reason"] == "io_error" for e in failed)
    assert not any(e["event"] == "trial_failed" for e in events)
    assert not state.finished
    for path in made:
        path.unlink()
    resume_experiment(str(store), "ckpt")
    _, state = strict_events(str(store), "ckpt")
    assert state.finished
    assert outcome(state) == reference["big"]
