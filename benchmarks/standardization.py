"""The built-in MLP on raw tabular data, with and without standardization.

For each of scikit-learn's bundled tabular datasets, prepared as a user would (no
scaling), trains the built-in ``MLPSpec`` with the default ``standardize: true`` and with
``standardize: false`` (the model of earlier versions), over several trial seeds, by real
training units over the dataset's partitions (MOP visit orders), and prints the validation
accuracy (classification) or RMSE (regression):

    python benchmarks/standardization.py --epochs 5 --seeds 1,2,3
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile

import numpy as np

from cerebro_spark.data import load_source, prepare_dataset, read_partition
from cerebro_spark.store import open_store
from cerebro_spark.training import run_unit
from cerebro_spark.units import UnitKind, UnitTask

SOURCES = ("sklearn:breast_cancer", "sklearn:wine", "sklearn:iris", "sklearn:diabetes")


def train(store, info, parts, params, seed, epochs, trial):
    key = None
    for epoch in range(epochs):
        order = np.random.default_rng([seed, epoch]).permutation(len(parts))
        for step, index in enumerate(order):
            task = UnitTask(
                kind=UnitKind.TRAIN,
                trial_id=trial,
                spec="cerebro_spark.training:MLPSpec",
                params=params,
                trial_seed=seed,
                epoch=epoch,
                partition=int(index),
                step=step,
                epoch_units=len(parts),
                checkpoint_in=key,
                checkpoint_out=f"{trial}/e{epoch}s{step}.pt",
            )
            run_unit(task, parts[int(index)], store, info)
            key = task.checkpoint_out
    return key


def score(store, info, validation, params, seed, key, trial, task_kind):
    sums, rows = 0.0, 0
    for index, part in enumerate(validation):
        task = UnitTask(
            kind=UnitKind.VALIDATE,
            trial_id=trial,
            spec="cerebro_spark.training:MLPSpec",
            params=params,
            trial_seed=seed,
            epoch=0,
            partition=index,
            checkpoint_in=key,
        )
        result = run_unit(task, part, store, info)
        metric = "accuracy" if task_kind == "classification" else "loss"
        sums += result.metric_sums[metric]
        rows += result.rows
    value = sums / rows
    return value if task_kind == "classification" else math.sqrt(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--partitions", type=int, default=2)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    root = tempfile.mkdtemp(prefix="cerebro-standardize-")
    store = open_store(f"{root}/checkpoints")
    print(f"MLPSpec hidden_units=[64] lr={args.lr} epochs={args.epochs} seeds={seeds}")
    print(f"{'dataset':<24}{'metric':<10}{'standardize: true':>26}{'standardize: false':>26}")
    for source in SOURCES:
        table, meta = load_source(source)
        manifest = prepare_dataset(
            table,
            root,
            features=meta["features"],
            label=meta["label"],
            num_partitions=args.partitions,
            seed=0,
        )
        uri = f"{root}/datasets/{manifest.dataset_id}"
        parts = [read_partition(uri, "train", i, manifest=manifest) for i in range(args.partitions)]
        validation = [
            read_partition(uri, "validation", i, manifest=manifest) for i in range(args.partitions)
        ]
        cells = []
        for standardize in (True, False):
            params = {"hidden_units": [64], "lr": args.lr, "standardize": standardize}
            values = []
            for seed in seeds:
                trial = f"{source.split(':')[1]}-{standardize}-{seed}"
                key = train(store, manifest.info, parts, params, seed, args.epochs, trial)
                values.append(
                    score(store, manifest.info, validation, params, seed, key, trial, manifest.task)
                )
            cells.append(f"{statistics.mean(values):.3f} ({min(values):.3f}-{max(values):.3f})")
        metric = "accuracy" if manifest.task == "classification" else "rmse"
        print(f"{source:<24}{metric:<10}{cells[0]:>26}{cells[1]:>26}")


if __name__ == "__main__":
    main()
