"""A round end asks for the report and goes on: the page is rendered in a thread beside
the next round, and the run waits for it only before its final report.

The engine runs on a real WorkerPool over the in-memory fake transport (no torch, no
Spark); the report's rendering is held until the engine has finished the next round.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.driver._experiment import Experiment
from cerebro_spark.engine import run_experiment
from cerebro_spark.report import REPORT_NAME
from cerebro_spark.report import _api as report_api
from tests.driver.test_early_start import (
    EPOCHS,
    config,
    events_of,
    pool,
    script,  # noqa: F401 (the fake transport, reset)
)


def test_a_round_end_does_not_wait_for_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert EPOCHS == 2  # round 0's report is held until round 1 ends
    next_round_ended = threading.Event()
    renders: list[dict[str, Any]] = []
    render, end_round = report_api.render, Experiment._end_round

    def held_render(data: Any) -> str:
        if not renders:  # round 0's refresh: held until the engine finished round 1
            renders.append({"went_on": next_round_ended.wait(timeout=60)})
        else:
            renders.append({"went_on": True})
        renders[-1]["thread"] = threading.current_thread().name
        return render(data)

    def ending(self: Experiment) -> None:
        if self.state.round == 1:
            next_round_ended.set()
        end_round(self)

    monkeypatch.setattr(report_api, "render", held_render)
    monkeypatch.setattr(Experiment, "_end_round", ending)
    cfg = config(tmp_path)
    result = run_experiment(cfg, experiment_id="held", backend_factory=pool)

    assert renders[0] == {"went_on": True, "thread": "report-held"}  # round 1 ran meanwhile
    assert renders[-1]["thread"] == threading.current_thread().name  # the final one: here
    assert len(renders) == 2
    assert not [t for t in threading.enumerate() if t.name == "report-held"]
    page = (tmp_path / "experiments" / "held" / REPORT_NAME).read_text()
    assert "finished" in page and 'http-equiv="refresh"' not in page
    events = events_of(tmp_path, "held")
    assert [e["round"] for e in events if e["event"] == "round_end"] == [0, 1]
    assert all(t.epochs == EPOCHS for t in result.trials)
