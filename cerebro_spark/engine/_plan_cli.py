"""The ``plan`` and ``profile`` commands.

``cerebro-spark plan CONFIG.yaml --profile P --prices C --deadline S [--budget USD]
[--instance-type T]`` plans exactly what ``run CONFIG.yaml`` will do (the procedure is
built by the same code, :func:`cerebro_spark.engine.experiment_spec`). Without a config,
``--procedure sha|hyperband|seer`` with ``--trials``, ``--eta``, ``--max-epochs``,
``--min-epochs`` and ``--option KEY=VALUE`` (any other option of the procedure) describes
the search; ``--workers`` is SEER's ``num_workers`` (with a config: the config's
``workers``). Without ``--profile`` the command prints the search's stages only, nothing
priced. ``--deadline`` defaults to the config's one deadline (its top-level ``deadline``,
the one ``run``, the procedure and the elastic controller read); a procedure that stops
at a deadline (SEER, HyperSched, ASHA with a deadline) is planned for it, and another
``--deadline`` is refused. Flags win over the config's ``elastic:`` section; with
``--prices`` naming another catalog, the planner chooses among that catalog's types (the
config's ``instance_type`` is not applied, with a warning) unless ``--instance-type`` is
given. An infeasible
deadline or budget exits with status 2 and the numbers (with ``--format json``, also as
``{"feasible": false, "fastest": ..., "cheapest": ..., "message": ...}``).

``cerebro-spark profile CONFIG.yaml --instance-type T --out P`` runs a short pilot on the
config's data and models and writes a profile (:mod:`._pilot`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import Any

from cerebro_spark.driver import experiment_spec, load_config
from cerebro_spark.elastic import (
    PlanInfeasible,
    format_plan,
    load_catalog,
    load_profile,
    plan,
    plan_deadline,
    procedure_spec,
)
from cerebro_spark.engine._elastic import (
    given_capacity,
    plan_at_capacity,
    planned_pack_size,
    planned_spec,
)
from cerebro_spark.engine._pilot import pilot_profile
from cerebro_spark.errors import ConfigError
from cerebro_spark.search import ExperimentSpec

logger = logging.getLogger(__name__)

FLAG_PROCEDURES = ("sha", "hyperband", "seer")
"""Procedures ``plan`` can describe from flags, without a config."""


def _write(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def add_plan_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``plan`` command and return its parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "plan",
        help="plan the workers of every stage for a deadline and a budget, before running",
        description=(
            "Plan the cheapest allocation of workers per stage that meets a deadline and a "
            "budget (RubberBand's planner on a profile and a price catalog), and show it "
            "beside the cheapest static cluster. Without --profile, show the stages only."
        ),
    )
    parser.add_argument("config", nargs="?", help="experiment config (YAML), as for 'run'")
    parser.add_argument("--procedure", choices=FLAG_PROCEDURES, help="without a config")
    parser.add_argument("--trials", type=int, help="trials of SHA (num_trials)")
    parser.add_argument("--eta", type=int, help="reduction factor")
    parser.add_argument("--max-epochs", type=int, help="R: the most epochs of a trial")
    parser.add_argument("--min-epochs", type=int, help="r: the epochs of the first rung")
    parser.add_argument(
        "--workers", type=int, help="SEER's num_workers (with a config: the config's workers)"
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another procedure option, VALUE as JSON (e.g. worker_seconds=120 for SEER)",
    )
    parser.add_argument("--profile", help="profile YAML (cerebro-spark profile, or by hand)")
    parser.add_argument("--prices", help="price catalog YAML (conf/prices/aws-us-east-1.yaml)")
    parser.add_argument(
        "--deadline",
        type=float,
        help="seconds from run to the end, start-up included (default: the procedure's own)",
    )
    parser.add_argument("--budget", type=float, help="most dollars")
    parser.add_argument("--instance-type", help="plan on this type only (default: every one)")
    parser.add_argument("--samples", type=int, default=32, help="latency samples (default 32)")
    parser.add_argument(
        "--seed", type=int, default=None, help="seed of the samples (default: the config's, else 0)"
    )
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.set_defaults(handler=run_plan)
    return parser


def _options(items: list[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--option must look like KEY=VALUE, got {item!r}")
        try:
            options[key] = json.loads(raw)
        except json.JSONDecodeError:
            options[key] = raw
    return options


def spec_from_args(args: argparse.Namespace) -> tuple[ExperimentSpec, int | None]:
    """The stages to plan (from the config, else from flags) and the config's partitions.

    Raises:
        ConfigError: Neither a config nor ``--procedure``, both, or a bad flag.
    """
    if args.config is not None:
        if args.procedure is not None:
            raise ConfigError("give a config or --procedure, not both")

        config = load_config(args.config)
        if args.workers is not None:
            config = config.replace(workers=args.workers)
        partitions = config.data.partitions if config.data.source is not None else None
        return experiment_spec(config), partitions
    if args.procedure is None:
        raise ConfigError("plan needs a config (CONFIG.yaml) or --procedure sha|hyperband|seer")
    if args.max_epochs is None:
        raise ConfigError(f"--procedure {args.procedure} needs --max-epochs (R)")
    options = _options(list(args.option))
    if args.eta is not None:
        options["eta"] = args.eta
    if args.min_epochs is not None:
        options["min_epochs"] = args.min_epochs
    if args.procedure == "sha":
        if args.trials is None:
            raise ConfigError("--procedure sha needs --trials")
        options["num_trials"] = args.trials
    elif args.trials is not None:
        raise ConfigError(f"--trials is for sha; {args.procedure} chooses its own trials")
    if args.procedure == "seer":
        if args.min_epochs is not None:
            raise ConfigError("--min-epochs is for sha and hyperband; SEER plans its stages")
        if args.workers is not None:
            options.setdefault("num_workers", args.workers)
        options.setdefault("num_workers", 1)
        if "deadline" not in options:
            if args.deadline is None:
                raise ConfigError("--procedure seer needs --deadline (or --option deadline=S)")
            options["deadline"] = args.deadline
    elif args.workers is not None:
        raise ConfigError(
            f"--workers is SEER's num_workers; {args.procedure} has no such option: the "
            "planner chooses its workers per stage"
        )
    return procedure_spec(args.procedure, args.max_epochs, **options), None


def _elastic_defaults(args: argparse.Namespace) -> Any:
    """Fill unset flags from the config (its deadline, its ``elastic:`` section).

    ``plan CONFIG`` then plans exactly what ``run CONFIG`` will follow: the same profile,
    prices, deadline, budget and instance type, and the same cap on executors
    (:func:`cerebro_spark.engine._elastic.planned_spec`). ``None`` without a config.

    A flag wins over the config. ``--prices`` naming another catalog than the config's
    asks what that catalog would choose: the config's ``elastic.instance_type`` (a type
    of its own catalog) is then not applied, with a warning naming both, unless
    ``--instance-type`` names a type.
    """
    if args.config is None:
        return None

    config = load_config(args.config)
    if args.deadline is None:
        args.deadline = config.deadline
    elastic = config.elastic
    if elastic is None:
        return config
    if args.profile is None and elastic.profile != "auto":
        args.profile = elastic.profile
    other_catalog = args.prices is not None and not _same_file(args.prices, elastic.prices)
    if args.prices is None:
        args.prices = elastic.prices
    if args.budget is None:
        args.budget = elastic.budget
    if args.instance_type is None and elastic.instance_type is not None:
        if other_catalog:
            logger.warning(
                "--prices %s is not the config's catalog (elastic.prices: %s): planning on "
                "the instance types it prices, not on the config's elastic.instance_type "
                "%s; pass --instance-type %s to plan on that type",
                args.prices,
                elastic.prices,
                elastic.instance_type,
                elastic.instance_type,
            )
        else:
            args.instance_type = elastic.instance_type
    if args.seed is None:
        args.seed = config.seed  # what run plans with
    return config


def _same_file(a: str, b: str) -> bool:
    return Path(a).resolve() == Path(b).resolve()


def run_plan(args: argparse.Namespace) -> int:
    """The ``plan`` command (see the module docstring)."""
    config = _elastic_defaults(args)
    if args.seed is None:
        args.seed = 0
    spec, partitions = spec_from_args(args)
    deadline = plan_deadline(spec, args.deadline)
    if args.profile is None:
        if args.format == "json":
            _write(json.dumps({"feasible": None, **spec.to_dict()}, indent=2))
        else:
            _write(format_stages(spec))
        return 0
    if args.prices is None or deadline is None:
        raise ConfigError("planning with --profile needs --prices and --deadline")
    profile = load_profile(args.profile)
    if partitions is not None and partitions != profile.partitions:
        raise ConfigError(
            f"the profile {args.profile} measured partitions={profile.partitions}, but the "
            f"config's data.partitions is {partitions}: profile this config again"
        )
    given = None
    if config is not None and config.elastic is not None:
        config = config.replace(workers=args.workers or config.workers)
        given = given_capacity(config)  # serverless: the run cannot resize (``run``'s rule)
        spec = planned_spec(config, profile, None if given is None else given.workers)
    catalog = load_catalog(args.prices)
    pack_size = 1 if config is None else planned_pack_size(config, profile)
    options: dict[str, Any] = {"budget": args.budget, "instance_type": args.instance_type,
                               "samples": args.samples, "seed": args.seed,
                               "pack_size": pack_size}  # fmt: skip
    try:
        if given is not None:
            result = plan_at_capacity(spec, profile, catalog, given, deadline=deadline, **options)
        else:
            result = plan(spec, profile, catalog, deadline=deadline, **options)
    except PlanInfeasible as error:
        if args.format != "json":
            raise
        logger.error("%s", error)
        _write(json.dumps(error.to_dict(), indent=2))
        return 2
    if args.format == "json":
        _write(json.dumps(result.to_dict(), indent=2))
    else:
        _write(format_plan(result))
    return 0


def format_stages(spec: ExperimentSpec) -> str:
    """The stages of a search as a table (``plan`` without a profile)."""
    kind = "elastic" if spec.elastic else "one allocation (asynchronous)"
    lines = [
        f"{spec.procedure}: {spec.num_stages()} stages, {kind}"
        + ("" if spec.max_workers is None else f", at most {spec.max_workers} trials in flight")
        + ("" if spec.fixed_seconds is None else f", runs {spec.fixed_seconds:g} s")
        + (
            ""
            if spec.deadline is None or spec.fixed_seconds is not None
            else f", stops at its deadline {spec.deadline:g} s"
        ),
        "",
        "| stage | trials | epochs | cohorts (trials x epochs x workers each) |",
        "|--:|--:|--:|:--|",
    ]
    for i, stage in enumerate(spec.stages):
        cohorts = ", ".join(f"{c.trials} x {c.epochs} x {c.resources}" for c in stage.cohorts)
        lines.append(f"| {i + 1} | {stage.trials} | {stage.epochs} | {cohorts} |")
    lines += ["", "pass --profile, --prices and --deadline to plan workers and dollars"]
    return "\n".join(lines)


def add_profile_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``profile`` command and return its parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "profile",
        help="measure a config's workload with a short pilot and write a profile",
        description=(
            "Run a short pilot on the config's data and model families (one trial of each, "
            "two epochs, group units where the backend has the workers) and write the "
            "profile the planner reads."
        ),
    )
    parser.add_argument("config", help="experiment config (YAML)")
    parser.add_argument(
        "--instance-type",
        default="local",
        help="the instance type these numbers stand for (a price catalog's name)",
    )
    parser.add_argument("--out", help="where to write the profile (default: <name>.profile.yaml)")
    parser.add_argument("--epochs", type=int, default=2, help="pilot epochs (default 2)")
    parser.add_argument(
        "--groups", default="2,4", help="group sizes to measure when workers allow (2,4)"
    )
    parser.add_argument(
        "--scale-seconds",
        type=float,
        default=0.0,
        help="provider latency from request to executor (not measurable on a fixed cluster)",
    )
    parser.add_argument(
        "--scale-seconds-each",
        type=float,
        default=0.0,
        help="what each further instance of one request adds to --scale-seconds "
        "(a provider that starts them one after another; default 0)",
    )
    parser.add_argument(
        "--driver-start-seconds",
        type=float,
        default=0.0,
        help="from `run` to the first request for instances, not billed (default 0)",
    )
    parser.add_argument(
        "--bandwidth",
        type=float,
        default=1.25e9,
        help="bytes/s between workers for Cynthia's model when no group can be measured",
    )
    parser.add_argument("--backend", choices=("local", "spark"), help="override the config's")
    parser.add_argument("--master", help="Spark master URL; implies --backend spark")
    parser.set_defaults(handler=run_profile)
    return parser


def run_profile(args: argparse.Namespace) -> int:
    """The ``profile`` command."""
    config = load_config(args.config)
    if args.master is not None:
        config = config.replace(
            backend="spark", spark=dataclasses.replace(config.spark, master=args.master)
        )
    elif args.backend is not None:
        config = config.replace(backend=args.backend)
    try:
        groups = tuple(int(g) for g in str(args.groups).split(",") if g.strip())
    except ValueError:
        raise ConfigError(
            f"--groups must be comma-separated integers, got {args.groups!r}"
        ) from None
    profile = pilot_profile(
        config,
        instance_type=args.instance_type,
        epochs=args.epochs,
        groups=groups,
        scale_seconds=args.scale_seconds,
        scale_seconds_each=args.scale_seconds_each,
        driver_start_seconds=args.driver_start_seconds,
        bandwidth=args.bandwidth,
    )
    out = Path(args.out or f"{config.name}.profile.yaml")
    profile.dump(out)
    _write(f"profile of {config.name} on {args.instance_type}: {out}")
    return 0
