"""spark-submit entry point: score a table or a path with an experiment's best model.

    spark-submit --master yarn jobs/score.py --store s3://bucket/runs --experiment churn-1 \\
        --input s3a://bucket/new-customers.parquet --output s3a://bucket/scored

    spark-submit jobs/score.py --store /data/runs --experiment churn-1 \\
        --table analytics.customers --output-table analytics.customers_scored --mode overwrite

The model is ``<store>/experiments/<id>/best.pt`` (or ``--checkpoint URI``), scored on the
executors by ``cerebro_spark.scoring.ModelTransformer``: the output holds every input
column plus ``prediction`` (the original class label, or the value) and, for
classification, ``probability`` (array<double>, in the order of the model's classes).
It prints the trial and the epoch it scored with, the epoch counted from 1 as the
leaderboard counts it. ``--help`` lists every argument. Exit status: 0 done, 2 bad
arguments, model or data (the error is on stderr).
"""

import argparse
import logging
import sys

from cerebro_spark.cli import quiet_spark
from cerebro_spark.errors import CerebroError
from cerebro_spark.scoring._score_cli import add_score_arguments, run_score


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="score.py",
        description="Score a table or a path with an experiment's best model.",
    )
    add_score_arguments(parser)
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
            return run_score(args)
    except (CerebroError, FileNotFoundError, FileExistsError) as error:
        print(f"score: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
