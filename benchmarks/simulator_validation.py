"""The MOP epoch model against measured runs, then its prediction at scale (issue 13, part 6).

**Validation.** For each Spark master (default ``local[2]`` and ``local-cluster[2,1,1024]``,
the Spark backend, 2 workers) two real runs of an MLP grid search on sklearn's digits
(two hidden layers of :data:`HIDDEN` units, batch 16: train units of about 0.17 s on an
idle core; with 256 units they were 25-35 ms, so short that the jitter of each unit's
dispatch and of each round's decisions, not the model, set the error):

* run A: 6 trials, P = 4, 3 epochs;
* run B: 10 trials, P = 4, 3 epochs (another config).

The overheads (:func:`~cerebro_spark.simulate.measure_overheads`: compute, hop, dispatch,
start-up, round) are fitted on one run and the model
(:func:`~cerebro_spark.simulate.predict_epoch`) predicts epochs it did not see: fitted on
run A's epochs 2 and 3, every epoch of run B (another config); fitted on run B's first
epoch, its second and third (the next epochs). Run A's first epoch is the first a fresh
cluster runs: its train units are about a third slower on this machine (the warm-up of new
JVMs and worker processes; run B, on the same processes, does not show it). It is printed
beside the fit, and paid once a run like start-up, not modelled as an epoch. Each epoch is
predicted twice: strict (every input
from the fit) and speed-corrected (the fit scaled to the machine's speed during the
predicted epoch -- its mean train compute over the fit's -- since on a shared machine the
speed changes between runs and that is no part of the model). Driver CPU per unit is the
driver process's CPU (``time.process_time``: Spark's JVM and the workers are other
processes) from the first fitted round's ``round_start`` to the last one's ``round_end``
(the report's refreshes between them included), divided by their units. Each master
runs in its own Python process (one SparkContext each).

**At scale.** With the overheads fitted on ``local-cluster`` (the Spark backend with
executors in their own JVMs), the predicted epoch makespan and driver load at p in {64,
256, 1024} workers, |S| = 1,024 trials, P = 64 partitions (p > P: each partition has p / P
replicas), for the measured tiny unit and for a unit of 1 s compute (a real model; same
hop and dispatch), with each driver CPU per unit of ``--driver-cpu-ms`` (default 0.2 ms:
the bound ``benchmarks/driver_scale.py`` checks on an instant backend; give also the
marginal one of ``driver_scale.py --real``, a real backend's control protocol included)
and with the one measured on the local-cluster run (its few units carry the run's fixed
work: an upper bound).

    python benchmarks/simulator_validation.py
    python benchmarks/simulator_validation.py --out benchmarks/results/simulator_validation.txt
    python benchmarks/simulator_validation.py --quick     # local[2] only, no table at p = 1024
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cerebro_spark.driver import Experiment, experiment_prefix
from cerebro_spark.driver._preflight import preflight
from cerebro_spark.engine import default_backend, parse_config, read_events
from cerebro_spark.simulate import (
    UnitOverheads,
    measure_overheads,
    predict_epoch,
    round_makespans,
)
from cerebro_spark.store import open_store

RUNS = {"A": (6, 3), "B": (10, 3)}
"""Run name -> (trials, epochs)."""
PARTITIONS = 4
HIDDEN = [1024, 1024]
"""Hidden layer widths of the MLPs searched (the compute of a unit)."""
WORKERS = 2


def config(root: Path, master: str, trials: int, epochs: int) -> Any:
    """A small MLP grid search on the Spark backend."""
    return parse_config(
        {
            "name": "simval",
            "seed": 7,
            "store": str(root),
            "data": {"source": "sklearn:digits", "partitions": PARTITIONS},
            "procedure": "grid",
            "epochs": epochs,
            "metric": "loss",
            "mode": "min",
            "workers": WORKERS,
            "backend": "spark",
            "spark": {"master": master, "conf": {"spark.ui.enabled": "false"}},
            "torch_threads": 1,
            "model": "cerebro_spark.training:MLPSpec",
            "space": {
                "hidden_units": HIDDEN,
                "batch_size": 16,
                "lr": {"grid": [round(1e-3 * (i + 1), 6) for i in range(trials)]},
            },
        }
    )


def run_master(master: str, root: Path) -> dict[str, Any]:
    """Run A and B on ``master``; return their event logs and the driver CPU at each round.

    The real engine (``Experiment.run``, as ``run_experiment`` runs it) with an event-log
    listener that reads the process CPU time at each ``round_start`` and ``round_end``: the
    driver's CPU over any rounds, without the Spark session's and the workers' start-up.
    """
    store = open_store(str(root))
    logs: dict[str, Any] = {}
    cpu: dict[str, dict[str, dict[int, float]]] = {}
    for name, (trials, epochs) in RUNS.items():
        checked = preflight(config(root, master, trials, epochs), store)
        experiment_id = f"{name}-{int(time.time())}"
        experiment = Experiment(
            checked.config, store, experiment_id, default_backend, preflight=checked
        )
        marks: dict[str, dict[int, float]] = {"start": {}, "end": {}}

        def listen(event: dict[str, Any], marks: dict[str, dict[int, float]] = marks) -> None:
            if event["event"] in ("round_start", "round_end"):
                marks[event["event"].split("_")[1]][event["round"]] = time.process_time()

        experiment.log.listeners.append(listen)
        experiment.run()
        logs[name] = list(read_events(store.child(experiment_prefix(experiment_id))))
        cpu[name] = marks
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    if session is not None:
        session.stop()  # before the interpreter exits: no executor relaunched mid-shutdown
    return {"master": master, "logs": logs, "cpu_rounds": cpu}


FITS = (("A", [1, 2], "B", None), ("B", [0], "B", [1, 2]))
"""(run fitted on, its rounds, run predicted, its rounds (None: all)): another config; the
next epochs of the same run."""


def _driver_cpu(measured: dict[str, Any], run: str, rounds: Sequence[int]) -> float:
    """The driver's CPU seconds per unit over ``rounds`` of ``run`` (consecutive)."""
    marks = measured["cpu_rounds"][run]
    start, end = marks["start"][str(rounds[0])], marks["end"][str(rounds[-1])]
    units = sum(
        1 for e in measured["logs"][run] if e["event"] == "unit_end" and e["round"] in rounds
    )
    return float(end - start) / units


def _cold_epoch(logs: Sequence[dict[str, Any]]) -> str:
    """Run A's first epoch against its later ones: mean train compute (the warm-up)."""
    first = measure_overheads(logs, rounds=[0]).train_seconds
    later = measure_overheads(logs, rounds=[1, 2]).train_seconds
    return (
        f"cold first epoch of the cluster (run A, epoch 1): train {first * 1e3:.1f} ms a unit "
        f"against {later * 1e3:.1f} ms in epochs 2-3 ({first / later - 1:+.0%}), not fitted"
    )


def validate(measured: dict[str, Any]) -> tuple[list[str], UnitOverheads, float, list[float]]:
    """Fit and predict as :data:`FITS` says; return table lines, run A's fit and errors.

    Two predictions of each epoch: *strict*, every input from the fit; *speed-corrected*,
    the fit run on a machine as fast as it was during the predicted epoch (the epoch's
    mean train compute over the fit's, :meth:`UnitOverheads.slower`): on a machine
    shared with other jobs the speed changes between runs, and that is not the model's
    to predict. The errors returned are the speed-corrected ones.
    """
    logs = measured["logs"]
    master = measured["master"]
    lines = []
    rows = []
    errors = []
    fits = {}
    for fitted, fit_rounds, predicted_run, rounds in FITS:
        fit = measure_overheads(logs[fitted], rounds=fit_rounds)
        driver_cpu = _driver_cpu(measured, fitted, fit_rounds)
        fits[fitted] = (fit, driver_cpu)
        which = "epoch" + (
            f" {fit_rounds[0] + 1}"
            if len(fit_rounds) == 1
            else f"s {fit_rounds[0] + 1}-{fit_rounds[-1] + 1}"
        )
        lines.append(
            f"{master}: fitted on run {fitted} {which}: {fit.describe()}; "
            f"driver CPU {driver_cpu * 1e3:.2f} ms/unit (its rounds)"
        )
        trials = RUNS[predicted_run][0]
        spans = round_makespans(logs[predicted_run])
        for number, span in sorted(spans.items()):
            if rounds is not None and number not in rounds:
                continue
            speed = measure_overheads(logs[predicted_run], rounds=[number]).train_seconds
            factor = speed / fit.train_seconds
            strict, corrected = (
                predict_epoch(
                    overheads,
                    trials=trials,
                    partitions=PARTITIONS,
                    workers=WORKERS,
                    driver_cpu_seconds=driver_cpu,
                ).makespan
                for overheads in (fit, fit.slower(factor))
            )
            errors.append(corrected / span - 1)
            rows.append(
                f"| {master} | {fitted} {which} | {predicted_run} | {trials} | {number + 1} "
                f"| {span:.2f} | {strict:.2f} | {strict / span - 1:+.1%} | {factor:.2f} "
                f"| {corrected:.2f} | {corrected / span - 1:+.1%} |"
            )
    lines += [
        f"{master}: {_cold_epoch(logs['A'])}",
        "",
        "| master | fitted on | run | trials | epoch | measured s | strict s | error "
        "| speed factor | speed-corrected s | error |",
        "|:--|:--|:--|--:|--:|--:|--:|--:|--:|--:|--:|",
        *rows,
    ]
    fit, driver_cpu = fits["A"]
    return lines, fit, driver_cpu, errors


def scale_table(
    fit: UnitOverheads, driver_cpus: Sequence[tuple[str, float]], workers: Sequence[int]
) -> list[str]:
    """Predicted epochs at scale: measured unit and 1 s of compute, for each driver CPU."""
    trials, partitions = 1024, 64
    lines = [
        f"Predicted one epoch at |S| = {trials} trials, P = {partitions} partitions (p > P: "
        "p / P replicas a partition), overheads fitted on local-cluster run A, epochs 2-3: "
        f"{fit.describe()}. No worker lost; start-up ({fit.startup_seconds:.1f} s measured, "
        "paid once a run, workers in parallel) not in the epoch. 'epoch + gap': the "
        "makespan and the measured gap to the next round (EpochPrediction.period).",
        "",
        "| unit compute | driver CPU/unit | p | units | makespan s | bound s | epoch + gap s "
        "| driver CPU s | driver load (cores) | workers busy |",
        "|:--|:--|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    variants = [("measured", fit), ("1 s", fit.with_compute(1.0, 0.25))]
    for label, overheads in variants:
        for cpu_label, cpu in driver_cpus:
            for p in workers:
                r = predict_epoch(
                    overheads,
                    trials=trials,
                    partitions=partitions,
                    workers=p,
                    driver_cpu_seconds=cpu,
                )
                compute = f"{label} ({overheads.train_seconds * 1e3:.0f} ms train)"
                lines.append(
                    f"| {compute} | {cpu * 1e3:.2f} ms ({cpu_label}) | {p} | {r.units:,} "
                    f"| {r.makespan:,.1f} | {r.bound:,.1f} | {r.period:,.1f} "
                    f"| {r.driver_cpu:,.1f} | {r.driver_load:.2f} | {r.worker_busy:.0%} |"
                )
    return lines


def _file_name(master: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in master)


def main(argv: Sequence[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--masters", nargs="*", help="Spark masters to validate on")
    parser.add_argument("--quick", action="store_true", help="local[2] only, p in {64, 256}")
    parser.add_argument(
        "--driver-cpu-ms", type=float, nargs="+", default=[0.2], help="for the table (one or more)"
    )
    parser.add_argument("--out", type=Path, help="also write the text to this file")
    parser.add_argument("--keep", type=Path, help="keep each master's event logs (JSON) here")
    parser.add_argument("--load", type=Path, help="re-analyse the logs --keep kept, run nothing")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one master
    parser.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.getLogger("cerebro_spark").setLevel(logging.WARNING)
    if args.one:
        with tempfile.TemporaryDirectory(prefix="simval-") as tmp:
            args.json.write_text(json.dumps(run_master(args.one, Path(tmp))))
        return ""
    masters = args.masters or (
        ["local[2]"] if args.quick else ["local[2]", "local-cluster[2,1,1024]"]
    )
    lines: list[str] = []
    fits: dict[str, tuple[UnitOverheads, float]] = {}
    errors: list[float] = []
    with tempfile.TemporaryDirectory(prefix="simval-json-") as tmp:
        for master in masters:
            out = (args.load or args.keep or Path(tmp)) / f"{_file_name(master)}.json"
            if args.load is None:
                out.parent.mkdir(parents=True, exist_ok=True)
                command = [sys.executable, __file__, "--one", master, "--json", str(out)]
                subprocess.run(command, check=True, env=os.environ.copy())
            found, fit, cpu, errs = validate(json.loads(out.read_text()))
            fits[master] = (fit, cpu)
            errors += errs
            lines += [*found, ""]
            print("\n".join(found), flush=True)
    worst = max(abs(e) for e in errors)
    lines.append(
        f"largest speed-corrected prediction error: {worst:.1%} over {len(errors)} epochs "
        "not fitted on"
    )
    lines.append("")
    fit, measured_cpu = fits.get("local-cluster[2,1,1024]", fits[masters[-1]])
    cpus = [*(("given", ms / 1e3) for ms in args.driver_cpu_ms), ("measured here", measured_cpu)]
    table = scale_table(fit, cpus, [64, 256] if args.quick else [64, 256, 1024])
    lines += table
    print("\n".join(lines[-len(table) - 2 :]), flush=True)
    text = "\n".join(lines) + "\n"
    if args.out is not None:
        args.out.write_text(text)
    return text


if __name__ == "__main__":
    main()
