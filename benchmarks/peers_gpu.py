"""cerebro-spark against the plain task-parallel job on a GPU machine, without Spark.

Where the Spark peers of ``benchmarks/peers.py`` cannot run (a GPU box with no JVM), this
compares what can: the same grid of ``CNNSpec`` configs trained for the same epochs on the
same prepared Parquet (images of ``--shape``, 10 classes), by

1. **cerebro** -- the real API (:func:`~cerebro_spark.engine.run_experiment`) on
   ``backend: local``: ``--workers`` worker processes spread over the GPUs
   (``device: cuda``), each loading its partitions once; model hopper parallelism;
   checkpoints hop through a local store;
2. **plain** -- the task-parallel job a user writes first, as ``peers.py``'s plain Spark
   job but with processes: ``--workers`` processes (process ``k`` on GPU ``k mod GPUs``)
   take configs from a queue; each task reads the whole training and validation data with
   pyarrow and trains its config for every epoch with the bare loop (seeded permutation,
   ``zero_grad``, forward, cross-entropy, ``backward``, ``step``), validating after each.

Both copy each batch from host memory to the GPU (``features[index].to(device)``), build
the model and optimizer with the same ``CNNSpec`` methods, batch 64, validate in batches of
8192 rows (cerebro: its whole default metric set; plain: accuracy). Runs are interleaved
and paired (repeat ``r`` rotates the order); the wall time of each includes starting its
processes (CUDA initialisation included). Printed: wall seconds (median and range), the
paired ratio to cerebro, bytes of Parquet read, checkpoint bytes moved, and every config's
final validation accuracy.

    python benchmarks/peers_gpu.py --repeats 3 [--rows 100000] [--epochs 3] [--workers 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # the data, the reader and the table helpers

SPEC = "cerebro_spark.training:CNNSpec"
SYSTEMS = ("cerebro", "plain")
CHANNELS = ([16, 32], [32, 64])
LRS = (1e-3, 3e-3)


@dataclasses.dataclass(frozen=True)
class Job:
    """What a plain task needs (pickled to its process)."""

    location: peers.Location
    manifest: str
    configs: tuple[dict[str, Any], ...]
    epochs: int
    seed: int = 0


def configs(batch: int) -> list[dict[str, Any]]:
    """The grid, in cerebro's order (``channels`` outer, ``lr`` inner)."""
    return [
        {"channels": list(c), "lr": lr, "batch_size": batch, "validation_batch_size": 8192}
        for c, lr in itertools.product(CHANNELS, LRS)
    ]


def prepare(rows: int, shape: tuple[int, ...], partitions: int, data_dir: Path) -> Path:
    """Prepare the images once under ``data_dir``; return the dataset directory."""
    from cerebro_spark.data import prepare_dataset

    width = math.prod(shape)
    root = data_dir / f"{rows}x{'x'.join(map(str, shape))}-p{partitions}"
    marker = root / "dataset_id"
    if not marker.exists():
        setting = dataclasses.replace(peers.SETTINGS["quick"], rows=rows, features=width)
        manifest = prepare_dataset(
            peers.make_table(setting),
            str(root),
            features=["features"],
            label="label",
            num_partitions=partitions,
            seed=0,
            feature_shapes={"features": shape},
            source=f"benchmarks/peers_gpu.py {rows}x{shape}",
        )
        marker.write_text(manifest.dataset_id)
    return root / "datasets" / marker.read_text().strip()


def plain_task(job: Job, index: int, device: str) -> dict[str, Any]:
    """Read all the data, train config ``index`` for every epoch on ``device``."""
    import numpy as np
    import torch

    from cerebro_spark.data import Manifest
    from cerebro_spark.training import CNNSpec

    started = time.perf_counter()
    manifest = Manifest.from_json(job.manifest)
    parts = range(manifest.num_partitions)
    x, y, train_bytes = peers.read_split(job.location, job.manifest, "train", parts)
    vx, vy, validation_bytes = peers.read_split(job.location, job.manifest, "validation", parts)
    shape = (-1, *manifest.feature_shape)  # the reader gives flat rows
    x, y = torch.from_numpy(x).reshape(shape), torch.from_numpy(y)
    vx, vy = torch.from_numpy(vx).reshape(shape), torch.from_numpy(vy)
    params = job.configs[index]
    spec = CNNSpec()
    torch.manual_seed(job.seed + index)
    model = spec.build_model(params, manifest.info).to(device)
    optimizer = spec.build_optimizer(model, params)
    rng = np.random.default_rng([job.seed, index])
    accuracy = []
    for _ in range(job.epochs):
        order = torch.from_numpy(rng.permutation(len(x)))
        peers.train_epoch(model, optimizer, x, y, order, params["batch_size"], device)
        accuracy.append(peers.correct(model, vx, vy, device) / len(vx))
    return {
        "index": index,
        "accuracy": accuracy,
        "bytes_read": train_bytes + validation_bytes,
        "seconds": time.perf_counter() - started,
    }


def _plain_process(job: Job, device: str, todo: Any, done: Any) -> None:
    import torch

    torch.set_num_threads(1)
    if device != "cpu":
        torch.cuda.set_device(device)
    while True:
        index = todo.get()
        if index is None:
            return
        try:
            done.put(plain_task(job, index, device))
        except BaseException as error:  # the parent raises it
            done.put(error)
            raise


def plain(job: Job, workers: int, devices: list[str]) -> peers.Outcome:
    context = multiprocessing.get_context("spawn")
    todo, done = context.Queue(), context.Queue()
    for index in range(len(job.configs)):
        todo.put(index)
    started = time.perf_counter()
    processes = [
        context.Process(target=_plain_process, args=(job, devices[k % len(devices)], todo, done))
        for k in range(workers)
    ]
    for process in processes:
        todo.put(None)
        process.start()
    results = [done.get(timeout=3600) for _ in job.configs]
    for result in results:
        if isinstance(result, BaseException):
            raise RuntimeError("a plain task failed") from result
    for process in processes:
        process.join()
    seconds = time.perf_counter() - started
    return peers.Outcome(
        "plain",
        seconds,
        sum(r["bytes_read"] for r in results),
        0,
        0,
        {r["index"]: r["accuracy"][-1] for r in results},
    )


def cerebro(
    dataset: Path,
    job: Job,
    workers: int,
    device: str,
    scratch: Path,
    run: int,
    pack: str | int = "off",
) -> peers.Outcome:
    from cerebro_spark.engine import parse_config, read_events, run_experiment
    from cerebro_spark.store import open_store

    store = scratch / f"run{run}"
    raw = {
        "name": "peers-gpu",
        "seed": 0,
        "store": str(store),
        "data": {"dataset": str(dataset)},
        "procedure": "grid",
        "epochs": job.epochs,
        "workers": workers,
        "backend": "local",
        "device": device,
        "pack": pack,
        "space": {
            "model": SPEC,
            "channels": {"grid": [list(c) for c in CHANNELS]},
            "lr": {"grid": list(LRS)},
            "batch_size": job.configs[0]["batch_size"],
            "validation_batch_size": 8192,
        },
    }
    started = time.perf_counter()
    result = run_experiment(parse_config(raw), experiment_id="peers")
    seconds = time.perf_counter() - started
    events = read_events(open_store(str(store)).child("experiments/peers"))
    devices = sorted({e["device"] for e in events if e["event"] == "worker_joined"})
    if not all(d.startswith(device) for d in devices):
        raise RuntimeError(f"cerebro's workers did not train on a GPU: {devices}")
    accuracy = peers.cerebro_accuracy(events, result.trials, job.configs, "channels")
    read, moved = peers.cerebro_bytes(events)
    return peers.Outcome("cerebro", seconds, read, moved, 0, accuracy)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--shape", default="1,28,28", help="image shape C,H,W")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument(
        "--data-dir", default=os.path.join(tempfile.gettempdir(), "cerebro-peers-gpu-data")
    )
    parser.add_argument("--out", help="also write the report to this file")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument(
        "--pack", default="off", help="cerebro-spark's pack: off, auto or N (default off)"
    )
    given = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(given)
    import torch

    gpus = torch.cuda.device_count()
    if gpus == 0 and args.device == "cuda":
        parser.error("torch sees no GPU here (--device cpu: a smoke run on the CPU)")
    devices = [f"cuda:{g}" for g in range(gpus)] if args.device == "cuda" else ["cpu"]
    shape = tuple(int(n) for n in args.shape.split(","))
    dataset = prepare(args.rows, shape, args.partitions, Path(args.data_dir))
    manifest = (dataset / "manifest.json").read_text()
    job = Job(peers.Location(str(dataset)), manifest, tuple(configs(args.batch)), args.epochs)
    scratch = Path(tempfile.mkdtemp(prefix="cerebro-peers-gpu-"))
    runs: list[dict[str, peers.Outcome]] = []
    for repeat in range(args.repeats):
        run: dict[str, peers.Outcome] = {}
        for system in SYSTEMS[repeat % 2 :] + SYSTEMS[: repeat % 2]:
            if system == "cerebro":
                pack = int(args.pack) if args.pack.isdigit() else args.pack
                run[system] = cerebro(
                    dataset, job, args.workers, args.device, scratch, repeat, pack
                )
            else:
                run[system] = plain(job, args.workers, devices)
            print(f"repeat {repeat + 1} {system}: {run[system].seconds:.1f} s", flush=True)
        runs.append(run)
    size = sum(f.stat().st_size for f in (dataset / "train").iterdir())
    lines = [
        "# benchmarks/peers_gpu.py",
        "",
        f"command: python benchmarks/peers_gpu.py {' '.join(given)}",
        f"{torch.cuda.get_device_name(0) + f' x {gpus}' if args.device == 'cuda' else 'CPU'}; "
        f"torch {torch.__version__}; "
        f"{os.cpu_count()} CPU cores",
        f"{args.rows:,} images of {shape} ({peers._size(size)} of training Parquet, "
        f"{args.partitions} partitions), {len(job.configs)} CNN configs x {args.epochs} epochs, "
        f"batch {args.batch}, {args.workers} workers, cerebro pack: {args.pack}",
        "",
        "| system | wall s median [range] | x cerebro median [range] | data read | ckpt moved |",
        "|---|--:|--:|--:|--:|",
    ]
    for system in SYSTEMS:
        outcomes = [r[system] for r in runs]
        ratios = [r[system].seconds / r["cerebro"].seconds for r in runs]
        lines.append(
            f"| {system} | {peers._spread([o.seconds for o in outcomes], '.1f')} "
            f"| {peers._spread(ratios, '.2f')} "
            f"| {peers._size(statistics.median(o.bytes_read for o in outcomes))} "
            f"| {peers._size(statistics.median(o.checkpoint_bytes for o in outcomes))} |"
        )
    lines += ["", "| config | cerebro | plain |", "|---|--:|--:|"]
    for index, config in enumerate(job.configs):
        cells = [f"{statistics.median(r[s].accuracy[index] for r in runs):.4f}" for s in SYSTEMS]
        lines.append(
            f"| channels {config['channels']}, lr {config['lr']:g} | " + " | ".join(cells) + " |"
        )
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
