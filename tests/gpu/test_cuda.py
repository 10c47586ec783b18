"""The CUDA path, on a real GPU: units, groups on NCCL, a local run and scoring.

Skipped where torch sees no GPU (CI has none); run on a machine with one with
``pytest tests/gpu``. What each test shows:

* a unit trains and validates on the GPU, deterministically (the same checkpoint bit for
  bit twice), with the CPU's validation metrics on the same checkpoint (up to float
  rounding), for an MLP and a CNN;
* a trial hops between a GPU worker and a CPU worker (checkpoints hold CPU tensors);
* a checkpoint restored for the GPU leaves the optimizer's step counts on the host;
* a data-parallel group on NCCL: a group of one equals ``run_unit`` bit for bit; a group
  of two ranks on two GPUs trains (two GPUs only: NCCL refuses two ranks on one GPU);
* ``backend: local`` with ``device: auto`` puts its workers on the GPU, and two runs of
  one config end with the same checkpoints; the best model scores the same on the GPU
  and on the CPU.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from cerebro_spark.data import DatasetInfo, PartitionData
from cerebro_spark.engine import parse_config, read_events, run_experiment
from cerebro_spark.scoring import load_model
from cerebro_spark.store import Store, open_store
from cerebro_spark.training import decode_checkpoint, run_group_unit, run_unit
from cerebro_spark.training._cache import worker_cache
from cerebro_spark.training._loading import load_spec
from cerebro_spark.training._unit import _load_checkpoint, open_state
from cerebro_spark.units import UnitKind, UnitResult, UnitTask, group_tasks

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no GPU here"),
]

MLP = "cerebro_spark.training:MLPSpec"
CNN = "cerebro_spark.training:CNNSpec"
IMAGES = DatasetInfo(feature_shape=(1, 8, 8), task="classification", num_classes=3)
FAMILIES = {
    "mlp": (MLP, {"hidden_units": [32], "lr": 0.01, "dropout": 0.2, "batch_size": 32}),
    "cnn": (CNN, {"channels": [8, 16], "lr": 0.003, "dropout": 0.2, "batch_size": 32}),
}


def images(index: int, rows: int = 256, split: str = "train") -> PartitionData:
    """Three classes of 8x8 images: a bright row, column or diagonal, plus noise."""
    rng = np.random.default_rng([index, split == "train"])
    labels = rng.integers(0, 3, rows).astype(np.int64)
    features = rng.normal(0.0, 0.5, (rows, 1, 8, 8)).astype(np.float32)
    for row, label in enumerate(labels):
        line = rng.integers(0, 8)
        if label == 0:
            features[row, 0, line, :] += 2.0
        elif label == 1:
            features[row, 0, :, line] += 2.0
        else:
            features[row, 0, np.arange(8), np.arange(8)] += 2.0
    return PartitionData.from_arrays(
        split, index, features, labels, features.nbytes + labels.nbytes
    )


def task(
    family: str, *, kind: UnitKind = UnitKind.TRAIN, epoch: int = 0, partition: int = 0,
    step: int = 0, epoch_units: int = 1, checkpoint_in: str | None = None,
    checkpoint_out: str | None = None,
) -> UnitTask:  # fmt: skip
    spec, params = FAMILIES[family]
    return UnitTask(
        kind=kind,
        trial_id=family,
        spec=spec,
        params=params,
        trial_seed=3,
        epoch=epoch,
        partition=partition,
        step=step,
        epoch_units=epoch_units,
        checkpoint_in=checkpoint_in,
        checkpoint_out=checkpoint_out if kind is UnitKind.TRAIN else None,
    )


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return open_store(str(tmp_path / "store"))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_units_on_the_gpu_are_deterministic_and_validate_as_on_the_cpu(family, store):
    start = run_unit(task(family, checkpoint_out="start.pt"), images(0), store, IMAGES,
                     device="cuda:0")  # fmt: skip
    again = [
        run_unit(
            task(family, epoch=1, partition=1, checkpoint_in="start.pt", checkpoint_out=f"{n}.pt"),
            images(1),
            store,
            IMAGES,
            device="cuda:0",
        )
        for n in ("a", "b")
    ]
    assert again[0].checkpoint_sha256 == again[1].checkpoint_sha256
    assert again[0].metric_sums == again[1].metric_sums
    assert start.checkpoint_sha256 != again[0].checkpoint_sha256
    saved = decode_checkpoint(store.get("a.pt"))
    assert all(t.device.type == "cpu" for t in saved["model"].values())  # CPU tensors at rest

    check = task(family, kind=UnitKind.VALIDATE, epoch=1, checkpoint_in="a.pt")
    validation = images(0, rows=300, split="validation")
    on_gpu = run_unit(check, validation, store, IMAGES, device="cuda:0")
    on_cpu = run_unit(check, validation, store, IMAGES, device="cpu")
    assert on_gpu.metrics().keys() == on_cpu.metrics().keys()
    for name, value in on_cpu.metrics().items():
        assert on_gpu.metrics()[name] == pytest.approx(value, rel=1e-4, abs=1e-5), name
    assert on_gpu.metrics()["accuracy"] > 0.5  # it learned (chance: 1/3)


def test_a_trial_hops_between_a_gpu_worker_and_a_cpu_worker(store):
    key, devices = None, ["cuda:0", "cpu", "cuda:0", "cpu"]
    results: list[UnitResult] = []
    for step, device in enumerate(devices):
        unit = task("cnn", partition=step, step=step, epoch_units=4, checkpoint_in=key,
                    checkpoint_out=f"hop/{step}.pt")  # fmt: skip
        results.append(run_unit(unit, images(step), store, IMAGES, device=device))
        key = unit.checkpoint_out
    counters = decode_checkpoint(store.get(key))["counters"]
    assert counters["samples_seen"] == 4 * 256
    losses = [r.metric_sums["loss"] / r.rows for r in results]
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("cached", [True, False], ids=["cache-hit", "store-read"])
def test_a_restored_optimizer_keeps_its_step_counts_on_the_host(store, cached):
    """Adam reads each step count with ``.item()``: on the GPU a host sync per parameter
    per batch (most of a unit's fixed cost on an H100 before the fix)."""
    first = run_unit(task("cnn", checkpoint_out="s.pt"), images(0), store, IMAGES,
                     device="cuda:0")  # fmt: skip
    if not cached:
        worker_cache().clear()
    unit = dataclasses.replace(
        task("cnn", epoch=1, checkpoint_in="s.pt", checkpoint_out="t.pt"),
        checkpoint_in_sha256=first.checkpoint_sha256,
    )
    read = _load_checkpoint(store, unit, "s.pt")
    assert read.cache_hit is cached
    dev = torch.device("cuda:0")
    state = open_state(load_spec(unit.spec), unit, IMAGES, dev, read.checkpoint)
    steps = [entry["step"] for entry in state.optimizer.state.values()]
    assert steps and all(step.device.type == "cpu" for step in steps)
    moments = [entry["exp_avg"] for entry in state.optimizer.state.values()]
    assert all(m.device == dev for m in moments)
    assert all(p.device == dev for p in state.model.parameters())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_group_of_one_on_nccl_is_bit_identical_to_run_unit(store):
    data = images(0)
    single = run_unit(task("mlp", checkpoint_out="single.pt"), data, store, IMAGES,
                      device="cuda:0")  # fmt: skip
    (rank,) = group_tasks(task("mlp", checkpoint_out="group.pt"), [0], "g1",
                          address="127.0.0.1", port=free_port())  # fmt: skip
    grouped = run_group_unit(rank, data, store, IMAGES, device="cuda:0")
    assert grouped.checkpoint_sha256 == single.checkpoint_sha256
    assert grouped.metric_sums == single.metric_sums
    assert not torch.distributed.is_initialized()


def _rank(rank_task: UnitTask, root: str, device: str, out: Any) -> None:
    try:
        part = images(rank_task.partition)
        out.put(run_group_unit(rank_task, part, open_store(root), IMAGES, device=device))
    except Exception as error:
        out.put(error)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a GPU per rank")
def test_a_group_of_two_ranks_trains_on_two_gpus_over_nccl(tmp_path):
    root = str(tmp_path / "store")
    base = task("cnn", epoch_units=2, checkpoint_out="pair.pt")
    ranks = group_tasks(base, [0, 1], "g2", address="127.0.0.1", port=free_port())
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    processes = [
        context.Process(target=_rank, args=(r, root, f"cuda:{i}", out), daemon=True)
        for i, r in enumerate(ranks)
    ]
    for process in processes:
        process.start()
    replies = [out.get(timeout=300) for _ in processes]
    for process in processes:
        process.join(30)
    results = sorted((r for r in replies if isinstance(r, UnitResult)), key=lambda r: r.rows)
    assert len(results) == 2, replies
    assert sum(r.checkpoint_sha256 is not None for r in results) == 1  # rank 0 writes it


def config(store: Path, **changes: Any) -> Any:
    raw = {
        "name": "gpu",
        "seed": 5,
        "store": str(store),
        "data": {"source": "sklearn:digits", "partitions": 4},
        "procedure": "grid",
        "epochs": 2,
        "workers": 2,
        "backend": "local",
        "space": {
            "choice": [
                {"model": MLP, "hidden_units": {"grid": [[64], [128]]}, "lr": 0.003},
                {"model": CNN, "channels": {"grid": [[8, 16]]}, "dropout": 0.25, "lr": 0.003},
            ]
        },
    }
    return parse_config({**raw, **changes})


def test_a_local_run_trains_on_the_gpu_reproducibly_and_its_best_model_scores_anywhere(
    tmp_path,
):
    results = [
        run_experiment(config(tmp_path / "store"), experiment_id=name) for name in ("a", "b")
    ]
    events = read_events(open_store(str(tmp_path / "store")).child("experiments/a"))
    devices = {e["worker"]: e["device"] for e in events if e["event"] == "worker_joined"}
    assert sorted(devices.values()) == ["cuda:0", "cuda:0"], devices  # device: auto
    digests = [{t.trial_id: t.checkpoint_sha256 for t in r.trials} for r in results]
    assert digests[0] == digests[1]
    best = results[0].best
    assert best is not None and best.best_metrics["accuracy"] > 0.8

    rows = np.random.default_rng(0).uniform(0, 16, (500, 1, 8, 8)).astype(np.float32)
    on_gpu = load_model(results[0].url, device="cuda").predict_proba(rows)
    on_cpu = load_model(results[0].url, device="cpu").predict_proba(rows)
    np.testing.assert_allclose(on_gpu, on_cpu, atol=1e-4)
