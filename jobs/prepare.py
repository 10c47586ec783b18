"""spark-submit entry point: shuffle, split and partition a dataset into the store.

    spark-submit --master local[2] jobs/prepare.py --input data.parquet \\
        --features image --label label --feature-shape image=1,8,8 \\
        --partitions 4 --seed 0 --store s3://bucket/runs?endpoint_override=... \\
        --name digits-2026-11

The arguments are those of ``cerebro-spark prepare`` (``--help`` lists them); the engine is
Spark unless ``--engine python`` is given. Prints one line: the dataset id, rows per split,
P and the dataset's URI; ``--name`` names the dataset in the store (a config's
``data: {dataset: NAME}``). Exit status: 0 done, 2 bad arguments or data (the error is on
stderr).
"""

import argparse
import logging
import sys

from cerebro_spark.cli import quiet_spark
from cerebro_spark.data._prepare_cli import add_prepare_arguments, run_prepare
from cerebro_spark.errors import CerebroError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="prepare.py",
        description="Shuffle, split and partition a dataset into a cerebro-spark store.",
    )
    add_prepare_arguments(parser)
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="debug logging, and Spark's INFO lines"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        with quiet_spark(args.verbose):  # Spark at WARN unless -v
            return run_prepare(args)
    except (CerebroError, FileNotFoundError, FileExistsError) as error:
        print(f"prepare: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
