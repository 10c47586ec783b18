"""The leaderboard: one row per trial, best first."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable

from cerebro_spark.engine._state import TrialState

LEADERBOARD_NAME = "leaderboard.csv"


def rank(trials: Iterable[TrialState], metric: str, mode: str) -> list[TrialState]:
    """Return trials best first by their latest ``metric``; trials without it come last."""

    def key(trial: TrialState) -> tuple[int, float, str]:
        value = trial.metrics.get(metric)
        if value is None or math.isnan(value):
            return (1, 0.0, trial.trial_id)
        return (0, -value if mode == "max" else value, trial.trial_id)

    return sorted(trials, key=key)


def leaderboard_csv(trials: Iterable[TrialState], metric: str, mode: str) -> str:
    """Render ``leaderboard.csv``: ``trial_id,status,epochs,<metric>,params``.

    Metric values are written with ``repr`` (shortest exact round trip), params as JSON
    with sorted keys, so equal runs give byte-identical files.
    """
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["trial_id", "status", "epochs", metric, "params"])
    for trial in rank(trials, metric, mode):
        value = trial.metrics.get(metric)
        writer.writerow(
            [
                trial.trial_id,
                trial.status,
                trial.epochs,
                "" if value is None else repr(float(value)),
                json.dumps(trial.params, sort_keys=True),
            ]
        )
    return out.getvalue()


def format_table(trials: Iterable[TrialState], metric: str, mode: str, limit: int = 20) -> str:
    """Render the leaderboard as an aligned text table for terminals."""
    ranked = rank(trials, metric, mode)
    rows = [["#", "trial", "status", "epochs", metric, "model", "params"]]
    for position, trial in enumerate(ranked[:limit], start=1):
        value = trial.metrics.get(metric)
        params = json.dumps({k: v for k, v in trial.params.items() if k != "model"}, sort_keys=True)
        rows.append(
            [
                str(position),
                trial.trial_id,
                trial.status,
                str(trial.epochs),
                "-" if value is None else f"{value:.4f}",
                trial.spec.rsplit(":", 1)[-1].rsplit(".", 1)[-1],
                params if len(params) <= 80 else params[:77] + "...",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = [
        "  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]])
        for row in rows
    ]
    if len(ranked) > limit:
        lines.append(f"... {len(ranked) - limit} more in leaderboard.csv")
    return "\n".join(lines)
