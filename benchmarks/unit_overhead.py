"""A training unit against a bare PyTorch loop: same data, model, optimizer, batches.

In one process, on in-memory tensors, interleaved and paired (each repetition runs every
variant once, in rotating order), for units sized so that the bare loop takes about
0.01, 0.1, 0.5 and 2 s:

* **bare**: the loop a peer writes: a model and Adam built once, then per batch
  ``x, y = features[index], labels[index]``, ``zero_grad``, forward, cross-entropy,
  ``backward``, ``step``; nothing else (no metric, no check);
* **pass**: our train loop (``_train_pass``: seeded batch order and torch stream, the
  finite-loss check, the loss and the default metrics a training pass computes, on the
  device, deterministic algorithms on) on a model kept alive between runs, plus ``report_metrics``;
* **worker**: the unit as a worker runs it since its checkpoint write overlaps the next
  unit (issue 13, part 3): ``train_unit`` (the pass and the checkpoint taken), its
  encoding and write in a thread while the next unit (another trial's) trains; timed:
  what keeps the worker from its next unit;
* **unit**: the real :func:`~cerebro_spark.training.run_unit`: spec loading, model and
  optimizer built and restored from the previous unit's checkpoint (given its digest, as
  the engine gives it, so the worker's checkpoint cache answers, as when a trial comes
  back to the worker that wrote its checkpoint), the pass, the checkpoint encoded and
  written (fsync'd) to a local :class:`~cerebro_spark.store.FileSystemStore`.

Same model (``MLPSpec``: 64 features -> 128 ReLU -> 10 classes), same Adam, batch size
64, same row permutation, same thread count (``torch.set_num_threads``, default 1, what
the engine's ``torch_threads`` gives a worker). Prints the median seconds of each
variant and the median of the paired overheads (``variant / bare - 1``), on the wall
clock and on process CPU time (one torch thread: CPU time is what the loop costs, and
is far less disturbed than wall time on a shared machine), and the overhead of the least
CPU time of each variant (``+%min``: the least disturbed runs, on a loaded machine the
closest to the code's own cost).

    python benchmarks/unit_overhead.py [--repeat 7] [--threads 1] [--device cpu]
        [--model mlp]  (cnn: CNNSpec, two conv blocks of 32 and 64 channels on 3x32x32;
                        mlp-wide: hidden layers of 1,024 and 1,024, a 13.5 MB checkpoint)
        [--profile]   (cProfile of a 0.5 s pass and of five 0.1 s units: where time goes)

On a GPU (``--device cuda --model cnn``) every variant copies each batch from host memory
to the device, as the bare loop does, and ends with the device synchronised (the bare
loop by ``torch.cuda.synchronize``, ours by reading its metrics and loss to the host).

**Where the gap came from** (numbers in ``benchmarks/results/unit_overhead.txt``): the
train loop itself, not checkpoints. Every batch updated each default metric separately:
for 10 classes that is accuracy, top-5, log loss, and precision/recall/F1 macro and per
class, 33 count metrics each recomputing the same argmax and one-hot counts: about 300
small tensor operations per batch, more than the forward, backward and Adam step of a
small MLP (the pass took 4.4x the bare loop here; with 3 classes, 12 count metrics, it is
the issue's 1.2-1.6x). Per-operation dispatch cost, not arithmetic, dominated, spread
over hundreds of tiny ``sum``/``argmax``/``arange``/``eq`` calls, so a profile by function
showed no hot spot (the "~10 % explained"). ``float(loss)`` per batch (the finite-loss
check) added a host sync per batch on a GPU. Thread count and deterministic algorithms
were not the cause (same ``torch.set_num_threads`` in unit and bare loop; deterministic
mode costs 0-1.4 % on CPU).

The fix: a pass buffers each batch's detached outputs, labels and loss and adds them to
the metrics in groups (one update per metric per group; every metric is exact over any
grouping of rows, the protocol already requires it); count metrics with one
``accumulator_key`` share one accumulator, updated once; the loss is checked for
finiteness once per 64 batches. Same weights bit for bit, same counts. What is left
(pass: +6 to +13 % CPU on this 0.5 ms-per-batch MLP): the metrics' own arithmetic, about
300 ns per row (float64 log loss most of it), and a few microseconds per batch; a unit
adds a fixed ~9 ms CPU (checkpoint decode and encode, model build), which the checkpoint
cache being built separately removes for a trial returning to its worker.

**Then** (issue 13, part 2): the metrics of a group share one
:class:`~cerebro_spark.metrics.Batch` (the argmax, the label's score and rank, per-class
counts by ``bincount`` computed once; log loss as ``logsumexp`` minus the label's score
in float64 instead of a float64 ``log_softmax``): 2.7 -> 1.2 ms for 3,584 rows of 10
classes, about 100 ns per row. The fixed cost of a unit went from 9 to about 4.5-6 ms
CPU: a checkpoint the worker wrote is restored from the cache without decoding it
(3.6 ms of ``torch.load(weights_only=True)`` replaced by 0.2 ms of unpacking), and CPU
units seed the CPU generator alone (``torch.manual_seed`` spent 0.2 ms, twice a unit,
queuing seeds for accelerators). What is left: ``torch.save`` (0.9-1.4 ms), the store's
atomic, fsync'd put (0.6 ms CPU; 6-8 ms of wall time on this disk), building the model
and optimizer (0.8 ms, most of it the initial weights' random draws), the report (0.6
ms) and the metrics' arithmetic.

**Then, on a quiet machine**, the pass itself was the gap (+6 to +10 % at 0.1-2 s): a
tensor operation costs 2-3 us here, and a batch added six that nothing needed (detaches,
reshapes, the finite check's own copy of the loss), and the 36 default metrics of a
10-class problem ran on every training pass though nothing reads them there. Now one
detached loss serves the check and the metrics, one guard wraps a batch's user code,
and training passes compute the loss and accuracy (other classification metrics are
validation only unless made with ``on_train=True``): the pass is +3 to +5 %, a unit and
a worker +4 to +7 % (``benchmarks/results/unit_overhead.txt``).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from cerebro_spark.data import DatasetInfo, PartitionData
from cerebro_spark.store import open_store
from cerebro_spark.training import _unit as unit_module
from cerebro_spark.training import run_unit, train_unit
from cerebro_spark.training._loading import load_spec
from cerebro_spark.units import UnitKind, UnitResult, UnitTask

MODELS: dict[str, tuple[str, dict[str, Any], tuple[int, ...]]] = {
    # name: (spec, params, feature shape)
    "mlp": (
        "cerebro_spark.training:MLPSpec",
        {"hidden_units": [128], "lr": 1e-3, "batch_size": 64, "standardize": False},
        (64,),
    ),
    "mlp-wide": (  # two hidden layers of 1,024: a 13.5 MB checkpoint to encode and write
        "cerebro_spark.training:MLPSpec",
        {"hidden_units": [1024, 1024], "lr": 1e-3, "batch_size": 64, "standardize": False},
        (64,),
    ),
    "cnn": (  # a small CNN on CIFAR-sized images: 2 conv blocks (32, 64), dense 128
        "cerebro_spark.training:CNNSpec",
        {"channels": [32, 64], "dense_units": 128, "lr": 1e-3, "batch_size": 64,
         "standardize": False},
        (3, 32, 32),
    ),
}  # fmt: skip
CLASSES, BATCH = 10, 64
TARGETS = (0.01, 0.1, 0.5, 2.0)


def make_data(rows: int, shape: tuple[int, ...]) -> PartitionData:
    rng = np.random.default_rng(0)
    features = rng.standard_normal((rows, *shape), dtype=np.float32)
    labels = rng.integers(0, CLASSES, rows)
    return PartitionData.from_arrays("train", 0, features, labels, bytes_read=0)


class Bare:
    """The peer's loop: model and optimizer built once, trained batch after batch."""

    def __init__(self, info: DatasetInfo, device: torch.device, task: UnitTask) -> None:
        spec = load_spec(task.spec)
        torch.manual_seed(0)
        self.model = spec.build_model(task.params, info).to(device)
        self.optimizer = spec.build_optimizer(self.model, task.params)
        self.device = device

    def run(self, data: PartitionData, task: UnitTask) -> None:
        order = torch.from_numpy(unit_module.batch_order(task, data.rows))
        features, labels = data.tensors()
        self.model.train()
        for first in range(0, data.rows, BATCH):
            index = order[first : first + BATCH]
            x, y = features[index].to(self.device), labels[index].to(self.device)
            self.optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
            loss.backward()
            self.optimizer.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize()


class Pass:
    """Our train loop on a live model (no spec loading, no checkpoint)."""

    def __init__(self, info: DatasetInfo, device: torch.device, task: UnitTask) -> None:
        self.info, self.device = info, device
        self.spec = load_spec(task.spec)
        with unit_module.unit_environment(str(device)) as dev:
            self.state = unit_module.open_state(self.spec, task, info, dev, None)

    def run(self, data: PartitionData, task: UnitTask) -> None:
        with unit_module.unit_environment(str(self.device)) as dev:
            metrics, _, _ = unit_module._train_pass(
                self.spec, self.state, task, data, self.info, dev
            )
            unit_module.report_metrics(metrics, task)


class Unit:
    """The real unit, chaining checkpoints on a local store."""

    def __init__(
        self, info: DatasetInfo, device: torch.device, root: str, trial: str = "t0"
    ) -> None:
        self.info, self.device, self.trial = info, device, trial
        self.store = open_store(root)
        self.count = 0
        self.sha256: str | None = None  # the digest the engine logged, sent with the next unit

    def task(self, task: UnitTask) -> UnitTask:
        """The next unit of this trial's chain."""
        previous = f"{self.trial}/{self.count - 1}.pt" if self.count else None
        return UnitTask(
            UnitKind.TRAIN,
            self.trial,
            task.spec,
            task.params,
            trial_seed=task.trial_seed,
            epoch=task.epoch,
            partition=0,
            checkpoint_in=previous,
            checkpoint_out=f"{self.trial}/{self.count}.pt",
            checkpoint_in_sha256=self.sha256 if previous else None,
        )

    def run(self, data: PartitionData, task: UnitTask) -> None:
        result = run_unit(self.task(task), data, self.store, self.info, device=str(self.device))
        self.done(result)

    def done(self, result: UnitResult) -> None:
        self.sha256 = result.checkpoint_sha256
        self.count += 1


class Worker:
    """The unit as a worker runs it: the pass and the checkpoint taken (``train_unit``),
    then its encoding and write in a thread while the next unit trains (one in flight, as
    ``backends/_serve._Writer``). Two trials alternate, as on a worker: a trial's next unit
    waits for its checkpoint to be durable, another trial's does not. Timed: what keeps
    the worker from its next unit (the pass, a wait for the last write)."""

    def __init__(self, info: DatasetInfo, device: torch.device, root: str) -> None:
        self.chains = [Unit(info, device, root, trial) for trial in ("t0", "t1")]
        self.writer = ThreadPoolExecutor(1)
        self.writing: Future[None] | None = None
        self.turn = 0

    def run(self, data: PartitionData, task: UnitTask) -> None:
        chain = self.chains[self.turn % len(self.chains)]
        self.turn += 1
        trained = train_unit(
            chain.task(task), data, chain.store, chain.info, device=str(chain.device)
        )
        if self.writing is not None:
            self.writing.result()
        self.writing = self.writer.submit(lambda: chain.done(trained.write()))


def timed(
    run: Callable[[PartitionData, UnitTask], None], data: PartitionData, task: UnitTask
) -> tuple[float, float]:
    """Run once; return ``(wall seconds, process CPU seconds)``."""
    wall, cpu = time.perf_counter(), time.process_time()
    run(data, task)
    return time.perf_counter() - wall, time.process_time() - cpu


def overhead(times: dict[str, list[tuple[float, float]]], name: str, clock: int) -> float:
    """Median paired overhead of ``name`` over ``bare``, in %, on clock 0 (wall) or 1 (CPU)."""
    pairs = zip(times[name], times["bare"], strict=True)
    return 100 * statistics.median(a[clock] / b[clock] - 1 for a, b in pairs)


def least_overhead(times: dict[str, list[tuple[float, float]]], name: str) -> float:
    """Overhead of ``name``'s least process CPU time over the bare loop's least, in %.

    On a loaded machine every run is slowed by the others' use of the caches and cores,
    by amounts that swamp a few per cent; the least CPU time of each variant is the run
    least disturbed, the closest to what the code itself costs.
    """
    return 100 * (min(t[1] for t in times[name]) / min(t[1] for t in times["bare"]) - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", choices=tuple(MODELS), default="mlp")
    parser.add_argument("--targets", default=",".join(map(str, TARGETS)))
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    spec, params, shape = MODELS[args.model]
    info = DatasetInfo(shape, "classification", CLASSES)
    task = UnitTask(UnitKind.TRAIN, "t0", spec, params, trial_seed=1, epoch=0, partition=0)

    bare = Bare(info, device, task)
    calibration = make_data(64 * BATCH, shape)
    timed(bare.run, calibration, task)
    per_batch = min(timed(bare.run, calibration, task)[0] for _ in range(3)) / 64
    targets = [float(t) for t in args.targets.split(",")]
    largest = max(BATCH, int(max(targets) / per_batch) * BATCH)
    pool = make_data(largest, shape)
    print(
        f"model {args.model} {spec.rsplit(':', 1)[1]} {params} on {shape}, "
        f"device {device}, torch threads {torch.get_num_threads()}, bare loop "
        f"{per_batch * 1e3:.3f} ms per batch of {BATCH}"
    )

    if args.profile:
        # the pass over ~0.5 s of batches; then five units of ~0.1 s, where a unit's
        # fixed costs (restore, encode, write) stand out
        for variant, seconds, runs in (("pass", 0.5, 1), ("unit", 0.1, 5)):
            rows = max(BATCH, int(seconds / per_batch) * BATCH)
            data = PartitionData.from_arrays(
                "train", 0, pool.features[:rows], pool.labels[:rows], 0
            )
            with tempfile.TemporaryDirectory() as root:
                runner = Pass(info, device, task) if variant == "pass" else Unit(info, device, root)
                runner.run(data, task)
                profile = cProfile.Profile()
                for _ in range(runs):
                    profile.runcall(runner.run, data, task)
            out = io.StringIO()
            stats = pstats.Stats(profile, stream=out)
            print(f"-- {variant}: {runs} run(s) of {rows} rows")
            stats.sort_stats("cumulative").print_stats(30)
            stats.sort_stats("tottime").print_stats(15)
            print(out.getvalue())
        return

    variants = ("pass", "unit", "worker")
    print(
        f"{'target s':>8} {'rows':>7} {'batches':>7} {'bare s':>7} "
        + " ".join(f"{v + ' s':>8}" for v in variants)
        + " "
        + " ".join(f"{v + ' +%':>9}" for v in variants)
        + " "
        + " ".join(f"{v + ' +%cpu':>11}" for v in variants)
        + " "
        + " ".join(f"{v + ' +%min':>11}" for v in variants)
    )
    with tempfile.TemporaryDirectory() as root:
        for target in targets:
            rows = max(BATCH, int(target / per_batch) * BATCH)
            data = PartitionData.from_arrays(
                "train", 0, pool.features[:rows], pool.labels[:rows], 0
            )
            runners: dict[str, Callable[[PartitionData, UnitTask], None]] = {
                "bare": bare.run,
                "pass": Pass(info, device, task).run,
                "unit": Unit(info, device, f"{root}/{target}").run,
                "worker": Worker(info, device, f"{root}/{target}-worker").run,
            }
            for run in runners.values():  # warm-up, untimed
                run(data, task)
            times: dict[str, list[tuple[float, float]]] = {name: [] for name in runners}
            names = list(runners)
            for rep in range(args.repeat):
                turn = rep % len(names)
                for name in names[turn:] + names[:turn]:
                    times[name].append(timed(runners[name], data, task))

            med = {name: statistics.median(t[0] for t in values) for name, values in times.items()}
            print(
                f"{target:>8} {rows:>7} {rows // BATCH:>7} {med['bare']:>7.4f} "
                + " ".join(f"{med[v]:>8.4f}" for v in variants)
                + " "
                + " ".join(f"{overhead(times, v, 0):>+9.1f}" for v in variants)
                + " "
                + " ".join(f"{overhead(times, v, 1):>+11.1f}" for v in variants)
                + " "
                + " ".join(f"{least_overhead(times, v):>+11.1f}" for v in variants),
                flush=True,
            )


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
