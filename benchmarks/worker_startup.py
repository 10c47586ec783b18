"""How long a worker takes to be ready, phase by phase, on the local and the Spark backend.

Starts a pool of workers on a small prepared dataset (default 2 workers, 4 partitions of
20,000 x 64 float32 rows), ``--repeat`` times, and prints for each phase the median
seconds from the worker's launch (the driver asked its transport for it) to the end of
the phase, over every worker of every repetition. The phases are the worker's own
timestamps, sent with its first ``load`` reply (``PoolStats.startup``):

* ``task`` (Spark only): Spark launched the worker's task (the status store's launch
  time; with ``local[N]`` the executor is already there: a warm machine). The first pool
  of the session gets new Python workers; later pools get Spark's reused ones, where
  torch is already imported (reported apart);
* ``process``: the worker's Python process started (a Spark task's Python worker may be
  forked from Spark's Python daemon, or reused from an earlier task: then this is before
  the launch, and shows as negative);
* ``serve``: the worker's code began (after the imports the task's closure needs);
* ``connected`` / ``registered`` / ``welcomed``: it reached the driver / the driver
  had its registration / it was accepted;
* ``partitions``: it had read its partitions (both splits);
* ``torch``: torch, the unit code and ``torch._dynamo`` (which the first optimizer
  imports) were imported, in a thread started at ``serve``;
* ``ready``: it answered the load (after both of the above); ``listed``: the driver
  listed it as taking units.

Per pool it also prints the seconds from calling ``start()`` until it returned (when the
engine submits its first units: since ``start`` returns once one worker is ready) and
until every worker was ready (``wait_started``); before that change both were the same.

    python benchmarks/worker_startup.py [--backend local|spark|both] [--repeat 3]
        [--workers 2] [--rows 20000] [--stagger 0] [--importtime]

``--stagger S`` (local backend) launches worker ``i`` ``i * S`` seconds late, as a loaded
cluster grants executors seconds apart: ``start()`` then returns with the first worker.

``--importtime`` also prints the slowest imports of a worker's entry (``python -X
importtime``), cumulative.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import numpy as np
import pyarrow as pa

from cerebro_spark.backends import LocalBackend, LocalTransport, WorkerJob, WorkerPool
from cerebro_spark.backends._serve import WorkerSpec
from cerebro_spark.backends._spark import tasks_of_group
from cerebro_spark.data import write_dataset
from cerebro_spark.store import open_store

PHASES = (
    "task",
    "process",
    "serve",
    "connected",
    "registered",
    "welcomed",
    "partitions",
    "torch",
    "ready",
    "listed",
)


def make_dataset(root: str, rows: int, features: int, partitions: int) -> str:
    rng = np.random.default_rng(0)
    values = rng.standard_normal((rows, features), dtype=np.float32)
    table = pa.table(
        {
            **{f"f{i}": values[:, i] for i in range(features)},
            "label": rng.integers(0, 10, rows),
        }
    )
    uri = f"{root}/dataset"
    write_dataset(
        table,
        uri,
        features=[f"f{i}" for i in range(features)],
        label="label",
        num_partitions=partitions,
        seed=1,
        validation_fraction=0.2,
    )
    return uri


class StaggeredTransport(LocalTransport):
    """Worker processes launched ``stagger`` seconds apart (executors granted one by one)."""

    def __init__(self, stagger: float) -> None:
        super().__init__()
        self.stagger = stagger
        self.launched = 0

    def launch(self, spec: WorkerSpec) -> Future[str]:
        ended: Future[str] = Future()
        delay = self.stagger * self.launched
        self.launched += 1

        def go() -> None:
            inner = LocalTransport.launch(self, spec)
            inner.add_done_callback(lambda f: ended.set_result(f.result()))

        threading.Timer(delay, go).start()
        return ended


def local_pool(workers: int, stagger: float) -> WorkerPool:
    if not stagger:
        return LocalBackend(workers)
    return WorkerPool(StaggeredTransport(stagger), workers)


def spark_launch_times(pool: Any) -> dict[str, float]:
    """Each worker's task launch time (``time.time()`` scale) from Spark's status store."""
    transport = pool._spark_transport  # the benchmark reads the transport's job groups
    launched: dict[str, float] = {}
    for worker_id, group in transport._groups.items():
        for task in tasks_of_group(transport.context, group):
            launched[worker_id] = task.launchTime().getTime() / 1000.0
    return launched


def measure(
    make_pool: Any, job: WorkerJob, spark: bool, pools: list[dict[str, float]]
) -> list[dict[str, float]]:
    """Start a pool, return each worker's phases in seconds from its launch, and close it.

    Appends to ``pools`` the seconds from calling ``start()`` to its return (``first``:
    the engine's first units go then) and to every worker being ready (``all``).
    """
    pool: WorkerPool = make_pool()
    try:
        begun = time.monotonic()
        pool.start(job)
        first = time.monotonic() - begun
        wait = getattr(pool, "wait_started", None)  # (absent before start returned early)
        if wait is not None:
            wait()
        pools.append({"first": first, "all": time.monotonic() - begun})
        time.sleep(0.5 if spark else 0.0)  # Spark's listener lags behind the tasks
        tasks = spark_launch_times(pool) if spark else {}
        stats = pool.stats()
        out = []
        for worker_id, listed in sorted(stats.ready_seconds.items()):
            stamps = dict(getattr(stats, "startup", {}).get(worker_id, {}))  # older: none
            launched = stamps.get("launched", 0.0)
            if worker_id in tasks and stamps:
                stamps["task"] = tasks[worker_id]
            phases = {name: stamps[name] - launched for name in PHASES if name in stamps}
            phases["registered"] = stats.register_seconds[worker_id]
            phases["listed"] = listed
            out.append(phases)
        return out
    finally:
        pool.close()


def report(name: str, runs: list[dict[str, float]], pools: list[dict[str, float]]) -> None:
    print(f"{name}: seconds from launch, median (min-max) over {len(runs)} workers")
    for key, what in (("first", "start() returned"), ("all", "every worker ready")):
        values = [p[key] for p in pools]
        print(
            f"  {what + ' (pool)':<30} {statistics.median(values):7.2f}  "
            f"({min(values):.2f}-{max(values):.2f}) over {len(values)} pools"
        )
    for phase in PHASES:
        values = [run[phase] for run in runs if phase in run]
        if values:
            print(
                f"  {phase:<11} {statistics.median(values):7.2f}  "
                f"({min(values):.2f}-{max(values):.2f})"
            )


def import_times(limit: int = 12) -> None:
    """The slowest cumulative imports of a Spark worker's entry and of its warm-up."""
    code = (
        "import cerebro_spark.backends._spark; import torch; import cerebro_spark.training; "
        "import torch._dynamo"
    )
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ),
    )
    rows = []
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), parts[2].rstrip()))
    top = [(us, name) for us, name in rows if not name.startswith("   ")]  # top level
    print("slowest top-level imports of a worker (cumulative seconds):")
    for us, name in sorted(top, reverse=True)[:limit]:
        print(f"  {us / 1e6:6.2f}  {name.strip()}")


@contextlib.contextmanager
def spark_pool_factory(master: str, workers: int) -> Iterator[Any]:
    from cerebro_spark.backends import SparkBackend
    from cerebro_spark.spark_session import spark_session

    spark = spark_session(master, "worker-startup", {"spark.ui.enabled": "false"})
    try:
        yield lambda: SparkBackend(workers, spark=spark, join_new_executors=False)
    finally:
        spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("local", "spark", "both"), default="both")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--stagger", type=float, default=0.0)
    parser.add_argument("--importtime", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        uri = make_dataset(root, args.rows, args.features, args.partitions)
        job = WorkerJob(uri, open_store(f"{root}/store"), torch_threads=1)
        if args.backend in ("local", "both"):
            runs: list[dict[str, float]] = []
            pools: list[dict[str, float]] = []
            for _ in range(args.repeat):
                make = functools.partial(local_pool, args.workers, args.stagger)
                runs += measure(make, job, False, pools)
            stagger = f", launched {args.stagger:g} s apart" if args.stagger else ""
            report(f"local backend (spawned processes{stagger})", runs, pools)
        if args.backend in ("spark", "both"):
            cold_pools: list[dict[str, float]] = []
            warm_pools: list[dict[str, float]] = []
            with spark_pool_factory(args.master, args.workers) as make_pool:
                cold = measure(make_pool, job, True, cold_pools)
                runs = []
                for _ in range(args.repeat):
                    runs += measure(make_pool, job, True, warm_pools)
            report(
                f"Spark backend ({args.master}), first pool: new Python workers", cold, cold_pools
            )
            report(
                f"Spark backend ({args.master}), later pools: Python workers reused "
                "(spark.python.worker.reuse), torch already imported",
                runs,
                warm_pools,
            )
    if args.importtime:
        import_times()


if __name__ == "__main__":
    main()
