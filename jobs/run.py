"""spark-submit entry point: ``spark-submit jobs/run.py CONFIG.yaml [--workers N ...]``.

Equivalent to ``cerebro-spark run``; the arguments are the same.
"""

import sys

from cerebro_spark.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
