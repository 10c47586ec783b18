"""The ``score`` job: arguments and the function that runs them (``jobs/score.py``).

Scores a table or a path (Parquet, CSV, JSON, Delta) with an experiment's best model (or
any checkpoint) through :class:`~cerebro_spark.scoring.ModelTransformer`, on the
executors, and writes the rows with their ``prediction`` (and ``probability``) columns as
Parquet or as a table::

    add_score_arguments(parser)
    sys.exit(run_score(parser.parse_args()))
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from cerebro_spark.data._spark_prepare import load_frame
from cerebro_spark.errors import ConfigError
from cerebro_spark.spark_session import spark_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

WRITE_MODES: tuple[str, ...] = ("error", "overwrite", "append", "ignore")


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def add_score_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``score`` arguments to ``parser``."""
    model = parser.add_argument_group("the model (an experiment's best.pt, or a checkpoint)")
    model.add_argument("--store", help="the experiments' store (the config's 'store')")
    model.add_argument("--experiment", help="experiment id: its best checkpoint scores")
    model.add_argument(
        "--checkpoint",
        help="a checkpoint (path or URI) or an experiment directory, instead of --experiment",
    )
    model.add_argument(
        "--dataset",
        help="the training dataset's URI, for checkpoints written without dataset metadata",
    )
    rows = parser.add_argument_group("the rows to score")
    rows.add_argument("--input", help="a path (Parquet, CSV, JSON, Delta) or a table name")
    rows.add_argument("--table", help="a table name (same as --input NAME --format table)")
    rows.add_argument(
        "--format", help="parquet, csv, json, delta or table (default: from the path)"
    )
    rows.add_argument(
        "--option",
        action="append",
        type=_key_value,
        default=[],
        metavar="KEY=VALUE",
        help="a Spark reader option (repeatable; CSV: header and inferSchema default true)",
    )
    out = parser.add_argument_group("where the scored rows go")
    out.add_argument("--output", help="a directory: the scored rows as Parquet")
    out.add_argument("--output-table", help="a table name: the scored rows as a table")
    out.add_argument(
        "--mode",
        choices=WRITE_MODES,
        default="error",
        help="what to do when the output exists (default: error)",
    )
    out.add_argument("--prediction-col", default="prediction", help="default: prediction")
    out.add_argument(
        "--probability-col",
        default="probability",
        help="class probabilities, array<double> (default: probability; '' for none)",
    )
    out.add_argument("--batch-size", type=int, default=1024, help="rows per forward pass")
    out.add_argument(
        "--device", default="auto", help="auto (the executor's GPU if any), cpu or cuda"
    )
    parser.add_argument("--master", help="Spark master (default: spark-submit's or local)")


def _check(args: argparse.Namespace) -> None:
    if (args.checkpoint is None) == (args.experiment is None):
        raise ConfigError("give exactly one of --experiment (with --store) or --checkpoint")
    if args.experiment is not None and args.store is None:
        raise ConfigError("--experiment needs --store (the store the experiment ran in)")
    if (args.input is None) == (args.table is None):
        raise ConfigError("give exactly one of --input (a path or table) or --table")
    if (args.output is None) == (args.output_table is None):
        raise ConfigError("give exactly one of --output (a directory) or --output-table")


def run_score(args: argparse.Namespace, spark: SparkSession | None = None) -> int:
    """Score the rows the arguments name and write them; return the exit status (0).

    Raises:
        ConfigError: Bad or missing arguments.
        FileNotFoundError: No experiment, checkpoint or input there.
        DataError: The input lacks a feature column or holds bad values.
    """
    # pyspark and torch: the transformer's module imports both; the CLI parser stays light
    from cerebro_spark.scoring._transformer import ModelTransformer

    _check(args)
    if args.experiment is not None:
        transformer = ModelTransformer.from_checkpoint(
            args.experiment,
            store=args.store,
            dataset=args.dataset,
            predictionCol=args.prediction_col,
            probabilityCol=args.probability_col,
            batchSize=args.batch_size,
            device=args.device,
        )
    else:
        transformer = ModelTransformer.from_checkpoint(
            args.checkpoint,
            dataset=args.dataset,
            predictionCol=args.prediction_col,
            probabilityCol=args.probability_col,
            batchSize=args.batch_size,
            device=args.device,
        )
    session = (
        spark
        if spark is not None
        else spark_session(args.master, "cerebro-spark score", preload_torch=True)
    )
    source = args.table if args.table is not None else args.input
    fmt = "table" if args.table is not None else args.format
    frame, description = load_frame(session, source, fmt, dict(args.option))
    scored = transformer.transform(frame)
    if args.output is not None:
        scored.write.mode(args.mode).parquet(args.output)
        where = args.output
    else:
        scored.write.mode(args.mode).saveAsTable(args.output_table)
        where = f"table {args.output_table}"
    metadata = transformer.metadata
    logger.info(
        "scored %s with %s (trial %s, epoch %d) into %s",
        description,
        metadata.spec,
        metadata.trial_id,
        metadata.epoch,
        where,
    )
    sys.stdout.write(
        f"scored {description} with trial {metadata.trial_id} (epoch {metadata.epoch}): {where}\n"
    )
    return 0
