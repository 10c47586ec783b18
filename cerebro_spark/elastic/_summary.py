"""An elastic run's honest totals: actual against the first plan and the last re-plan.

A run is planned once before it starts (the *first* plan) and may be re-planned at stage
boundaries or when early measurements contradict the profile (the *last* plan is the one
in force at the end). Comparing the actual total with the last re-plan only hides how far
the run strayed from what the user was promised: a re-plan made late in a run predicts
little more than what has already happened. :func:`summarize` therefore reports both, and
says whether the deadline and the budget were met; when one is missed, :func:`miss_lines`
says by how much and why: the stage that ran over its plan the most, and which of its
parts did (:data:`PARTS`).

Each stage's parts are what the event log records for it (``stage_actual.parts``, beside
``planned_parts`` of the plan it ran under and ``first_parts`` of the first plan): its
lead (``start-up`` for the session's first stage: from ``run`` to its first round;
``resizing`` for later ones: the resize at its start), and its units' seconds from their
``unit_end`` events (``units``: train compute, ``hops``: checkpoint I/O around train units,
``validation``: validation units), each divided by the stage's workers (wall seconds if
the workers were evenly busy); ``waiting`` is the rest (idle workers, the driver). The
planned parts (:func:`planned_parts`) split the stage's planned training seconds in the
proportions of :func:`~._profile.trial_epoch`'s terms.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cerebro_spark.elastic._profile import TypeProfile

PARTS = ("start-up", "resizing", "units", "hops", "validation", "waiting")
"""The parts of a stage's seconds, in the order they are shown."""

_SHOWN_OVER = 0.05
"""A part is named as running over when it exceeds its plan by this share of the stage's
planned seconds (smaller overruns are noise)."""


def planned_parts(
    typed: TypeProfile, lead_seconds: float, train_seconds: float, *, first: bool
) -> dict[str, float]:
    """The planned seconds of a stage's parts (module docstring).

    Args:
        typed: The profile the stage was planned with.
        lead_seconds: Planned seconds before its training starts (scale, worker start,
            partition loads; re-homing).
        train_seconds: Planned seconds of its training.
        first: Whether it is the session's first stage (its lead is its ``start-up``).
    """
    partitions = typed.partitions
    terms = {
        "units": partitions * typed.unit.mean,
        "hops": partitions * typed.hop.mean,
        "validation": typed.validation.mean,
    }
    total = sum(terms.values())
    parts = {"start-up" if first else "resizing": max(0.0, lead_seconds)}
    for name, term in terms.items():
        parts[name] = train_seconds * term / total if total > 0 else 0.0
    return parts


def summarize(
    *,
    deadline: float,
    seconds: float,
    budget: float | None,
    usd: float,
    first_plan: tuple[float, float],
    last_plan: tuple[float, float],
    replans: Sequence[Mapping[str, Any]],
    stages: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """The ``elastic_summary`` fields that judge a run against its plans.

    Args:
        deadline: Seconds from ``run`` to the end the config asked for.
        seconds: Seconds the run took (experiment time).
        budget: Most dollars (``None``: no limit).
        usd: Dollars it cost.
        first_plan: ``(seconds, dollars)`` of the plan made before the run.
        last_plan: ``(seconds, dollars)`` of the plan in force at the end.
        replans: Each re-plan (``replanned`` fields: ``stage``, ``reason`` ...).
        stages: The ``stage_actual`` events, in stage order.

    Returns:
        ``deadline_met``, ``budget_met``, ``first_plan``, ``last_plan``, ``replans`` and
        ``misses`` (a line per missed deadline or budget, :func:`miss_lines`).
    """
    deadline_met = seconds <= deadline + 1e-9
    budget_met = budget is None or usd <= budget + 1e-9
    fields: dict[str, Any] = {
        "deadline_met": deadline_met,
        "budget_met": budget_met,
        "first_plan": {"seconds": round(first_plan[0], 3), "usd": round(first_plan[1], 6)},
        "last_plan": {"seconds": round(last_plan[0], 3), "usd": round(last_plan[1], 6)},
        "replans": [dict(r) for r in replans],
    }
    fields["misses"] = miss_lines(
        deadline=deadline,
        seconds=seconds,
        budget=budget,
        usd=usd,
        first_plan=first_plan,
        stages=stages,
    )
    return fields


def miss_lines(
    *,
    deadline: float,
    seconds: float,
    budget: float | None,
    usd: float,
    first_plan: tuple[float, float],
    stages: Sequence[Mapping[str, Any]],
) -> list[str]:
    """A line per missed deadline or budget: by how much, and why (module docstring)."""
    lines = []
    why = overrun(stages)
    if seconds > deadline + 1e-9:
        lines.append(
            f"deadline missed: {seconds:.1f} s against a deadline of {deadline:g} s "
            f"({seconds - deadline:.1f} s over; the first plan said {first_plan[0]:.1f} s, "
            f"{_share(seconds, first_plan[0])})" + (f"; {why}" if why else "")
        )
    if budget is not None and usd > budget + 1e-9:
        lines.append(
            f"budget missed: ${usd:.4f} against a budget of ${budget:.4f} "
            f"(${usd - budget:.4f} over; the first plan said ${first_plan[1]:.4f}, "
            f"{_share(usd, first_plan[1])})" + (f"; {why}" if why else "")
        )
    return lines


def overrun(stages: Sequence[Mapping[str, Any]]) -> str:
    """Which stage ran over its first plan the most, and which of its parts did.

    Against the first plan (``first_seconds``, ``first_parts``): a re-plan that absorbed
    an overrun would hide it. A ``stage_actual`` without them (a log of an older version)
    is compared with the plan it ran under. ``""``: no stage ran over.
    """

    def planned_of(stage: Mapping[str, Any]) -> float:
        return float(stage.get("first_seconds", stage["planned_seconds"]))

    worst = max(stages, key=lambda s: float(s["seconds"]) - planned_of(s), default=None)
    if worst is None or float(worst["seconds"]) <= planned_of(worst):
        return ""
    seconds, planned = float(worst["seconds"]), planned_of(worst)
    which = "the first plan" if "first_seconds" in worst else "its plan"
    line = (
        f"stage {int(worst['stage']) + 1} ran {seconds - planned:.1f} s over {which} "
        f"({seconds:.1f} s against {planned:.1f} s)"
    )
    parts: Mapping[str, float] = worst.get("parts") or {}
    plan_parts: Mapping[str, float] = worst.get("first_parts") or worst.get("planned_parts") or {}
    if not parts:  # a log written before stages recorded their parts
        return line
    over = sorted(
        (
            (float(parts.get(p, 0.0)) - float(plan_parts.get(p, 0.0)), p)
            for p in PARTS
            if p in parts or p in plan_parts
        ),
        reverse=True,
    )
    named = [
        f"{p} {float(parts.get(p, 0.0)):.1f} s against {float(plan_parts.get(p, 0.0)):.1f} s"
        for extra, p in over
        if extra > _SHOWN_OVER * max(planned, 1e-9)
    ]
    if named:
        line += ", most in " + "; then ".join(named[:2])
    return line


def _share(actual: float, planned: float) -> str:
    if planned <= 0:
        return "no plan to compare"
    return f"{100.0 * (actual - planned) / planned:+.1f} %"
