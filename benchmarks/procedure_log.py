"""The event log of an asynchronous search against its number of trials (issue 29, part 2).

ASHA's state grows with its trials (its rungs), and ``round_start``/``round_end`` carry
it: logged whole at every round, the log grew quadratically (633 B of state at round 1,
17 KB at round 500; 8.9 of a 15.1 MB log at 600 trials). The driver now logs snapshots
and deltas (:mod:`cerebro_spark.driver._state_delta`). For ASHA searches of 100, 1,000 and
5,000 trials on the real driver with units that finish at once (``driver_scale.py``'s
instant backend: 16 workers, 4 partitions), this prints per trial: the log's bytes, the
bytes of procedure state in it, what the state would weigh as a snapshot at every round
event (the old log, computed from the same run's states), the process's resident memory right
after the run (``VmRSS``, before this script reads the log back; cases run smallest first
in one process) and the time ``ExperimentState.from_events`` takes to fold the log (what
``resume`` and ``leaderboard`` do).

    python benchmarks/procedure_log.py
    python benchmarks/procedure_log.py --trials 100 1000 --out benchmarks/results/procedure_log.txt
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from driver_scale import InstantBackend

from cerebro_spark.driver import Experiment, experiment_prefix
from cerebro_spark.driver._preflight import preflight
from cerebro_spark.driver._state import ExperimentState
from cerebro_spark.driver._state_delta import apply_delta
from cerebro_spark.engine import parse_config, read_events
from cerebro_spark.store import open_store

WORKERS, PARTITIONS = 16, 4


def measure(root: Path, trials: int) -> dict[str, float]:
    """Run one ASHA search of ``trials`` trials; return its log's numbers."""
    config = parse_config(
        {
            "name": "procedure-log",
            "seed": 29,
            "store": str(root),
            "data": {"source": "sklearn:digits", "partitions": PARTITIONS},
            "procedure": {"name": "asha", "num_trials": trials, "eta": 3, "min_epochs": 1},
            "epochs": 9,
            "metric": "loss",
            "mode": "min",
            "workers": WORKERS,
            "model": "cerebro_spark.training:MLPSpec",
            "space": {"lr": {"loguniform": [1e-4, 1e-1]}},
        }
    )
    store = open_store(config.store)
    checked = preflight(config, store)
    name = f"asha-{trials}"
    backend = InstantBackend(WORKERS)
    started = time.perf_counter()
    experiment_run = Experiment(checked.config, store, name, lambda c: backend, preflight=checked)
    experiment_run.run()
    seconds = time.perf_counter() - started
    del experiment_run
    gc.collect()
    rss = _rss_mib()  # the driver's, before this benchmark reads the whole log
    experiment = store.child(experiment_prefix(name))
    log_bytes = sum(len(experiment.get(k)) for k in experiment.list() if k.startswith("events"))
    events = read_events(experiment)
    state_bytes = snapshot_bytes = 0
    current = None
    for event in events:
        if "procedure_state" in event:
            current = event["procedure_state"]
            state_bytes += len(json.dumps(current, separators=(",", ":")))
        elif "procedure_state_delta" in event:
            delta = event["procedure_state_delta"]
            state_bytes += len(json.dumps(delta, separators=(",", ":")))
            current = apply_delta(current, delta)
        else:
            continue
        snapshot_bytes += len(json.dumps(current, separators=(",", ":")))
    fold = time.process_time()
    state = ExperimentState.from_events(events)
    fold = time.process_time() - fold
    assert state.finished and len(state.trials) == trials, (state.finished, len(state.trials))
    return {
        "rounds": sum(e["event"] == "round_end" for e in events),
        "log_per_trial": log_bytes / trials,
        "state_per_trial": state_bytes / trials,
        "snapshots_per_trial": snapshot_bytes / trials,
        "rss_mib": rss,
        "fold_s": fold,
        "run_s": seconds,
    }


def _rss_mib() -> float:
    """This process's resident memory now (``VmRSS``), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: Sequence[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, nargs="*", default=[100, 1000, 5000])
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    args = parser.parse_args(argv)
    lines = [
        f"ASHA (eta 3, epochs 1..9), {WORKERS} instant workers, {PARTITIONS} partitions",
        "",
        "| trials | rounds | log B/trial | state B/trial | state as snapshots B/trial "
        "| RSS after run MiB | fold s | run s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory(prefix="procedure-log-") as tmp:
        measure(Path(tmp), 4)  # warm-up: the dataset and one-off imports
        for trials in sorted(args.trials):
            row = measure(Path(tmp), trials)
            line = (
                f"| {trials:,} | {row['rounds']:,.0f} | {row['log_per_trial']:,.0f} "
                f"| {row['state_per_trial']:,.0f} | {row['snapshots_per_trial']:,.0f} "
                f"| {row['rss_mib']:,.0f} | {row['fold_s']:.2f} | {row['run_s']:.1f} |"
            )
            lines.append(line)
            print(line, flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    return text


if __name__ == "__main__":
    main()
