"""The train loop's speed work keeps its results: grouped metrics, shared counts, lazy checks.

A pass no longer syncs with the host per batch: metrics take batches in groups, count
metrics share one accumulator, and the loss is checked for finiteness once per
``_CHECK_BATCHES`` batches. None of it may change weights or metric states.
"""

import numpy as np
import pytest
import torch
from training_fixtures import BLOBS_INFO, blobs, train_task

from cerebro_spark.data import DatasetInfo, PartitionData
from cerebro_spark.errors import TrialError
from cerebro_spark.training import MLPSpec, run_unit, weights_digest
from cerebro_spark.training import _metrics as pass_metrics
from cerebro_spark.training._unit import _CHECK_BATCHES, batch_order

PARAMS = {"hidden_units": [16], "lr": 0.01, "batch_size": 3, "dropout": 0.25, "standardize": False}
INFO4 = DatasetInfo(feature_shape=(4,), task="classification", num_classes=4)


class EveryMetricOnTrain(MLPSpec):
    """The default metrics, each (but ROC AUC's buffers) computed on training passes too."""

    def build_metrics(self, info):
        metrics = list(super().build_metrics(info))
        for metric in metrics:
            if metric.name != "roc_auc":
                metric.on_train = True
        return metrics


def two_units(store, spec="cerebro_spark.training:MLPSpec", **params):
    first = run_unit(
        train_task("pin", spec=spec, params={**PARAMS, **params}, seed=5),
        blobs(0, rows=400),
        store,
        BLOBS_INFO,
    )
    second = run_unit(
        train_task(
            "pin",
            spec=spec,
            params={**PARAMS, **params},
            seed=5,
            epoch=1,
            checkpoint_in=first.task.checkpoint_out,
        ),
        blobs(0, rows=400),
        store,
        BLOBS_INFO,
    )
    return first, second


def test_weights_and_counts_are_those_of_the_per_batch_loop(store):
    # Pinned with the loop that synced and updated every metric per batch (134 batches
    # a unit, dropout on: the torch stream and the batch order are exercised).
    first, second = two_units(store, spec="test_train_loop:EveryMetricOnTrain")
    # Dropout masks differ between CPU models (the same torch wheel): the digest pinned on
    # the machine the per-batch loop ran on, and on an Intel Xeon @ 2.50GHz (AVX512), where
    # that loop (commit f42bb69) gives the second.
    assert weights_digest(store.get(second.task.checkpoint_out)) in {
        "2537a17f7ee4f341a9656aa733d31b4a4cb20c326bb211ceb13b1c605bf45b46",
        "adb25633291d21f279e4610d7e3c6a323a45711b0283426d2ffbe24d7fdaa602",
    }
    assert first.metric_states["accuracy"] == {"correct": 397, "count": 400}
    assert second.metric_states["accuracy"] == {"correct": 400, "count": 400}
    assert first.metric_states["precision_macro"] == {
        "tp": [196, 201],
        "predicted": [196, 204],
        "true": [199, 201],
    }


def test_training_passes_compute_the_loss_and_accuracy_unless_a_metric_asks(store):
    default, _ = two_units(store)
    assert set(default.metric_states) == set(default.metric_sums) == {"loss", "accuracy"}
    every, _ = two_units(store.child("every"), spec="test_train_loop:EveryMetricOnTrain")
    # metrics never touch the weights (the checkpoints differ: each names its spec)
    assert weights_digest(store.get(default.task.checkpoint_out)) == weights_digest(
        store.child("every").get(every.task.checkpoint_out)
    )
    assert {"precision_macro", "f1_class_1", "log_loss"} <= set(every.metric_states)
    assert "roc_auc" not in every.metric_states
    assert every.metric_states["accuracy"] == default.metric_states["accuracy"]


def test_grouping_does_not_change_metric_states(store, monkeypatch):
    spec = "test_train_loop:EveryMetricOnTrain"
    grouped, _ = two_units(store, spec=spec)
    monkeypatch.setattr(pass_metrics, "GROUP_BATCHES", 1)  # the old cadence: every batch
    single, _ = two_units(store.child("single"), spec=spec)
    assert grouped.checkpoint_sha256 == single.checkpoint_sha256
    assert grouped.metric_states.keys() == single.metric_states.keys()
    for name, state in grouped.metric_states.items():
        for key, value in state.items():
            assert np.allclose(value, single.metric_states[name][key], rtol=1e-12, atol=0), name


def test_count_metrics_share_one_accumulator() -> None:
    metrics = pass_metrics.PassMetrics(MLPSpec(), INFO4, torch.device("cpu"), training=False)
    names = [n for n in metrics.metrics if n.startswith(("precision", "recall", "f1"))]
    assert len(names) == 3 + 3 * 4
    assert len({id(metrics.accumulators[n]) for n in names}) == 1
    outputs = torch.eye(4)[[0, 1, 2, 3, 0]] * 5
    labels = torch.tensor([0, 1, 2, 0, 0])
    metrics.add(outputs, labels, torch.tensor(0.5))
    metrics.add(outputs, labels, torch.tensor(1.5))
    states, sums = metrics.report()
    assert states["recall_class_0"] == {
        "tp": [4, 2, 2, 0],
        "predicted": [4, 2, 2, 2],
        "true": [6, 2, 2, 0],
    }
    assert states["accuracy"] == {"correct": 8, "count": 10}
    assert states["loss"] == {"sum": 10.0, "count": 10}
    assert sums["loss"] == pytest.approx(10.0)


class ReplacesPrecision(MLPSpec):
    """A deprecated per-batch ``metrics`` that replaces one metric of a shared group."""

    def metrics(self, outputs, labels, info):
        return {"precision_macro": 0.25}


def test_replacing_the_first_shared_metric_keeps_the_others_updated() -> None:
    metrics = pass_metrics.PassMetrics(
        ReplacesPrecision(), INFO4, torch.device("cpu"), training=False
    )
    outputs = torch.eye(4)[[0, 1, 2, 3]]
    metrics.add(outputs, torch.tensor([0, 1, 2, 3]), torch.tensor(1.0))
    states, sums = metrics.report()
    assert states["recall_macro"]["tp"] == [1, 1, 1, 1]
    assert sums["precision_macro"] == pytest.approx(0.25 * 4)


class NaNAtRow(MLPSpec):
    """Loss is NaN for the batch holding the row whose first feature is 1e6."""

    def loss(self, outputs, labels, info):
        return super().loss(outputs, labels, info) * torch.where(
            self.marked, torch.tensor(float("nan")), torch.tensor(1.0)
        )

    def transform(self, features, labels):
        self.marked = (features[:, 0] == 1e6).any()
        return features, labels


def test_a_non_finite_loss_after_many_batches_names_its_batch(store):
    data = blobs(0, rows=3 * (2 * _CHECK_BATCHES + 10))
    task = train_task("late", spec="test_train_loop:NaNAtRow", params=PARAMS, seed=2)
    order = batch_order(task, data.rows)
    position = 3 * (_CHECK_BATCHES + 5) + 1  # in the second check group, mid-batch
    features = data.features.copy()
    features[order[position], 0] = 1e6
    marked = PartitionData.from_arrays("train", 0, features, data.labels, 0)
    with pytest.raises(
        TrialError, match=rf"training loss is nan .* batch at row {position - 1} of"
    ):
        run_unit(task, marked, store, BLOBS_INFO)
    assert not store.exists(task.checkpoint_out)


def test_a_loss_of_several_values_is_a_trial_error(store):
    task = train_task("many", spec="test_train_loop:VectorLoss", params=PARAMS)
    with pytest.raises(TrialError, match=r"the forward pass or loss raised ValueError: the loss"):
        run_unit(task, blobs(0, rows=30), store, BLOBS_INFO)


class VectorLoss(MLPSpec):
    def loss(self, outputs, labels, info):
        return torch.nn.functional.cross_entropy(outputs, labels, reduction="none")


class GradientBatchMetric(MLPSpec):
    """A deprecated per-batch ``metrics`` reporting whether its outputs need a gradient."""

    def metrics(self, outputs, labels, info):
        return {"needs_grad": float(outputs.requires_grad or labels.requires_grad)}


def test_a_per_batch_metric_gets_outputs_without_a_gradient(store):
    task = train_task("detached", spec="test_train_loop:GradientBatchMetric", params=PARAMS)
    result = run_unit(task, blobs(0, rows=30), store, BLOBS_INFO)
    assert result.metric_sums["needs_grad"] == 0.0
