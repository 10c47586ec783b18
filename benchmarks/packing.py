"""Packed units (issue 27) against unpacked units: wall time per trial of one unit.

``n`` trials of one architecture with varying learning rates and weight decays (Adam),
one partition, one unit each, as a worker runs them:

* **unpacked**: :func:`~cerebro_spark.training.run_unit` for each trial in a loop;
* **k = 1, 2, 4, 8, 16**: :func:`~cerebro_spark.training.run_pack` over packs of ``k``
  trials (``n / k`` calls);
* **auto**: the ``k`` :func:`~cerebro_spark.training.choose_pack_size` picks from the
  curve :func:`~cerebro_spark.training.pack_throughput` measures on the partition (the
  probe's own time is reported apart: a pre-flight pays it once per architecture).

Both include everything a unit costs: the spec loaded, each trial's checkpoint read
(verified by its digest, as the engine gives it, so the worker's cache answers as when a
trial comes back to the worker that wrote it), models and optimizers built and restored,
the pass, metrics reported, each checkpoint encoded and written (fsync'd) to a local
:class:`~cerebro_spark.store.FileSystemStore`. The trials' first unit (from scratch) is
run first, untimed, to give every trial a checkpoint to start from.

Models: ``mlp``, a tiny MLP (16 features -> 32 ReLU -> 4 classes); ``cnn``, a small CNN
(``CNNSpec``, 8 channels, dense 32, on 1x16x16 images, 4 classes). One torch thread (a
worker's default ``torch_threads``). Run with ``nice -n 19`` on a shared machine; each
variant is repeated ``--repeat`` times and the least wall time kept (the least disturbed).

    nice -n 19 .venv/bin/python benchmarks/packing.py [--trials 16 64] [--models mlp cnn]
        [--rows 4096] [--repeat 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time

import numpy as np
import torch

from cerebro_spark.data import DatasetInfo, PartitionData
from cerebro_spark.store import FileSystemStore
from cerebro_spark.training import choose_pack_size, pack_throughput, run_pack, run_unit
from cerebro_spark.units import UnitKind, UnitResult, UnitTask

MODELS = {
    "mlp": (
        "cerebro_spark.training:MLPSpec",
        {"hidden_units": [32], "batch_size": 64},
        (16,),
    ),
    "cnn": (
        "cerebro_spark.training:CNNSpec",
        {"channels": 8, "dense_units": 32, "batch_size": 64},
        (1, 16, 16),
    ),
}
SIZES = (1, 2, 4, 8, 16)


def partition(shape: tuple[int, ...], rows: int) -> tuple[PartitionData, DatasetInfo]:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, size=rows).astype(np.int64)
    features = rng.normal(size=(rows, *shape)).astype(np.float32)
    features += labels.reshape(-1, *([1] * len(shape))).astype(np.float32) * 0.5
    info = DatasetInfo(feature_shape=shape, task="classification", num_classes=4)
    return PartitionData.from_arrays("train", 0, features, labels, features.nbytes), info


def trial_tasks(spec: str, base: dict, trials: int) -> list[UnitTask]:
    rng = np.random.default_rng(1)
    return [
        UnitTask(
            kind=UnitKind.TRAIN,
            trial_id=f"t{i}",
            spec=spec,
            params={
                **base,
                "lr": float(10 ** rng.uniform(-4, -1)),
                "weight_decay": float(rng.choice([0.0, 1e-4, 1e-2])),
            },
            trial_seed=100 + i,
            epoch=0,
            partition=0,
            checkpoint_out=f"t{i}/e0.pt",
        )
        for i in range(trials)
    ]


def next_units(first: list[UnitTask], results: list[UnitResult], name: str) -> list[UnitTask]:
    return [
        dataclasses.replace(
            task,
            epoch=1,
            checkpoint_in=task.checkpoint_out,
            checkpoint_in_sha256=result.checkpoint_sha256,
            checkpoint_out=f"{task.trial_id}/e1-{name}.pt",
        )
        for task, result in zip(first, results, strict=True)
    ]


def timed(run) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def bench(model: str, trials: int, rows: int, repeat: int) -> list[tuple[str, int, float]]:
    spec, base, shape = MODELS[model]
    data, info = partition(shape, rows)
    first = trial_tasks(spec, base, trials)
    with tempfile.TemporaryDirectory() as root:
        store = FileSystemStore(root)
        results = [run_unit(task, data, store, info) for task in first]
        probe_start = time.perf_counter()
        curve = pack_throughput(first[0], data, info, max_k=16, batches=8)
        probe = time.perf_counter() - probe_start
        auto = choose_pack_size(curve)
        rows_out: list[tuple[str, int, float]] = []
        variants: list[tuple[str, int]] = [("unpacked", 0)]
        variants += [(f"k={k}", k) for k in SIZES if k <= trials]
        variants.append((f"auto (k={auto})", auto))
        best: dict[str, float] = {}
        for rep in range(repeat):
            for name, k in variants:
                tasks = next_units(first, results, f"{name}-{rep}".replace(" ", ""))

                def run(tasks=tasks, k=k) -> None:  # type: ignore[no-untyped-def]
                    if k == 0:
                        for task in tasks:
                            run_unit(task, data, store, info)
                        return
                    for at in range(0, len(tasks), k):
                        out = run_pack(tasks[at : at + k], data, store, info)
                        assert all(isinstance(r, UnitResult) for r in out), out

                seconds = timed(run)
                best[name] = min(best.get(name, float("inf")), seconds)
        for name, k in variants:
            rows_out.append((name, k, best[name]))
    curve_text = ", ".join(f"k={k}: {rate:,.0f}" for k, rate in curve.items())
    print(f"  {model}, {trials} trials: probe {probe:.2f} s, trial rows/s {curve_text}")
    return rows_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"], choices=list(MODELS))
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"packed vs unpacked units: {args.rows} rows, batch 64, one torch thread, "
        f"least of {args.repeat} runs"
    )
    table = []
    for model in args.models:
        for trials in args.trials:
            for name, _, seconds in bench(model, trials, args.rows, args.repeat):
                table.append((model, trials, name, seconds))
    print()
    print(
        f"{'model':<6}{'trials':>7}  {'variant':<14}{'wall s':>9}{'ms/trial':>10}{'speed-up':>10}"
    )
    base: dict[tuple[str, int], float] = {}
    for model, trials, name, seconds in table:
        if name == "unpacked":
            base[(model, trials)] = seconds
        speedup = base[(model, trials)] / seconds
        print(
            f"{model:<6}{trials:>7}  {name:<14}{seconds:>9.2f}"
            f"{1000 * seconds / trials:>10.1f}{speedup:>9.2f}x"
        )


if __name__ == "__main__":
    main()
