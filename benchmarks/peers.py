"""cerebro-spark against its peers: the same grid search trained six ways on Spark.

Six systems train the same configs (``MLPSpec`` models from a grid of ``hidden_units`` x
``lr``, Adam, batch size 64, cross-entropy, one torch thread per worker) for the same
epochs on the same prepared dataset (cerebro-spark's partitioned Parquet, prepared once
and reused), validating every config after every epoch in batches of
:data:`VALIDATION_BATCH` rows (cerebro: the ``validation_batch_size`` param; it computes
its whole default metric set there, the peers accuracy alone):

1. **cerebro** -- the real API (:func:`~cerebro_spark.engine.run_experiment`): grid search,
   model hopper parallelism on the Spark backend, one long-lived worker per slot, each
   loading its partitions once; checkpoints hop through the store.
2. **hyperopt** -- Hyperopt's ``SparkTrials`` (``parallelism`` = workers): one Spark job per
   config, whose task reads the whole training and validation data from Parquet and trains
   the config for all epochs. A grid ``algo`` hands out the configs in order (the same set
   as cerebro's grid: TPE or random search would pick other points).
3. **plain** -- the task-parallel job a Spark user writes first:
   ``sc.parallelize(configs, n).map(train_one_config).collect()``, each task as above.
4. **ddp** -- ``pyspark.ml.torch.distributor.TorchDistributor`` (``local_mode=False``:
   a barrier stage, one torchrun process per Spark task, gloo), ``num_processes`` =
   workers, one config after the other. Rank ``r`` reads partitions ``r, r + W, ...`` of
   each split; each rank's batch is ``64 / W`` rows, so one step averages the gradient of
   64 rows, as in the other three.
5. **optuna** -- Optuna on Spark as MLflow 3 runs it, the way Databricks recommends since
   it dropped Hyperopt: ``mlflow.pyspark.optuna.study.MlflowSparkStudy`` with an
   ``MlflowStorage`` (the study and every trial are MLflow runs, written and read through
   the tracking server's REST API), ``optimize(n_trials=configs)`` with its default
   ``n_jobs=-1``: one ``mapInPandas`` Spark task per trial, each task loading the study from
   MLflow and running its trial, whose objective reads the whole training and validation
   data and trains the config for all epochs, as above. The tracking server is a real
   ``mlflow server`` (full ``mlflow``, from a virtual environment of its own: it pins
   versions the package's environment must not take; ``--mlflow-venv``) on 127.0.0.1 with a
   SQLite store, started before the repeats and stopped by the benchmark. Configs are
   handed out as the grid: a sampler gives Spark task ``p`` config ``p``
   (:func:`task_grid_sampler`). Optuna's own ways do not train each config exactly once
   here: ``GridSampler`` picks each trial's point at random among those not yet visited
   (and ``MlflowSparkStudy`` reseeds it in every task), so two tasks that start together can
   pick the same one; ``enqueue_trial``'s waiting trials are claimed by a read-then-write
   on ``MlflowStorage`` (in a try of 4 enqueued configs on 2 slots, one stayed waiting and
   was never trained).
6. **ray** -- Ray Tune on Spark: ``ray.util.spark.setup_ray_cluster`` (a Ray head node on
   the driver, one Ray worker node per Spark task: ``max_worker_nodes`` = workers, one CPU
   each, ``spark.task.cpus``; local mode allows no other shape), then ``ray.tune.Tuner``
   with a ``grid_search`` over the configs, one CPU per trial, ``max_concurrent_trials`` =
   workers; each trial (a Ray actor on a worker node) reads the whole data and trains the
   config, as above; then ``shutdown_ray_cluster``. Its wall time includes starting the Ray
   cluster (as cerebro's includes starting its workers), printed apart in the progress
   line: Ray on Spark starts worker nodes on one machine 10 s apart
   (``RAY_ON_SPARK_RAY_WORKER_NODE_STARTUP_INTERVAL``, a port-range lock), and each trial
   runs in a fresh Ray worker process that imports torch. Ray is an optional extra
   (``pip install -e '.[peers]'``); without it the table says so in the ray row.

The peers read Parquet with pyarrow inside their tasks (``LocalFileSystem`` or
``S3FileSystem``), each file as cerebro-spark's store does (one request, decoded from
memory), and build the model and optimizer with the same ``MLPSpec`` methods
cerebro's units call; their training loop is the bare loop of
``benchmarks/unit_overhead.py`` (seeded permutation, ``zero_grad``, forward, loss,
``backward``, ``step``).

Runs are interleaved and paired: repeat ``r`` runs every system in the order rotated by
``r`` (ABCD, BCDA, CDAB, ...) in one Spark application (``local[W]``), each after a warm-up
job that imports torch in every Python worker (untimed; before each system, since Spark
stops a Python worker idle for a minute, as they are while DDP's own processes train;
before optuna also in the ``mapInPandas`` tasks' Python workers, which Spark keeps apart
from the RDD tasks'). Printed per system (median and range over repeats):

* **wall s** of the whole search (for cerebro: ``run_experiment``, worker start-up and
  partition loading included) and **x cerebro**, the paired ratio to cerebro's wall time
  of the same repeat (> 1: the peer is slower);
* **data read**: bytes of Parquet each system read (cerebro: the ``worker_bytes`` events;
  peers: the sizes of the files their tasks opened);
* **ckpt moved**: checkpoint bytes read plus written (cerebro: the ``unit_end`` events'
  ``checkpoint_bytes_read`` and ``checkpoint_bytes_written``; the peers keep their model in
  memory and write none);
* **peak RSS / worker**: the largest peak resident set (``VmHWM``) of one worker process,
  reset (``/proc/<pid>/clear_refs``) before each system runs. Peers read it inside their
  tasks (DDP: in each rank's torchrun process); cerebro's workers are long-lived Spark
  tasks, read from the driver after the run (Python workers are reused across systems);
* the final validation accuracy of every config (a second table), so that a reader sees
  the systems train the same thing to similar accuracy.

Settings: ``small`` (200k x 64 rows on local disk, 8 configs x 3 epochs, 4 partitions,
2 workers), ``heavy`` (625k x 512 float32 rows, 1.03 GB of training Parquet, 8 partitions,
on an S3 protocol server -- moto's ``ThreadedMotoServer`` on 127.0.0.1, started in a child
process and stopped by the benchmark -- 4 configs x 1 epoch on 2 workers; every system
reads from S3: cerebro through its S3 store, the peers through pyarrow's
``S3FileSystem``; a peer keeps the data in memory across epochs, so more epochs add
training, not reads), ``small-lrs`` (the small data, 16 configs of one architecture:
learning rates from 1e-4 to 1e-2) and ``quick`` (1 config, seconds; the smoke test's).
``--pack off|auto|N`` is cerebro-spark's ``pack`` (issue 27: trials of one architecture
trained together in one visit of a partition; default off). ``--rows``,
``--features``, ``--epochs``, ``--workers``, ``--partitions`` and ``--storage`` override a
setting; ``--systems`` runs only some systems (``cerebro,plain``: a quick pair) and
``--keep-logs DIR`` keeps each cerebro run's event log and its workers' start-up phases
(for a breakdown of where cerebro's time went). The generated data is prepared once into
``--data-dir`` and reused by later invocations.

What each peer pays (measured here): SparkTrials and the plain job read the whole
dataset once per config (cerebro once per run) and keep no checkpoint, so on small local
data they pay only the re-reads and the Parquet decode. TorchDistributor starts, per
config, a barrier stage whose tasks each launch a chain of fresh Python processes
(``torch_run_process_wrapper`` -> ``torch.distributed.run`` -> the training script), each
importing torch, plus a gloo rendezvous: about 30 s per config on this 2-core machine,
whatever the data size (``localhost`` as the rendezvous address costs seconds more than
``127.0.0.1`` here, an IPv6 lookup first). Optuna through ``MlflowSparkStudy`` and Ray
Tune read the data as SparkTrials does, once per config, so their data read is the plain
job's: configs x the dataset (the ``heavy`` setting's 4 configs read 4x what cerebro
reads, whatever the system; only a grid of 8 or more configs can show 8x). On top,
MlflowSparkStudy pays MLflow REST calls per trial (loading the study, creating the trial
run, its params, tags and state) and Ray on Spark its cluster start.

    python benchmarks/peers.py --setting small --repeats 3 --out benchmarks/results/peers_small.txt
    python benchmarks/peers.py --setting heavy --repeats 1 --out benchmarks/results/peers_heavy.txt
    python benchmarks/peers.py --setting quick --repeats 1
    python benchmarks/peers.py --setting heavy --repeats 1 --systems cerebro,optuna,ray
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import itertools
import json
import logging
import math
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

SYSTEMS = ("cerebro", "hyperopt", "plain", "ddp", "optuna", "ray")
SPEC = "cerebro_spark.training:MLPSpec"
CLASSES = 10
VALIDATION_BATCH = 8192
"""Rows per validation batch, every system (no gradient is kept there)."""
REGION = "us-east-1"
MLFLOW_VERSION = "3.17.2"
"""Full ``mlflow`` for the tracking server: the version of the ``tracking`` extra's client."""
BUILT = "cerebro-built.txt"
"""What a finished build of a server venv leaves in it (as ``tests/background.py`` does)."""

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One workload: data shape, configs, epochs, workers and where the data lives."""

    rows: int
    features: int
    partitions: int
    hidden: tuple[tuple[int, ...], ...]
    lrs: tuple[float, ...]
    epochs: int
    workers: int
    s3: bool
    batch_size: int = 64

    @property
    def configs(self) -> list[dict[str, Any]]:
        """The grid, in cerebro's grid order (``hidden_units`` outer, ``lr`` inner)."""
        return [
            {"hidden_units": list(hidden), "lr": lr, "batch_size": self.batch_size}
            for hidden, lr in itertools.product(self.hidden, self.lrs)
        ]


SETTINGS = {
    "quick": Setting(3_000, 16, 2, ((32,),), (3e-3,), 1, 2, s3=False),
    "small": Setting(200_000, 64, 4, ((64,), (128,), (128, 64), (256,)), (1e-3, 3e-3), 3, 2, False),
    # the small data, 16 configs of one architecture (learning rates): what packs are for
    "small-lrs": Setting(
        200_000,
        64,
        4,
        ((64,),),
        tuple(float(lr) for lr in np.geomspace(1e-4, 1e-2, 16).round(6)),
        3,
        2,
        False,
    ),
    "heavy": Setting(625_000, 512, 8, ((64,), (128,)), (1e-3, 3e-3), 1, 2, s3=True),
    # the heavy data, a grid of 8: a peer reads the dataset once per config, cerebro once
    "heavy-8": Setting(625_000, 512, 8, ((64,), (128,)), (3e-4, 1e-3, 3e-3, 1e-2), 1, 2, True),
}


# --------------------------------------------------------------------------- the data


def make_table(setting: Setting, seed: int = 0) -> Any:
    """A seeded 10-class problem: a random ReLU teacher labels Gaussian features.

    Features get per-column scales and shifts (what ``standardize`` is for); 10 % of the
    labels are noise, so accuracy tops out below 1.
    """
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    rows, width = setting.rows, setting.features
    hidden = rng.standard_normal((width, 32)).astype(np.float32) / math.sqrt(width)
    readout = rng.standard_normal((32, CLASSES)).astype(np.float32)
    features = np.empty((rows, width), dtype=np.float32)
    labels = np.empty(rows, dtype=np.int64)
    for first in range(0, rows, 65_536):  # in chunks: the heavy table is 1.3 GB
        x = rng.standard_normal((min(65_536, rows - first), width), dtype=np.float32)
        labels[first : first + len(x)] = np.argmax(np.maximum(x @ hidden, 0) @ readout, axis=1)
        features[first : first + len(x)] = x
    noisy = rng.random(rows) < 0.1
    labels[noisy] = rng.integers(0, CLASSES, int(noisy.sum()))
    features *= rng.uniform(0.5, 5.0, width).astype(np.float32)
    features += rng.normal(0.0, 3.0, width).astype(np.float32)
    column = pa.FixedSizeListArray.from_arrays(pa.array(features.reshape(-1)), width)
    return pa.table({"features": column, "label": pa.array(labels)})


def prepared_dataset(setting: Setting, data_dir: Path) -> Path:
    """Prepare the setting's data once under ``data_dir``; return the dataset directory."""
    from cerebro_spark.data import prepare_dataset

    root = data_dir / f"{setting.rows}x{setting.features}-p{setting.partitions}"
    marker = root / "dataset_id"
    if not marker.exists():
        started = time.perf_counter()
        table = make_table(setting)
        manifest = prepare_dataset(
            table,
            str(root),
            features=["features"],
            label="label",
            num_partitions=setting.partitions,
            seed=0,
            source=f"benchmarks/peers.py {setting.rows}x{setting.features}",
        )
        del table
        marker.write_text(manifest.dataset_id)
        print(f"prepared {manifest.dataset_id} in {time.perf_counter() - started:.0f} s")
    return root / "datasets" / marker.read_text().strip()


@dataclasses.dataclass(frozen=True)
class Location:
    """Where the prepared dataset lives, as the peers' tasks open it with pyarrow.

    Attributes:
        path: The dataset directory (local path, or ``bucket/prefix`` on S3).
        endpoint: ``host:port`` of the S3 server; ``None`` for the local disk.
    """

    path: str
    endpoint: str | None = None

    def filesystem(self) -> Any:
        """A pyarrow ``LocalFileSystem`` or ``S3FileSystem`` for :attr:`path`."""
        import pyarrow.fs as pafs

        if self.endpoint is None:
            return pafs.LocalFileSystem()
        return pafs.S3FileSystem(
            access_key="testing",
            secret_key="testing",
            region=REGION,
            scheme="http",
            endpoint_override=self.endpoint,
            allow_bucket_creation=True,  # for the upload's bucket
        )

    def uri(self, path: str | None = None) -> str:
        """The URI cerebro-spark's stores take for ``path`` (default: the dataset)."""
        path = self.path if path is None else path
        if self.endpoint is None:
            return path
        return f"s3://{path}?endpoint_override={self.endpoint}&scheme=http&region={REGION}"


@contextmanager
def s3_server() -> Iterator[str]:
    """moto's ``ThreadedMotoServer`` on 127.0.0.1 in a child process; yields ``host:port``.

    A child process, so the S3 server does not share the driver's interpreter (and GIL)
    with the systems measured.
    """
    code = (
        "import logging, sys\n"
        "from moto.server import ThreadedMotoServer\n"
        "logging.getLogger('werkzeug').setLevel(logging.ERROR)\n"
        "server = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False)\n"
        "server.start()\n"
        "print('%s:%d' % server.get_host_and_port(), flush=True)\n"
        "sys.stdin.read()\n"
        "server.stop()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        endpoint = child.stdout.readline().strip()
        if not endpoint:
            raise RuntimeError("the moto S3 server did not start")
        yield endpoint
    finally:
        assert child.stdin is not None
        child.stdin.close()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def upload(local: Path, endpoint: str) -> Location:
    """Copy a prepared dataset directory into a fresh bucket; return its S3 location."""
    import pyarrow.fs as pafs

    bucket = f"peers-{uuid.uuid4().hex[:12]}"
    s3 = Location(bucket, endpoint).filesystem()
    s3.create_dir(bucket)
    target = f"{bucket}/lake/datasets/{local.name}"
    started = time.perf_counter()
    pafs.copy_files(str(local), target, destination_filesystem=s3, use_threads=True)
    size = sum(f.stat().st_size for f in local.rglob("*") if f.is_file())
    print(f"uploaded {size / 1e9:.2f} GB to S3 in {time.perf_counter() - started:.0f} s")
    return Location(target, endpoint)


def mlflow_server_venv(venv: Path) -> Path:
    """The ``mlflow`` executable of a virtual environment with full ``mlflow``; built once.

    Full ``mlflow`` (the server) pins versions that the package's environment must not take
    (it has only ``mlflow-skinny``, the client), so the server runs from a venv of its own,
    as the tracking tests' does: one built by them (``.pytest_cache/d/mlflow-server``) or
    by this function (``uv`` when installed, else pip) is reused.

    Args:
        venv: The virtual environment's directory.

    Returns:
        Its ``bin/mlflow``.

    Raises:
        subprocess.CalledProcessError: Building it failed.
    """
    requirement = f"mlflow=={MLFLOW_VERSION}"
    mlflow, python, built = venv / "bin" / "mlflow", venv / "bin" / "python", venv / BUILT
    if mlflow.exists() and built.is_file() and built.read_text() == requirement:
        return mlflow
    started = time.perf_counter()
    venv.parent.mkdir(parents=True, exist_ok=True)
    if importlib.util.find_spec("uv") is not None:
        uv = [sys.executable, "-m", "uv"]
        subprocess.run(
            [*uv, "venv", "--quiet", "--clear", "--python", sys.executable, str(venv)], check=True
        )
        install = [*uv, "pip", "install", "--quiet", "--python", str(python), requirement]
    else:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        install = [str(python), "-m", "pip", "install", "--quiet", requirement]
    subprocess.run(install, check=True)
    check = f"import mlflow; assert mlflow.__version__ == {MLFLOW_VERSION!r}"
    subprocess.run([str(python), "-c", check], check=True)
    built.write_text(requirement)
    logger.info("built %s in %s in %.0f s", requirement, venv, time.perf_counter() - started)
    return mlflow


def _healthy(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


@contextmanager
def mlflow_server(mlflow: Path, timeout_s: float = 300.0) -> Iterator[str]:
    """A real ``mlflow server`` on 127.0.0.1 (SQLite store, local artifacts); yields its URI.

    Started as the tracking tests start theirs: its own process group, one worker, no job
    runner; stopped (the whole group) and its files removed on exit.

    Args:
        mlflow: The ``mlflow`` executable (:func:`mlflow_server_venv`).
        timeout_s: How long to wait for ``/health`` to answer.

    Raises:
        RuntimeError: The server ended or did not answer in ``timeout_s``.
    """
    root = Path(tempfile.mkdtemp(prefix="cerebro-peers-mlflow-"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    uri = f"http://127.0.0.1:{port}"
    command = [
        str(mlflow),
        "server",
        "--backend-store-uri",
        f"sqlite:///{root / 'mlflow.db'}",
        "--artifacts-destination",
        str(root / "artifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with (root / "server.log").open("wb") as log:
        child = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
    try:
        started = time.perf_counter()
        while not _healthy(uri):
            if child.poll() is not None or time.perf_counter() - started > timeout_s:
                tail = (root / "server.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the MLflow server did not start: {tail}")
            time.sleep(0.2)
        logger.info("MLflow server at %s after %.0f s", uri, time.perf_counter() - started)
        yield uri
    finally:
        with contextlib.suppress(ProcessLookupError):  # the group: the server's workers too
            os.killpg(child.pid, signal.SIGTERM)
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        shutil.rmtree(root, ignore_errors=True)


# ------------------------------------------------------------- inside a peer's task


def reset_peak_rss(pid: int | str = "self") -> None:
    """Reset ``VmHWM`` of a process to its current RSS (Linux >= 4.0; else a no-op)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        pass


def peak_rss(pid: int | str = "self") -> int:
    """Peak resident set of a process since its last reset, in bytes (0 if unknown)."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return 0
    if pid == "self":
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return 0


def read_split(
    location: Location, manifest_json: str, split: str, indices: Sequence[int]
) -> tuple[np.ndarray, np.ndarray, int]:
    """Read partitions of one split with pyarrow: features, labels and the bytes read.

    Each file is read as cerebro-spark's store reads it: one request for the whole file,
    then decoded from memory (on moto ~2.8x faster than ``pq.read_table`` on an open S3
    file, whose column-chunk reads are one ranged GET each).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cerebro_spark.data import Manifest

    manifest = Manifest.from_json(manifest_json)
    filesystem = location.filesystem()
    parts = [manifest.partition(split, index) for index in indices]
    width = math.prod(manifest.feature_shape)
    features = np.empty((sum(part.rows for part in parts), width), dtype=np.float32)
    labels = np.empty(len(features), dtype=np.int64)
    at, read = 0, 0
    for part in parts:  # into arrays sized up front: one copy of the data in memory
        with filesystem.open_input_file(f"{location.path}/{part.path}") as handle:
            data = handle.read()
        read += len(data)
        table = pq.read_table(pa.BufferReader(data), columns=["features", "label"])
        del data
        labels[at : at + table.num_rows] = table.column("label").to_numpy()
        for chunk in table.column("features").chunks:
            values = chunk.flatten().to_numpy(zero_copy_only=False)
            features[at : at + len(chunk)] = values.reshape(len(chunk), width)
            at += len(chunk)
        del table
    return features, labels, read


def build(manifest_json: str, params: dict[str, Any], seed: int) -> tuple[Any, Any]:
    """The model and optimizer cerebro's units build: ``MLPSpec`` with the same params."""
    import torch

    from cerebro_spark.data import Manifest
    from cerebro_spark.training import MLPSpec

    spec = MLPSpec()
    torch.manual_seed(seed)
    model = spec.build_model(params, Manifest.from_json(manifest_json).info)
    return model, spec.build_optimizer(model, params)


def train_epoch(
    model: Any, optimizer: Any, x: Any, y: Any, order: Any, batch: int, device: Any = None
) -> None:
    """The bare loop: one pass over ``order`` in batches of ``batch`` rows.

    With a ``device``, each batch is copied there from ``x`` and ``y`` (host memory).
    """
    import torch

    model.train()
    for first in range(0, len(order), batch):
        index = order[first : first + batch]
        xb, yb = x[index], y[index]
        if device is not None:
            xb, yb = xb.to(device), yb.to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()


def correct(model: Any, x: Any, y: Any, device: Any = None) -> int:
    """Rows the model classifies right (each batch copied to ``device``, if given)."""
    import torch

    model.eval()
    right = 0
    with torch.no_grad():
        for first in range(0, len(x), VALIDATION_BATCH):
            xb, yb = x[first : first + VALIDATION_BATCH], y[first : first + VALIDATION_BATCH]
            if device is not None:
                xb, yb = xb.to(device), yb.to(device)
            right += int((model(xb).argmax(dim=1) == yb).sum())
    return right


@dataclasses.dataclass(frozen=True)
class Job:
    """What a peer's task needs (pickled to it)."""

    location: Location
    manifest: str
    configs: tuple[dict[str, Any], ...]
    epochs: int
    workers: int
    seed: int = 0


def train_one_config(job: Job, index: int) -> dict[str, Any]:
    """A peer's task: read all the data, train config ``index`` for every epoch."""
    import torch

    reset_peak_rss()
    torch.set_num_threads(1)
    started = time.perf_counter()
    partitions = range(json.loads(job.manifest)["num_partitions"])
    x, y, train_bytes = read_split(job.location, job.manifest, "train", partitions)
    vx, vy, validation_bytes = read_split(job.location, job.manifest, "validation", partitions)
    x, y, vx, vy = (torch.from_numpy(a) for a in (x, y, vx, vy))  # type: ignore[assignment]
    params = job.configs[index]
    model, optimizer = build(job.manifest, params, job.seed + index)
    rng = np.random.default_rng([job.seed, index])
    accuracy = []
    for _ in range(job.epochs):
        order = torch.from_numpy(rng.permutation(len(x)))
        train_epoch(model, optimizer, x, y, order, params["batch_size"])
        accuracy.append(correct(model, vx, vy) / len(vx))
    return {
        "index": index,
        "accuracy": accuracy,
        "bytes_read": train_bytes + validation_bytes,
        "checkpoint_bytes": 0,
        "peak_rss": [peak_rss()],
        "seconds": time.perf_counter() - started,
    }


def ddp_train(job: Job, index: int) -> dict[str, Any]:
    """One rank of DDP training of config ``index`` (run by TorchDistributor's torchrun)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        mine = range(rank, json.loads(job.manifest)["num_partitions"], world)
        x, y, train_bytes = read_split(job.location, job.manifest, "train", mine)
        vx, vy, validation_bytes = read_split(job.location, job.manifest, "validation", mine)
        x, y, vx, vy = (torch.from_numpy(a) for a in (x, y, vx, vy))  # type: ignore[assignment]
        params = job.configs[index]
        model, optimizer = build(job.manifest, params, job.seed + index)
        model = torch.nn.parallel.DistributedDataParallel(model)
        rows = torch.tensor([len(x)])
        dist.all_reduce(rows, op=dist.ReduceOp.MIN)  # every rank takes as many steps
        batch = max(1, params["batch_size"] // world)
        rng = np.random.default_rng([job.seed, index, rank])
        accuracy = []
        for _ in range(job.epochs):
            order = torch.from_numpy(rng.permutation(len(x))[: int(rows)])
            train_epoch(model, optimizer, x, y, order, batch)
            counts = torch.tensor([correct(model.module, vx, vy), len(vx)], dtype=torch.int64)
            dist.all_reduce(counts)
            accuracy.append(int(counts[0]) / int(counts[1]))
        mine_stats = {"bytes_read": train_bytes + validation_bytes, "peak_rss": peak_rss()}
        stats: list[Any] = [None] * world
        dist.all_gather_object(stats, mine_stats)
    finally:
        dist.destroy_process_group()
    return {
        "index": index,
        "accuracy": accuracy,
        "bytes_read": sum(s["bytes_read"] for s in stats),
        "checkpoint_bytes": 0,
        "peak_rss": [s["peak_rss"] for s in stats],
    }


def task_grid_sampler() -> Any:
    """An Optuna sampler that gives the trial of Spark task ``p`` choice ``p`` of a param.

    For :meth:`Bench.optuna`: ``MlflowSparkStudy.optimize`` runs trial ``p`` of ``n`` (its
    default ``n_jobs=-1``) in partition ``p`` of ``spark.range(n, numPartitions=n)``, so
    ``suggest_categorical("config", range(n))`` hands out the grid, each config once, in
    order, whatever the tasks' timing (what Hyperopt's grid ``algo`` does by trial id).
    """
    import optuna

    class TaskGridSampler(optuna.samplers.BaseSampler):
        def infer_relative_search_space(self, study: Any, trial: Any) -> dict[str, Any]:
            return {}

        def sample_relative(
            self, study: Any, trial: Any, search_space: dict[str, Any]
        ) -> dict[str, Any]:
            return {}

        def sample_independent(
            self, study: Any, trial: Any, param_name: str, param_distribution: Any
        ) -> Any:
            from pyspark import TaskContext

            context = TaskContext.get()
            if context is None:
                raise RuntimeError("TaskGridSampler samples inside a Spark task only")
            return param_distribution.choices[context.partitionId()]

    return TaskGridSampler()


# ------------------------------------------------------------------- the systems


def cerebro_bytes(events: Sequence[dict[str, Any]]) -> tuple[int, int]:
    """A cerebro run's Parquet bytes read and checkpoint bytes moved, from its event log."""
    read = sum(e["bytes_read"] for e in events if e["event"] == "worker_bytes")
    moved = sum(
        e.get("checkpoint_bytes_read", 0) + e.get("checkpoint_bytes_written", 0)
        for e in events
        if e["event"] == "unit_end"
    )
    return read, moved


def cerebro_accuracy(
    events: Sequence[dict[str, Any]], trials: Any, configs: Sequence[dict[str, Any]], arch: str
) -> dict[int, float]:
    """Each config's last validation accuracy, by its index in ``configs`` (matched by the
    ``arch`` param and ``lr``)."""
    last: dict[str, dict[str, Any]] = {}  # each trial's last epoch
    for event in events:
        if event["event"] == "trial_epoch":
            last[event["trial"]] = event
    keys = [(tuple(c[arch]), c["lr"]) for c in configs]
    return {
        keys.index((tuple(t.params[arch]), t.params["lr"])): last[t.trial_id]["metrics"]["accuracy"]
        for t in trials
    }


class RayPathHook:
    """Ray on Spark's start hook (``RAY_ON_SPARK_START_HOOK``) for :meth:`Bench.ray`.

    Ray on Spark starts each Ray node with ``shutil.which("ray")``, which finds nothing
    when this Python's ``bin`` is not on the Spark workers' ``PATH`` (a venv run without
    activating it). The hook puts it first in the Ray nodes' environment; the rest is
    Ray's default hook.

    Args:
        is_global: Whether the cluster is a global one (Ray's hook argument; Ray builds
            a hook it loads by name with none).
    """

    def __init__(self, is_global: bool = False) -> None:
        self.is_global = is_global

    def get_default_temp_root_dir(self) -> str:
        return "/tmp"

    def on_ray_dashboard_created(self, port: int) -> None:
        """Nothing to do."""

    def on_cluster_created(self, ray_cluster_handler: Any) -> None:
        """Nothing to do."""

    def on_spark_job_created(self, job_group_id: str) -> None:
        """Nothing to do."""

    def custom_environment_variables(self) -> dict[str, str]:
        """``PATH`` with this Python's ``bin`` first."""
        return {"PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])}


@contextmanager
def _environ(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the ``with`` block; restore them after."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@dataclasses.dataclass
class Outcome:
    """One system's run: what the tables print."""

    system: str
    seconds: float
    bytes_read: int
    checkpoint_bytes: int
    peak_rss: int
    accuracy: dict[int, float]
    note: str = ""
    """Printed in the progress line only (e.g. Ray's cluster start)."""


def _totals(system: str, seconds: float, results: list[dict[str, Any]]) -> Outcome:
    return Outcome(
        system,
        seconds,
        sum(r["bytes_read"] for r in results),
        sum(r["checkpoint_bytes"] for r in results),
        max(max(r["peak_rss"]) for r in results),
        {r["index"]: r["accuracy"][-1] for r in results},
    )


def python_workers() -> list[int]:
    """Pids of the Python processes under this driver (Spark's daemon and workers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                parent = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, stack = [], list(children.get(os.getpid(), []))
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                command = handle.read().split(b"\0")[0]
        except OSError:
            continue
        if b"python" in os.path.basename(command):
            found.append(pid)
    return found


class Bench:
    """The systems on one Spark session, dataset and grid.

    Args:
        setting: The workload.
        location: Where the prepared dataset lives.
        spark: The Spark session every system runs on.
        keep_logs: Where to copy each cerebro run's event log (``None``: nowhere).
        pack: cerebro-spark's ``pack``.
        mlflow_uri: The MLflow tracking server's URI (for ``optuna``).
    """

    def __init__(
        self,
        setting: Setting,
        location: Location,
        spark: Any,
        keep_logs: str | None = None,
        pack: str = "off",
        mlflow_uri: str | None = None,
    ) -> None:
        self.setting, self.location, self.spark = setting, location, spark
        self.keep_logs = keep_logs
        self.mlflow_uri = mlflow_uri
        self.pack: str | int = int(pack) if pack.isdigit() else pack
        self.backend: Any = None
        filesystem = location.filesystem()
        with filesystem.open_input_file(f"{location.path}/manifest.json") as handle:
            manifest = handle.read().decode()
        self.job = Job(location, manifest, tuple(setting.configs), setting.epochs, setting.workers)
        self.scratch = Path(tempfile.mkdtemp(prefix="cerebro-peers-"))

    def run(self, system: str) -> Outcome:
        runner: Callable[[], Outcome] = getattr(self, system)
        return runner()

    def cerebro(self) -> Outcome:
        from cerebro_spark.engine import parse_config, read_events, run_experiment
        from cerebro_spark.store import open_store

        setting = self.setting
        name = uuid.uuid4().hex[:8]
        if self.location.endpoint is None:
            store = str(self.scratch / name)
        else:
            store = self.location.uri(f"{self.location.path.split('/')[0]}/runs/{name}")
        raw = {
            "name": "peers",
            "seed": 0,
            "store": store,
            "data": {"dataset": self.location.uri()},
            "procedure": "grid",
            "epochs": setting.epochs,
            "workers": setting.workers,
            "backend": "spark",
            "spark": {"master": self.spark.sparkContext.master},
            "pack": self.pack,
            "space": {
                "model": SPEC,
                "hidden_units": {"grid": [list(h) for h in setting.hidden]},
                "lr": {"grid": list(setting.lrs)},
                "batch_size": setting.batch_size,
                "validation_batch_size": VALIDATION_BATCH,
            },
        }
        for pid in python_workers():
            reset_peak_rss(pid)
        started = time.perf_counter()
        result = run_experiment(
            parse_config(raw), experiment_id="peers", backend_factory=self._cerebro_backend
        )
        seconds = time.perf_counter() - started
        rss = max((peak_rss(pid) for pid in python_workers()), default=0)
        experiment = open_store(store).child("experiments/peers")
        events = read_events(experiment)
        if self.keep_logs:
            kept = Path(self.keep_logs) / f"cerebro-{name}.events.jsonl"
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_text("".join(json.dumps(event) + "\n" for event in events))
            startup = self.backend.stats().startup
            kept.with_suffix(".startup.json").write_text(json.dumps(startup, indent=1))
        accuracy = cerebro_accuracy(events, result.trials, setting.configs, "hidden_units")
        read, moved = cerebro_bytes(events)
        if self.location.endpoint is None:
            shutil.rmtree(store, ignore_errors=True)
        return Outcome("cerebro", seconds, read, moved, rss, accuracy)

    def _cerebro_backend(self, config: Any) -> Any:
        """The Spark backend ``run`` builds, given time to load a large dataset from S3.

        Its default ``start_timeout_s`` (300 s) is shorter than two workers loading 0.6 GB
        each from the moto server on this loaded machine took.
        """
        from cerebro_spark.backends import SparkBackend

        self.backend = SparkBackend(config.workers, spark=self.spark, start_timeout_s=3600.0)
        return self.backend

    def hyperopt(self) -> Outcome:
        from hyperopt import STATUS_OK, SparkTrials, fmin, hp  # type: ignore[import-untyped]

        job, count = self.job, len(self.job.configs)

        def objective(index: int) -> dict[str, Any]:
            result = train_one_config(job, index)
            return {"loss": -result["accuracy"][-1], "status": STATUS_OK, "peer": result}

        def grid(new_ids: list[int], domain: Any, trials: Any, seed: int) -> list[Any]:
            docs = []
            for new_id in new_ids:
                misc = {
                    "tid": new_id,
                    "cmd": domain.cmd,
                    "workdir": domain.workdir,
                    "idxs": {"config": [new_id]},
                    "vals": {"config": [new_id % count]},
                }
                docs.extend(trials.new_trial_docs([new_id], [None], [domain.new_result()], [misc]))
            return docs

        trials = SparkTrials(parallelism=self.setting.workers, spark_session=self.spark)
        started = time.perf_counter()
        fmin(
            objective,
            hp.choice("config", list(range(count))),
            algo=grid,
            max_evals=count,
            trials=trials,
            rstate=np.random.default_rng(0),
            show_progressbar=False,
        )
        seconds = time.perf_counter() - started
        results = [r["peer"] for r in trials.results if r.get("status") == STATUS_OK]
        if sorted(r["index"] for r in results) != list(range(count)):
            raise RuntimeError(f"SparkTrials did not train every config once: {trials.results}")
        return _totals("hyperopt", seconds, results)

    def plain(self) -> Outcome:
        job, count = self.job, len(self.job.configs)
        started = time.perf_counter()
        results = (
            self.spark.sparkContext.parallelize(range(count), count)
            .map(lambda index: train_one_config(job, index))
            .collect()
        )
        return _totals("plain", time.perf_counter() - started, results)

    def ddp(self) -> Outcome:
        from pyspark.ml.torch.distributor import TorchDistributor

        started = time.perf_counter()
        results = [
            TorchDistributor(
                num_processes=self.setting.workers, local_mode=False, use_gpu=False
            ).run(ddp_train, self.job, index)
            for index in range(len(self.job.configs))
        ]
        return _totals("ddp", time.perf_counter() - started, results)  # type: ignore[arg-type]

    def optuna(self) -> Outcome:
        """Optuna on Spark through MLflow 3's ``MlflowSparkStudy`` (see the module docstring)."""
        import mlflow
        from mlflow.optuna.storage import MlflowStorage
        from mlflow.pyspark.optuna.study import MlflowSparkStudy
        from optuna.trial import TrialState

        if self.mlflow_uri is None:
            raise RuntimeError("optuna needs an MLflow tracking server (Bench's mlflow_uri)")
        job, count, uri = self.job, len(self.job.configs), self.mlflow_uri
        name = f"peers-{uuid.uuid4().hex[:8]}"
        experiment = mlflow.MlflowClient(uri).create_experiment(name)

        def objective(trial: Any) -> float:
            index = trial.suggest_categorical("config", list(range(count)))
            result = train_one_config(job, index)
            trial.set_user_attr("peer", result)
            return float(result["accuracy"][-1])

        started = time.perf_counter()
        mlflow.set_tracking_uri(uri)  # MlflowStorage's client takes the global URI
        study = MlflowSparkStudy(
            name,
            MlflowStorage(experiment_id=experiment),
            sampler=task_grid_sampler(),
            mlflow_tracking_uri=uri,
            direction="maximize",
        )
        study.optimize(objective, n_trials=count)  # n_jobs=-1: one Spark task per trial
        seconds = time.perf_counter() - started
        trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        results = [trial.user_attrs["peer"] for trial in trials]
        if sorted(r["index"] for r in results) != list(range(count)):
            raise RuntimeError(f"MlflowSparkStudy did not train every config once: {trials}")
        return _totals("optuna", seconds, results)

    def ray(self) -> Outcome:
        """Ray Tune on a Ray cluster on Spark (see the module docstring)."""
        import ray
        import ray.cloudpickle
        from ray import tune
        from ray.util.spark import setup_ray_cluster, shutdown_ray_cluster

        if __name__ != "__main__":  # as for Spark: ship this module's functions by value
            ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]
        job, count, workers = self.job, len(self.job.configs), self.setting.workers

        def trainable(config: dict[str, Any]) -> None:
            result = train_one_config(job, config["config"])
            tune.report({"accuracy": result["accuracy"][-1], "peer": json.dumps(result)})

        temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's Unix socket paths
        hook = {"RAY_ON_SPARK_START_HOOK": f"{__name__}.RayPathHook"}
        started = time.perf_counter()
        try:
            with _environ(hook):
                address, _ = setup_ray_cluster(
                    max_worker_nodes=workers,
                    ray_temp_root_dir=temp,
                    head_node_options={"include_dashboard": False},
                )
            try:
                ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
                cluster_s = time.perf_counter() - started
                tuner = tune.Tuner(
                    tune.with_resources(trainable, {"cpu": 1}),
                    param_space={"config": tune.grid_search(list(range(count)))},
                    tune_config=tune.TuneConfig(max_concurrent_trials=workers),
                    run_config=tune.RunConfig(
                        name=f"peers-{uuid.uuid4().hex[:8]}",
                        storage_path=str(self.scratch / "ray-results"),
                        verbose=0,
                    ),
                )
                grid = tuner.fit()
                seconds = time.perf_counter() - started
            finally:
                ray.shutdown()
                shutdown_ray_cluster()  # ends the Spark job that holds the worker nodes
        finally:
            shutil.rmtree(temp, ignore_errors=True)
        if grid.errors:
            raise RuntimeError(f"Ray Tune trials failed: {grid.errors}")
        results = [json.loads((grid[i].metrics or {})["peer"]) for i in range(len(grid))]
        if sorted(r["index"] for r in results) != list(range(count)):
            raise RuntimeError(f"Ray Tune did not train every config once: {results}")
        outcome = _totals("ray", seconds, results)
        outcome.note = f"(Ray cluster start {cluster_s:.1f} s)"
        return outcome

    def warm_up(self, system: str | None = None) -> None:
        """Start every Python worker and import torch in it (a cost no system should pay).

        ``torch._dynamo`` too: the first optimizer step in a process imports it (seconds),
        so without it whichever system runs first in a Python worker pays that import
        (cerebro's workers at start-up, a peer in its first task). Before ``optuna`` also
        in the Python workers of ``mapInPandas`` tasks, which Spark keeps apart from the RDD
        tasks' workers.

        Args:
            system: The system about to run (``None``: any but ``optuna``).
        """
        workers = self.setting.workers

        def touch(_: int) -> int:
            import torch
            import torch._dynamo

            return int(torch.ones(1).sum())

        self.spark.sparkContext.parallelize(range(workers), workers).map(touch).collect()
        if system == "optuna":

            def touch_frames(frames: Iterator[Any]) -> Iterator[Any]:
                touch(0)
                yield from frames

            frames = self.spark.range(0, workers, 1, workers)
            frames.mapInPandas(touch_frames, "id long").collect()

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


# ---------------------------------------------------------------------- the tables


def _size(value: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} B"


def _spread(values: Sequence[float], fmt: str) -> str:
    low, mid, high = min(values), statistics.median(values), max(values)
    if len(values) == 1:
        return format(mid, fmt)
    return f"{format(mid, fmt)} [{format(low, fmt)}-{format(high, fmt)}]"


def tables(
    setting: Setting, runs: list[dict[str, Outcome]], missing: Mapping[str, str] | None = None
) -> str:
    """The wall-time table and the accuracy table, over every repeat (of the systems run).

    Args:
        setting: The workload.
        runs: Each repeat's outcomes, by system.
        missing: Systems asked for that could not run here, and why: one row each.
    """
    systems = [system for system in SYSTEMS if system in runs[0]]
    lines = [
        "| system | wall s median [range] | x cerebro median [range] | data read "
        "| ckpt moved | peak RSS / worker |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for system in systems:
        outcomes = [run[system] for run in runs]
        ratios = [run[system].seconds / run["cerebro"].seconds for run in runs if "cerebro" in run]
        lines.append(
            f"| {system} | {_spread([o.seconds for o in outcomes], '.1f')} "
            f"| {_spread(ratios, '.2f') if ratios else '-'} "
            f"| {_size(statistics.median(o.bytes_read for o in outcomes))} "
            f"| {_size(statistics.median(o.checkpoint_bytes for o in outcomes))} "
            f"| {_size(statistics.median(o.peak_rss for o in outcomes))} |"
        )
    for system, reason in (missing or {}).items():
        lines.append(f"| {system} | not run: {reason} | - | - | - | - |")
    lines += [
        "",
        "Final validation accuracy per config (median over repeats):",
        "",
        "| config | " + " | ".join(systems) + " |",
        "|---|" + "--:|" * len(systems),
    ]
    for index, config in enumerate(setting.configs):
        cells = [
            f"{statistics.median(run[system].accuracy[index] for run in runs):.4f}"
            for system in systems
        ]
        name = f"hidden {config['hidden_units']}, lr {config['lr']:g}"
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _order(repeat: int, systems: Sequence[str] = SYSTEMS) -> list[str]:
    """The order of repeat ``repeat``: ``systems`` rotated by ``repeat``."""
    shift = repeat % len(systems)
    return [*systems[shift:], *systems[:shift]]


def unavailable(systems: Sequence[str]) -> dict[str, str]:
    """The systems of ``systems`` whose packages are not installed here, and why."""
    needs = {
        "hyperopt": ("hyperopt", "Hyperopt", "bench"),
        "optuna": ("mlflow.pyspark.optuna.study", "MLflow's MlflowSparkStudy", "tracking"),
        "ray": ("ray.util.spark", "Ray Tune", "peers"),
    }
    missing = {}
    for system in systems:
        if system not in needs:
            continue
        module, what, extra = needs[system]
        try:
            importlib.import_module(module)
        except ImportError as error:
            missing[system] = f"{what} is not installed here ({error}; pip install -e '.[{extra}]')"
    return missing


def _register_pickle_by_value() -> None:
    """Let Spark ship this module's functions by value when it is imported, not run."""
    if __name__ == "__main__":
        return
    import cloudpickle  # type: ignore[import-untyped]
    from pyspark import cloudpickle as spark_cloudpickle

    module = sys.modules[__name__]
    for pickler in (cloudpickle, spark_cloudpickle):
        pickler.register_pickle_by_value(module)


def benchmark(args: argparse.Namespace) -> tuple[str, list[dict[str, Outcome]]]:
    """Run every repeat; return the report (header and tables) and each repeat's outcomes."""
    from pyspark.sql import SparkSession

    from cerebro_spark.spark_session import spark_session

    overrides = {
        key: getattr(args, key)
        for key in ("rows", "features", "epochs", "workers", "partitions")
        if getattr(args, key) is not None
    }
    if args.storage is not None:
        overrides["s3"] = args.storage == "s3"
    setting = dataclasses.replace(SETTINGS[args.setting], **overrides)
    _register_pickle_by_value()
    local = prepared_dataset(setting, Path(args.data_dir))
    size = sum(f.stat().st_size for f in (local / "train").iterdir())
    missing = unavailable(args.systems)
    systems = [system for system in args.systems if system not in missing]
    for system, reason in missing.items():
        logger.warning("%s: not run: %s", system, reason)
    # before the JVM starts, so that its Python workers inherit it: MLflow's client prints
    # a "View run" line per trial run it ends
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    load_before = os.getloadavg()
    runs: list[dict[str, Outcome]] = []
    with contextlib.ExitStack() as servers:
        endpoint = servers.enter_context(contextlib_s3(setting.s3))
        mlflow_uri = None
        if "optuna" in systems:
            mlflow_exe = mlflow_server_venv(
                Path(args.mlflow_venv or Path(args.data_dir) / "mlflow-server")
            )
            mlflow_uri = servers.enter_context(mlflow_server(mlflow_exe))
        location = Location(str(local)) if endpoint is None else upload(local, endpoint)
        if endpoint is not None:  # before the JVM starts: its Python workers inherit them
            for name, value in {
                "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": REGION,
                "AWS_EC2_METADATA_DISABLED": "true",
            }.items():
                os.environ[name] = value
        ours = SparkSession.getActiveSession() is None
        spark = spark_session(
            f"local[{setting.workers}]",
            "cerebro-spark peers",
            {
                "spark.ui.enabled": "false",
                "spark.ui.showConsoleProgress": "false",
                "spark.driver.memory": "2g",
            },
        )
        spark.sparkContext.setLogLevel("ERROR")
        bench = Bench(setting, location, spark, args.keep_logs, args.pack, mlflow_uri)
        try:
            for repeat in range(args.repeats):
                run: dict[str, Outcome] = {}
                for system in _order(repeat, systems):
                    bench.warm_up(system)  # Spark stops Python workers idle for a minute
                    run[system] = bench.run(system)
                    print(
                        f"repeat {repeat + 1}/{args.repeats} {system}: {run[system].seconds:.1f} s"
                        + (f" {run[system].note}" if run[system].note else ""),
                        flush=True,
                    )
                runs.append(run)
        finally:
            bench.close()
            if ours:
                spark.stop()
    load_after = os.getloadavg()
    orders = ["".join(s[0].upper() for s in _order(r, systems)) for r in range(args.repeats)]
    legend = ", ".join(f"{system[0].upper()} {system}" for system in SYSTEMS)
    header = [
        f"# benchmarks/peers.py --setting {args.setting}",
        "",
        f"command: python benchmarks/peers.py {' '.join(args.argv)}",
        f"setting {args.setting}: {setting.rows:,} rows x {setting.features} float32 features "
        f"({size / 1e9:.3f} GB = {_size(size)} of training Parquet, "
        f"{setting.partitions} partitions per split, "
        f"{'S3 (moto, 127.0.0.1)' if setting.s3 else 'local disk'}), "
        f"{len(setting.configs)} configs x {setting.epochs} epochs, batch {setting.batch_size}, "
        f"{setting.workers} workers, local[{setting.workers}], 1 torch thread each; "
        f"cerebro pack: {args.pack}",
        f"machine: {os.cpu_count()} cores, load average {load_before[0]:.2f} before, "
        f"{load_after[0]:.2f} after (shared with other work)",
        f"orders: {', '.join(orders)} ({legend})",
        *_versions(systems),
        "",
    ]
    text = "\n".join(header) + tables(setting, runs, missing) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    return text, runs


def _versions(systems: Sequence[str]) -> list[str]:
    """A header line with the versions of the new peers' packages, when they ran."""
    from importlib.metadata import version

    parts = []
    if "optuna" in systems:
        parts.append(
            f"optuna {version('optuna')} with mlflow-skinny {version('mlflow-skinny')}'s "
            f"MlflowSparkStudy (server: mlflow {MLFLOW_VERSION}, 127.0.0.1, SQLite)"
        )
    if "ray" in systems:
        parts.append(f"ray {version('ray')} (ray.util.spark, ray.tune)")
    return [f"peers: {'; '.join(parts)}"] if parts else []


@contextmanager
def contextlib_s3(wanted: bool) -> Iterator[str | None]:
    """An S3 server when ``wanted``, else ``None``."""
    if not wanted:
        yield None
        return
    with s3_server() as endpoint:
        yield endpoint


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--setting", choices=tuple(SETTINGS), default="small")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, help="override the setting's rows")
    parser.add_argument("--features", type=int, help="override the setting's features")
    parser.add_argument("--epochs", type=int, help="override the setting's epochs")
    parser.add_argument("--workers", type=int, help="override the setting's workers")
    parser.add_argument("--partitions", type=int, help="override the setting's partitions")
    parser.add_argument(
        "--storage", choices=("local", "s3"), help="override where the setting's data lives"
    )
    parser.add_argument(
        "--data-dir",
        default=os.path.join(tempfile.gettempdir(), "cerebro-peers-data"),
        help="where the generated data is prepared once and reused",
    )
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma-separated systems to run, in this order (default: {','.join(SYSTEMS)})",
    )
    parser.add_argument(
        "--keep-logs",
        metavar="DIR",
        help="copy each cerebro run's event log (events.jsonl) into DIR, for a breakdown",
    )
    parser.add_argument(
        "--pack", default="off", help="cerebro-spark's pack: off, auto or N (default off)"
    )
    parser.add_argument(
        "--mlflow-venv",
        metavar="DIR",
        default=os.environ.get("CEREBRO_MLFLOW_SERVER_VENV"),
        help="a virtual environment with full mlflow for optuna's tracking server (built "
        "there once if it has none; default $CEREBRO_MLFLOW_SERVER_VENV, else "
        "DATA_DIR/mlflow-server)",
    )
    parser.add_argument("--out", help="also write the report to this file")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    systems = [name.strip() for name in args.systems.split(",") if name.strip()]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown or not systems or len(set(systems)) != len(systems):
        parser.error(
            f"--systems {args.systems!r}: each of {', '.join(SYSTEMS)} at most once, "
            f"at least one (unknown: {', '.join(unknown) or 'none'})"
        )
    args.systems = tuple(systems)
    args.argv = argv
    return args


def main(argv: Sequence[str] | None = None) -> str:
    logging.basicConfig(format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logger.setLevel(logging.INFO)  # this script's notes; other libraries' warnings only
    args = parse_args(argv)
    text, _ = benchmark(args)
    print(text)
    return text


if __name__ == "__main__":
    main()
