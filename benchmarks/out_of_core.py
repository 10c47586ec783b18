"""Out-of-core partitions (issue 25, part 2): a worker over its ``worker_memory``.

Target: with a dataset ``--factor`` (3) times the budget, a worker's peak memory above its
idle baseline is at most budget + model + 256 MiB, and an epoch takes at most 1.3x the
epoch of a worker that holds everything in RAM.

Prepares one dataset of ``uint8`` pixel arrays (``3x32x32``, random, so Parquet does not
compress them: the held bytes are about the file bytes), 10 classes, ``--partitions``
partitions per split, whose held bytes are ``--factor`` x ``--budget-mib``. Then, for
each mode, in a fresh Python process: a :class:`~cerebro_spark.backends.Worker`
imports torch (the idle baseline is its RSS then), loads every partition (timed; peak
RSS above idle), then runs one epoch (timed; peak RSS above idle): one trial's train
units over every partition, chained, then a validation unit per partition. Modes:

* ``in-memory``: ``worker_memory`` far above the dataset;
* ``spilled``: ``worker_memory = --budget-mib``, pages released every 0.05 s while a
  unit reads a spilled partition (the default);
* ``spilled-per-unit``: the same budget, pages released only when a unit ends;
* ``spilled-cold`` (``--cold``, root only): ``spilled`` with the page cache dropped
  after the load, so that the epoch reads the local files from the disk.

Peak RSS is ``VmHWM`` of ``/proc/self/status`` after resetting it
(``/proc/self/clear_refs``), exact and without sampling; the model's bytes are its
parameters and the optimizer's state. Prints one table with the command and the machine.

    python benchmarks/out_of_core.py [--budget-mib 256] [--factor 3] [--partitions 8]
        [--batch-size 256] [--hidden 64] [--cold]

:func:`measure` runs one mode and returns its row (the lead may fold it into
``benchmarks/dl_data.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

SHAPE = (3, 32, 32)
ROW_BYTES = int(np.prod(SHAPE)) + 8  # pixels and the int64 label, as held
MIB = 1 << 20
MODES = ("in-memory", "spilled", "spilled-per-unit", "spilled-cold")


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    """Reset ``VmHWM`` to the current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")


def prepare(directory: Path, budget: int, factor: float, partitions: int) -> str:
    """Write (once) the dataset whose held bytes are ``factor * budget``; return its URI."""
    from cerebro_spark.data import prepare_dataset

    rows = int(factor * budget / ROW_BYTES)
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(rows, int(np.prod(SHAPE))), dtype=np.uint8)
    table = pa.table(
        {
            "x": pa.FixedSizeListArray.from_arrays(pa.array(pixels.reshape(-1)), pixels.shape[1]),
            "y": pa.array(rng.integers(0, 10, rows)),
        }
    )
    manifest = prepare_dataset(
        table,
        str(directory),
        features=["x"],
        label="y",
        num_partitions=partitions,
        seed=0,
        feature_shapes={"x": list(SHAPE)},
    )
    return f"{directory}/datasets/{manifest.dataset_id}"


def measure(
    uri: str, mode: str, budget: int, *, batch_size: int = 256, hidden: int = 64
) -> dict[str, Any]:
    """One mode's load and epoch in this process (call it in a fresh one); its row."""
    from cerebro_spark.backends import Worker, WorkerJob
    from cerebro_spark.data import read_manifest
    from cerebro_spark.store import open_store
    from cerebro_spark.units import UnitKind, UnitTask

    manifest = read_manifest(uri)
    held = sum(p.rows for p in manifest.partitions) * ROW_BYTES
    memory = budget if mode.startswith("spilled") else 1 << 50
    with tempfile.TemporaryDirectory() as scratch:
        store = open_store(f"{scratch}/store")
        worker = Worker(
            "w0",
            WorkerJob(uri, store, torch_threads=1, worker_memory=memory),
            spill_dir=f"{scratch}/local",
        )
        if mode == "spilled-per-unit":
            worker._residence._interval = 1e9  # the release thread waits
        worker.warm_up()
        worker._prepare_torch()  # torch imported: the idle baseline
        idle = _status("VmRSS")
        _reset_peak()
        started = time.perf_counter()
        worker.load(range(manifest.num_partitions))
        load_s = time.perf_counter() - started
        load_peak = _status("VmHWM") - idle
        if mode == "spilled-cold":
            subprocess.run(["sync"], check=True)
            Path("/proc/sys/vm/drop_caches").write_text("1\n")
        _reset_peak()
        params = {"hidden_units": [hidden], "lr": 0.01, "batch_size": batch_size}
        spec = "cerebro_spark.training:MLPSpec"
        previous = None
        started = time.perf_counter()
        parts = list(range(manifest.num_partitions))
        for step, index in enumerate(parts):
            task = UnitTask(
                kind=UnitKind.TRAIN,
                trial_id="t",
                spec=spec,
                params=params,
                trial_seed=1,
                epoch=0,
                partition=index,
                step=step,
                epoch_units=len(parts),
                checkpoint_in=previous,
                checkpoint_out=f"ckpt/s{step}.pt",
            )
            worker.run(task)
            previous = task.checkpoint_out
        for index in parts:
            worker.run(
                UnitTask(
                    kind=UnitKind.VALIDATE,
                    trial_id="t",
                    spec=spec,
                    params=params,
                    trial_seed=1,
                    epoch=0,
                    partition=index,
                    checkpoint_in=previous,
                )
            )
        epoch_s = time.perf_counter() - started
        epoch_peak = _status("VmHWM") - idle
        model = (int(np.prod(SHAPE)) * hidden + hidden + hidden * 10 + 10) * 4
        row = {
            "mode": mode,
            "budget": memory if mode.startswith("spilled") else None,
            "dataset_held": held,
            "in_ram": worker.held_bytes,
            "on_disk": worker.spilled_bytes,
            "bytes_read": worker.bytes_read,
            "file_bytes": sum(p.bytes for p in manifest.partitions),
            "load_s": load_s,
            "epoch_s": epoch_s,
            "load_peak": load_peak,
            "epoch_peak": epoch_peak,
            "model_bytes": 2 * model,  # parameters and SGD momentum
        }
        worker.close()
    return row


def _child(uri: str, mode: str, budget: int, batch_size: int, hidden: int) -> dict[str, Any]:
    command = [
        sys.executable,
        __file__,
        "--child",
        json.dumps([uri, mode, budget, batch_size, hidden]),
    ]
    out = subprocess.run(command, check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / MIB:.0f}"


def main(argv: Sequence[str] | None = None) -> str:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--budget-mib", type=float, default=256)
    parser.add_argument("--factor", type=float, default=3.0)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each mode, interleaved")
    parser.add_argument("--cold", action="store_true", help="add spilled-cold (needs root)")
    parser.add_argument(
        "--data-dir", default=os.path.join(tempfile.gettempdir(), "cerebro-out-of-core")
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        uri, mode, budget, batch_size, hidden = json.loads(args.child)
        row = measure(uri, mode, budget, batch_size=batch_size, hidden=hidden)
        print(json.dumps(row))
        return ""
    budget = int(args.budget_mib * MIB)
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    uri = prepare(Path(args.data_dir), budget, args.factor, args.partitions)
    prepared_s = time.perf_counter() - started
    modes = [m for m in MODES if m != "spilled-cold" or args.cold]
    rows = [
        _child(uri, mode, budget, args.batch_size, args.hidden)
        for _ in range(args.repeat)
        for mode in modes
    ]
    by_mode = {m: [r for r in rows if r["mode"] == m] for m in modes}
    base = statistics.median(r["epoch_s"] for r in by_mode["in-memory"])
    best = min(r["epoch_s"] for r in by_mode["in-memory"])
    lines = [
        "# out_of_core: a worker over its worker_memory (issue 25, part 2)",
        f"# command: python benchmarks/out_of_core.py {shlex.join(argv or sys.argv[1:])}",
        f"# machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
        f"{_mib(os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE'))} MiB RAM, "
        f"Python {platform.python_version()}, torch_threads 1; load average "
        f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after",
        f"# dataset: {rows[0]['dataset_held'] / MIB:.0f} MiB held ({args.factor:g}x the budget "
        f"{args.budget_mib:g} MiB), {args.partitions} partitions per split, uint8 "
        f"{'x'.join(map(str, SHAPE))} rows; prepared (or reused) in {prepared_s:.1f} s; "
        f"MLP hidden {args.hidden}, batch {args.batch_size}",
        f"# {args.repeat} run(s) of each mode, interleaved, each in a fresh process: median "
        "times (range), 'min vs': fastest against fastest; largest peaks;",
        "# peak: VmHWM above the RSS after import torch;",
        "# target: peak <= budget + model + 256 MiB and epoch <= 1.3x in-memory",
        "",
        f"{'mode':<17} {'RAM MiB':>8} {'disk MiB':>8} {'load s':>7} {'epoch s':>17} "
        f"{'vs RAM':>7} {'min vs':>7} {'peak load':>9} {'peak epoch':>10} {'target':>7} "
        f"{'read once':>9}",
    ]
    for mode, runs in by_mode.items():
        r = runs[0]
        epochs = [x["epoch_s"] for x in runs]
        target = None if r["budget"] is None else r["budget"] + r["model_bytes"] + 256 * MIB
        once = all(x["bytes_read"] == x["file_bytes"] for x in runs)
        lines.append(
            f"{mode:<17} {_mib(r['in_ram']):>8} {_mib(r['on_disk']):>8} "
            f"{statistics.median(x['load_s'] for x in runs):>7.2f} "
            f"{statistics.median(epochs):>6.2f} ({min(epochs):.2f}-{max(epochs):.2f}) "
            f"{statistics.median(epochs) / base:>6.2f}x {min(epochs) / best:>6.2f}x "
            f"{_mib(max(x['load_peak'] for x in runs)):>9} "
            f"{_mib(max(x['epoch_peak'] for x in runs)):>10} {_mib(target):>7} "
            f"{'yes' if once else 'NO':>9}"
        )
    table = "\n".join(lines)
    print(table)
    return table


if __name__ == "__main__":
    main()
