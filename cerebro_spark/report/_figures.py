"""The report's charts, as plotly figures built from :class:`~._data.ReportData`."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from cerebro_spark.report._data import UNIT_KINDS, ReportData

STATUS_COLORS = {
    "running": "#1f77b4",
    "paused": "#ff7f0e",
    "stopped": "#d62728",
    "completed": "#2ca02c",
    "failed": "#444444",
}
"""A trial's colour by what the procedure decided: continued (running), paused, stopped
early, completed its epochs, or failed."""

DECISION_LABELS = {
    "running": "continued",
    "paused": "paused",
    "stopped": "stopped",
    "completed": "completed",
    "failed": "failed",
}

KIND_COLORS = {
    "train": "#4c78a8",
    "validate": "#f58518",
    "group": "#54a24b",
    "failed": "#e45756",
    "unfinished": "#bab0ac",
}

MARKER_SYMBOLS = {
    "joined": ("triangle-right", "#2ca02c"),
    "ready": ("circle", "#2ca02c"),
    "retiring": ("triangle-left", "#9467bd"),
    "retired": ("square", "#9467bd"),
    "lost": ("x", "#d62728"),
}

_CLUSTER_COLOR = "#7f7f7f"
TEMPLATE = "plotly_white"
"""The figures' plotly template: added to each figure's JSON as the page is written
(:func:`~cerebro_spark.report._html.render`), not set on the figure, where plotly
validates and copies the whole template each time (half a refresh's CPU)."""
_LAYOUT: dict[str, Any] = {
    "margin": {"l": 70, "r": 30, "t": 50, "b": 50},
    "legend": {"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0},
}


def _status_of(point_status: str | None, decision: str | None) -> str:
    if point_status:
        return point_status
    return {"continue": "running", "pause": "paused", "stop": "stopped"}.get(decision or "", "")


def _metric_names(data: ReportData) -> list[str]:
    """The experiment's metric, the loss, then the others that are not per class."""
    names = {name for points in data.curves.values() for p in points for name in p.metrics}
    first = [n for n in (data.metric, "loss") if n in names]
    others = sorted(n for n in names - set(first) if not re.search(r"_class_\d+$", n))
    return first + others


def learning_curves(data: ReportData) -> go.Figure:
    """Every trial's validation metric by epoch; points coloured by the decision after it.

    A line's colour is its trial's status now; each point's colour is the decision taken
    after that epoch (continued, paused, stopped, completed). A menu switches the metric.
    The trials of one status share one trace (their lines apart, joined by gaps), so the
    figure costs the same to draw with 10,000 trials as with ten traces. It is built
    from plain dicts, unvalidated (:func:`_unvalidated`): plotly checked each point's
    colour with a regular expression, 0.45 s of the driver's CPU per refresh at 1,024
    trials.
    """
    metrics = _metric_names(data)
    traces: list[dict[str, Any]] = []
    visibility: dict[str, list[bool]] = {m: [] for m in metrics}
    order = sorted(data.curves, key=_trial_order)
    for metric in metrics:
        lines: dict[str, tuple[list[Any], list[Any], list[str], list[str]]] = {}
        for trial_id in order:
            points = [p for p in data.curves[trial_id] if metric in p.metrics]
            if not points:
                continue
            trial = data.state.trials.get(trial_id)
            status = trial.status if trial is not None else "running"
            xs, ys, colors, hover = lines.setdefault(status, ([], [], [], []))
            if xs:  # a gap: the previous trial's line ends here
                xs.append(None)
                ys.append(None)
                colors.append("#999999")
                hover.append("")
            for p in points:
                then = _status_of(p.status, p.decision)
                xs.append(p.epoch)
                ys.append(p.metrics[metric])
                colors.append(STATUS_COLORS.get(then, "#999999"))
                hover.append(
                    f"trial {trial_id} epoch {p.epoch}<br>{metric} {p.metrics[metric]:.4f}<br>"
                    f"then: {DECISION_LABELS.get(then, 'no decision')}"
                )
        for status, (xs, ys, colors, hover) in lines.items():
            traces.append(
                {
                    "connectgaps": False,
                    "hoverinfo": "text",
                    "hovertext": hover,
                    "legendgroup": status,
                    "line": {"color": STATUS_COLORS.get(status, "#999999"), "width": 1.5},
                    "marker": {
                        "color": colors,
                        "line": {"color": "white", "width": 1},
                        "size": 9,
                    },
                    "mode": "lines+markers",
                    "name": DECISION_LABELS.get(status, status),
                    "showlegend": metric == data.metric,
                    "visible": metric == data.metric,
                    "x": xs,
                    "y": ys,
                    "type": "scatter",
                }
            )
            for name in metrics:
                visibility[name].append(name == metric)
    for status in ("running", "paused", "stopped", "completed"):  # what the point colours say
        traces.append(
            {
                "hoverinfo": "skip",
                "marker": {"color": STATUS_COLORS[status], "size": 9},
                "mode": "markers",
                "name": f"then {DECISION_LABELS[status]}",
                "x": [None],
                "y": [None],
                "type": "scatter",
            }
        )
        for name in metrics:
            visibility[name].append(True)
    buttons = [
        {"args": [{"visible": visibility[name]}], "label": name, "method": "update"}
        for name in metrics
    ]
    layout: dict[str, Any] = {
        **_LAYOUT,
        "title": {
            "text": f"Learning curves ({data.metric}, {data.mode}; line: status now, "
            "point: decision after the epoch)"
        },
        "xaxis": {"dtick": 1, "title": {"text": "epoch"}},
        "yaxis": {"title": {"text": "validation metric"}},
        "height": 460,
        "updatemenus": [{"buttons": buttons, "x": 1.0, "xanchor": "right", "y": 1.15}]
        if len(buttons) > 1
        else [],
    }
    return _unvalidated(traces, layout)


def _unvalidated(traces: list[dict[str, Any]], layout: dict[str, Any]) -> go.Figure:
    """A figure of plain trace and layout dicts, not checked by plotly.

    They must be in the form plotly's validation gives (``title`` as ``{"text": ...}``,
    every trace with its ``type``): the report's tests validate each such figure
    (``go.Figure(figure.to_plotly_json())``) and compare.
    """
    return go.Figure(data=traces, layout=layout, _validate=False)


def _trial_order(trial_id: str) -> tuple[int, str]:
    digits = "".join(c for c in trial_id if c.isdigit())
    return (int(digits) if digits else -1, trial_id)


def gantt(data: ReportData) -> go.Figure:
    """Units per worker over time (train, validation, group ranks, failed), with events.

    Worker joins, readiness, retirements and losses are marked on the worker's row;
    resizes, re-plans, stage ends and resumed sessions are vertical lines across all rows.
    A unit's hover text says how long it waited for batches, when its log says.
    """
    figure = go.Figure()
    workers = data.workers
    for kind in UNIT_KINDS:
        bars = [u for u in data.units if u.kind == kind]
        if not bars:
            continue
        hover = []
        for u in bars:
            text = (
                f"{u.kind} unit, trial {u.trial}, epoch {u.epoch + 1}, partition {u.partition}"
                f"<br>worker {u.worker}, round {u.round + 1}<br>{u.start:.1f} s to {u.end:.1f} s"
            )
            if u.data_wait is not None and u.seconds is not None:
                share = u.data_wait / u.seconds if u.seconds > 0 else 0.0
                text += f"<br>data wait {u.data_wait:.2f} s of {u.seconds:.2f} s ({share:.1%})"
            if u.group:
                text += f"<br>group {u.group}"
            if u.error:
                text += f"<br>error: {u.error[:200]}"
            hover.append(text)
        # Arrays, not lists: plotly checks and copies a list element by element (a
        # bar per unit: the most costly part of the report at 10,000 trials).
        figure.add_trace(
            go.Bar(
                base=np.array([u.start for u in bars], dtype=float),
                x=np.array([max(u.end - u.start, 1e-3) for u in bars], dtype=float),
                y=np.array([u.worker for u in bars], dtype=object),
                orientation="h",
                name=kind,
                marker={"color": KIND_COLORS[kind], "line": {"width": 0.5, "color": "white"}},
                hovertext=np.array(hover, dtype=object),
                hoverinfo="text",
            )
        )
    for label, (symbol, color) in MARKER_SYMBOLS.items():
        marks = [m for m in data.markers if m.worker is not None and m.label == label]
        if marks:
            figure.add_trace(
                go.Scatter(
                    x=[m.time for m in marks],
                    y=[m.worker for m in marks],
                    mode="markers",
                    name=f"worker {label}",
                    marker={"symbol": symbol, "size": 12, "color": color},
                    hovertext=[m.detail for m in marks],
                    hoverinfo="text",
                )
            )
    cluster = [m for m in data.markers if m.worker is None]
    for mark in cluster:
        figure.add_vline(x=mark.time, line={"color": _CLUSTER_COLOR, "dash": "dot", "width": 1})
    if cluster:
        figure.add_trace(
            go.Scatter(
                x=[m.time for m in cluster],
                y=[workers[-1] if workers else ""] * len(cluster),
                mode="markers+text",
                text=[m.label for m in cluster],
                textposition=[("top center", "bottom center")[i % 2] for i in range(len(cluster))],
                name="cluster / plan",
                marker={"symbol": "diamond", "size": 10, "color": _CLUSTER_COLOR},
                hovertext=[m.detail or m.label for m in cluster],
                hoverinfo="text",
            )
        )
    figure.update_layout(
        **_LAYOUT,
        title="Units per worker over time",
        barmode="overlay",
        xaxis_title="seconds since the experiment started",
        yaxis={"categoryorder": "array", "categoryarray": workers[::-1], "title": "worker"},
        height=max(260, 90 + 48 * len(workers)),
    )
    return figure


def rungs(data: ReportData) -> go.Figure:
    """Per round, every trial that trained and what the procedure decided (rungs, brackets).

    A point's colour is the decision after the round, its label the epoch the trial
    reached.
    """
    figure = go.Figure()
    trials = sorted({t for r in data.rounds for t in r.epochs}, key=_trial_order)
    for status, color in STATUS_COLORS.items():
        xs, ys, texts, hover = [], [], [], []
        for summary in data.rounds:
            for trial, (decided, epoch) in summary.decisions.items():
                if decided != status:
                    continue
                xs.append(summary.round + 1)  # rounds counted from 1, as progress shows them
                ys.append(trial)
                texts.append(str(epoch))
                hover.append(
                    f"round {summary.round + 1}: trial {trial} reached epoch {epoch}, "
                    f"{DECISION_LABELS[status]}"
                )
        if xs:
            figure.add_trace(
                go.Scatter(
                    x=xs,
                    y=ys,
                    mode="markers+text",
                    text=texts,
                    textposition="middle right",
                    name=DECISION_LABELS[status],
                    marker={"color": color, "size": 12, "symbol": "square"},
                    hovertext=hover,
                    hoverinfo="text",
                )
            )
    figure.update_layout(
        **_LAYOUT,
        title="Rounds: who trained, to which epoch, and the decision after it",
        xaxis={"title": "round", "dtick": 1},
        yaxis={"categoryorder": "array", "categoryarray": trials[::-1], "title": "trial"},
        height=max(260, 90 + 22 * len(trials)),
    )
    return figure


def plan_vs_actual(data: ReportData) -> go.Figure:
    """Predicted and actual seconds and dollars per stage (a run with a plan)."""
    figure = make_subplots(rows=1, cols=2, subplot_titles=("seconds", "dollars"))
    labels = [f"stage {s.stage + 1}" for s in data.stages]
    series: Sequence[tuple[str, str, str, str]] = (
        ("planned", "planned_seconds", "planned_usd", "#9ecae1"),
        ("actual", "seconds", "usd", "#08519c"),
    )
    for name, seconds, usd, color in series:
        for column, field in ((1, seconds), (2, usd)):
            figure.add_trace(
                go.Bar(
                    x=labels,
                    y=[getattr(s, field) for s in data.stages],
                    name=name,
                    legendgroup=name,
                    showlegend=column == 1,
                    marker={"color": color},
                ),
                row=1,
                col=column,
            )
    figure.update_layout(**_LAYOUT, title="Plan vs actual per stage", barmode="group", height=380)
    return figure
