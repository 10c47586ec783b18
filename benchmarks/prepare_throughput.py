"""``prepare_with_spark`` throughput against a plain ``df.repartition(P).write.parquet``.

In one warm Spark session (``local[2]`` by default), for each row count: writes a Parquet
input of N rows (20 ``float32`` features, an ``int64`` label with 3 classes, seeded) as 8
files, then times, interleaved and paired (prepare, plain, prepare, plain, ...):

* **prepare**: :func:`~cerebro_spark.data.prepare_with_spark` from the path into a fresh
  store (checks, staging with the content-hash keys, shuffle, write, commit);
* **plain**: ``spark.read.parquet(path).repartition(2 * P).write.parquet(out)``: the same
  data read, shuffled into as many files as the prepared dataset has and written once,
  with no checks, normalisation or determinism.

and prints the median seconds of each, rows per second and the throughput ratio
(plain seconds / prepare seconds: ``0.5`` means prepare runs at half the plain write's
speed), plus the per-run times so that contention shows. Every prepare of the same input
must give the same dataset id (checked). The session is warmed by one untimed run of each.

    python benchmarks/prepare_throughput.py [--rows 600,200000,2000000] [--repeat 3]
        [--partitions 4] [--master local[2]]
"""

from __future__ import annotations

import argparse
import logging
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cerebro_spark.data import prepare_with_spark
from cerebro_spark.spark_session import spark_session

FEATURES = [f"x{i}" for i in range(20)]


def write_input(directory: Path, rows: int, files: int = 8) -> None:
    """Write ``rows`` seeded rows as ``files`` Parquet files under ``directory``."""
    rng = np.random.default_rng(0)
    directory.mkdir(parents=True)
    for index, block in enumerate(np.array_split(np.arange(rows), files)):
        data = rng.standard_normal((len(block), len(FEATURES)), dtype=np.float32)
        columns: dict[str, pa.Array] = {
            name: pa.array(data[:, i]) for i, name in enumerate(FEATURES)
        }
        columns["label"] = pa.array(rng.integers(0, 3, len(block)))
        pq.write_table(pa.table(columns), directory / f"part-{index:03d}.parquet")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="600,200000,2000000")
    parser.add_argument("--repeat", type=int, default=3, help="paired runs per row count")
    parser.add_argument("--partitions", type=int, default=4, help="P (default 4)")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    spark = spark_session(
        master=args.master,
        app_name="prepare-throughput",
        conf={"spark.ui.showConsoleProgress": "false"},
    )
    spark.sparkContext.setLogLevel("ERROR")
    P = args.partitions
    print(
        f"{'rows':>9} {'MB':>6} {'prepare s':>10} {'plain s':>9} {'prepare rows/s':>15} "
        f"{'plain rows/s':>13} {'ratio':>6}  runs (prepare / plain, s)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for rows in (int(n) for n in args.rows.split(",")):
            source = root / f"in-{rows}"
            write_input(source, rows)
            size = sum(p.stat().st_size for p in source.iterdir())
            ids: set[str] = set()
            times: dict[str, list[float]] = {"prepare": [], "plain": []}
            for run in range(args.repeat + 1):  # run 0 warms up, untimed
                for engine in ("prepare", "plain"):
                    out = root / f"out-{engine}"
                    shutil.rmtree(out, ignore_errors=True)
                    started = time.perf_counter()
                    if engine == "prepare":
                        manifest = prepare_with_spark(
                            str(source),
                            str(out),
                            features=FEATURES,
                            label="label",
                            num_partitions=P,
                            seed=0,
                            spark=spark,
                        )
                        ids.add(manifest.dataset_id)
                    else:
                        frame = spark.read.parquet(str(source))
                        frame.repartition(2 * P).write.parquet(str(out))
                    if run:
                        times[engine].append(time.perf_counter() - started)
            assert len(ids) == 1, f"prepare gave different ids: {ids}"
            prep, plain = (statistics.median(times[e]) for e in ("prepare", "plain"))
            runs = " ".join(
                f"{a:.1f}/{b:.1f}" for a, b in zip(times["prepare"], times["plain"], strict=True)
            )
            print(
                f"{rows:>9} {size / 1e6:>6.1f} {prep:>10.2f} {plain:>9.2f} {rows / prep:>15,.0f} "
                f"{rows / plain:>13,.0f} {plain / prep:>6.2f}  {runs}",
                flush=True,
            )
            shutil.rmtree(source)
    spark.stop()


if __name__ == "__main__":
    main()
