#!/usr/bin/env bash
# The nightly ETL-then-train pipeline for cron: etl, prepare, plan, run, report, score
# (schedulers/steps.sh, whose environment variables set everything), one night at a time.
#
#   # crontab -e
#   0 2 * * *  CEREBRO_SOURCE=s3a://raw/wine/ /srv/cerebro-spark/schedulers/cron/nightly.sh
#
# - Locking: the script holds `flock -n` on $CEREBRO_LOCK (default $CEREBRO_LOG_DIR/nightly.lock)
#   for its whole run. A night that starts while the previous one still runs does nothing:
#   it prints who holds the lock on stderr and exits 75 (EX_TEMPFAIL).
# - Logs: each run writes $CEREBRO_LOG_DIR/nightly-<UTC time>.log (default directory
#   $CEREBRO_HOME/logs), `latest.log` links to it, and only the newest $CEREBRO_KEEP_LOGS
#   (default 14) are kept. stdout gets one line per step; cron mails it.
# - The experiment id is nightly-<UTC date> unless CEREBRO_EXPERIMENT_ID says otherwise: a
#   second try the same night resumes the search where the first stopped.
#
# Exit status: 0 every step done; 75 another run holds the lock; otherwise the status of
# the step that failed (2 bad config or data, or plan found the deadline or budget cannot
# be met; 3 every trial failed; 130 interrupted), named on stdout and in the log.
set -euo pipefail

EXIT_LOCKED=75
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export CEREBRO_HOME=${CEREBRO_HOME:-$(cd "$HERE/../.." && pwd)}
export CEREBRO_EXPERIMENT_ID=${CEREBRO_EXPERIMENT_ID:-nightly-$(date -u +%Y%m%d)}
LOG_DIR=${CEREBRO_LOG_DIR:-$CEREBRO_HOME/logs}
KEEP=${CEREBRO_KEEP_LOGS:-14}
LOCK=${CEREBRO_LOCK:-$LOG_DIR/nightly.lock}
STEPS=(etl prepare plan run report score)

if ! [[ $KEEP =~ ^[1-9][0-9]*$ ]]; then
    echo "nightly.sh: CEREBRO_KEEP_LOGS must be a whole number >= 1, got '$KEEP'" >&2
    exit 2
fi
mkdir -p "$LOG_DIR" "$(dirname "$LOCK")"

exec 9>>"$LOCK" # opened for append: the holder's line stays readable
if ! flock -n 9; then
    echo "nightly.sh: another nightly run holds $LOCK ($(cat "$LOCK" 2>/dev/null || true));" \
        "not starting (exit $EXIT_LOCKED)" >&2
    exit "$EXIT_LOCKED"
fi
echo "pid $$ since $(date -u +%Y-%m-%dT%H:%M:%SZ), experiment $CEREBRO_EXPERIMENT_ID" >"$LOCK"

stamp=$(date -u +%Y%m%dT%H%M%SZ)
log="$LOG_DIR/nightly-$stamp.log"
if [[ -e $log ]]; then log="$LOG_DIR/nightly-$stamp-$$.log"; fi
ln -sfn "$(basename "$log")" "$LOG_DIR/latest.log"
# rotate: keep the newest $KEEP logs (names sort by time), this one included
: >"$log"
mapfile -t logs < <(find "$LOG_DIR" -maxdepth 1 -name 'nightly-*.log' -printf '%f\n' | sort)
for ((i = 0; i < ${#logs[@]} - KEEP; i++)); do rm -f -- "$LOG_DIR/${logs[i]}"; done

echo "nightly.sh: experiment $CEREBRO_EXPERIMENT_ID, log $log"
for step in "${STEPS[@]}"; do
    started=$SECONDS
    echo "=== $(date -u +%H:%M:%S) $step" >>"$log"
    status=0
    "$HERE/../steps.sh" "$step" >>"$log" 2>&1 || status=$?
    if ((status != 0)); then
        echo "nightly.sh: step $step failed with status $status after $((SECONDS - started)) s;" \
            "see $log" | tee -a "$log"
        exit "$status"
    fi
    echo "nightly.sh: $step done in $((SECONDS - started)) s" | tee -a "$log"
done
echo "nightly.sh: experiment $CEREBRO_EXPERIMENT_ID done" | tee -a "$log"
