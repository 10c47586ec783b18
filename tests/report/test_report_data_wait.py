"""The report's data wait: per unit in the Gantt chart's hover, and per worker, overall and
for the most waiting trials in the page and the terminal summary; logs written before
``unit_end`` carried ``data_wait_seconds`` show none of it and do not fail."""

from __future__ import annotations

from typing import Any

import pytest

from cerebro_spark.engine import parse_config
from cerebro_spark.report import collect, data_wait_text, summary_text
from cerebro_spark.report._data import UnitBar, data_wait
from cerebro_spark.report._figures import gantt
from cerebro_spark.report._html import render

CONFIG = parse_config(
    {
        "name": "u",
        "store": "runs",
        "data": {"source": "sklearn:digits"},
        "space": {"model": "cerebro_spark.training:MLPSpec"},
        "metric": "accuracy",
        "mode": "max",
        "epochs": 1,
    }
)


def end(time: float, trial: str, worker: str, seconds: float, **fields: Any) -> dict[str, Any]:
    return {"event": "unit_end", "time": time, "round": 0, "trial": trial, "epoch": 0,
            "kind": "train", "partition": 0, "step": 0, "worker": worker, "seconds": seconds,
            "io_seconds": 0.0, "rows": 10, "metric_sums": {}, "checkpoint": f"{trial}.pt",
            "checkpoint_sha256": "s", **fields}  # fmt: skip


def log(*units: dict[str, Any]) -> list[dict[str, Any]]:
    trials = sorted({u["trial"] for u in units})
    return [
        {"event": "experiment_start", "time": 100.0, "config": {}, "resumed": False},
        *({"event": "trial_added", "time": 100.0, "trial": t, "params": {}, "seed": 1,
           "spec": "m:S", "clone_from": None} for t in trials),
        {"event": "round_start", "time": 100.0, "round": 0, "trials": trials,
         "epochs": dict.fromkeys(trials, 0), "visit_orders": None, "procedure_state": {}},
        *units,
    ]  # fmt: skip


def hovers(data: Any) -> list[str]:
    figure = gantt(data)
    return [text for trace in figure.data if trace.type == "bar" for text in trace.hovertext]


NEW_LOG = log(
    end(103.0, "t1", "w0", 2.0, data_wait_seconds=0.5),
    end(104.0, "t2", "w1", 4.0, data_wait_seconds=0.2),
    end(105.0, "t1", "w0", 1.0, data_wait_seconds=0.3, kind="validate"),
    end(106.0, "t3", "w1", 3.0),  # a unit of an older worker: not counted
    end(107.0, "t3", "w2", 2.0, data_wait_seconds="nan"),  # not finite: not counted
    {"event": "unit_failed", "time": 108.0, "round": 0, "trial": "t2", "epoch": 0,
     "kind": "train", "partition": 1, "step": 1, "worker": "w0", "reason": "worker_lost",
     "error": "gone"},
)  # fmt: skip


def test_the_summary_sums_per_worker_overall_and_ranks_trials_by_share() -> None:
    wait = collect("x", CONFIG, NEW_LOG).data_wait
    assert wait is not None
    overall = wait.overall
    assert (overall.name, overall.units) == ("all", 3)
    assert overall.wait_seconds == pytest.approx(1.0) and overall.unit_seconds == pytest.approx(7.0)
    assert overall.share == pytest.approx(1.0 / 7.0)
    workers = [(r.name, r.units, r.wait_seconds, r.unit_seconds) for r in wait.workers]
    assert workers == [("w0", 2, pytest.approx(0.8), 3.0), ("w1", 1, 0.2, 4.0)]
    assert [(r.name, r.share) for r in wait.trials] == [
        ("t1", pytest.approx(0.8 / 3.0)),
        ("t2", pytest.approx(0.05)),
    ]


def test_top_trials_are_cut_and_ties_go_to_more_seconds_waited_then_the_id() -> None:
    def bar(trial: str, wait: float, seconds: float) -> UnitBar:
        return UnitBar("w0", trial, "train", 0.0, seconds, 0, 0, 0, seconds=seconds,
                       data_wait=wait)  # fmt: skip

    units = [bar("t10", 1.0, 10.0), bar("t9", 1.0, 10.0), bar("t2", 2.0, 20.0),
             bar("t1", 5.0, 10.0), bar("t3", 0.0, 0.0)]  # fmt: skip
    wait = data_wait(units, top=3)
    assert wait is not None
    assert [r.name for r in wait.trials] == ["t1", "t2", "t9"]  # t9 before t10 by number
    idle = data_wait([bar("t1", 0.0, 0.0)])  # a unit of no seconds: a share of 0, no error
    assert idle is not None and idle.overall.share == 0.0
    assert data_wait([]) is None


def test_the_gantt_hover_says_each_units_data_wait() -> None:
    texts = hovers(collect("x", CONFIG, NEW_LOG))
    assert len(texts) == 6
    waits = [t.split("<br>data wait ")[1].split("<br>")[0] for t in texts if "data wait" in t]
    assert waits == ["0.50 s of 2.00 s (25.0%)", "0.20 s of 4.00 s (5.0%)",
                     "0.30 s of 1.00 s (30.0%)"]  # fmt: skip
    assert sum("data wait" in t for t in texts) == 3  # not the old, the NaN, the failed unit


def test_the_page_and_the_terminal_show_the_summary() -> None:
    data = collect("x", CONFIG, NEW_LOG)
    page = render(data)
    section = page.split("<h2>Data wait</h2>")[1].split("<h2>")[0]
    rows = [row.split("</tr>")[0] for row in section.split("<tr>")[1:]]
    cells = [[c.split(">", 1)[1] for c in row.split("</td>")[:-1]] for row in rows]
    cells = [row for row in cells if row]  # not the header rows
    assert cells[:3] == [
        ["w0", "2", "0.8000", "3.0000", "26.7%"],
        ["w1", "1", "0.2000", "4.0000", "5.0%"],
        ["all", "3", "1.0000", "7.0000", "14.3%"],
    ]
    assert [row[0] for row in cells[3:]] == ["t1", "t2"]  # the trials table
    assert "Top 2 trials by data wait share" in section
    assert "<td>data wait (all workers)</td><td>1.0 s, 14.3% of 7.0 unit seconds</td>" in page
    text = summary_text(data)
    assert text.splitlines()[-2:] == [
        "data wait: 1.0 s of 7.0 unit-seconds (14.3%); by worker: w0 26.7%, w1 5.0%",
        "  most waiting trials: t1 26.7% (0.8 s), t2 5.0% (0.2 s)",
    ]
    assert data_wait_text(data.data_wait) == "\n".join(text.splitlines()[-2:])


def test_an_old_log_shows_no_data_wait_and_does_not_fail() -> None:
    old = log(end(103.0, "t1", "w0", 2.0), end(104.0, "t2", "w1", 4.0))
    data = collect("x", CONFIG, old)
    assert data.data_wait is None
    assert [u.data_wait for u in data.units] == [None, None]
    assert not any("data wait" in t for t in hovers(data))
    page = render(data)
    assert "Data wait" not in page and "data wait" not in page
    text = summary_text(data)
    assert "data wait" not in text and text.splitlines()[-1].startswith("time: ")
    assert data_wait_text(None) == ""
