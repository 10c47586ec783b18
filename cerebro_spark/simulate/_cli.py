"""The ``simulate`` and ``plan`` commands (wired into ``cerebro_spark.cli`` by the lead).

``cerebro-spark simulate --procedures asha,hypersched,seer --deadline 30 --workers 8
--seeds 10 --scaling linear --overhead 0.5`` prints each procedure's best score at the
deadline (mean ± std over the seeds) on the simulated workload.

``cerebro-spark plan --procedure seer --deadline 10 --budget 80`` prints SEER's plan
(``K``, ``t1``, ``N``, ``P`` and every stage's trials and resources, SEER Alg. 2-3).

Each ``add_*_command`` adds one subparser with ``set_defaults(handler=...)``; a handler
writes to stdout and returns the exit code, and raises ``ConfigError`` on bad input.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from cerebro_spark.errors import ConfigError
from cerebro_spark.search._seer import SeerPlan, seer_plan
from cerebro_spark.simulate._run import (
    SimulationSettings,
    compare_procedures,
    format_table,
    summaries_to_json,
)

PLANNED_PROCEDURES = ("seer",)
"""Procedures the ``plan`` command can plan."""


def _write(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def add_simulate_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``simulate`` command to ``subparsers`` and return its parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "simulate",
        help="compare search procedures on a simulated workload in virtual time",
        description=(
            "Run search procedures on HyperSched's parametric score model (HyperSched §6) "
            "on Cerebro's round template with a virtual clock; print each procedure's best "
            "score at the deadline, mean ± std over seeds."
        ),
    )
    parser.add_argument(
        "--procedures",
        default="asha,hypersched,seer",
        help="comma-separated registered procedures (default: asha,hypersched,seer)",
    )
    parser.add_argument("--deadline", type=float, required=True, help="seconds of virtual time")
    parser.add_argument("--workers", type=int, default=8, help="cluster size N (default 8)")
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0..K-1 (default 10)")
    parser.add_argument("--scaling", choices=("linear", "sqrt", "none"), default="linear")
    parser.add_argument(
        "--overhead", type=float, default=0.0, help="start-up / resize seconds (default 0)"
    )
    parser.add_argument("--epochs", type=int, default=50, help="epochs per trial R (default 50)")
    parser.add_argument(
        "--epoch-seconds", type=float, default=1.0, help="one epoch on one worker (default 1)"
    )
    parser.add_argument(
        "--steps-per-epoch", type=int, default=10, help="score-model steps per epoch"
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="PROC.KEY=VALUE",
        help="a procedure option, VALUE parsed as JSON, e.g. hypersched.cooldown=2",
    )
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.set_defaults(handler=_cmd_simulate)
    return parser


def parse_options(items: list[str], procedures: list[str]) -> dict[str, dict[str, Any]]:
    """Parse ``PROC.KEY=VALUE`` items (VALUE as JSON, else a string) by procedure.

    Raises:
        ConfigError: An item is malformed or names a procedure not being simulated.
    """
    options: dict[str, dict[str, Any]] = {}
    for item in items:
        target, sep, raw = item.partition("=")
        name, dot, key = target.partition(".")
        if not sep or not dot or not name or not key:
            raise ConfigError(f"--option must look like PROC.KEY=VALUE, got {item!r}")
        if name not in procedures:
            raise ConfigError(
                f"--option {item!r} names procedure {name!r}, which is not among "
                f"--procedures {','.join(procedures)}"
            )
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        options.setdefault(name, {})[key] = value
    return options


def _cmd_simulate(args: argparse.Namespace) -> int:
    procedures = [p.strip() for p in str(args.procedures).split(",") if p.strip()]
    if not procedures:
        raise ConfigError(f"--procedures must name at least one procedure, got {args.procedures!r}")
    if args.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {args.seeds}")
    settings = SimulationSettings(
        deadline=args.deadline,
        num_workers=args.workers,
        scaling=args.scaling,
        overhead=args.overhead,
        epochs=args.epochs,
        epoch_seconds=args.epoch_seconds,
        steps_per_epoch=args.steps_per_epoch,
    )
    options = parse_options(list(args.option), procedures)
    summaries = compare_procedures(procedures, settings, seeds=args.seeds, options=options)
    if args.format == "json":
        _write(summaries_to_json(summaries, settings))
    else:
        _write(format_table(summaries, settings))
    return 0


def add_plan_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``plan`` command to ``subparsers`` and return its parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "plan",
        help="show a procedure's plan for a deadline and budget before running it",
        description=(
            "Print SEER's plan (SEER Alg. 2-3): number of stages K, first stage time t1, "
            "trials N and resources P per bracket, and each stage's trials and resources. "
            "Time is in any unit; the budget is in resources times that unit."
        ),
    )
    parser.add_argument("--procedure", choices=PLANNED_PROCEDURES, default="seer")
    parser.add_argument("--deadline", type=float, required=True, help="deadline T")
    parser.add_argument("--budget", type=float, required=True, help="budget B (resource-time)")
    parser.add_argument("--eta", type=float, default=2.0, help="elimination factor (default 2)")
    parser.add_argument("--v", type=float, default=2.0, help="parallelism growth (default 2)")
    parser.add_argument("--p-min", type=int, default=1, help="fewest resources per trial")
    parser.add_argument("--p-max", type=int, default=None, help="most resources per trial")
    parser.add_argument("--t-min", type=float, default=1.0, help="shortest first stage")
    parser.add_argument(
        "--epoch-seconds",
        type=float,
        default=None,
        help="time of one epoch on one resource (adds epochs per stage and bracket)",
    )
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.set_defaults(handler=_cmd_plan)
    return parser


def _cmd_plan(args: argparse.Namespace) -> int:
    if args.procedure not in PLANNED_PROCEDURES:
        raise ConfigError(
            f"plan supports {', '.join(PLANNED_PROCEDURES)}, got procedure {args.procedure!r}"
        )
    plan = seer_plan(
        args.deadline,
        args.budget,
        eta=args.eta,
        v=args.v,
        p_min=args.p_min,
        p_max=args.p_max,
        t_min=args.t_min,
        epoch_seconds=args.epoch_seconds,
    )
    if args.format == "json":
        _write(json.dumps(plan.to_dict(), indent=2))
    else:
        _write(format_plan(plan))
    return 0


def format_plan(plan: SeerPlan) -> str:
    """Return a SEER plan as text: the parameters, the brackets and a table of stages."""
    p_max = "inf" if plan.p_max is None else str(plan.p_max)
    lines = [
        f"SEER plan for deadline T={plan.deadline:g}, budget B={plan.budget:g} "
        f"(eta={plan.eta:g}, v={plan.v:g}, p_min={plan.p_min}, p_max={p_max}, "
        f"t_min={plan.t_min:g})",
        f"R* = {plan.R_star:.4g}   K = {plan.K}   t1 = {plan.t1:.4g}   B0 = {plan.B0:.4g}   "
        f"q* = {plan.q_star}",
        f"brackets: N = {list(plan.N)}   P = {list(plan.P)}   "
        f"B = [{', '.join(f'{b:.4g}' for b in plan.B)}]",
    ]
    for p, b in plan.dropped:
        lines.append(f"dropped bracket: P = {p}, B = {b:.4g} (too small for one trial)")
    with_epochs = any(stage.epochs for stage in plan.stages)
    header = "| stage | start | end | trials x resources | workers | cost |"
    rule = "|--:|--:|--:|:--|--:|--:|"
    if with_epochs:
        header = header.replace(" workers |", " epochs per trial | workers |")
        rule = rule.replace(":--|--:|--:|", ":--|:--|--:|--:|")
    lines += ["", header, rule]
    for stage in plan.stages:
        brackets = ", ".join(
            f"{n} x {p}" for n, p in zip(stage.trials, stage.resources, strict=True)
        )
        epochs = f" {', '.join(map(str, stage.epochs))} |" if with_epochs else ""
        lines.append(
            f"| {stage.stage} | {stage.start:.4g} | {stage.end:.4g} | {brackets} |{epochs} "
            f"{stage.workers} | {stage.cost:.4g} |"
        )
    lines += [
        "",
        f"{plan.total_trials} trials; time {plan.time:.4g} of {plan.deadline:g}; cost "
        f"{plan.cost:.4g} of {plan.budget:g}"
        + ("" if math.isclose(plan.cost, plan.budget) else " (the rest stays unspent)"),
    ]
    return "\n".join(lines)
