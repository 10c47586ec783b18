"""An elastic run's bill: predicted against actual seconds and dollars, from its log."""

from __future__ import annotations

from cerebro_spark.driver._state import ExperimentState


def cost_table(state: ExperimentState) -> str | None:
    """Predicted vs actual seconds and dollars per stage and in total (``None``: not elastic).

    Stages are numbered from 1, as ``plan`` numbers them (the log's ``stage`` from 0);
    seconds are experiment time, the clock the deadline counts.
    """
    if not state.stage_actuals:
        return None
    rows = [
        f"{'stage':>5} {'workers':>9} {'seconds':>17} {'err':>7} {'dollars':>21} {'err':>7}",
        f"{'':>5} {'plan/act':>9} {'plan/actual':>17} {'':>7} {'plan/actual':>21} {'':>7}",
    ]
    for index in sorted(state.stage_actuals):
        a = state.stage_actuals[index]
        rows.append(
            f"{index + 1:>5} {a['planned_workers']:>4}/{a['workers']:<4} "
            f"{a['planned_seconds']:>8.1f}/{a['seconds']:<8.1f} "
            f"{_err(a['seconds'], a['planned_seconds']):>7} "
            f"{a['planned_usd']:>10.4f}/{a['usd']:<10.4f} {_err(a['usd'], a['planned_usd']):>7}"
        )
    summary = state.elastic_summary
    if summary is not None:
        rows.append(
            f"{'total':>5} {'':>9} {summary['planned_seconds']:>8.1f}/{summary['seconds']:<8.1f} "
            f"{_err(summary['seconds'], summary['planned_seconds']):>7} "
            f"{summary['planned_usd']:>10.4f}/{summary['usd']:<10.4f} "
            f"{_err(summary['usd'], summary['planned_usd']):>7}"
        )
        if summary.get("stopped"):
            rows.append(f"stopped early: {summary['stopped']}")
    return "\n".join(rows)


def _err(actual: float, planned: float) -> str:
    if planned == 0:
        return "-"
    return f"{100.0 * (actual - planned) / planned:+.1f}%"
