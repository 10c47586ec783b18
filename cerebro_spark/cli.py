"""The ``cerebro-spark`` command line.

Each command imports what it runs inside its function (torch, Spark, plotly stay off
``cerebro-spark --help`` and commands that do not need them: the CLI starts in a fraction
of a second); those imports stay in the functions on purpose.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from cerebro_spark import __version__
from cerebro_spark.errors import CerebroError, ConfigError, SearchFailedError

if TYPE_CHECKING:
    from cerebro_spark.engine import ExperimentConfig, ExperimentResult, ExperimentState

logger = logging.getLogger("cerebro_spark.cli")

EXIT_SEARCH_FAILED = 3
"""Exit status of ``run`` and ``resume`` when the search produced nothing (no trial
completed an epoch with a finite metric: every trial failed, or the procedure suggested
none, as a deadline-bound one does once its deadline has passed); 2 is any other error of
the input (a deadline shorter than start-up plus one unit included), 1 a replay that
differs, 130 an interrupt."""


SPARK_LOG_LEVEL = "WARN"
"""Spark's log level in the sessions a command starts, unless ``-v`` (``spark.log.level``)."""


@contextlib.contextmanager
def quiet_spark(verbose: bool = False) -> Iterator[None]:
    """Spark at :data:`SPARK_LOG_LEVEL` in the sessions started in the block, unless ``verbose``.

    Under ``spark-submit`` Spark logs its start-up and every job at INFO (126 of 142 lines
    of ``jobs/run.py``): its JVM is no interpreter, so no console threshold applies. Spark's
    ``spark.log.level`` (set as ``SparkContext.setLogLevel`` when a context starts) is
    given where the user gave none, and taken back when the block ends:

    * under ``spark-submit`` (``PYSPARK_GATEWAY_PORT`` set: the JVM is up, and its ``spark.*``
      system properties are the application's conf), as a JVM system property;
    * for a JVM this process starts later, in ``PYSPARK_SUBMIT_ARGS`` (unless set).

    A Spark context already running in this process is left as it is. A
    ``spark.log.level`` of the user (``--conf``, the config's ``spark.conf``) wins.
    """
    if verbose:
        yield
        return
    undo = _quiet_next_context()
    try:
        yield
    finally:
        undo()


def _quiet_next_context() -> Callable[[], None]:
    """Give the next Spark context ``spark.log.level`` (:func:`quiet_spark`); return the undo."""
    key = "spark.log.level"
    if "pyspark" in sys.modules and _active_spark_context() is not None:
        return lambda: None
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        # spark-submit: pyspark is there, and Spark will start in this process anyway
        from pyspark import SparkContext

        SparkContext._ensure_initialized()  # connects to spark-submit's JVM; starts nothing
        jvm = SparkContext._jvm
        assert jvm is not None  # ok: set by _ensure_initialized
        system = jvm.java.lang.System
        if system.getProperty(key) is not None:
            return lambda: None
        system.setProperty(key, SPARK_LOG_LEVEL)
        return lambda: system.clearProperty(key)
    if "PYSPARK_SUBMIT_ARGS" in os.environ:
        return lambda: None
    value = f"--conf {key}={SPARK_LOG_LEVEL} pyspark-shell"
    os.environ["PYSPARK_SUBMIT_ARGS"] = value

    def undo() -> None:
        if os.environ.get("PYSPARK_SUBMIT_ARGS") == value:
            del os.environ["PYSPARK_SUBMIT_ARGS"]

    return undo


def _active_spark_context() -> object | None:
    from pyspark import SparkContext  # already imported: the caller checked sys.modules

    return SparkContext._active_spark_context


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _split_experiment(reference: str, store: str | None) -> tuple[str, str]:
    """Accept ``<store>/experiments/<id>`` or an id with ``--store``."""
    cleaned = reference.rstrip("/")
    marker = "/experiments/"
    if marker in cleaned:
        root, experiment_id = cleaned.rsplit(marker, 1)
        return root or "/", experiment_id
    if cleaned.startswith("experiments/"):
        return store or ".", cleaned.split("/", 1)[1]
    return store or "runs", cleaned


def _experiment_started(store_uri: str, experiment_id: str) -> bool:
    """Whether ``run`` already wrote the experiment's config (so ``resume`` can go on)."""
    from cerebro_spark.driver._layout import CONFIG_NAME, experiment_prefix
    from cerebro_spark.store import open_store

    return open_store(store_uri).exists(f"{experiment_prefix(experiment_id)}/{CONFIG_NAME}")


def _load_secrets_config(path: str | None) -> ExperimentConfig | None:
    """The config file given to ``resume``/``replay`` for the redacted credentials."""
    if path is None:
        return None
    from cerebro_spark._redact import register_config_secrets
    from cerebro_spark.engine import load_config

    config = load_config(path)
    register_config_secrets(config.to_dict())
    return config


def _override(config: ExperimentConfig, flag: str, field: str, value: object) -> ExperimentConfig:
    """``config`` with ``field`` set from the command line, checked like the YAML field."""
    from cerebro_spark.driver._config import validate_config

    changed = config.replace(**{field: value})
    try:
        validate_config(changed)
    except ConfigError as error:
        raise ConfigError(f"{flag} {value}: {error}") from None
    return changed


def _cmd_run(args: argparse.Namespace) -> int:
    from cerebro_spark._redact import register_config_secrets
    from cerebro_spark.driver._config import check_name
    from cerebro_spark.engine import format_table, load_config, load_state, run_experiment

    config = load_config(args.config)
    register_config_secrets(config.to_dict())
    overrides = (
        ("--workers", "workers"),
        ("--store", "store"),
        ("--seed", "seed"),
        ("--device", "device"),
    )
    for flag, field in overrides:
        value = getattr(args, field)
        if value is not None:
            config = _override(config, flag, field, value)
    if args.worker_memory is not None:
        from cerebro_spark.data._residence import parse_memory

        try:
            budget = parse_memory(args.worker_memory, "worker_memory")
        except ConfigError as error:
            raise ConfigError(f"--worker-memory {args.worker_memory}: {error}") from None
        config = _override(config, "--worker-memory", "worker_memory", budget)
    if args.experiment_id is not None:
        check_name(args.experiment_id, "--experiment-id")
    if args.if_exists == "resume":
        if args.experiment_id is None:
            raise ConfigError("--if-exists resume needs --experiment-id (the id to find)")
        if _experiment_started(config.store, args.experiment_id):
            logger.info("experiment %s already started: resuming it", args.experiment_id)
            args.experiment, args.store = args.experiment_id, config.store
            args.secrets_config = config
            return _cmd_resume(args)
    if args.master is not None:
        spark = dataclasses.replace(config.spark, master=args.master)
        config = config.replace(backend="spark", spark=spark)
    elif args.backend is not None:
        config = config.replace(backend=args.backend)
    try:
        result = run_experiment(config, experiment_id=args.experiment_id)
    except SearchFailedError as error:
        config, _ = load_state(config.store, error.experiment_id)  # metric and mode resolved
        _out(format_table(error.trials, *config.objective))
        raise
    _print_result(config.store, result)
    _out(f"experiment {result.experiment_id}: {result.url}")
    return 0


def _print_result(store: str, result: ExperimentResult) -> None:
    """The end-of-run summary, the best checkpoint, the cost and where the report is."""
    from cerebro_spark.report import REPORT_NAME, load_report_data, summary_text

    data = load_report_data(store, result.experiment_id)  # metric and mode resolved
    _out(summary_text(data))
    if result.failed:
        _out(
            f"{len(result.failed)} of {len(result.trials)} trials failed; the others' results stand"
        )
    best = result.best
    if best is not None:
        _out(
            f"best: trial {best.trial_id}, epoch {best.best_epoch}, {data.metric} "
            f"{best.best_metrics[data.metric]:.4f}: {result.best_checkpoint_url}"
        )
    _out(f"report: {result.url}/{REPORT_NAME}")
    _print_cost(data.state)


def _print_cost(state: ExperimentState) -> None:
    """Predicted vs actual seconds and dollars of an elastic run, and what it cost."""
    from cerebro_spark.driver import cost_table

    table = cost_table(state)
    if table is None:
        return
    summary = state.elastic_summary or {}
    _out("")
    _out(table)
    if summary:
        first = summary.get("first_plan") or {
            "usd": summary["planned_usd"],
            "seconds": summary["planned_seconds"],
        }
        _out(
            f"the search cost ${summary['usd']:.4f} ({summary['instance_seconds']:.0f} "
            f"instance-seconds on {summary['instances']} instances) in {summary['seconds']:.0f} s; "
            f"first planned ${first['usd']:.4f} in {first['seconds']:.0f} s"
            + (
                f", last re-planned ${summary['planned_usd']:.4f} in "
                f"{summary['planned_seconds']:.0f} s"
                if summary.get("replans")
                else ""
            )
        )
        if summary.get("deadline_met") is not None:
            met = "met" if summary["deadline_met"] else "MISSED"
            _out(f"deadline {summary['deadline']:g} s: {met}" + (
                "" if summary.get("budget") is None
                else f"; budget ${summary['budget']:.4f}: "
                + ("met" if summary.get("budget_met") else "MISSED")
            ))  # fmt: skip


def _cmd_resume(args: argparse.Namespace) -> int:
    from cerebro_spark.engine import format_table, load_state, resume_experiment

    store, experiment_id = _split_experiment(args.experiment, args.store)
    secrets = getattr(args, "secrets_config", None) or _load_secrets_config(args.config)
    config, _ = load_state(store, experiment_id, secrets=secrets)
    try:
        result = resume_experiment(store, experiment_id, secrets=secrets)
    except SearchFailedError as error:
        _out(format_table(error.trials, *config.objective))
        raise
    _print_result(store, result)
    _out(f"experiment {result.experiment_id}: {result.url}")
    return 0


def _cmd_replay(args: argparse.Namespace) -> int:
    from cerebro_spark.engine import replay_experiment

    store, experiment_id = _split_experiment(args.experiment, args.store)
    if args.workers is not None and (isinstance(args.workers, bool) or args.workers < 1):
        raise ConfigError(f"--workers must be an int ≥ 1, got {args.workers}")
    secrets = _load_secrets_config(args.config)
    report = replay_experiment(
        store, experiment_id, workers=args.workers, secrets=secrets, pack=args.pack
    )
    repacked = any(row.max_weight_diff is not None for row in report.rows)
    extra = "  max |weight diff|" if repacked else ""
    _out(f"{'trial':<8} {'original sha256':<20} {'replay sha256':<20} identical{extra}")
    for row in report.rows:
        diff = "" if row.max_weight_diff is None else f"  {row.max_weight_diff:.3g}"
        _out(
            f"{row.trial_id:<8} {(row.original_sha256 or '-')[:16]:<20} "
            f"{(row.replay_sha256 or '-')[:16]:<20} {'yes' if row.identical else 'NO':<9}{diff}"
        )
    if repacked:  # packed and unpacked kernels round otherwise: compared by value, not bits
        largest = max(row.max_weight_diff or 0.0 for row in report.rows)
        _out(
            f"replay {report.replay.experiment_id} (pack {args.pack}): the largest weight "
            f"difference is {largest:.3g}"
        )
        return 0
    _out(
        f"replay {report.replay.experiment_id}: {'identical' if report.identical else 'DIFFERENT'}"
    )
    return 0 if report.identical else 1


def _cmd_leaderboard(args: argparse.Namespace) -> int:
    from cerebro_spark.engine import format_table, leaderboard_csv
    from cerebro_spark.report import (
        check_metric,
        failures_text,
        leaderboard_json,
        load_report_data,
        metric_mode,
        rejudge,
    )

    if args.limit < 1:
        raise ConfigError(f"--limit must be an int ≥ 1, got {args.limit}")
    store, experiment_id = _split_experiment(args.experiment, args.store)
    data = load_report_data(store, experiment_id)
    metric = args.metric or data.metric
    trials = list(data.state.trials.values())
    check_metric(trials, metric)
    mode = args.mode or metric_mode(metric, data.config)
    if (metric, mode) != (data.metric, data.mode):
        trials = rejudge(trials, metric, mode)
    if args.format == "csv":
        sys.stdout.write(leaderboard_csv(trials, metric, mode))
    elif args.format == "json":
        sys.stdout.write(leaderboard_json(trials, metric, mode, data.trial_seconds, data.trial_usd))
    else:
        _out(
            format_table(
                trials, metric, mode, limit=args.limit, seconds=data.trial_seconds,
                usd=data.trial_usd,
            )
        )  # fmt: skip
        failures = failures_text(trials, data.unit_failures)
        if failures:
            _out(failures)
        _print_cost(data.state)
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from cerebro_spark.report import write_report

    store, experiment_id = _split_experiment(args.experiment, args.store)
    _out(f"report: {write_report(store, experiment_id, args.output)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of ``cerebro-spark``."""
    parser = argparse.ArgumentParser(
        prog="cerebro-spark",
        allow_abbrev=False,
        description="Deep learning model selection with model hopper parallelism.",
    )
    parser.add_argument("--version", action="version", version=f"cerebro-spark {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="debug logging, and Spark's INFO lines"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    parser.add_argument(
        "--debug", action="store_true", help="debug logging, and a traceback with every error"
    )
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run an experiment from a YAML config")
    run.add_argument("config", help="experiment config (YAML)")
    run.add_argument("--experiment-id", help="id of the new experiment (default: name-time)")
    run.add_argument("--workers", type=int, help="override the config's number of workers")
    run.add_argument("--store", help="override the config's store URI")
    run.add_argument("--seed", type=int, help="override the config's seed")
    run.add_argument("--backend", choices=("spark", "local"), help="override the config's backend")
    run.add_argument("--device", help="override the config's device (auto, cpu, cuda or cuda:N)")
    run.add_argument(
        "--worker-memory",
        metavar="SIZE",
        help="override the config's worker_memory (e.g. 4GiB): partitions a worker holds in "
        "RAM; the rest are spilled to its local disk",
    )
    run.add_argument(
        "--master", help="Spark master URL (local[2], spark://host:7077, yarn ...); implies spark"
    )
    run.add_argument(
        "--if-exists",
        choices=("error", "resume"),
        default="error",
        help="when --experiment-id already exists: refuse (default) or resume it (a retry)",
    )
    run.set_defaults(handler=_cmd_run)

    store_help = "store URI when EXPERIMENT is an id (default: runs)"
    secrets_help = (
        "the YAML config the experiment was started with: credentials redacted from its "
        "stored config.json (spark.conf secrets ...) are taken from it"
    )
    resume = commands.add_parser("resume", help="continue an interrupted experiment")
    resume.add_argument("experiment", help="experiment directory or id")
    resume.add_argument("--store", help=store_help)
    resume.add_argument("--config", help=secrets_help)
    resume.set_defaults(handler=_cmd_resume)

    replay = commands.add_parser("replay", help="re-train from the logged visit order")
    replay.add_argument("experiment", help="experiment directory or id")
    replay.add_argument("--workers", type=int, help="number of workers for the replay")
    replay.add_argument(
        "--pack",
        help="pack otherwise than the original: off trains a packed run's unpacked twin "
        "(its weights are then compared by value)",
    )
    replay.add_argument("--store", help=store_help)
    replay.add_argument("--config", help=secrets_help)
    replay.set_defaults(handler=_cmd_replay)

    board = commands.add_parser("leaderboard", help="print an experiment's leaderboard")
    board.add_argument("experiment", help="experiment directory or id")
    board.add_argument("--store", help=store_help)
    board.add_argument(
        "--metric", help="rank by this metric, each trial at its best epoch by it (default: "
        "the experiment's)"
    )  # fmt: skip
    board.add_argument(
        "--mode", choices=("max", "min"), help="whether a larger --metric is better (default: "
        "the experiment's or the built-in metric's)"
    )  # fmt: skip
    board.add_argument("--format", choices=("table", "csv", "json"), default="table")
    board.add_argument("--limit", type=int, default=50, help="rows of the table (default: 50)")
    board.set_defaults(handler=_cmd_leaderboard)

    report = commands.add_parser(
        "report", help="write an experiment's HTML report (self-contained, opens offline)"
    )
    report.add_argument("experiment", help="experiment directory or id")
    report.add_argument("--store", help=store_help)
    report.add_argument(
        "--output", help="a local file (default: report.html in the experiment's directory)"
    )
    report.set_defaults(handler=_cmd_report)

    from cerebro_spark.data._prepare_cli import add_prepare_arguments, run_prepare

    prepare = commands.add_parser(
        "prepare", help="shuffle once, split and partition a dataset (Spark or plain Python)"
    )
    add_prepare_arguments(prepare)
    prepare.set_defaults(handler=run_prepare)

    from cerebro_spark.data._datasets_cli import add_datasets_command

    add_datasets_command(commands)

    from cerebro_spark.engine._plan_cli import add_plan_command, add_profile_command
    from cerebro_spark.simulate import add_simulate_command

    add_simulate_command(commands)
    add_plan_command(commands)
    add_profile_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``cerebro-spark`` console script."""
    args = build_parser().parse_args(argv)
    debug = args.debug
    level = (
        logging.DEBUG if args.verbose or debug else logging.WARNING if args.quiet else logging.INFO
    )
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    from cerebro_spark._redact import install_log_filter

    install_log_filter()  # credentials never reach the terminal or a log file
    try:
        with quiet_spark(args.verbose or debug):
            return int(args.handler(args))
    except SearchFailedError as error:
        logger.error("%s", error, exc_info=debug)
        return EXIT_SEARCH_FAILED
    except CerebroError as error:
        logger.error("%s", error, exc_info=debug)
        return 2
    except OSError as error:  # a missing or unreadable file, a full or read-only disk
        logger.error("%s%s", _os_error_text(error), "" if debug else _DEBUG_HINT, exc_info=debug)
        return 2
    except KeyboardInterrupt:
        logger.error("interrupted; continue with 'cerebro-spark resume'")
        return 130


_DEBUG_HINT = " (--debug shows the traceback)"


def _os_error_text(error: OSError) -> str:
    """One line for an error of the operating system: what failed, on which file."""
    if error.strerror and error.filename:
        return f"{error.strerror}: {error.filename}"
    return f"{type(error).__name__}: {error}"


if __name__ == "__main__":
    sys.exit(main())
