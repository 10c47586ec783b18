"""Summaries for terminals and logs: the end-of-run summary and the leaderboard formats.

``cerebro-spark leaderboard --metric NAME`` judges trials by any metric they report: each
trial's best epoch is then the one with the best value of that metric (ties: the lower
loss, then the earlier epoch), and its checkpoint is named only where the run kept it (the
trial's best epoch by the experiment's own metric, or its latest).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from cerebro_spark.driver import ExperimentConfig, TrialState, format_table, leaderboard_rows
from cerebro_spark.driver._state import FAILED, improves
from cerebro_spark.errors import ConfigError
from cerebro_spark.metrics import default_metrics, did_you_mean, metric_modes
from cerebro_spark.report._data import DataWait, ReportData

TOP_TRIALS = 10
"""Trials the end-of-run summary lists."""

_MAX_PATTERNS = (r"^top\d+_accuracy$", r"^(precision|recall|f1)_")
"""Names of built-in metrics with a larger-is-better mode beyond the fixed names."""


def metric_mode(metric: str, config: ExperimentConfig) -> str:
    """The mode (``max`` / ``min``) of ``metric``: the experiment's, or a built-in's.

    Raises:
        ConfigError: ``metric`` is neither the experiment's nor a built-in metric (pass
            the mode explicitly).
    """
    if config.metric == metric and config.mode is not None:
        return config.mode
    known = metric_modes(default_metrics("regression", None) + default_metrics("classification", 2))
    if metric in known:
        return known[metric]
    if any(re.match(pattern, metric) for pattern in _MAX_PATTERNS):
        return "max"
    raise ConfigError(
        f"metric {metric!r} is not a built-in metric, so its mode is unknown: pass --mode "
        "max or --mode min"
    )


def metric_names(trials: Iterable[TrialState]) -> list[str]:
    """Every metric any trial reported, sorted."""
    return sorted({name for t in trials for epoch in t.history for name in epoch})


def check_metric(trials: Iterable[TrialState], metric: str) -> None:
    """Refuse a metric that no trial reported (while some reported any).

    Raises:
        ConfigError: No trial reported ``metric`` (the message lists those reported).
    """
    reported = metric_names(trials)
    if reported and metric not in reported:
        raise ConfigError(
            f"no trial reported metric {metric!r}{did_you_mean(metric, reported)}; the "
            f"trials report {reported}"
        )


def rejudge(trials: Iterable[TrialState], metric: str, mode: str) -> list[TrialState]:
    """Copies of ``trials`` whose best epoch is judged by ``metric`` and ``mode``.

    Raises:
        ConfigError: No trial reported ``metric`` (the message lists those reported).
    """
    trials = list(trials)
    check_metric(trials, metric)
    judged = []
    for trial in trials:
        best: int | None = None
        for epoch, metrics in enumerate(trial.history, 1):
            if improves(metrics, None if best is None else trial.history[best - 1], metric, mode):
                best = epoch
        if best is None:
            checkpoint, sha = None, None
        elif best == trial.best_epoch:
            checkpoint, sha = trial.best_checkpoint, trial.best_checkpoint_sha256
        elif best == trial.epochs:
            checkpoint, sha = trial.checkpoint, trial.checkpoint_sha256
        else:
            checkpoint, sha = None, None  # the run did not keep it
        judged.append(
            dataclasses.replace(
                trial,
                best_epoch=best,
                best_metrics={} if best is None else trial.history[best - 1],
                best_checkpoint=checkpoint,
                best_checkpoint_sha256=sha,
            )
        )
    return judged


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def leaderboard_json(
    trials: Iterable[TrialState],
    metric: str,
    mode: str,
    seconds: Mapping[str, float],
    usd: Mapping[str, float] | None = None,
) -> str:
    """The leaderboard as JSON: ``{"metric", "mode", "trials": [row, ...]}``.

    Rows are :func:`~cerebro_spark.driver.leaderboard_rows` plus ``rank``, ``seconds``
    (the trial's unit seconds) and, for a billed run, ``usd`` (its share of the bill).
    Non-finite metrics are ``null``.
    """
    rows = []
    for position, row in enumerate(leaderboard_rows(trials, metric, mode), 1):
        trial = row["trial_id"]
        out = {"rank": position, **{k: _json_value(v) for k, v in row.items()}}
        out["seconds"] = round(seconds.get(trial, 0.0), 3)
        if usd is not None:
            out["usd"] = round(usd.get(trial, 0.0), 6)
        rows.append(out)
    return json.dumps({"metric": metric, "mode": mode, "trials": rows}, indent=2) + "\n"


def failures_text(trials: Iterable[TrialState], unit_failures: Mapping[str, int]) -> str:
    """The failed trials with their errors, and how many units failed for which reason.

    A unit fails when its trial's code raises (``trial_error``) or, to be run again, when
    its worker is lost, its group breaks or the store fails (``worker_lost``,
    ``group_broken``, ``io_error``).
    """
    failed = sorted((t for t in trials if t.status == FAILED), key=lambda t: t.trial_id)
    lines = []
    if failed:
        lines.append(f"{len(failed)} trial{'s' if len(failed) > 1 else ''} failed:")
        for trial in failed:
            error = (trial.error or "no error recorded").strip().splitlines()
            lines.append(f"  {trial.trial_id}: {error[-1] if error else ''}")
            lines += [f"      {line}" for line in error[:-1][-6:]]
    if unit_failures:
        retried = ", ".join(f"{n} {reason}" for reason, n in sorted(unit_failures.items()))
        lines.append(f"units that failed, by reason: {retried}")
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{rest:02d}s" if hours else f"{minutes}m{rest:02d}s"


def data_wait_text(wait: DataWait | None) -> str:
    """How long units waited for batches: overall, per worker, the worst trials.

    Empty for logs whose units do not say (written before ``data_wait_seconds``).
    """
    if wait is None:
        return ""
    overall = wait.overall
    workers = ", ".join(f"{row.name} {100.0 * row.share:.1f}%" for row in wait.workers)
    trials = ", ".join(
        f"{row.name} {100.0 * row.share:.1f}% ({row.wait_seconds:.1f} s)" for row in wait.trials
    )
    return "\n".join(
        [
            f"data wait: {overall.wait_seconds:.1f} s of {overall.unit_seconds:.1f} "
            f"unit-seconds ({100.0 * overall.share:.1f}%); by worker: {workers}",
            f"  most waiting trials: {trials}",
        ]
    )


def summary_text(data: ReportData, top: int = TOP_TRIALS) -> str:
    """The end-of-run summary: the top trials, the failures, the time and the data wait.

    Each listed trial shows its best and last metric, its unit seconds and, for a billed
    run, its share of the bill (the run's whole bill is
    :func:`~cerebro_spark.driver.cost_table`). The data wait
    (:func:`data_wait_text`) follows the time, for logs whose units say.
    """
    state = data.state
    trials = list(state.trials.values())
    lines = [
        f"top {min(top, len(trials))} of {len(trials)} trials by {data.metric} ({data.mode}):",
        format_table(
            trials, data.metric, data.mode, limit=top, seconds=data.trial_seconds,
            usd=data.trial_usd,
        ),
    ]  # fmt: skip
    failures = failures_text(trials, data.unit_failures)
    if failures:
        lines.append(failures)
    total = sum(data.trial_seconds.values())
    line = (
        f"time: {_duration(state.experiment_seconds)} of driver time, "
        f"{total:.0f} unit-seconds on {len(data.workers)} workers"
    )
    lines.append(line)  # the bill of an elastic run: cost_table, after this
    wait = data_wait_text(data.data_wait)
    if wait:
        lines.append(wait)
    return "\n".join(lines)
