"""The ETL step of the nightly pipelines: read a source, clean it, (over)write a table.

    spark-submit schedulers/etl.py --source sklearn:wine --output lake/wine
    spark-submit schedulers/etl.py --source s3a://raw/wine/ --output-table analytics.wine
    python schedulers/etl.py --source raw.parquet --output lake/wine --master 'local[2]'

A stand-in for a real ETL job, written as one would: the source is a scikit-learn bundled
data set (``sklearn:iris``, ``sklearn:wine``, ``sklearn:breast_cancer``,
``sklearn:diabetes``; no download) or a Parquet path; the job keeps the feature columns
and the label, gives columns plain lower-case names, casts features to double (the label
to an integer for classification), drops rows with a null or NaN and exact duplicates,
and overwrites a Parquet directory (``--output``) or a managed table in the session's
catalog (``--output-table``). It prints one line: the rows written and where.

Exit status: 0 done, 2 a bad argument or source (the error is on stderr).
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from typing import Any

logger = logging.getLogger("cerebro_spark.schedulers.etl")

SKLEARN_SOURCES = {
    "iris": ("load_iris", "classification"),
    "wine": ("load_wine", "classification"),
    "breast_cancer": ("load_breast_cancer", "classification"),
    "diabetes": ("load_diabetes", "regression"),
}
"""``sklearn:NAME`` sources: the loader and the task (which fixes the label's type)."""


def clean_name(name: str) -> str:
    """``"od280/od315_of_diluted_wines"`` -> ``"od280_od315_of_diluted_wines"``."""
    cleaned = re.sub(r"[^0-9a-zA-Z]+", "_", name.strip()).strip("_").lower()
    return cleaned or "column"


def check_source(source: str) -> None:
    """Refuse an unknown ``sklearn:`` source, naming the known ones.

    Raises:
        ValueError: An unknown ``sklearn:NAME``.
    """
    if source.startswith("sklearn:") and source.split(":", 1)[1] not in SKLEARN_SOURCES:
        known = ", ".join(f"sklearn:{key}" for key in SKLEARN_SOURCES)
        raise ValueError(f"unknown source {source!r}: sklearn sources are {known}")


def read_source(spark: Any, source: str, label: str) -> tuple[Any, str]:
    """Return the source as a Spark DataFrame and its task (classification or regression).

    Raises:
        ValueError: An unknown ``sklearn:`` source, or a Parquet source without ``label``.
    """
    check_source(source)
    if source.startswith("sklearn:"):
        import sklearn.datasets

        loader, task = SKLEARN_SOURCES[source.split(":", 1)[1]]
        frame = getattr(sklearn.datasets, loader)(as_frame=True).frame
        frame = frame.rename(columns={"target": label})
        return spark.createDataFrame(frame), task
    frame = spark.read.parquet(source)
    if label not in frame.columns:
        raise ValueError(
            f"the source {source!r} has no label column {label!r} (columns: {frame.columns})"
        )
    kind = dict(frame.dtypes)[label]
    task = "regression" if kind in ("float", "double") else "classification"
    return frame, task


def clean(frame: Any, label: str, task: str) -> Any:
    """Plain names, double features, an integer label (classification), no bad rows."""
    from pyspark.sql import functions as F

    names = {column: clean_name(column) for column in frame.columns}
    if len(set(names.values())) != len(names):
        raise ValueError(f"column names clash once cleaned: {names}")
    label_type = "long" if task == "classification" else "double"
    columns = [
        F.col(f"`{column}`").cast(label_type if column == label else "double").alias(new)
        for column, new in names.items()
    ]
    cleaned = frame.select(*columns)
    for column in cleaned.columns:
        cleaned = cleaned.filter(F.col(column).isNotNull() & ~F.isnan(F.col(column)))
    return cleaned.dropDuplicates()


def main(argv: list[str] | None = None) -> int:
    """Run the ETL job (see the module docstring); return the exit status."""
    parser = argparse.ArgumentParser(prog="etl.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", required=True, help="sklearn:NAME or a Parquet path")
    parser.add_argument("--label", default="label", help="the label column (default: label)")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--output", help="a directory: the table as Parquet (overwritten)")
    target.add_argument("--output-table", help="a managed table in the session's catalog")
    parser.add_argument("--master", help="Spark master (default: spark-submit's or local)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        check_source(args.source)  # before Spark starts
    except ValueError as error:
        print(f"etl: error: {error}", file=sys.stderr)
        return 2
    from cerebro_spark.spark_session import spark_session

    settings = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false"}
    spark = spark_session(args.master, "cerebro-spark-etl", settings)
    spark.sparkContext.setLogLevel("WARN")
    try:
        frame, task = read_source(spark, args.source, args.label)
        table = clean(frame, clean_name(args.label), task).coalesce(1)
    except ValueError as error:
        print(f"etl: error: {error}", file=sys.stderr)
        return 2
    if args.output is not None:
        table.write.mode("overwrite").parquet(args.output)
        where = args.output
    else:
        table.write.mode("overwrite").saveAsTable(args.output_table)
        where = f"table {args.output_table}"
    written = spark.read.parquet(args.output) if args.output else spark.table(args.output_table)
    rows = written.count()
    print(f"etl: {rows} rows ({task}) from {args.source} to {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
