"""The Spark Connect transport against the classic one on one machine (issue 28, part 1).

Each transport runs in a process of its own (PySpark allows no Connect session beside a
classic one): ``classic`` on a ``local[2]`` session, ``connect`` on a Spark Connect server
(``local[2]``, its own process, as in ``tests/connect_server.py``). In each, ``--repeat``
times: a :class:`~cerebro_spark.backends.SparkBackend` of 2 workers starts on a
4-partition dataset (seconds until ``start`` returned and until every worker was ready),
then every worker runs ``--units`` small train units one after another (the median
seconds of a unit as the driver waits for it: the per-unit overhead of the transport and
the wire, the training itself being the same), then it closes (seconds).

    python benchmarks/connect_transport.py [--repeat 3] [--units 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def measure(kind: str, repeat: int, units: int, tmp: Path) -> dict[str, Any]:
    """In this process: start, run and close backends on a session of ``kind``."""
    sys.path.insert(0, str(ROOT))
    from cerebro_spark.backends import SparkBackend, WorkerJob
    from cerebro_spark.store import open_store
    from tests.backends.contract import make_dataset, train_task

    server = None
    if kind == "connect":
        from tests.connect_server import ConnectServer

        server = ConnectServer(tmp / "server", slots=2)
        session = server.session()
    else:
        from cerebro_spark.spark_session import spark_session

        session = spark_session("local[2]", "transport-bench", {"spark.ui.enabled": "false"})
    dataset = make_dataset(tmp / "dataset")
    rows: dict[str, list[float]] = {"start": [], "ready": [], "unit": [], "close": []}
    try:
        for r in range(repeat):
            job = WorkerJob(dataset.uri, open_store(str(tmp / f"store-{r}")), torch_threads=1)
            backend = SparkBackend(2, spark=session)
            begun = time.perf_counter()
            backend.start(job)
            rows["start"].append(time.perf_counter() - begun)
            backend.wait_started(300)
            rows["ready"].append(time.perf_counter() - begun)
            for worker, info in sorted(backend.workers().items()):
                partition = min(info.partitions)
                for i in range(units):
                    task = train_task(f"{worker}-{i}", partition, out=f"u/{r}/{worker}/{i}.pt")
                    sent = time.perf_counter()
                    backend.submit(worker, task).result(timeout=300)
                    rows["unit"].append(time.perf_counter() - sent)
            begun = time.perf_counter()
            backend.close()
            rows["close"].append(time.perf_counter() - begun)
    finally:
        session.stop()
        if server is not None:
            server.close()
    return {k: statistics.median(v) for k, v in rows.items()} | {"units": len(rows["unit"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--units", type=int, default=20)
    parser.add_argument("--child", choices=("classic", "connect"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if args.child:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(measure(args.child, args.repeat, args.units, Path(tmp))))
        return
    results = {}
    for kind in ("classic", "connect"):
        done = subprocess.run(
            [sys.executable, __file__, "--child", kind, "--repeat", str(args.repeat),
             "--units", str(args.units)],
            capture_output=True, text=True, check=True, cwd=ROOT,
        )  # fmt: skip
        results[kind] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"\nSparkBackend, 2 workers, local[2], median of {args.repeat} starts\n")
    print("| transport | start() s | all ready s | unit s (median) | close s |")
    print("|:--|--:|--:|--:|--:|")
    for kind, r in results.items():
        print(
            f"| {kind} | {r['start']:.2f} | {r['ready']:.2f} | {r['unit']:.4f} "
            f"({r['units']} units) | {r['close']:.2f} |"
        )


if __name__ == "__main__":
    main()
