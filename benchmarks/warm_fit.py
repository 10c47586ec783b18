"""A second ``Tuner.fit`` in one session: cold against warm workers (issue 30, part 6).

In one Spark session (``local[2]``; ``--backend local``: worker processes, no Spark), a
Tuner fits a small search ``--fits`` times on one prepared dataset (digits, or ``--rows``
random rows of 64 float features and 10 classes; 2 partitions, 2 workers, 2 MLPs, 1
epoch). The first fit starts its workers; with ``warm_workers`` (the
Tuner's default, 120 s) the next fits take them, their partitions loaded; with
``warm_workers=0`` every fit starts its own. Printed per fit: the seconds from calling
``fit`` to its first training unit (start-up: the pre-flight, the workers, their
partitions) and to its return.

    python benchmarks/warm_fit.py [--backend spark|local] [--fits 3] [--rows N]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from cerebro_spark.data import load_source, prepare_dataset
from cerebro_spark.engine import read_events, release_workers
from cerebro_spark.search import Grid
from cerebro_spark.store import open_store
from cerebro_spark.tuner import Tuner

SPACE = {
    "model": "cerebro_spark.training:MLPSpec",
    "hidden_units": [32],
    "lr": Grid([0.003, 0.01]),
    "batch_size": 64,
}


def first_unit_seconds(store: str, experiment_id: str, called: float) -> float:
    events = read_events(open_store(store).child(f"experiments/{experiment_id}"))
    first = min(e["time"] for e in events if e["event"] == "unit_start" and e["kind"] == "train")
    return float(first) - called


def source(rows: int) -> pa.Table:
    """Digits (``rows`` 0), else ``rows`` seeded random rows of 64 features, 10 classes."""
    if rows == 0:
        table, _ = load_source("sklearn:digits")
        return table
    rng = np.random.default_rng(0)
    features = rng.standard_normal((rows, 64), dtype=np.float32)
    columns = {f"x{i}": features[:, i] for i in range(64)}
    return pa.table({**columns, "label": rng.integers(0, 10, rows)})


def fits(
    backend: str, warm: float, count: int, root: Path, label: str, rows: int
) -> list[tuple[Any, ...]]:
    store = str(root / label)
    table = source(rows)
    manifest = prepare_dataset(
        table,
        open_store(store),
        features=[c for c in table.column_names if c != "label"],
        label="label",
        num_partitions=2,
        seed=0,
    )
    dataset = f"{store}/datasets/{manifest.dataset_id}"
    tuner = Tuner(
        SPACE,
        epochs=1,
        workers=2,
        store=store,
        backend=backend,
        progress=False,
        warm_workers=warm,
    )
    rows = []
    for i in range(count):
        called = time.time()
        result = tuner.fit(dataset, experiment_id=f"{label}-{i}")
        ended = time.time() - called
        rows.append((label, i + 1, first_unit_seconds(store, result.experiment_id, called), ended))
    release_workers()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("spark", "local"), default="spark")
    parser.add_argument("--fits", type=int, default=3)
    parser.add_argument("--rows", type=int, default=0, help="random rows (default: digits)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if args.backend == "spark":
        from cerebro_spark.spark_session import spark_session

        spark_session("local[2]", "warm-fit", {"spark.ui.enabled": "false"}, preload_torch=True)
    with tempfile.TemporaryDirectory() as tmp:
        rows = fits(args.backend, 0.0, args.fits, Path(tmp), "cold", args.rows)
        rows += fits(args.backend, 120.0, args.fits, Path(tmp), "warm", args.rows)
    data = f"{args.rows} random rows" if args.rows else "digits (1,797 rows)"
    print(f"\nTuner.fit x{args.fits} on one prepared dataset of {data}, backend {args.backend}\n")
    print("| warm_workers | fit | to first train unit s | fit s |")
    print("|:--|--:|--:|--:|")
    for label, number, first, total in rows:
        setting = "0 (cold)" if label == "cold" else "120 (warm)"
        print(f"| {setting} | {number} | {first:.2f} | {total:.2f} |")


if __name__ == "__main__":
    main()
