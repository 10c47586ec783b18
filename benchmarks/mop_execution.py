"""What model hopping costs on a real backend, measured from a run's events.jsonl.

Runs a digits experiment (or reads an existing one with --experiment) and prints:

1. bytes each worker read from storage, against the bytes of the partitions it holds
   (each partition must be read once, however many epochs run);
2. the per-hop overhead: checkpoint read + write seconds as a fraction of unit seconds;
3. each round's makespan over the schedule lower bound max(max worker load, max trial
   total) computed from the measured unit times;
4. checkpoint traffic: bytes read from and written to the store per unit, and the units
   whose checkpoint the worker's memory cache answered (``--cache-bytes 0`` turns the
   cache off: the traffic before it existed).

    python benchmarks/mop_execution.py --backend spark --master local[2] --epochs 5
    python benchmarks/mop_execution.py --backend spark --master local[2] --epochs 5 --s3
    python benchmarks/mop_execution.py --backend local --epochs 5 --s3 --s3-latency-ms 20
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator

from cerebro_spark.engine import parse_config, read_events, run_experiment
from cerebro_spark.store import open_store
from cerebro_spark.training._cache import CACHE_BYTES_ENV


def run(args: argparse.Namespace) -> tuple[str, str]:
    store = args.store or tempfile.mkdtemp(prefix="cerebro-bench-")
    raw = {
        "name": "bench",
        "seed": 1,
        "store": store,
        "data": {"source": "sklearn:digits", "partitions": args.partitions},
        "procedure": "grid",
        "epochs": args.epochs,
        "workers": args.workers,
        "backend": args.backend,
        "space": {
            "choice": [
                {
                    "model": "cerebro_spark.training:MLPSpec",
                    "hidden_units": {"grid": [[64], [128], [256, 128]]},
                    "lr": {"grid": [0.001, 0.003]},
                },
                {
                    "model": "cerebro_spark.training:CNNSpec",
                    "channels": {"grid": [[16, 32]]},
                    "lr": {"grid": [0.001, 0.003]},
                },
            ]
        },
    }
    if args.backend == "spark":
        conf = {"spark.ui.enabled": "false"}
        if args.cache_bytes is not None:
            conf[f"spark.executorEnv.{CACHE_BYTES_ENV}"] = str(args.cache_bytes)
        raw["spark"] = {"master": args.master, "conf": conf}
    result = run_experiment(parse_config(raw), experiment_id="bench")
    return store, result.experiment_id


def report(store_uri: str, experiment_id: str) -> None:
    store = open_store(store_uri)
    events = read_events(store.child(f"experiments/{experiment_id}"))
    dataset = next(e for e in events if e["event"] == "dataset")
    manifest = json.loads(open_store(dataset["uri"]).get("manifest.json"))
    part_bytes: dict[int, int] = defaultdict(int)
    for part in manifest["partitions"]:
        part_bytes[part["index"]] += part["bytes"]
    holds = {e["worker"]: e["partitions"] for e in events if e["event"] == "worker_ready"}
    read = {e["worker"]: e["bytes_read"] for e in events if e["event"] == "worker_bytes"}
    rounds = max(e["round"] for e in events if e["event"] == "round_end") + 1
    print(f"experiment {experiment_id}: {rounds} epochs, {len(holds)} workers")
    print()
    print("| worker | partitions | partition bytes | bytes read | read / held |")
    print("|---|---|--:|--:|--:|")
    for worker in sorted(read):
        held = sum(part_bytes[p] for p in holds.get(worker, []))
        ratio = read[worker] / held if held else float("nan")
        print(f"| {worker} | {holds.get(worker)} | {held} | {read[worker]} | {ratio:.3f} |")

    ends = [e for e in events if e["event"] == "unit_end"]
    train = [e for e in ends if e["kind"] == "train"]
    fractions = [e["io_seconds"] / e["seconds"] for e in train if e["seconds"] > 0]
    print()
    print("| units | median unit s | median hop (ckpt read+write) s | median hop / unit |")
    print("|--:|--:|--:|--:|")
    unit = statistics.median(e["seconds"] for e in train)
    hop = statistics.median(e["io_seconds"] for e in train)
    print(f"| {len(train)} train | {unit:.4f} | {hop:.4f} | {statistics.median(fractions):.3f} |")

    starts = {e["round"]: e["time"] for e in events if e["event"] == "round_start"}
    finish: dict[int, float] = {}
    for e in events:
        if e["event"] == "trial_epoch":
            finish[e["round"]] = max(finish.get(e["round"], 0.0), e["time"])
    print()
    print("| epoch | makespan s | lower bound s | makespan / bound |")
    print("|--:|--:|--:|--:|")
    ratios = []
    for number in sorted(starts):
        units = [e for e in ends if e["round"] == number]
        load: dict[str, float] = defaultdict(float)
        total: dict[str, float] = defaultdict(float)
        for e in units:
            load[e["worker"]] += e["seconds"]
            total[e["trial"]] += e["seconds"]
        bound = max(max(load.values()), max(total.values()))
        makespan = finish[number] - starts[number]
        ratios.append(makespan / bound)
        print(f"| {number + 1} | {makespan:.2f} | {bound:.2f} | {makespan / bound:.3f} |")
    print(f"| mean | | | {statistics.mean(ratios):.3f} |")
    traffic(ends, dataset_bytes=sum(part_bytes.values()))


def traffic(ends: list[dict], dataset_bytes: int) -> None:
    """Checkpoint bytes moved per unit (logs from before the cache lack the fields)."""
    if not ends or "checkpoint_bytes_read" not in ends[0]:
        print("\n(no checkpoint traffic fields in this log: it predates them)")
        return
    print()
    print("| units | n | ckpt bytes read | ckpt bytes written | per unit | cache hits |")
    print("|---|--:|--:|--:|--:|--:|")
    total = 0
    for kind in ("train", "validate"):
        units = [e for e in ends if e["kind"] == kind]
        read = sum(e["checkpoint_bytes_read"] for e in units)
        written = sum(e["checkpoint_bytes_written"] for e in units)
        hits = sum(e["checkpoint_cache_hits"] for e in units)
        total += read + written
        per_unit = (read + written) / len(units) if units else 0.0
        print(f"| {kind} | {len(units)} | {read} | {written} | {per_unit:.0f} | {hits} |")
    print(f"| all | {len(ends)} | | | {total / len(ends):.0f} | |")
    print(f"checkpoint bytes moved / dataset bytes: {total / dataset_bytes:.2f}")


class LatencyProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target``; each answer comes ``latency_s`` late.

    The first bytes the server sends after the client spoke are held back ``latency_s``:
    every request (a PUT, a GET) takes that much longer, as across a network, without
    costing CPU here (moto runs on this machine's cores; a network's latency does not).
    """

    def __init__(self, target: tuple[str, int], latency_s: float) -> None:
        self.target, self.latency_s = target, latency_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            asked = threading.Event()
            for source, sink, delay in ((client, server, None), (server, client, asked)):
                threading.Thread(
                    target=self._pipe, args=(source, sink, asked, delay), daemon=True
                ).start()

    def _pipe(
        self, source: socket.socket, sink: socket.socket, asked: threading.Event,
        answer: threading.Event | None,
    ) -> None:  # fmt: skip
        with contextlib.suppress(OSError):
            while chunk := source.recv(1 << 16):
                if answer is None:
                    asked.set()  # the client spoke: the next answer is late
                elif answer.is_set():
                    answer.clear()
                    time.sleep(self.latency_s)
                sink.sendall(chunk)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.listener.close()


@contextlib.contextmanager
def moto_store(latency_ms: float = 0.0) -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 and a fresh bucket: the ``s3://`` store URI.

    With ``latency_ms``, the URI points at a :class:`LatencyProxy` in front of it.
    """
    import boto3
    from moto.server import ThreadedMotoServer

    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        os.environ[name] = value
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        bucket = f"bench-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=f"http://{host}:{port}").create_bucket(Bucket=bucket)
        proxy = LatencyProxy((host, port), latency_ms / 1000) if latency_ms else None
        if proxy is not None:
            port = proxy.port
        yield (f"s3://{bucket}/lake?endpoint_override={host}:{port}&scheme=http&region=us-east-1")
    finally:
        if proxy is not None:
            proxy.close()
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", choices=("local", "spark"), default="spark")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--store")
    parser.add_argument(
        "--experiment", help="report on this experiment id in --store instead of running"
    )
    parser.add_argument(
        "--cache-bytes",
        type=int,
        help=f"bound of each worker's checkpoint cache ({CACHE_BYTES_ENV}; 0: no cache)",
    )
    parser.add_argument("--s3", action="store_true", help="store on a local moto S3 server")
    parser.add_argument(
        "--s3-latency-ms",
        type=float,
        default=0.0,
        help="with --s3: each S3 request answers this much later (a network's latency)",
    )
    args = parser.parse_args()
    if args.cache_bytes is not None:
        os.environ[CACHE_BYTES_ENV] = str(args.cache_bytes)
    if args.experiment:
        report(args.store, args.experiment)
    elif args.s3:
        with moto_store(args.s3_latency_ms) as uri:
            args.store = uri
            report(*run(args))
    else:
        report(*run(args))


if __name__ == "__main__":
    main()
