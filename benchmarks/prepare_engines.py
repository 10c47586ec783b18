"""``cerebro-spark prepare`` wall time: the plain-Python engine against Spark (local mode).

Writes a Parquet file of N rows (20 float32 features, an int64 label with 3 classes,
seeded), then times the whole command as a user runs it (``cerebro-spark prepare --engine
python`` and ``--engine spark --master local[K]``, process start and Spark's JVM included)
into a fresh store each time, and prints rows, prepared MB and seconds per engine. The
threshold behind ``prepare``'s "--engine python is faster" hint
(``SMALL_DATA_BYTES`` in ``cerebro_spark/data/_prepare_cli.py``) comes from these numbers.

    python benchmarks/prepare_engines.py [--rows 600,200000] [--repeat 1] [--master local[2]]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def _write_input(path: Path, rows: int) -> None:
    rng = np.random.default_rng(0)
    data = rng.standard_normal((rows, 20), dtype=np.float32)
    columns = {f"x{i}": data[:, i] for i in range(20)}
    columns["label"] = rng.integers(0, 3, rows)
    pq.write_table(pa.table(columns), path)


def _time(argv: list[str]) -> tuple[float, float]:
    """Run ``argv``; return its wall seconds and its peak resident memory in MB."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"{' '.join(argv)} failed:\n{err.read().decode()[-2000:]}")
    return seconds, usage.ru_maxrss / 1024


def _bytes(store: Path) -> int:
    return sum(p.stat().st_size for p in (store / "datasets").rglob("*.parquet"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="600,200000", help="row counts (default 600,200000)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per cell (best is kept)")
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    parser.add_argument("--engines", default="python,spark", help="(default python,spark)")
    args = parser.parse_args()
    engines = args.engines.split(",")
    print(
        f"{'rows':>10} {'MB':>8}" + "".join(f" {e + ' s':>9} {e + ' RSS MB':>14}" for e in engines)
    )
    for rows in (int(n) for n in args.rows.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            source = Path(tmp) / "input.parquet"
            _write_input(source, rows)
            best: dict[str, tuple[float, float]] = {}
            size = 0
            for engine in engines:
                for run in range(args.repeat):
                    store = Path(tmp) / f"store-{engine}-{run}"
                    argv = [sys.executable, "-m", "cerebro_spark.cli", "-q", "prepare"]
                    argv += ["--input", str(source), "--store", str(store), "--engine", engine]
                    if engine == "spark":
                        argv += ["--master", args.master]
                    measured = _time(argv)
                    best[engine] = min(best.get(engine, measured), measured)
                    size = _bytes(store)
            cells = "".join(f" {best[e][0]:>9.1f} {best[e][1]:>14.0f}" for e in engines)
            print(f"{rows:>10} {size / 1e6:>8.1f}{cells}", flush=True)


if __name__ == "__main__":
    main()
