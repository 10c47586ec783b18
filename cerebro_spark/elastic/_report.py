"""A plan as a table, for people (``plan --format table``)."""

from __future__ import annotations

from cerebro_spark.elastic._planner import Plan, usd


def format_plan(plan: Plan) -> str:
    """Return the plan: a row per stage, the totals, the cheapest static plan beside them."""
    budget = "none" if plan.budget is None else f"${plan.budget:.2f}"
    kind = "elastic" if plan.spec.elastic else "one allocation (asynchronous procedure)"
    lines = [
        f"plan for {plan.spec.procedure} on {plan.instance_type}: deadline {plan.deadline:g} s, "
        f"budget {budget}, {kind}",
        "",
        "| stage | trials | epochs | workers | group | instances | type | start s | end s | usd |",
        "|--:|--:|--:|--:|--:|--:|:--|--:|--:|--:|",
    ]
    for i, stage in enumerate(plan.outcome.stages):
        lines.append(
            f"| {i + 1} | {stage.trials} | {stage.epochs} | {stage.workers} | "
            f"{max(stage.groups)} | {stage.instances} | {plan.instance_type} | "
            f"{stage.start:.1f} | {stage.end:.1f} | {usd(stage.usd)} |"
        )
    outcome, static = plan.outcome, plan.static
    lines += [
        "",
        f"total: {outcome.seconds:.1f} s, {usd(outcome.usd)} (compute "
        f"{usd(outcome.compute_usd)}, data {usd(outcome.data_usd)}, {outcome.loads} partition "
        "loads)",
        f"cheapest static plan: {static.workers[0]} worker(s), {static.seconds:.1f} s, "
        f"{usd(static.usd)}; the plan saves {plan.saving:.0%}",
    ]
    if plan.pack_size > 1:
        lines.append(f"trials trained in packs of up to {plan.pack_size} (the profile's packing)")
    if plan.running:
        lines.append(f"re-planned with {plan.running} worker(s) already running at 0 s")
    if plan.price is not None:
        price = plan.price
        effective = f", effective {price.effective}" if price.effective else ""
        source = f" ({price.source})" if price.source else ""
        lines.append(f"price: {price.instance_type} ${price.usd_per_hour:g}/h{effective}{source}")
    if len(plan.candidates) > 1:
        options = ", ".join(
            f"{t} " + ("infeasible" if v is None else f"{usd(v[1])} in {v[0]:.0f} s")
            for t, v in sorted(plan.candidates.items())
        )
        lines.append(f"instance types: {options}")
    return "\n".join(lines)
