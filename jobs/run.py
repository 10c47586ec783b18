"""spark-submit entry point: ``spark-submit jobs/run.py CONFIG.yaml [--workers N ...]``.

Equivalent to ``cerebro-spark run``; the arguments are the same. Exit status: 0 the search
produced a result (some trials may have failed: their errors are in the leaderboard), 3
the search produced nothing: no trial completed an epoch (every trial failed, or the
procedure suggested none; the error naming why is logged; the event log and leaderboard
are written), 2 bad arguments, config or data (a deadline shorter than start-up plus one
training unit included), 130 interrupted. spark-submit
exits with the same status, so a scheduler sees a search that produced nothing as a failed
job.
"""

import sys

from cerebro_spark.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
