"""The report page: one self-contained HTML file (plotly.js inlined once, no network)."""

from __future__ import annotations

import datetime
import functools
import html
import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

import plotly.io as pio
from plotly.offline import get_plotlyjs

from cerebro_spark.driver import cost_table, leaderboard_rows
from cerebro_spark.report._data import ReportData, WaitRow
from cerebro_spark.report._figures import (
    STATUS_COLORS,
    TEMPLATE,
    gantt,
    learning_curves,
    plan_vs_actual,
    rungs,
)

_LEADERBOARD_METRICS = 5
"""Metrics the leaderboard shows beside the experiment's (the loss first)."""

LIVE_REFRESH_SECONDS = 30
"""A report of a run that has not ended reloads itself this often (it is rewritten at
every round end), so a browser tab shows the run live."""

_STYLE = """
body { font-family: -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
       margin: 24px; color: #222; background: #fff; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 18px; margin-top: 28px; }
.meta { color: #555; font-size: 13px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { border-bottom: 1px solid #ddd; padding: 4px 8px; text-align: left;
         vertical-align: top; white-space: nowrap; }
td.text, td.error { white-space: normal; min-width: 240px; max-width: 480px;
                    overflow-wrap: anywhere; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.scroll { max-height: 480px; overflow: auto; }
.status { display: inline-block; width: 10px; height: 10px; border-radius: 5px;
          margin-right: 4px; }
.error { color: #b00020; font-family: monospace; font-size: 12px; }
.chart { margin: 8px 0 16px 0; }
pre { background: #f7f7f7; padding: 8px; font-size: 12px; overflow: auto; }
"""


def _cell(value: Any) -> str:
    if value is None:
        return "<td>-</td>"
    if isinstance(value, bool):
        return f"<td>{value}</td>"
    if isinstance(value, float):
        return f'<td class="num">{value:.4f}</td>'
    if isinstance(value, int):
        return f'<td class="num">{value}</td>'
    if isinstance(value, dict):
        return f'<td class="text">{html.escape(json.dumps(value, sort_keys=True))}</td>'
    return f"<td>{html.escape(str(value))}</td>"


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]], scroll: bool = False) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in rows)
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    return f'<div class="scroll">{table}</div>' if scroll else table


def _status(status: str) -> str:
    color = STATUS_COLORS.get(status, "#999")
    return f'<span class="status" style="background:{color}"></span>{html.escape(status)}'


def _leaderboard(data: ReportData) -> str:
    metric, mode = data.metric, data.mode
    rows = leaderboard_rows(data.state.trials.values(), metric, mode)
    fixed = _fixed_columns(metric)
    extra = _shown_metrics([k for k in (rows[0] if rows else {}) if k not in fixed])
    header = ["#", "trial", "status", "epochs", "best epoch", metric, f"last {metric}"]
    header += [*extra, "seconds"]
    if data.trial_usd is not None:
        header.append("dollars")
    header += ["error", "params"]
    body = []
    for position, row in enumerate(rows, 1):
        trial = row["trial_id"]
        cells = [
            f'<td class="num">{position}</td>',
            _cell(trial),
            f"<td>{_status(row['status'])}</td>",
            _cell(row["epochs"]),
            _cell(row["best_epoch"]),
            _cell(row[metric]),
            _cell(row[f"last_{metric}"]),
            *(_cell(row[k]) for k in extra),
            f'<td class="num">{data.trial_seconds.get(trial, 0.0):.1f}</td>',
        ]
        if data.trial_usd is not None:
            cells.append(_cell(data.trial_usd.get(trial, 0.0)))
        error = row["error"]
        cells.append(
            "<td>-</td>" if error is None else f'<td class="error">{html.escape(error)}</td>'
        )
        cells.append(_cell(row["params"]))
        body.append("<tr>" + "".join(cells) + "</tr>")
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    return (
        f'<div class="scroll"><table><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def _shown_metrics(columns: list[str]) -> list[str]:
    """The loss and the first other metrics that are not per class (the CSV has all)."""
    first = [c for c in columns if c == "loss"]
    others = [c for c in columns if c != "loss" and not re.search(r"_class_\d+$", c)]
    return (first + others)[:_LEADERBOARD_METRICS]


def _fixed_columns(metric: str) -> set[str]:
    return {
        "trial_id",
        "status",
        "epochs",
        "best_epoch",
        metric,
        f"last_{metric}",
        "best_checkpoint",
        "params",
        "error",
    }


def _rounds_table(data: ReportData) -> str:
    rows = []
    for r in data.rounds:
        by: dict[str, list[str]] = {}
        for trial, (status, epoch) in sorted(r.decisions.items()):
            by.setdefault(status, []).append(f"{trial}@{epoch}")
        seconds = None if r.end is None else round(r.end - r.start, 1)
        epochs = sorted({e + 1 for e in r.epochs.values()})
        rows.append(
            [
                r.round + 1,  # rounds, epochs and stages are shown counted from 1
                len(r.epochs),
                ", ".join(str(e) for e in epochs),
                seconds,
                " ".join(r.resumed),
                " ".join(by.get("running", [])),
                " ".join(by.get("paused", [])),
                " ".join(by.get("stopped", [])),
                " ".join(by.get("completed", [])),
                " ".join(by.get("failed", [])),
            ]
        )
    header = ["round", "trials", "epoch", "seconds", "resumed", "continued", "paused"]
    header += ["stopped", "completed", "failed"]
    return _table(header, rows, scroll=True)


def _stages_table(data: ReportData) -> str:
    rows = [
        [
            s.stage + 1,
            s.planned_workers,
            s.workers,
            s.planned_seconds,
            s.seconds,
            s.planned_usd,
            s.usd,
            s.replan,
        ]
        for s in data.stages
    ]
    header = [
        "stage",
        "planned workers",
        "workers",
        "planned seconds",
        "seconds",
        "planned $",
        "actual $",
        "plan #",
    ]
    return _table(header, rows)


def _wait_summary(data: ReportData) -> list[list[Any]]:
    """The cost table's data wait row (none for logs without it)."""
    if data.data_wait is None:
        return []
    overall = data.data_wait.overall
    return [
        [
            "data wait (all workers)",
            f"{overall.wait_seconds:.1f} s, {100.0 * overall.share:.1f}% of "
            f"{overall.unit_seconds:.1f} unit seconds",
        ]
    ]


def _cost(data: ReportData) -> str:
    state = data.state
    busy = sum(data.trial_seconds.values())
    workers = len(data.workers)
    span = state.experiment_seconds
    rows: list[list[Any]] = [
        ["experiment seconds (driver up)", round(span, 1)],
        ["unit seconds (all workers)", round(busy, 1)],
        *_wait_summary(data),
        ["workers seen", workers],
        ["driver sessions", state.sessions],
    ]
    if span > 0 and workers:
        rows.append(["busy share of worker time", f"{100.0 * busy / (span * workers):.1f}%"])
    if data.unit_failures:
        rows.append(
            [
                "units that failed, by reason",
                ", ".join(f"{n} {reason}" for reason, n in sorted(data.unit_failures.items())),
            ]
        )
    summary = state.elastic_summary
    if summary:
        for key in (
            "usd",
            "planned_usd",
            "seconds",
            "planned_seconds",
            "instance_seconds",
            "instances",
            "replans",
            "failed_resizes",
            "deadline",
            "deadline_met",
            "budget",
            "budget_met",
            "stopped",
        ):
            if key in summary:
                rows.append([key.replace("_", " "), summary[key]])
        for which in ("first_plan", "last_plan"):
            if which in summary:
                rows.append([f"{which.replace('_', ' ')} seconds", summary[which]["seconds"]])
                rows.append([f"{which.replace('_', ' ')} usd", summary[which]["usd"]])
        for replan in summary.get("replans") or ():
            rows.append([f"re-plan at {replan.get('elapsed', 0.0):.1f} s", replan.get("reason")])
        for line in summary.get("misses") or ():
            rows.append(["missed", line])
    out = _table(["", "value"], rows)
    table = cost_table(state)
    if table is not None:
        out += f"<pre>{html.escape(table)}</pre>"
    return out


def _wait_cells(row: WaitRow) -> list[Any]:
    return [
        row.units,
        round(row.wait_seconds, 2),
        round(row.unit_seconds, 2),
        f"{100.0 * row.share:.1f}%",
    ]


def _data_wait(data: ReportData) -> str:
    """Data wait per worker and overall, and the trials that waited the largest share."""
    wait = data.data_wait
    if wait is None:
        return ""
    numbers = ["units", "data wait s", "unit s", "share"]
    rows = [[row.name, *_wait_cells(row)] for row in (*wait.workers, wait.overall)]
    out = (
        '<p class="meta">Seconds units waited for their batches (reading, decoding, '
        "augmenting data the training or validation loop had not got yet), of the units' "
        "seconds.</p>" + _table(["worker", *numbers], rows)
    )
    out += f"<p>Top {len(wait.trials)} trials by data wait share:</p>"
    return out + _table(["trial", *numbers], ([r.name, *_wait_cells(r)] for r in wait.trials))


def _figure(figure: Any, div_id: str) -> str:
    """The figure's ``<div>``, drawn in :data:`~cerebro_spark.report._figures.TEMPLATE`."""
    spec = figure.to_plotly_json()
    spec["layout"]["template"] = _template()
    body: str = pio.to_html(
        spec,
        validate=False,  # validated as the figure was built
        full_html=False,
        include_plotlyjs=False,
        div_id=div_id,
        config={"displaylogo": False, "responsive": True},
    )
    return f'<div class="chart">{body}</div>'


@functools.cache
def _template() -> dict[str, Any]:
    """The figures' template as JSON, built once per process."""
    template: dict[str, Any] = pio.templates[TEMPLATE].to_plotly_json()
    return template


@functools.cache
def _plotly_js() -> str:
    """plotly.js (4.6 MB), read from plotly's package once per process."""
    script: str = get_plotlyjs()
    return script


def render(data: ReportData, *, generated: datetime.datetime | None = None) -> str:
    """The whole report page for ``data``.

    Args:
        data: What to show (:func:`~cerebro_spark.report._data.collect`).
        generated: When it was made (shown in the header; default: now, in UTC).
    """
    state = data.state
    generated = generated or datetime.datetime.now(datetime.timezone.utc)
    if state.finished:
        phase = "finished"
    elif state.stopped:
        phase = f"stopped: {state.stopped}"
    else:
        phase = (
            f"running (round {max(state.round, 0) + 1}; this page reloads every "
            f"{LIVE_REFRESH_SECONDS} s)"
        )
    refresh = (
        "" if state.finished else f'<meta http-equiv="refresh" content="{LIVE_REFRESH_SECONDS}">'
    )
    config = data.config
    options = ", ".join(f"{k}={v}" for k, v in sorted(config.procedure_options.items()))
    procedure = f"{config.procedure}({options})" if options else config.procedure
    failed = [t for t in state.trials.values() if t.status == "failed"]
    sections = [
        f"<h1>Experiment {html.escape(data.experiment_id)}</h1>",
        '<p class="meta">'
        + " &middot; ".join(
            html.escape(str(part))
            for part in (
                phase,
                f"procedure {procedure}, {config.epochs} epochs, {data.workers_line}",
                f"{data.metric} ({data.mode})",
                f"{len(state.trials)} trials, {len(failed)} failed",
                f"dataset {state.dataset_id}",
                f"generated {generated.strftime('%Y-%m-%d %H:%M:%S %Z')}",
            )
        )
        + "</p>",
        "<h2>Leaderboard</h2>",
        _leaderboard(data),
    ]
    if data.curves:
        sections += ["<h2>Learning curves</h2>", _figure(learning_curves(data), "curves")]
    if data.units or data.markers:
        sections += ["<h2>Workers over time</h2>", _figure(gantt(data), "gantt")]
    if data.rounds:
        sections += [
            "<h2>Rounds, rungs and brackets</h2>",
            _figure(rungs(data), "rungs"),
            _rounds_table(data),
        ]
    if data.stages:
        sections += [
            "<h2>Plan vs actual</h2>",
            _figure(plan_vs_actual(data), "plan"),
            _stages_table(data),
        ]
    if data.data_wait is not None:
        sections += ["<h2>Data wait</h2>", _data_wait(data)]
    sections += ["<h2>Time and cost</h2>", _cost(data)]
    title = html.escape(f"cerebro-spark report: {data.experiment_id}")
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8">{refresh}<title>{title}</title>'
        f"<style>{_STYLE}</style>"
        f'<script type="text/javascript">{_plotly_js()}</script></head>'
        f"<body>{''.join(sections)}</body></html>\n"
    )
