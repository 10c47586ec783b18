"""An elastic run's bill: predicted against actual seconds and dollars, from its log."""

from __future__ import annotations

from typing import Any

from cerebro_spark.driver._state import ExperimentState


def cost_table(state: ExperimentState) -> str | None:
    """Predicted vs actual seconds and dollars per stage and in total (``None``: not elastic).

    Stages are numbered from 1, as ``plan`` numbers them (the log's ``stage`` from 0);
    seconds are experiment time, the clock the deadline counts. Each stage row compares
    with the plan in force when it ran; the totals compare with the *first* plan (made
    before the run: what the user was promised) and with the *last* (in force at the end),
    then each missed deadline or budget is said, with by how much and why
    (``elastic_summary.misses``). A log written before first and last plans has one total
    row, against the last.
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
        first, last = summary.get("first_plan"), summary.get("last_plan")
        if first is None or last is None:  # a log written before first and last plans
            rows.append(_total("total", "", summary["planned_seconds"], summary["planned_usd"],
                               summary))  # fmt: skip
        else:
            rows.append(_total("total", "first", first["seconds"], first["usd"], summary))
            rows.append(_total("total", "last", last["seconds"], last["usd"], summary))
            replans = len(summary.get("replans") or ())
            rows.append(
                "first: the plan made before the run; last: the plan in force at the end "
                f"({replans} re-plan{'' if replans == 1 else 's'})"
            )
        rows += [str(line) for line in summary.get("misses") or ()]
        if summary.get("stopped"):
            rows.append(f"stopped early: {summary['stopped']}")
    return "\n".join(rows)


def _total(label: str, plan: str, seconds: float, usd: float, summary: dict[str, Any]) -> str:
    """A total row: the run's seconds and dollars against a plan's."""
    return (
        f"{label:>5} {plan:>9} {seconds:>8.1f}/{summary['seconds']:<8.1f} "
        f"{_err(summary['seconds'], seconds):>7} "
        f"{usd:>10.4f}/{summary['usd']:<10.4f} {_err(summary['usd'], usd):>7}"
    )


def _err(actual: float, planned: float) -> str:
    if planned == 0:
        return "-"
    return f"{100.0 * (actual - planned) / planned:+.1f}%"
