"""The ``prepare`` command: arguments and the function that runs them.

Shared by ``cerebro-spark prepare`` and ``jobs/prepare.py`` (``spark-submit``)::

    add_prepare_arguments(parser)
    sys.exit(run_prepare(parser.parse_args()))

Two engines write the same dataset for the same rows: ``spark``
(:func:`~cerebro_spark.data.prepare_with_spark`; the default when pyspark is importable)
and ``python`` (:func:`~cerebro_spark.data.prepare_dataset`, the data in memory).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cerebro_spark.data._names import check_dataset_name, name_dataset
from cerebro_spark.data._options import DEFAULT_VOCABULARY_LIMIT, KindOptions
from cerebro_spark.data._sources import load_source, read_table
from cerebro_spark.data._spark_prepare import load_frame, prepare_with_spark
from cerebro_spark.data._writer import prepare_dataset
from cerebro_spark.errors import ConfigError, DataError
from cerebro_spark.spark_session import spark_session
from cerebro_spark.store import open_store

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

    from cerebro_spark.data._format import Manifest

logger = logging.getLogger(__name__)

ENGINES: tuple[str, str] = ("spark", "python")

#: Prepared size (bytes of the partition files) up to which ``prepare`` with Spark logs
#: that ``--engine python`` is faster. Measured (``benchmarks/prepare_engines.py``, README
#: "Preparing data"): Python was faster at every size tried, 20x at 163 MB, because Spark
#: pays for its start-up and jobs; what limits Python is memory (it peaks at about
#: :data:`PYTHON_MEMORY_FACTOR` times the prepared size), so the hint stops at 1 GB.
SMALL_DATA_BYTES = 10**9

#: Peak memory of the plain-Python engine over the prepared size (measured: 4.3 at 163 MB,
#: 3.7 at 816 MB).
PYTHON_MEMORY_FACTOR = 4.5


def _shape(text: str) -> tuple[str, tuple[int, ...]]:
    """Parse ``COLUMN=D1,D2,...`` (``image=1,8,8``)."""
    name, sep, dims = text.partition("=")
    try:
        shape = tuple(int(dim) for dim in dims.split(","))
    except ValueError:
        shape = ()
    if not sep or not name or not shape or any(dim < 1 for dim in shape):
        raise argparse.ArgumentTypeError(
            f"--feature-shape must look like COLUMN=D1,D2,... with dimensions >= 1 "
            f"(e.g. image=1,8,8), got {text!r}"
        )
    return name, shape


def _key_value(text: str) -> tuple[str, str]:
    """Parse ``KEY=VALUE``."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def add_prepare_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``prepare`` arguments to ``parser``.

    Args:
        parser: The (sub)command's parser; :func:`run_prepare` takes what it parses.
    """
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--input",
        "--source",
        dest="input",
        metavar="PATH",
        help="Parquet, CSV, JSON-lines or Delta file or directory (local, or any URI the "
        "engine reads), or a built-in source such as sklearn:digits",
    )
    source.add_argument("--table", metavar="NAME", help="a table in the Spark catalog (spark)")
    parser.add_argument(
        "--format",
        choices=("parquet", "csv", "json", "delta"),
        help="input format (default: from the file name; delta needs delta-spark)",
    )
    parser.add_argument(
        "--features",
        nargs="+",
        metavar="COLUMN",
        help="feature columns, space or comma separated (default: every column but the "
        "label and the validation column)",
    )
    parser.add_argument("--label", help="label column (default: label)")
    parser.add_argument(
        "--partitions", type=int, default=4, help="P: partitions per split (default: 4)"
    )
    parser.add_argument(
        "--validation-fraction",
        type=float,
        default=0.2,
        help="share of validation rows (default: 0.2)",
    )
    parser.add_argument(
        "--validation-column", metavar="COLUMN", help="boolean column: true = validation row"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the shuffle (default: 0)")
    parser.add_argument(
        "--store", default="runs", help="store URI; the dataset goes to <store>/datasets/<id>"
    )
    parser.add_argument(
        "--feature-shape",
        action="append",
        type=_shape,
        default=[],
        metavar="COLUMN=D1,D2,...",
        help="per-row shape of an array feature, e.g. image=1,8,8 (repeatable)",
    )
    kinds = parser.add_argument_group(
        "feature kinds",
        "images, categories and sequences (inferred where unambiguous: binary with JPEG/PNG "
        "magic is an image, a string a category, integer lists of different lengths a "
        "sequence; each choice is logged)",
    )
    kinds.add_argument(
        "--image-columns", nargs="+", metavar="COLUMN", help="columns of JPEG/PNG bytes"
    )
    kinds.add_argument(
        "--categorical",
        nargs="+",
        metavar="COLUMN",
        help="columns of categories (strings or integers) stored as int32 ids",
    )
    kinds.add_argument(
        "--sequence-columns",
        nargs="+",
        metavar="COLUMN",
        help="columns of variable-length integer lists (token ids)",
    )
    kinds.add_argument(
        "--image-size",
        nargs=2,
        type=int,
        metavar=("H", "W"),
        help="resize every image to H x W (default: images must all have one size)",
    )
    kinds.add_argument(
        "--image-channels",
        type=int,
        choices=(1, 3),
        help="convert every image to 1 (grayscale) or 3 (RGB) channels (default: 1 when "
        "all are grayscale, else 3)",
    )
    kinds.add_argument(
        "--vocabulary-limit",
        type=int,
        default=DEFAULT_VOCABULARY_LIMIT,
        metavar="N",
        help="values of a categorical column with an id of their own, at most (the most "
        f"frequent; default {DEFAULT_VOCABULARY_LIMIT:,})",
    )
    kinds.add_argument(
        "--hash-buckets",
        type=int,
        default=0,
        metavar="N",
        help="ids shared by hashing among the values beyond the vocabulary (default 0: "
        "they map to the unknown id 0)",
    )
    kinds.add_argument(
        "--max-length", type=int, metavar="N", help="cut sequences to their first N ids"
    )
    parser.add_argument(
        "--task",
        choices=("classification", "regression"),
        help="default: from the label type (integer/boolean/string: classification)",
    )
    parser.add_argument(
        "--order",
        choices=("input", "sorted"),
        default="input",
        help="kept for compatibility: since dataset format 2 the row order comes from a "
        "seeded content hash, so input order never changes the dataset",
    )
    parser.add_argument(
        "--option",
        action="append",
        type=_key_value,
        default=[],
        metavar="KEY=VALUE",
        help="Spark reader option, e.g. sep=; (repeatable; CSV: header and inferSchema "
        "default to true)",
    )
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        help="spark (default when pyspark is installed) or python (plain, in memory)",
    )
    parser.add_argument(
        "--name",
        help="name the dataset in the store (e.g. churn-2026-11) so that a config can say "
        "data: {dataset: NAME}; letters, digits, '.', '_', '-'",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="with --name: point the name at this dataset even if it names another one",
    )
    parser.add_argument(
        "--master",
        help="Spark master for a new session, e.g. local[2] (default: spark-submit's)",
    )
    parser.add_argument(
        "--conf",
        action="append",
        type=_key_value,
        default=[],
        metavar="KEY=VALUE",
        help="Spark setting for a new session (repeatable)",
    )


def _names(values: Sequence[str] | None) -> list[str] | None:
    if not values:
        return None
    return [name for value in values for name in value.split(",") if name]


def _kinds(args: argparse.Namespace, given: KindOptions | None) -> KindOptions | None:
    """The kind options of the command line (a built-in source's, with the flags over them)."""
    base = given or KindOptions()
    options = KindOptions(
        image_columns=tuple(_names(args.image_columns) or base.image_columns),
        categorical=tuple(_names(args.categorical) or base.categorical),
        sequence_columns=tuple(_names(args.sequence_columns) or base.sequence_columns),
        image_size=tuple(args.image_size) if args.image_size else base.image_size,
        image_channels=args.image_channels or base.image_channels,
        vocabulary_limit=args.vocabulary_limit,
        hash_buckets=args.hash_buckets,
        max_length=args.max_length if args.max_length is not None else base.max_length,
    )
    return None if options == KindOptions() else options


def _default_features(
    columns: Sequence[str], label: str, validation_column: str | None
) -> list[str]:
    return [name for name in columns if name not in {label, validation_column}]


def _print_result(manifest: Manifest, uri: str, name: str | None) -> None:
    named = f" (named {name})" if name else ""
    sys.stdout.write(
        f"dataset {manifest.dataset_id}{named}: {manifest.rows('train')} train rows, "
        f"{manifest.rows('validation')} validation rows, {manifest.num_partitions} "
        f"partitions at {uri}\n"
    )
    sys.stdout.flush()


def _hint_small(args: argparse.Namespace, manifest: Manifest, seconds: float) -> None:
    """Log that ``--engine python`` is faster when Spark prepared small data from a file."""
    if args.engine == "python" or args.table is not None or args.format == "delta":
        return
    size = sum(part.bytes for part in manifest.partitions)
    if size > SMALL_DATA_BYTES:
        return
    rows = manifest.rows("train") + manifest.rows("validation")
    logger.info(
        "Spark prepared %d rows (%.1f MB) in %.1f s; data this small prepares faster with "
        "--engine python (no Spark start-up or jobs; the same dataset, same id; it needs "
        "about %.0f MB of memory)",
        rows,
        size / 1e6,
        seconds,
        size * PYTHON_MEMORY_FACTOR / 1e6,
    )


def _builtin(args: argparse.Namespace) -> tuple[pa.Table | None, dict[str, Any]]:
    """Load a built-in source (``sklearn:...``) if ``--input`` names one."""
    if args.input is None or not args.input.startswith("sklearn:"):
        return None, {}
    return load_source(args.input)


def _run_python(args: argparse.Namespace, common: dict[str, Any], table: pa.Table | None) -> Any:
    if args.table is not None:
        raise ConfigError("--table needs the spark engine; the python engine reads files")
    if args.format == "delta":
        raise ConfigError("--format delta needs the spark engine (and delta-spark)")
    if table is None:
        table = read_table(args.input, args.format)
    if common["features"] is None:
        common["features"] = _default_features(
            table.column_names, common["label"], common["validation_column"]
        )
    return prepare_dataset(table, args.store, **common)


def _spark_frame(session: SparkSession, table: pa.Table) -> DataFrame:
    """A DataFrame of an Arrow table (fixed-size lists become arrays), row order kept."""
    import pyarrow as pa

    columns = [
        column.cast(pa.list_(column.type.value_type))
        if pa.types.is_fixed_size_list(column.type)
        else column
        for column in table.columns
    ]
    return session.createDataFrame(pa.table(columns, names=table.column_names))


def _run_spark(args: argparse.Namespace, common: dict[str, Any], table: pa.Table | None) -> Any:
    from pyspark.sql import SparkSession  # pyspark: only for --engine spark

    existing = SparkSession.getActiveSession()
    session = spark_session(args.master, "cerebro-spark prepare", dict(args.conf))
    try:
        options = dict(args.option)
        data: Any
        fmt: str | None = args.format
        if table is not None:
            data, fmt = _spark_frame(session, table), None
        elif args.table is not None:
            data, fmt = args.table, "table"
        else:
            data = args.input
        if common["features"] is None:
            frame = data if table is not None else load_frame(session, data, fmt, options)[0]
            common["features"] = _default_features(
                frame.columns, common["label"], common["validation_column"]
            )
        return prepare_with_spark(
            data,
            args.store,
            format=fmt,
            options=options,
            order=args.order,
            spark=session,
            **common,
        )
    finally:
        if existing is None:
            session.stop()


def run_prepare(args: argparse.Namespace) -> int:
    """Prepare the dataset ``args`` describes (from :func:`add_prepare_arguments`).

    Writes one line to stdout: the dataset id, rows per split, P and where it is. With
    ``--name`` the dataset gets that name in the store (``--force``: even if the name
    points at another dataset). When Spark prepared small data, logs that
    ``--engine python`` is faster.

    Returns:
        0 on success.

    Raises:
        CerebroError: Bad arguments or data (:class:`~cerebro_spark.errors.DataError`,
            :class:`~cerebro_spark.errors.ConfigError`) or a failed write.
    """
    if args.name is not None:
        check_dataset_name(args.name)  # before any work
    elif args.force:
        raise ConfigError("--force only applies with --name NAME")
    engine = args.engine or ("spark" if importlib.util.find_spec("pyspark") else "python")
    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if engine == "spark" and importlib.util.find_spec("pyspark") is None:
        raise ConfigError("--engine spark needs pyspark; install it or use --engine python")
    table, meta = _builtin(args)
    label = args.label or meta.get("label", "label")
    shapes = dict(meta.get("feature_shapes", {}))
    shapes.update(dict(args.feature_shape))
    common: dict[str, Any] = {
        "kinds": _kinds(args, meta.get("kinds")),
        "features": _names(args.features) or meta.get("features"),
        "label": label,
        "num_partitions": args.partitions,
        "seed": args.seed,
        "validation_fraction": args.validation_fraction,
        "validation_column": args.validation_column,
        "task": args.task or meta.get("task"),
        "feature_shapes": shapes or None,
        "source": meta.get("source") or (args.input if args.input else f"table {args.table}"),
    }
    logger.info("preparing %s with the %s engine", args.input or args.table, engine)
    runner = _run_spark if engine == "spark" else _run_python
    started = time.perf_counter()
    manifest = runner(args, common, table)
    if engine == "spark":
        _hint_small(args, manifest, time.perf_counter() - started)
    uri = open_store(args.store).child(f"datasets/{manifest.dataset_id}").uri
    if args.name is not None:
        try:
            name_dataset(args.store, args.name, manifest, overwrite=args.force)
        except DataError as error:
            raise DataError(
                f"{error} (dataset {manifest.dataset_id} is prepared at {uri})"
            ) from None
    _print_result(manifest, uri, args.name)
    return 0
