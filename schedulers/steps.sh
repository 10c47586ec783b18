#!/usr/bin/env bash
# The steps of the nightly ETL-then-train pipeline, one per call:
#
#   schedulers/steps.sh etl|prepare|plan|run|report|score
#
# Shared by the cron recipe (cron/nightly.sh runs them in order) and the Airflow DAG (one
# task per step). Every setting is an environment variable; the defaults fit a checkout
# with its `.venv` (`make venv`):
#
#   CEREBRO_HOME        the checkout (default: this file's parent directory)
#   CEREBRO_VENV        the project's virtual environment (default: $CEREBRO_HOME/.venv)
#   CEREBRO_CLI         the cerebro-spark command (default: $CEREBRO_VENV/bin/cerebro-spark)
#   CEREBRO_PYTHON      python for the Spark jobs (default: $CEREBRO_VENV/bin/python)
#   CEREBRO_CONFIG      the experiment config; its data is `dataset: $CEREBRO_DATASET`
#                       (default: schedulers/nightly.yaml)
#   CEREBRO_STORE       the store (overrides the config's; default: $CEREBRO_HOME/runs)
#   CEREBRO_SOURCE      what the ETL reads: sklearn:NAME or a Parquet path (sklearn:wine)
#   CEREBRO_TABLE       the table the ETL writes, prepare reads and score scores
#                       (a Parquet directory; default: $CEREBRO_HOME/lake/nightly)
#   CEREBRO_SCORED      where score writes (default: $CEREBRO_HOME/lake/nightly_scored)
#   CEREBRO_LABEL       the label column (default: label)
#   CEREBRO_PARTITIONS  partitions per split (default: 2)
#   CEREBRO_DATASET     the name prepare gives the dataset (default: nightly)
#   CEREBRO_ENGINE      prepare's engine: spark or python (default: prepare's own)
#   CEREBRO_MASTER      Spark master of the ETL, prepare and score jobs (default: local[2])
#   CEREBRO_PROFILE, CEREBRO_PRICES, CEREBRO_DEADLINE, CEREBRO_BUDGET
#                       what plan checks the run against (profile YAML, price catalog,
#                       seconds, dollars); unset: the config's `elastic:` section, and
#                       without one plan only lists the stages
#   CEREBRO_EXPERIMENT_ID  the experiment (default: nightly-<UTC date>): run starts it,
#                       or resumes it when it already started (a retry, a second try
#                       the same night); report and score use it
#
# Exit status: the step's own. prepare, plan and score exit 2 on a bad argument or data,
# plan also when the deadline or budget cannot be met; run 2 on a bad config, 3 when
# every trial failed, 130 when interrupted (the next run resumes).
set -euo pipefail

CEREBRO_HOME=${CEREBRO_HOME:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
CEREBRO_VENV=${CEREBRO_VENV:-$CEREBRO_HOME/.venv}
CEREBRO_CLI=${CEREBRO_CLI:-$CEREBRO_VENV/bin/cerebro-spark}
CEREBRO_PYTHON=${CEREBRO_PYTHON:-$CEREBRO_VENV/bin/python}
CEREBRO_CONFIG=${CEREBRO_CONFIG:-$CEREBRO_HOME/schedulers/nightly.yaml}
CEREBRO_STORE=${CEREBRO_STORE:-$CEREBRO_HOME/runs}
CEREBRO_SOURCE=${CEREBRO_SOURCE:-sklearn:wine}
CEREBRO_TABLE=${CEREBRO_TABLE:-$CEREBRO_HOME/lake/nightly}
CEREBRO_SCORED=${CEREBRO_SCORED:-$CEREBRO_HOME/lake/nightly_scored}
CEREBRO_LABEL=${CEREBRO_LABEL:-label}
CEREBRO_PARTITIONS=${CEREBRO_PARTITIONS:-2}
CEREBRO_DATASET=${CEREBRO_DATASET:-nightly}
CEREBRO_MASTER=${CEREBRO_MASTER:-local[2]}
CEREBRO_EXPERIMENT_ID=${CEREBRO_EXPERIMENT_ID:-nightly-$(date -u +%Y%m%d)}

step=${1:-}
case "$step" in
etl)
    exec "$CEREBRO_PYTHON" "$CEREBRO_HOME/schedulers/etl.py" --source "$CEREBRO_SOURCE" \
        --label "$CEREBRO_LABEL" --output "$CEREBRO_TABLE" --master "$CEREBRO_MASTER"
    ;;
prepare)
    # --force: tonight's data takes the name; last night's dataset stays under its id
    args=(--input "$CEREBRO_TABLE" --label "$CEREBRO_LABEL" --partitions "$CEREBRO_PARTITIONS"
        --store "$CEREBRO_STORE" --name "$CEREBRO_DATASET" --force)
    if [[ -n ${CEREBRO_ENGINE:-} ]]; then args+=(--engine "$CEREBRO_ENGINE"); fi
    if [[ ${CEREBRO_ENGINE:-spark} == spark ]]; then args+=(--master "$CEREBRO_MASTER"); fi
    exec "$CEREBRO_CLI" prepare "${args[@]}"
    ;;
plan)
    # exits 2 (and prints the fastest and cheapest plans) when the deadline or budget
    # cannot be met: the pipeline stops before the search spends anything
    args=(--format json)
    if [[ -n ${CEREBRO_PROFILE:-} ]]; then args+=(--profile "$CEREBRO_PROFILE"); fi
    if [[ -n ${CEREBRO_PRICES:-} ]]; then args+=(--prices "$CEREBRO_PRICES"); fi
    if [[ -n ${CEREBRO_DEADLINE:-} ]]; then args+=(--deadline "$CEREBRO_DEADLINE"); fi
    if [[ -n ${CEREBRO_BUDGET:-} ]]; then args+=(--budget "$CEREBRO_BUDGET"); fi
    exec "$CEREBRO_CLI" plan "$CEREBRO_CONFIG" "${args[@]}"
    ;;
run)
    "$CEREBRO_CLI" run "$CEREBRO_CONFIG" --store "$CEREBRO_STORE" \
        --experiment-id "$CEREBRO_EXPERIMENT_ID" --if-exists resume
    echo "$CEREBRO_EXPERIMENT_ID" # the last line: Airflow's XCom
    ;;
report)
    "$CEREBRO_CLI" report "$CEREBRO_STORE/experiments/$CEREBRO_EXPERIMENT_ID"
    echo "$CEREBRO_STORE/experiments/$CEREBRO_EXPERIMENT_ID/report.html"
    ;;
score)
    exec "$CEREBRO_PYTHON" "$CEREBRO_HOME/jobs/score.py" --store "$CEREBRO_STORE" \
        --experiment "$CEREBRO_EXPERIMENT_ID" --input "$CEREBRO_TABLE" \
        --output "$CEREBRO_SCORED" --mode overwrite --master "$CEREBRO_MASTER"
    ;;
*)
    echo "steps.sh: unknown step '$step'; the steps are etl, prepare, plan, run, report, score" >&2
    exit 2
    ;;
esac
