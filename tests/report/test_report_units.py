"""The report's parts that need neither torch nor Spark: the data of logs old and new,
re-judging by another metric, the terminal formats, the refresh that never fails a run."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.engine import ExperimentState, TrialState, parse_config
from cerebro_spark.errors import ConfigError
from cerebro_spark.report import (
    REPORT_NAME,
    Report,
    _api,
    check_metric,
    collect,
    failures_text,
    leaderboard_json,
    metric_mode,
    refresh_report,
    rejudge,
    trial_seconds,
)
from cerebro_spark.report._figures import learning_curves
from cerebro_spark.store import open_store

CONFIG = parse_config(
    {
        "name": "u",
        "store": "runs",
        "data": {"source": "sklearn:digits"},
        "space": {"model": "cerebro_spark.training:MLPSpec"},
        "metric": "accuracy",
        "mode": "max",
        "epochs": 2,
    }
)


def trial(trial_id: str, history: list[dict[str, float]], **fields: Any) -> TrialState:
    state = TrialState(trial_id, {"lr": 0.1}, 1, "m:S", epochs=len(history), history=history)
    for name, value in fields.items():
        setattr(state, name, value)
    return state


def test_rejudge_picks_each_trials_best_epoch_by_the_other_metric() -> None:
    history = [
        {"accuracy": 0.9, "loss": 0.5, "f1": 0.2},
        {"accuracy": 0.8, "loss": 0.3, "f1": 0.7},
        {"accuracy": 0.7, "loss": 0.4, "f1": 0.6},
    ]
    t = trial("t1", history, best_epoch=1, best_metrics=history[0], best_checkpoint="b1",
              checkpoint="c3", best_checkpoint_sha256="s1", checkpoint_sha256="s3")  # fmt: skip
    (by_loss,) = rejudge([t], "loss", "min")
    assert by_loss.best_epoch == 2 and by_loss.best_metrics["loss"] == 0.3
    assert by_loss.best_checkpoint is None  # epoch 2 was neither kept checkpoint
    (by_accuracy,) = rejudge([t], "accuracy", "max")
    assert (by_accuracy.best_epoch, by_accuracy.best_checkpoint) == (1, "b1")
    (by_last,) = rejudge([t], "loss", "max")  # the worst loss is the latest's... epoch 1
    assert by_last.best_epoch == 1
    t.history[2] = {"accuracy": 0.7, "loss": 0.1, "f1": 0.6}
    (latest,) = rejudge([t], "loss", "min")
    assert (latest.best_epoch, latest.best_checkpoint, latest.best_checkpoint_sha256) == (
        3,
        "c3",
        "s3",
    )
    assert t.best_epoch == 1  # the originals are untouched


def test_an_unreported_metric_and_an_unknown_mode_are_clear_errors() -> None:
    trials = [trial("t1", [{"accuracy": 0.5, "loss": 1.0}])]
    with pytest.raises(ConfigError, match=r"no trial reported metric 'f2'.*\['accuracy', 'loss'\]"):
        check_metric(trials, "f2")
    assert metric_mode("accuracy", CONFIG) == "max"
    assert metric_mode("rmse", CONFIG) == "min" and metric_mode("log_loss", CONFIG) == "min"
    assert metric_mode("f1_class_3", CONFIG) == "max"
    assert metric_mode("top3_accuracy", CONFIG) == "max"
    with pytest.raises(ConfigError, match=r"'my_score' is not a built-in metric.*--mode"):
        metric_mode("my_score", CONFIG)


def test_json_and_failures() -> None:
    trials = [
        trial("t1", [{"accuracy": 0.5, "loss": float("nan")}], best_epoch=1,
              best_metrics={"accuracy": 0.5, "loss": float("nan")}),
        trial("t2", [], status="failed", error="Traceback\n  line\nValueError: boom"),
    ]  # fmt: skip
    board = json.loads(leaderboard_json(trials, "accuracy", "max", {"t1": 2.5}, {"t1": 0.01}))
    assert board["metric"] == "accuracy" and [r["trial_id"] for r in board["trials"]] == [
        "t1",
        "t2",
    ]
    first = board["trials"][0]
    assert first["rank"] == 1 and first["loss"] is None and first["seconds"] == 2.5
    assert first["usd"] == 0.01 and board["trials"][1]["error"].endswith("boom")
    text = failures_text(trials, {"worker_lost": 2})
    assert text.splitlines() == [
        "1 trial failed:",
        "  t2: ValueError: boom",
        "      Traceback",
        "        line",
        "units that failed, by reason: 2 worker_lost",
    ]


def unit(kind: str, time: float, **fields: Any) -> dict[str, Any]:
    base = {"round": 0, "trial": "t", "epoch": 0, "kind": "train", "partition": 0, "step": 0,
            "worker": "w0"}  # fmt: skip
    return {"event": kind, "time": time, **base, **fields}


def test_logs_without_unit_starts_and_group_units_are_drawn() -> None:
    """Old logs have no ``unit_start``: a bar ends at its ``unit_end`` and lasts its seconds."""
    events = [
        {"event": "experiment_start", "time": 100.0, "config": {}, "resumed": False},
        {"event": "trial_added", "time": 100.0, "trial": "t", "params": {}, "seed": 1,
         "spec": "m:S", "clone_from": None},
        {"event": "round_start", "time": 101.0, "round": 0, "trials": ["t"], "epochs": {"t": 0},
         "visit_orders": None, "procedure_state": {}},
        unit("unit_end", 104.0, seconds=2.0, rows=1, metric_sums={}, checkpoint="c",
             checkpoint_sha256="s"),
        unit("unit_start", 104.0, partition=1, step=1, worker="w0", group="g"),
        unit("unit_start", 104.0, partition=2, step=2, worker="w1", group="g"),
        unit("unit_end", 106.0, partition=1, step=1, worker="w0", group="g",
             group_partitions=[1, 2], seconds=2.0, rows=1, metric_sums={}, checkpoint="c2",
             checkpoint_sha256="s2"),
        unit("unit_end", 106.5, partition=2, step=2, worker="w1", group="g",
             group_partitions=[1, 2], seconds=2.4, rows=1, metric_sums={}, checkpoint="c2",
             checkpoint_sha256="s2"),
        unit("unit_start", 107.0, partition=3, step=3, worker="w1"),
        {"event": "worker_lost", "time": 108.0, "worker": "w1", "reason": "executor died",
         "bytes_read": 0, "unit": None},
    ]  # fmt: skip
    data = collect("x", CONFIG, events)
    bars = [(u.worker, u.kind, u.start, u.end, u.group) for u in data.units]
    assert bars == [
        ("w0", "train", 2.0, 4.0, None),
        ("w0", "group", 4.0, 6.0, "g"),
        ("w1", "group", 4.0, 6.5, "g"),
        ("w1", "unfinished", 7.0, 8.0, None),  # never ended: drawn to the log's last event
    ]
    assert [(m.label, m.worker, m.detail) for m in data.markers] == [
        ("lost", "w1", "worker w1 lost: executor died")
    ]
    assert trial_seconds(events) == {"t": 6.4} and data.trial_usd is None
    assert data.workers == ["w0", "w1"]
    # A resumed session: the unit the dead driver left open ends with its session.
    events += [
        {"event": "experiment_start", "time": 200.0, "config": {}, "resumed": True},
        unit("unit_start", 201.0, partition=3, step=3, worker="w2"),
        unit("unit_end", 203.0, partition=3, step=3, worker="w2", seconds=1.5, rows=1,
             metric_sums={}, checkpoint="c3", checkpoint_sha256="s3"),
    ]  # fmt: skip
    resumed = collect("x", CONFIG, events)
    # One clock: the resumed session goes on from the experiment time the first one
    # reached (8 s); the 92 s the driver was down are not on the timeline.
    assert [(u.worker, u.kind, u.start, u.end) for u in resumed.units[-2:]] == [
        ("w1", "unfinished", 7.0, 8.0),
        ("w2", "train", 9.0, 11.0),
    ]
    assert resumed.last == resumed.state.experiment_seconds == 11.0
    assert ("resumed", None) in [(m.label, m.worker) for m in resumed.markers]


def test_the_notebook_view_is_an_escaped_iframe(tmp_path: Path) -> None:
    report = Report("x", '<html><body><p title="a">&</p></body></html>')
    shown = report._repr_html_()
    assert shown.startswith('<iframe srcdoc="&lt;html&gt;')
    assert "&quot;a&quot;" in shown and "&gt;&amp;&lt;/p" in shown
    assert report.save(tmp_path / "sub" / "r.html").read_text() == report.html


def test_a_refresh_never_fails_the_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = open_store(str(tmp_path)).child("experiments/x")
    store.put("events.jsonl", b"not json\n{}\n")  # a damaged log: the report cannot be built
    with caplog.at_level(logging.WARNING):
        refresh_report(store, "x", CONFIG, final=True)
    assert "could not write the report" in caplog.text and not store.exists(REPORT_NAME)


def test_a_refresh_writes_the_report_and_is_throttled(tmp_path: Path) -> None:
    store = open_store(str(tmp_path)).child("experiments/y")
    start = {"event": "experiment_start", "time": 1.0, "config": {}, "resumed": False}
    store.put("events.jsonl", (json.dumps(start) + "\n").encode())
    refresh_report(store, "y", CONFIG, final=False)
    first = store.get(REPORT_NAME)
    assert b'http-equiv="refresh"' in first  # not finished: the page reloads itself
    store.delete(REPORT_NAME)
    refresh_report(store, "y", CONFIG, final=False)  # right after: skipped
    assert not store.exists(REPORT_NAME)
    refresh_report(store, "y", CONFIG, final=True)  # the end of a run: always written
    assert store.exists(REPORT_NAME)


def test_state_fields_the_report_reads_exist() -> None:
    """The report reads these from the engine's state; a rename must break here first."""
    state = ExperimentState()
    for name in ("stage_plans", "stage_actuals", "elastic_summary", "finished", "stopped",
                 "sessions", "experiment_seconds", "dataset_id", "round"):  # fmt: skip
        assert hasattr(state, name), name


def test_learning_curves_draw_many_trials_in_one_trace_per_status() -> None:
    """Trials share their status's trace, apart (a gap between two trials' lines)."""
    events: list[dict[str, Any]] = [
        {"event": "experiment_start", "time": 100.0, "config": {}, "resumed": False},
    ]
    trials = [f"t{i:03d}" for i in range(300)]
    for t in trials:
        events.append({"event": "trial_added", "time": 100.0, "trial": t, "params": {},
                       "seed": 1, "spec": "m:S", "clone_from": None})  # fmt: skip
    for epoch in (1, 2):
        events.append({"event": "round_start", "time": 100.0 + epoch, "round": epoch - 1,
                       "trials": trials, "epochs": {t: epoch - 1 for t in trials},
                       "visit_orders": None, "procedure_state": {}})  # fmt: skip
        for i, t in enumerate(trials):
            events.append({"event": "trial_epoch", "time": 100.5 + epoch, "round": epoch - 1,
                           "trial": t, "epoch": epoch, "metrics": {"accuracy": int(t[1:]) / 300},
                           "checkpoint": None, "checkpoint_sha256": None})  # fmt: skip
            stop = epoch == 2 or i % 3 == 0
            events.append({"event": "decision", "time": 100.6 + epoch, "round": epoch - 1,
                           "trial": t, "epoch": epoch,
                           "decision": "stop" if stop else "continue",
                           "status": ("completed" if epoch == 2 else "stopped") if stop
                           else "running"})  # fmt: skip
            if stop and epoch == 1:
                trials = [x for x in trials if x != t]
    figure = learning_curves(collect("x", CONFIG, events))
    lines = [trace for trace in figure.data if trace.x and trace.x[0] is not None]
    by_name = {trace.name: trace for trace in lines}
    assert sorted(by_name) == ["completed", "stopped"]  # 300 trials, two traces
    stopped, completed = by_name["stopped"], by_name["completed"]
    assert list(stopped.x) == [1, None] * 99 + [1]  # 100 one-point lines, gaps between
    assert list(completed.x) == [1, 2, None] * 199 + [1, 2]
    assert completed.y[:2] == (1 / 300, 1 / 300) and completed.connectgaps is False
    assert len(completed.marker.color) == len(completed.x) == len(completed.hovertext)
    assert completed.hovertext[0].startswith("trial t001 epoch 1")


def test_learning_curves_built_unvalidated_are_what_plotly_validates_them_to() -> None:
    """Its dicts skip plotly's checks: they must already be in plotly's validated form."""
    import plotly.graph_objects as go

    events: list[dict[str, Any]] = [
        {"event": "experiment_start", "time": 100.0, "config": {}, "resumed": False},
    ]
    for t in ("t0", "t1", "t2"):
        events.append({"event": "trial_added", "time": 100.0, "trial": t, "params": {},
                       "seed": 1, "spec": "m:S", "clone_from": None})  # fmt: skip
    events.append({"event": "round_start", "time": 101.0, "round": 0, "trials": ["t0", "t1", "t2"],
                   "epochs": {}, "visit_orders": None, "procedure_state": {}})  # fmt: skip
    for i, t in enumerate(("t0", "t1", "t2")):
        metrics = {"accuracy": 0.5 + i / 10, "loss": 1.0 - i / 10, "f1_class_0": 0.1}
        events.append({"event": "trial_epoch", "time": 102.0, "round": 0, "trial": t,
                       "epoch": 1, "metrics": metrics, "checkpoint": None,
                       "checkpoint_sha256": None})  # fmt: skip
        events.append({"event": "decision", "time": 102.5, "round": 0, "trial": t, "epoch": 1,
                       "decision": ("continue", "pause", "stop")[i],
                       "status": ("running", "paused", "stopped")[i]})  # fmt: skip
    spec = learning_curves(collect("x", CONFIG, events)).to_plotly_json()
    validated = go.Figure(spec).to_plotly_json()  # raises on a property plotly lacks
    assert json.dumps(spec, sort_keys=True) == json.dumps(validated, sort_keys=True)
    buttons = spec["layout"]["updatemenus"][0]["buttons"]
    assert [b["label"] for b in buttons] == ["accuracy", "loss"]  # no per-class metric
    assert {trace["name"] for trace in spec["data"]} >= {"continued", "paused", "stopped"}


def test_each_figure_of_the_page_is_drawn_in_the_report_template() -> None:
    """The template is added to each figure's JSON as the page is written."""
    import plotly.io as pio

    from cerebro_spark.report._figures import TEMPLATE
    from cerebro_spark.report._html import render

    events: list[dict[str, Any]] = [
        {"event": "experiment_start", "time": 100.0, "config": {}, "resumed": False},
        {"event": "trial_added", "time": 100.0, "trial": "t0", "params": {}, "seed": 1,
         "spec": "m:S", "clone_from": None},
        {"event": "round_start", "time": 101.0, "round": 0, "trials": ["t0"],
         "epochs": {"t0": 0}, "visit_orders": None, "procedure_state": {}},
        {"event": "trial_epoch", "time": 102.0, "round": 0, "trial": "t0", "epoch": 1,
         "metrics": {"accuracy": 0.5}, "checkpoint": None, "checkpoint_sha256": None},
    ]  # fmt: skip
    page = render(collect("x", CONFIG, events))
    decoder = json.JSONDecoder()
    template = pio.templates[TEMPLATE].to_plotly_json()
    layouts = []
    for piece in page.split("<body>")[1].split("Plotly.newPlot(")[1:]:
        _, at = decoder.raw_decode(piece, piece.index('"'))  # the div id
        _, at = decoder.raw_decode(piece, piece.index("[", at))  # the traces
        layout, _ = decoder.raw_decode(piece, piece.index("{", at))
        layouts.append(layout)
    assert layouts and all(layout["template"] == template for layout in layouts)
    assert layouts[0]["title"]["text"].startswith("Learning curves")


def test_a_refresh_asked_while_one_runs_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = threading.Event()
    calls: list[bool] = []

    def refresh(*args: Any, final: bool) -> None:
        calls.append(final)
        release.wait(timeout=60)

    monkeypatch.setattr(_api, "refresh_report", refresh)
    refresher = _api.ReportRefresher(None, "x", None)  # type: ignore[arg-type]
    refresher.request()
    refresher.request()  # the first still runs: dropped
    release.set()
    refresher.wait()
    refresher.request()  # none runs: starts
    refresher.wait()
    assert calls == [False, False]


def test_rounds_and_stages_are_shown_counted_from_1() -> None:
    """The log counts rounds and stages from 0; the page shows them from 1, as progress,
    ``plan`` and the cost table do (a unit's epoch too: 0 in the log is epoch 1)."""
    from cerebro_spark.report._figures import plan_vs_actual, rungs
    from cerebro_spark.report._html import _rounds_table, _stages_table

    events = [
        {"event": "experiment_start", "time": 100.0, "config": {}, "resumed": False},
        {"event": "trial_added", "time": 100.0, "trial": "t", "params": {}, "seed": 1,
         "spec": "m:S", "clone_from": None},
        {"event": "stage_plan", "time": 100.5, "stage": 0, "trials": 1, "epochs": 1,
         "workers": 2, "start": 1.0, "end": 5.0, "usd": 0.01, "begin": 0.0, "replan": 0},
        {"event": "resized", "time": 100.6, "stage": 0, "from": 1, "target": 2, "workers": 2,
         "seconds": 0.1},
        {"event": "round_start", "time": 101.0, "round": 0, "trials": ["t"], "epochs": {"t": 0},
         "visit_orders": None, "procedure_state": {}},
        unit("unit_end", 104.0, seconds=2.0, rows=1, metric_sums={}, checkpoint="c",
             checkpoint_sha256="s"),
        {"event": "decision", "time": 104.5, "round": 0, "trial": "t", "epoch": 1,
         "decision": "stop", "status": "stopped"},
        {"event": "stage_actual", "time": 105.0, "stage": 0, "seconds": 5.0,
         "planned_seconds": 5.0, "end": 5.0, "planned_end": 5.0, "workers": 2,
         "planned_workers": 2, "executors_at_end": 2, "usd": 0.01, "planned_usd": 0.01,
         "spent_usd": 0.01},
        {"event": "replanned", "time": 105.1, "stage": 1, "reason": "stage 1 took 5.0 s",
         "elapsed": 5.0, "workers": [1]},
    ]  # fmt: skip
    data = collect("x", CONFIG, events)
    labels = [(m.label, m.detail) for m in data.markers]
    assert ("stage 1 ended", "stage 1: 5.0 s, 2 workers, $0.0100") in labels
    assert ("resized", "stage 1: 1 -> 2 workers (2 serve) in 0.1 s") in labels
    assert ("replanned", "from stage 2: stage 1 took 5.0 s") in labels
    assert data.rounds[0].round == 0 and data.stages[0].stage == 0  # as logged
    assert '<td class="num">1</td>' in _rounds_table(data).split("<tr>")[2]
    assert '<td class="num">1</td>' in _stages_table(data).split("<tr>")[2]
    assert list(plan_vs_actual(data).data[0].x) == ["stage 1"]
    assert list(rungs(data).data[0].x) == [1]
    assert "epoch 1, partition 0<br>worker w0, round 1<br>" in gantt_text(data)


def gantt_text(data: Any) -> str:
    from cerebro_spark.report._figures import gantt

    return " ".join(str(t) for trace in gantt(data).data for t in (trace.hovertext or []))


def test_the_timeline_counts_from_run_start_up_included() -> None:
    """``experiment_start.startup``: the seconds from ``run`` to the first event are on the
    timeline too, so its zero is the ``run`` the deadline and the plan count from."""
    events = [
        {"event": "experiment_start", "time": 100.0, "config": {}, "resumed": False,
         "startup": 3.0},
        {"event": "trial_added", "time": 100.0, "trial": "t", "params": {}, "seed": 1,
         "spec": "m:S", "clone_from": None},
        unit("unit_start", 101.0),
        unit("unit_end", 103.0, seconds=2.0, rows=1, metric_sums={}, checkpoint="c",
             checkpoint_sha256="s", trained_at=102.5),
        {"event": "experiment_start", "time": 500.0, "config": {}, "resumed": True,
         "startup": 1.0},
        {"event": "worker_lost", "time": 501.0, "worker": "w0", "reason": "gone",
         "bytes_read": 0, "unit": None},
    ]  # fmt: skip
    data = collect("x", CONFIG, events)
    assert data.origin == 97.0  # the run: 3 s before its first event
    [bar] = data.units
    assert (bar.start, bar.end) == (4.0, 5.5)  # its worker was freed at trained_at
    # The resumed session: 6 s into the run when the first driver's last event was
    # written, then its own second of start-up, then a second more.
    assert [(m.label, m.time) for m in data.markers] == [("resumed", 7.0), ("lost", 8.0)]
    assert data.last == data.state.experiment_seconds == 8.0
