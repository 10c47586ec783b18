"""The ``simulate`` command.

``cerebro-spark simulate --procedures asha,hypersched,seer --deadline 30 --workers 8
--seeds 10 --scaling linear --overhead 0.5`` prints each procedure's best score at the
deadline (mean ± std over the seeds) on the simulated workload. (``plan`` lives in
:mod:`cerebro_spark.elastic`.)

:func:`add_simulate_command` adds one subparser with ``set_defaults(handler=...)``; the
handler writes to stdout and returns the exit code, and raises ``ConfigError`` on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cerebro_spark.errors import ConfigError
from cerebro_spark.simulate._run import (
    SimulationSettings,
    compare_procedures,
    format_table,
    summaries_to_json,
)


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
