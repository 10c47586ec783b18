"""The driver's cost of a trial's validation metrics, by the number of partitions P.

At the end of a trial's epoch the driver merges the metric states of its P validation
units and takes their values (:func:`~cerebro_spark.driver._state.epoch_metrics`): the
default classification family, 36 metrics for 10 classes, whose precision, recall and F1
share one state per unit, and ROC AUC's binned counts (zlib and base64 in the log).
Merged pairwise, ROC AUC's counts were decoded and re-encoded P - 1 times; with
:meth:`~cerebro_spark.metrics.Metric.merge_all` each unit's state is decoded once and the
sum encoded once.

For each P and class count, makes P unit states of 600 random rows as a worker does
(``MLPSpec``'s validation :class:`~cerebro_spark.training._metrics.PassMetrics`, then
:func:`~cerebro_spark.units.pack_states` and back, as the result travels and is
logged), then prints the least of ``--repeat`` process-CPU timings of ``epoch_metrics``
per trial epoch, and that per unit (a trial's epoch is P train and P validation units),
with a digest of the metrics (equal digests: the same metrics, bit for bit, e.g. from two
versions of the library on ``PYTHONPATH``).

    python benchmarks/epoch_metrics.py [--partitions 2 16 64 256] [--classes 2 10]
        [--repeat 15]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from types import SimpleNamespace

import numpy as np
import torch

from cerebro_spark.data import DatasetInfo
from cerebro_spark.driver._state import epoch_metrics
from cerebro_spark.metrics import State
from cerebro_spark.training import MLPSpec
from cerebro_spark.training._metrics import PassMetrics, family_metrics
from cerebro_spark.units import pack_states, unpack_states

ROWS = 600
CPU = torch.device("cpu")


def unit_states(metrics: PassMetrics, classes: int, rng: np.random.Generator) -> dict[str, State]:
    """One validation unit's states as a worker reports them, through the wire and back."""
    logits = torch.from_numpy(rng.normal(size=(ROWS, classes)))
    labels = torch.from_numpy(rng.integers(0, classes, ROWS))
    metrics.add(logits, labels, torch.tensor(1.0))
    states, _ = metrics.report()
    return unpack_states(json.loads(json.dumps(pack_states(states))))


def measure(partitions: int, classes: int, repeat: int) -> tuple[float, str]:
    """Least CPU seconds of ``epoch_metrics`` for one trial epoch, and its metrics' digest."""
    spec, info = MLPSpec(), DatasetInfo((classes,), "classification", classes)
    metrics = family_metrics(spec, info)
    rng = np.random.default_rng([partitions, classes])
    units = {
        p: unit_states(PassMetrics(spec, info, CPU, training=False), classes, rng)
        for p in range(partitions)
    }
    state = SimpleNamespace(  # what epoch_metrics reads of the folded log
        validation_states={"t": units},
        validation_units={"t": partitions},
        validation_rows={"t": ROWS * partitions},
        validation_sums={"t": {}},
    )
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        values = epoch_metrics(state, "t", metrics)  # type: ignore[arg-type]
        best = min(best, time.process_time() - started)
    digest = hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:12]
    return best, digest


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, nargs="+", default=[2, 16, 64, 256])
    parser.add_argument("--classes", type=int, nargs="+", default=[2, 10])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'classes':>7} {'P':>5} {'ms / trial epoch':>16} {'us / unit':>10}  metrics digest")
    for classes in args.classes:
        for partitions in args.partitions:
            seconds, digest = measure(partitions, classes, args.repeat)
            per_unit = seconds / (2 * partitions)
            print(
                f"{classes:>7} {partitions:>5} {seconds * 1e3:>16.2f} {per_unit * 1e6:>10.1f}"
                f"  {digest}",
                flush=True,
            )


if __name__ == "__main__":
    main()
