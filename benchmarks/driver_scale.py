"""Driver CPU per unit against the number of trials, on the real engine (issue 13).

Runs :class:`~cerebro_spark.engine.Experiment` -- the real driver loop, MOP scheduler
(default rule: work-aware), event log, state fold, checkpoint bookkeeping, leaderboard --
on a backend whose units finish at once, so all the CPU the process spends is the
driver's. Units report heterogeneous times (each trial's cost drawn from Cerebro's CNN
table, each worker's speed from its GPU table, §5.4), so the work-aware rule ranks trials
by unequal, changing estimates. For each number of workers p and trials |S| it prints the
driver's CPU time per unit of one epoch of grid search: the process CPU time
(``time.process_time``) of ``Experiment.run`` less the CPU spent inside the backend's
``submit`` (which stands for the workers; shown apart), the wall time, and the CPU time
``ExperimentState.from_events`` (what ``resume`` and ``leaderboard`` do) takes per event
on the log the run wrote.

P partitions (default 16, for every p): with ``p > P`` each partition is held by ``p / P``
workers (replicas, §5.5), with ``p < P`` each worker holds several. One epoch of |S|
trials is ``2 |S| P`` units (train and validation), so |S| = 10,000 is 320,000 units; the
issue's p = 64 case with 64 partitions: ``--workers 64 --partitions 64``. An untimed
warm-up run of 4 trials comes first: what a process pays once (the modules plotly imports
when the report draws its first figure) is not a cost per unit of the first case.

    python benchmarks/driver_scale.py            # p in {2, 64, 256}, |S| in {64, 1024, 10000}
    python benchmarks/driver_scale.py --quick    # p in {2, 64}, |S| in {64, 256}
    python benchmarks/driver_scale.py --out benchmarks/results/driver_scale.txt

``--real``: the same measure on real runs instead (issue 13's "a real run of 1,024 tiny
trials whose driver CPU per unit is compared with a run of 64"): ``run_experiment`` on the
local backend, 2 worker processes (real spawned workers, real torch, real checkpoints on
local disk), a tiny MLP (64 -> 8 -> 10) on sklearn's digits in P = 2 partitions, one epoch
of grid search. The driver's CPU is the process CPU time (``time.process_time``) of this
process, which runs the driver only: the workers are other processes. A warm-up run of 4
trials first prepares the dataset and imports what the driver imports, so the timed runs
pay neither.

    python benchmarks/driver_scale.py --real                      # |S| in {64, 1024}
    python benchmarks/driver_scale.py --real --trials 64 256 --partitions 4
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import itertools
import logging
import tempfile
import time
import zlib
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import cerebro_spark.report  # noqa: F401  # imported before timing: a one-off, not per unit
from cerebro_spark.backends import Backend, Membership, WorkerChange, WorkerInfo, WorkerJob
from cerebro_spark.data import read_manifest
from cerebro_spark.driver import Experiment, experiment_prefix
from cerebro_spark.driver._preflight import preflight
from cerebro_spark.driver._state import ExperimentState
from cerebro_spark.engine import ExperimentConfig, ExperimentResult, parse_config, read_events
from cerebro_spark.mop import CNN_MFLOPS, GPU_TFLOPS
from cerebro_spark.store import Store, open_store
from cerebro_spark.units import UnitKind, UnitResult, UnitTask

COSTS = sorted(CNN_MFLOPS.values())
SPEEDS = sorted(GPU_TFLOPS.values())
ROWS = 100


class InstantBackend(Backend):
    """``p`` workers whose units finish at once, reporting heterogeneous unit times.

    Worker ``i`` holds partitions ``i, i + p, ...`` (``p <= P``) or ``i mod P``. A unit
    of trial ``t`` on worker ``w`` takes ``cost(t) / speed(w)`` (ms; validation a
    quarter of that); a train unit's checkpoint is written only at the trial's last step
    of the epoch (the one ``best.pt`` may be copied from), so no checkpoint I/O is timed.
    """

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers
        self.held: dict[str, frozenset[int]] = {}
        self.changed: list[WorkerChange] = []
        self.store: Store | None = None
        self.speeds = {
            f"w{i}": SPEEDS[zlib.crc32(f"w{i}".encode()) % len(SPEEDS)] for i in range(num_workers)
        }
        self.costs: dict[str, float] = {}
        self.cpu = 0.0
        """Process CPU seconds spent in :meth:`submit` (the workers' part, not the driver's)."""

    def start(self, job: WorkerJob, **placement: Any) -> None:
        self.store = job.store
        count = read_manifest(job.dataset_uri).num_partitions
        n = self.num_workers
        for i in range(n):
            held = frozenset(range(i, count, n)) if n <= count else frozenset({i % count})
            worker = f"w{i}"
            self.held[worker] = held
            self.changed.append(WorkerChange(Membership.JOINED, WorkerInfo(worker, frozenset())))
            self.changed.append(WorkerChange(Membership.READY, WorkerInfo(worker, held)))

    def workers(self) -> dict[str, WorkerInfo]:
        return {w: WorkerInfo(w, held) for w, held in self.held.items()}

    def changes(self) -> list[WorkerChange]:
        changed, self.changed = self.changed, []
        return changed

    def retire(self, worker_id: str) -> Future[None]:
        raise ValueError("the instant backend retires nobody")

    def submit(self, worker_id: str, task: UnitTask) -> Future[UnitResult]:
        started = time.process_time()
        try:
            return self._submit(worker_id, task)
        finally:
            self.cpu += time.process_time() - started

    def _submit(self, worker_id: str, task: UnitTask) -> Future[UnitResult]:
        if task.partition not in self.held.get(worker_id, ()):
            raise ValueError(f"worker {worker_id} lacks partition {task.partition}")
        cost = self.costs.get(task.trial_id)
        if cost is None:
            cost = self.costs[task.trial_id] = COSTS[zlib.crc32(task.trial_id.encode()) % 35]
        seconds = cost / self.speeds[worker_id] / 1000.0
        sha = None
        if task.kind is UnitKind.TRAIN:
            if task.step == task.epoch_units - 1 and task.checkpoint_out is not None:
                assert self.store is not None
                blob = f"{task.trial_id}:{task.epoch}".encode()
                path = Path(self.store.path(task.checkpoint_out))  # type: ignore[attr-defined]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(blob)  # not Store.put: its fsync is the workers' cost
                sha = hashlib.sha256(blob).hexdigest()
        else:
            seconds /= 4
        loss = cost / 1000.0 * (1 + task.epoch)
        future: Future[UnitResult] = Future()
        future.set_result(
            UnitResult(
                task=task,
                worker_id=worker_id,
                rows=ROWS,
                seconds=seconds,
                metric_sums={"loss": loss * ROWS},
                checkpoint_bytes=len(task.trial_id) if sha else 0,
                checkpoint_sha256=sha,
            )
        )
        return future

    def submit_group(self, assignments: Mapping[str, UnitTask]) -> dict[str, Future[UnitResult]]:
        raise ValueError("the instant backend runs no group units")

    def close(self) -> None:
        pass


def config(root: Path, workers: int, trials: int, partitions: int, epochs: int) -> ExperimentConfig:
    return parse_config(
        {
            "name": "driver-scale",
            "seed": 13,
            "store": str(root),
            "data": {"source": "sklearn:digits", "partitions": partitions},
            "procedure": "grid",
            "epochs": epochs,
            "metric": "loss",
            "mode": "min",
            "workers": workers,
            "model": "cerebro_spark.training:MLPSpec",
            "space": {"lr": {"grid": [round(1e-4 * (i + 1), 6) for i in range(trials)]}},
        }
    )


def measure(
    root: Path, workers: int, trials: int, partitions: int, epochs: int
) -> dict[str, float]:
    """Run one case; return its units, CPU and wall per unit, and the fold per event."""
    cfg = config(root, workers, trials, partitions, epochs)
    store = open_store(cfg.store)
    checked = preflight(cfg, store)  # dataset and model family: not the driver loop
    name = f"p{workers}-s{trials}-P{partitions}-e{epochs}"
    backend = InstantBackend(workers)
    experiment = Experiment(checked.config, store, name, lambda c: backend, preflight=checked)
    gc.collect()
    cpu, wall = time.process_time(), time.perf_counter()
    experiment.run()
    cpu, wall = time.process_time() - cpu - backend.cpu, time.perf_counter() - wall
    events = read_events(store.child(experiment_prefix(name)))
    units = sum(1 for e in events if e["event"] == "unit_end")
    assert units == 2 * trials * partitions * epochs, (units, trials, partitions)
    gc.collect()
    fold = time.process_time()
    state = ExperimentState.from_events(events)
    fold = time.process_time() - fold
    assert state.finished and len(state.trials) == trials
    return {
        "units": units,
        "cpu_ms": cpu / units * 1e3,
        "wall_ms": wall / units * 1e3,
        "cpu_s": cpu,
        "backend_ms": backend.cpu / units * 1e3,
        "events": len(events),
        "fold_us": fold / len(events) * 1e6,
    }


def real_config(root: Path, trials: int, partitions: int) -> ExperimentConfig:
    """A real grid search of ``trials`` tiny MLPs on 2 local worker processes, one epoch."""
    return parse_config(
        {
            "name": "driver-real",
            "seed": 13,
            "store": str(root),
            "data": {"source": "sklearn:digits", "partitions": partitions},
            "procedure": "grid",
            "epochs": 1,
            "metric": "loss",
            "mode": "min",
            "workers": 2,
            "backend": "local",
            "torch_threads": 1,
            "model": "cerebro_spark.training:MLPSpec",
            "space": {
                "hidden_units": [8],
                "batch_size": 256,
                "lr": {"grid": [round(1e-4 * (i + 1), 6) for i in range(trials)]},
            },
        }
    )


def measure_real(root: Path, trials: int, partitions: int) -> dict[str, float]:
    """Run one real experiment; return its units and driver CPU and wall per unit."""
    from cerebro_spark.engine import run_experiment

    cfg = real_config(root, trials, partitions)
    gc.collect()
    cpu, wall = time.process_time(), time.perf_counter()
    result = run_experiment(cfg, experiment_id=f"real-s{trials}-P{partitions}")
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    events = read_events(store_of(result))
    units = sum(1 for e in events if e["event"] == "unit_end")
    assert units == 2 * trials * partitions, (units, trials, partitions)
    unit_seconds = sum(float(e["seconds"]) for e in events if e["event"] == "unit_end")
    return {
        "units": units,
        "cpu_ms": cpu / units * 1e3,
        "wall_ms": wall / units * 1e3,
        "cpu_s": cpu,
        "wall_s": wall,
        "unit_ms": unit_seconds / units * 1e3,
    }


def store_of(result: ExperimentResult) -> Store:
    """The experiment directory of a :class:`~cerebro_spark.engine.ExperimentResult`."""
    return result.store.child(experiment_prefix(result.experiment_id))


def main_real(trials: Sequence[int], partitions: int, out: Path | None) -> str:
    """``--real``: driver CPU per unit of real runs of each size in ``trials``."""
    lines = [
        "Driver CPU per unit of real runs (run_experiment, local backend, 2 worker processes,",
        f"MLP 64 -> 8 -> 10 on digits, P = {partitions}, one epoch of grid search); the workers'",
        "CPU is in other processes and not counted.",
        "",
        "|    |S| |   P |  units | driver CPU ms/unit | wall ms/unit | unit ms (mean) "
        "| driver CPU s | wall s | driver load (cores) |",
        "|-------:|----:|-------:|-------------------:|-------------:|---------------:"
        "|-------------:|-------:|--------------------:|",
    ]
    print("\n".join(lines), flush=True)
    rows = {}
    with tempfile.TemporaryDirectory(prefix="driver-real-") as tmp:
        measure_real(Path(tmp), 4, partitions)  # warm-up: the dataset, the driver's imports
        for s in trials:
            r = rows[s] = measure_real(Path(tmp), s, partitions)
            line = (
                f"| {s:>6} | {partitions:>3} | {r['units']:>6,.0f} | {r['cpu_ms']:>18.3f} | "
                f"{r['wall_ms']:>12.2f} | {r['unit_ms']:>14.2f} | {r['cpu_s']:>12.2f} | "
                f"{r['wall_s']:>6.1f} | {r['cpu_s'] / r['wall_s']:>19.3f} |"
            )
            lines.append(line)
            print(line, flush=True)
    first, last = rows[trials[0]], rows[trials[-1]]
    lines += [
        "",
        f"driver CPU per unit at |S| = {trials[-1]} is {last['cpu_ms'] / first['cpu_ms']:.2f}x "
        f"that at |S| = {trials[0]}",
    ]
    marginal = (last["cpu_s"] - first["cpu_s"]) / (last["units"] - first["units"]) * 1e3
    lines.append(
        f"marginal driver CPU per unit from |S| = {trials[0]} to {trials[-1]}: "
        f"{marginal:.3f} ms (the start-up both runs pay taken out)"
    )
    print("\n".join(lines[-2:]))
    text = "\n".join(lines) + "\n"
    if out is not None:
        out.write_text(text)
    return text


def main(argv: Sequence[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small cases (CI-sized)")
    parser.add_argument("--workers", type=int, nargs="*", help="values of p")
    parser.add_argument("--trials", type=int, nargs="*", help="values of |S|")
    parser.add_argument("--partitions", type=int, help="P (default 16; --real: 2)")
    parser.add_argument("--real", action="store_true", help="real runs on 2 local workers")
    parser.add_argument("--epochs", type=int, default=1, help="epochs per trial (default 1)")
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    args = parser.parse_args(argv)
    logging.getLogger("cerebro_spark").setLevel(logging.WARNING)
    if args.real:
        return main_real(args.trials or [64, 1024], args.partitions or 2, args.out)
    workers = args.workers or ([2, 64] if args.quick else [2, 64, 256])
    trials = args.trials or ([64, 256] if args.quick else [64, 1024, 10000])
    lines = [
        "Driver CPU per unit (process CPU time / units) of one epoch of grid search on the",
        "real engine with an instant backend; work-aware rule, heterogeneous unit times.",
        "",
        "|   p |    |S| |   P |     units | driver CPU ms/unit | backend CPU ms/unit "
        "| wall ms/unit | driver CPU s | fold CPU µs/event |",
        "|----:|-------:|----:|----------:|-------------------:|--------------------:"
        "|-------------:|-------------:|------------------:|",
    ]
    print("\n".join(lines), flush=True)
    rows: dict[tuple[int, int], dict[str, float]] = {}
    partitions = args.partitions or 16
    with tempfile.TemporaryDirectory(prefix="driver-scale-") as tmp:
        measure(Path(tmp) / "warm-up", workers[0], 4, partitions, args.epochs)  # one-offs
        for p, s in itertools.product(workers, trials):
            r = rows[p, s] = measure(Path(tmp), p, s, partitions, args.epochs)
            line = (
                f"| {p:>3} | {s:>6} | {partitions:>3} | {r['units']:>9,.0f} | "
                f"{r['cpu_ms']:>18.4f} | {r['backend_ms']:>19.4f} | {r['wall_ms']:>12.4f} | "
                f"{r['cpu_s']:>12.1f} | {r['fold_us']:>17.2f} |"
            )
            lines.append(line)
            print(line, flush=True)
    lines.append("")
    for p in workers:
        first, last = rows[p, trials[0]], rows[p, trials[-1]]
        ratio = last["cpu_ms"] / first["cpu_ms"]
        lines.append(
            f"p = {p}: CPU per unit at |S| = {trials[-1]} is {ratio:.2f}x that at "
            f"|S| = {trials[0]}; fold per event {last['fold_us'] / first['fold_us']:.2f}x"
        )
    worst = max(r["cpu_ms"] for r in rows.values())
    lines.append(f"worst driver CPU per unit: {worst:.4f} ms")
    text = "\n".join(lines) + "\n"
    print("\n".join(lines[-len(workers) - 1 :]))
    if args.out is not None:
        args.out.write_text(text)
    return text


if __name__ == "__main__":
    main()
