"""How long a worker takes to load its partitions, reading one file at a time or several.

A worker holds both splits of its partitions in memory (Cerebro §3.1); it reads them when
it starts and when partitions are re-homed on it. This prepares one dataset (the peers'
generator, ``benchmarks/peers.py``: ``--rows`` x ``--features`` float32 features, 10
classes, ``--partitions`` partitions per split), optionally copies it to moto's S3 server
on 127.0.0.1, and times :meth:`cerebro_spark.backends.Worker.load` of ``--load``
partitions with 1 and with ``--threads`` reader threads, interleaved, ``--repeat`` times,
a new worker each time (torch is imported once, before timing). Prints the median and
range of each and the speed-up.

    python benchmarks/partition_load.py [--storage local|s3] [--rows 150000]
        [--features 512] [--partitions 8] [--load 4] [--threads 4] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path

import peers  # the peers benchmark's dataset generator and S3 server (same directory)

from cerebro_spark.backends import Worker, WorkerJob, _worker
from cerebro_spark.store import open_store


def timed_load(uri: str, store_dir: str, partitions: list[int], threads: int) -> tuple[float, int]:
    """Seconds and bytes of one new worker's load of ``partitions`` with ``threads`` readers."""
    _worker._READ_THREADS = threads  # the module's one setting, set for this measurement
    worker = Worker("w0", WorkerJob(uri, open_store(store_dir), torch_threads=1))
    started = time.perf_counter()
    read = worker.load(partitions)
    return time.perf_counter() - started, read


def main(argv: Sequence[str] | None = None) -> str:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--storage", choices=("local", "s3"), default="local")
    parser.add_argument("--rows", type=int, default=150_000)
    parser.add_argument("--features", type=int, default=512)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--load", type=int, default=4, help="partitions one worker loads")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--data-dir", default=os.path.join(tempfile.gettempdir(), "cerebro-peers-data")
    )
    args = parser.parse_args(argv)
    if not 1 <= args.load <= args.partitions:
        parser.error(f"--load {args.load} must be between 1 and --partitions {args.partitions}")
    setting = peers.Setting(
        args.rows, args.features, args.partitions, ((32,),), (1e-3,), 1, 1, args.storage == "s3"
    )
    local = peers.prepared_dataset(setting, Path(args.data_dir))
    partitions = list(range(args.load))
    samples: dict[int, list[float]] = {1: [], args.threads: []}
    with peers.s3_server() if setting.s3 else nullcontext() as endpoint:
        uri = peers.upload(local, endpoint).uri() if endpoint else str(local)
        with tempfile.TemporaryDirectory() as store_dir:
            timed_load(uri, store_dir, [0], 1)  # untimed: imports torch and the unit code
            for _ in range(args.repeat):
                for threads in samples:
                    seconds, read = timed_load(uri, store_dir, partitions, threads)
                    samples[threads].append(seconds)
    lines = [
        f"load of {args.load} partitions x 2 splits ({read / 1e6:.0f} MB, {args.features} "
        f"features) from {args.storage}, {args.repeat} runs each, interleaved; "
        f"load average {os.getloadavg()[0]:.2f}",
        "| reader threads | median s | range s |",
        "|--:|--:|--:|",
    ]
    for threads, values in samples.items():
        lines.append(
            f"| {threads} | {statistics.median(values):.3f} | {min(values):.3f}-{max(values):.3f} |"
        )
    one, many = (statistics.median(v) for v in samples.values())
    lines.append(f"speed-up with {args.threads} threads: {one / many:.2f}x")
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
