"""Test specs and data builders for tests/training (importable by load_spec as
``training_fixtures:Name`` because pytest puts this directory on sys.path)."""

import numpy as np
import torch

from cerebro_spark.data import DatasetInfo, PartitionData
from cerebro_spark.metrics import Metric
from cerebro_spark.store import Store
from cerebro_spark.training import MLPSpec, ModelSpec, decode_checkpoint, load_spec, run_unit
from cerebro_spark.training._group import group_steps, local_batch_sizes
from cerebro_spark.training._unit import batch_order, open_state, unit_environment
from cerebro_spark.units import UnitKind, UnitTask

MLP = "cerebro_spark.training:MLPSpec"
CNN = "cerebro_spark.training:CNNSpec"
BLOBS_INFO = DatasetInfo(feature_shape=(4,), task="classification", num_classes=2)


def blobs(index: int, rows: int = 200, split: str = "train", seed: int = 0) -> PartitionData:
    """Two well-separated Gaussian blobs in 4-D (seeded by ``seed`` and ``index``)."""
    rng = np.random.default_rng([seed, index, split == "train"])
    labels = rng.integers(0, 2, size=rows).astype(np.int64)
    centers = np.where(labels[:, None] == 1, 1.5, -1.5).astype(np.float32)
    features = (centers + rng.normal(size=(rows, 4))).astype(np.float32)
    return PartitionData.from_arrays(
        split, index, features, labels, features.nbytes + labels.nbytes
    )


def train_task(
    trial_id: str = "t0",
    *,
    spec: str = MLP,
    params: dict | None = None,
    seed: int = 1,
    epoch: int = 0,
    partition: int = 0,
    step: int = 0,
    epoch_units: int = 1,
    checkpoint_in: str | None = None,
    checkpoint_out: str | None = None,
) -> UnitTask:
    return UnitTask(
        kind=UnitKind.TRAIN,
        trial_id=trial_id,
        spec=spec,
        params=params if params is not None else {"hidden_units": [16], "lr": 0.01},
        trial_seed=seed,
        epoch=epoch,
        partition=partition,
        step=step,
        epoch_units=epoch_units,
        checkpoint_in=checkpoint_in,
        checkpoint_out=checkpoint_out or f"{trial_id}/e{epoch}s{step}.pt",
    )


def validate_task(train: UnitTask, checkpoint: str, partition: int = 0) -> UnitTask:
    return UnitTask(
        kind=UnitKind.VALIDATE,
        trial_id=train.trial_id,
        spec=train.spec,
        params=train.params,
        trial_seed=train.trial_seed,
        epoch=train.epoch,
        partition=partition,
        checkpoint_in=checkpoint,
    )


def train_epochs(store, info, parts, *, epochs, trial_id="t0", spec=MLP, params=None, seed=1):
    """Train ``epochs`` MOP epochs over ``parts`` (seeded visit orders); return the last key
    and the train results."""
    key, results = None, []
    for epoch in range(epochs):
        order = np.random.default_rng([seed, epoch]).permutation(len(parts))
        for step, index in enumerate(order):
            task = train_task(
                trial_id,
                spec=spec,
                params=params,
                seed=seed,
                epoch=epoch,
                partition=int(index),
                step=step,
                epoch_units=len(parts),
                checkpoint_in=key,
            )
            results.append(run_unit(task, parts[int(index)], store, info))
            key = task.checkpoint_out
    return key, results


class RaisingSpec(MLPSpec):
    def build_model(self, params, info):
        raise ValueError("boom in build_model")


class NaNLossSpec(MLPSpec):
    def loss(self, outputs, labels, info):
        return super().loss(outputs, labels, info) * float("nan")


class LossMetricSpec(MLPSpec):
    def metrics(self, outputs, labels, info):
        return {"loss": torch.tensor(0.0)}


class Positives(Metric):
    """Share of rows labelled 1: a custom metric with an additive state (default merge)."""

    name, mode = "positives", "max"

    def init(self, device):
        zero = torch.zeros((), dtype=torch.int64, device=device)
        return {"hits": zero, "count": zero.clone()}

    def update(self, acc, outputs, labels):
        acc["hits"] += (labels == 1).sum()
        acc["count"] += labels.shape[0]

    def value(self, state):
        return state["hits"] / state["count"] if state["count"] else float("nan")


class CustomMetricSpec(MLPSpec):
    def build_metrics(self, info):
        return [*super().build_metrics(info), Positives()]


class BatchMeanSpec(MLPSpec):
    def metrics(self, outputs, labels, info):
        return {"accuracy": torch.tensor(1.0), "half": 0.5}


class BrokenConstructorSpec(MLPSpec):
    def __init__(self) -> None:
        raise RuntimeError("constructor exploded")


class NotAModule(ModelSpec):
    def build_model(self, params, info):
        return "not a module"


def one_worker_on_concatenated_batches(
    tasks: tuple[UnitTask, ...],
    parts: dict[int, PartitionData],
    store: Store,
    info: DatasetInfo = BLOBS_INFO,
) -> dict[str, torch.Tensor]:
    """Train one model in this process, each step on the concatenation of the ranks'
    local batches (same rows, same order), with the global batch's mean loss: what a
    group unit's all-reduce must compute (up to float rounding)."""
    first = tasks[0]
    spec = load_spec(first.spec)
    rows = [parts[t.partition].rows for t in tasks]
    local = local_batch_sizes(spec.batch_size(first.params), len(tasks))
    orders = [torch.from_numpy(batch_order(t, parts[t.partition].rows)) for t in tasks]
    with unit_environment("cpu") as dev:
        checkpoint = None
        if first.checkpoint_in is not None:
            checkpoint = decode_checkpoint(store.get(first.checkpoint_in))
        state = open_state(spec, first, info, dev, checkpoint)
        state.model.train()
        for step, step_rows in enumerate(group_steps(rows, local)):
            xs, ys = [], []
            for rank, task in enumerate(tasks):
                index = orders[rank][step * local[rank] : step * local[rank] + step_rows[rank]]
                features, labels = parts[task.partition].tensors()
                xs.append(features[index])
                ys.append(labels[index])
            state.optimizer.zero_grad(set_to_none=True)
            loss = spec.loss(state.model(torch.cat(xs)), torch.cat(ys), info)
            loss.backward()
            state.optimizer.step()
        return {k: v.detach().clone() for k, v in state.model.state_dict().items()}


class _WithSparseTable(torch.nn.Module):
    """An MLP plus a table with a sparse gradient, looked up by the signs of the first
    four features (16 of its 32 rows can be looked up; the others never are)."""

    def __init__(self, inner: torch.nn.Module, outputs: int) -> None:
        super().__init__()
        self.inner = inner
        self.table = torch.nn.Embedding(32, outputs, sparse=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = ((x[:, :4] > 0).long() * torch.tensor([1, 2, 4, 8])).sum(1)
        out: torch.Tensor = self.inner(x) + self.table(ids)
        return out


class SparseTableSpec(MLPSpec):
    """An MLP with a sparse-gradient table (:class:`_WithSparseTable`): it cannot pack."""

    def build_model(self, params, info):
        outputs = info.num_classes if info.task == "classification" else 1
        return _WithSparseTable(super().build_model(params, info), outputs)
