"""The leaderboard: one row per trial, best first.

Trials are ranked by their **best** epoch (:func:`~cerebro_spark.driver._state.epoch_key`:
the metric, then the lower loss), then by trial id. Trials that did not fail and reported
a finite value of the metric come first; then those that did not (yet); failed trials come
last, with their error. A row shows the best and the last value of the metric, the epoch
of the best, the other metrics of that epoch and the checkpoint trained through it.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cerebro_spark.driver._state import FAILED, LOSS, TrialState, epoch_key

LEADERBOARD_NAME = "leaderboard.csv"
_TABLE_METRICS = 3
"""Other metrics the terminal table shows beside the experiment's (the loss first)."""
_TABLE_TEXT = 80
"""Characters of params or error the terminal table shows."""


def rank_key(trial: TrialState, metric: str, mode: str) -> tuple[int, float, float, str]:
    """A trial's place in :func:`rank`: smaller is better, unique (ends with its id)."""
    best = epoch_key(trial.best_metrics, metric, mode)
    group = 2 if trial.status == FAILED else 0 if best is not None else 1
    value, loss = best if best is not None else (math.inf, math.inf)
    return (group, value, loss, trial.trial_id)


def rank(trials: Iterable[TrialState], metric: str, mode: str) -> list[TrialState]:
    """Return trials best first by their best epoch's ``metric`` (see the module docstring)."""
    return sorted(trials, key=lambda trial: rank_key(trial, metric, mode))


def best_trial(ranked: Sequence[TrialState]) -> TrialState | None:
    """The first of ``ranked`` (see :func:`rank`) that did not fail and has a best epoch."""
    return next((t for t in ranked if t.status != FAILED and t.best_epoch is not None), None)


def _head(metric: str) -> list[str]:
    return ["trial_id", "status", "epochs", "best_epoch", metric, f"last_{metric}"]


_TAIL = ["best_checkpoint", "params", "error"]


def _metric_columns(trials: Iterable[TrialState], metric: str) -> dict[str, str]:
    """The other metrics at the best epoch, sorted by name, to their column names."""
    fixed = {*_head(metric), *_TAIL}
    names = sorted({name for t in trials for name in t.best_metrics if name != metric})
    return {name: f"metric_{name}" if name in fixed else name for name in names}


def _checkpoint_path(key: str | None) -> str | None:
    """A checkpoint's path inside the experiment directory (``checkpoints/<trial>/...``)."""
    if key is None:
        return None
    marker = "/checkpoints/"
    return "checkpoints/" + key.rsplit(marker, 1)[1] if marker in key else key


def leaderboard_rows(trials: Iterable[TrialState], metric: str, mode: str) -> list[dict[str, Any]]:
    """Return the leaderboard as one dict per trial, best first.

    Keys, in column order: ``trial_id``, ``status``, ``epochs``, ``best_epoch``,
    ``<metric>`` (its value at the best epoch), ``last_<metric>`` (after the latest
    epoch), every other metric at the best epoch (sorted by name; one named like a fixed
    column is ``metric_<name>``), ``best_checkpoint`` (its path in the experiment
    directory), ``params`` (a dict) and ``error`` (why the trial failed). Missing values
    are ``None``.
    """
    ranked = rank(trials, metric, mode)
    others = _metric_columns(ranked, metric)
    rows = []
    for trial in ranked:
        row: dict[str, Any] = {
            "trial_id": trial.trial_id,
            "status": trial.status,
            "epochs": trial.epochs,
            "best_epoch": trial.best_epoch,
            metric: trial.best_metrics.get(metric),
            f"last_{metric}": trial.metrics.get(metric),
        }
        for name, column in others.items():
            row[column] = trial.best_metrics.get(name)
        row["best_checkpoint"] = _checkpoint_path(trial.best_checkpoint)
        row["params"] = dict(trial.params)
        row["error"] = trial.error
        rows.append(row)
    return rows


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


def leaderboard_csv(trials: Iterable[TrialState], metric: str, mode: str) -> str:
    """Render ``leaderboard.csv``: the columns of :func:`leaderboard_rows`.

    Metric values are written with ``repr`` (shortest exact round trip), params as JSON
    with sorted keys, missing values as empty cells, so equal runs give byte-identical
    files.
    """
    trials = list(trials)
    header = [*_head(metric), *_metric_columns(trials, metric).values(), *_TAIL]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    for row in leaderboard_rows(trials, metric, mode):
        writer.writerow([_csv_cell(row[column]) for column in header])
    return out.getvalue()


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _clip(text: str) -> str:
    return text if len(text) <= _TABLE_TEXT else text[: _TABLE_TEXT - 3] + "..."


def format_table(
    trials: Iterable[TrialState],
    metric: str,
    mode: str,
    limit: int = 20,
    *,
    seconds: Mapping[str, float] | None = None,
    usd: Mapping[str, float] | None = None,
) -> str:
    """Render the leaderboard as an aligned text table for terminals.

    Columns: rank, trial, status, epochs, the best epoch, the metric at it and after the
    latest epoch (``last <metric>``), the loss and up to two other metrics at the best
    epoch (by name, per-class ones last), the trial's unit seconds and dollars (when
    given, by trial id), the model family, and the params -- or, for a failed trial, its
    error.
    """
    ranked = rank(trials, metric, mode)
    # a trial-wide metric (f1_macro) says more in one column than one class's (f1_class_0)
    names = sorted(
        {n for t in ranked for n in t.best_metrics if n not in (metric, LOSS)},
        key=lambda n: ("_class_" in n, n),
    )
    if any(LOSS in t.best_metrics for t in ranked) and metric != LOSS:
        names.insert(0, LOSS)
    names = names[:_TABLE_METRICS]
    head = ["#", "trial", "status", "epochs", "best epoch", metric, f"last {metric}"]
    timing = [*(["seconds"] if seconds is not None else []), *(["dollars"] if usd else [])]
    rows = [[*head, *names, *timing, "model"]]
    texts = ["params / error"]
    for position, trial in enumerate(ranked[:limit], start=1):
        rows.append(
            [
                str(position),
                trial.trial_id,
                trial.status,
                str(trial.epochs),
                "-" if trial.best_epoch is None else str(trial.best_epoch),
                _number(trial.best_metrics.get(metric)),
                _number(trial.metrics.get(metric)),
                *(_number(trial.best_metrics.get(name)) for name in names),
                *([f"{seconds.get(trial.trial_id, 0.0):.1f}"] if seconds is not None else []),
                *([f"{usd.get(trial.trial_id, 0.0):.4f}"] if usd else []),
                trial.spec.rsplit(":", 1)[-1].rsplit(".", 1)[-1],
            ]
        )
        if trial.error is not None:
            texts.append(_clip(f"error: {' '.join(trial.error.split())}"))
        else:
            params = {k: v for k, v in trial.params.items() if k != "model"}
            texts.append(_clip(json.dumps(params, sort_keys=True)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=True)), text]).rstrip()
        for row, text in zip(rows, texts, strict=True)
    ]
    if len(ranked) > limit:
        lines.append(f"... {len(ranked) - limit} more in leaderboard.csv")
    return "\n".join(lines)
