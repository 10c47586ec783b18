"""A run's reported metrics equal scikit-learn's on the final checkpoint's predictions
over the whole validation split (the issue: RMSE was a mean of per-batch values)."""

import math

import numpy as np
import pytest
import torch
from sklearn import metrics as skm

from cerebro_spark.data import read_manifest, read_partition
from cerebro_spark.engine import load_state, parse_config, read_events, run_experiment
from cerebro_spark.store import open_store
from cerebro_spark.training import MLPSpec, decode_checkpoint
from tests.metrics.auc_reference import auc_bins, sklearn_auc

pytestmark = [pytest.mark.torch, pytest.mark.slow]


def run(store, source, space):
    raw = {
        "name": source.split(":")[1],
        "seed": 5,
        "store": str(store),
        "data": {"source": source, "partitions": 3},
        "procedure": "grid",
        "epochs": 2,
        "workers": 2,
        "model": "cerebro_spark.training:MLPSpec",
        "space": space,
    }
    return run_experiment(parse_config(raw), experiment_id=raw["name"])


def predictions(store, result):
    """The trial's final checkpoint on every validation partition, concatenated."""
    trial = result.trials[0]
    events = read_events(open_store(str(store)).child(f"experiments/{result.experiment_id}"))
    uri = next(e["uri"] for e in events if e["event"] == "dataset")
    parts = [read_partition(uri, "validation", i) for i in range(3)]
    spec = MLPSpec()
    params = {k: v for k, v in trial.params.items() if k != "model"}
    model = spec.build_model(params, read_manifest(uri).info)
    model.load_state_dict(decode_checkpoint(open_store(str(store)).get(trial.checkpoint))["model"])
    model.eval()
    with torch.no_grad():
        outputs = torch.cat([model(spec.transform(*p.tensors())[0]) for p in parts])
    labels = np.concatenate([p.labels for p in parts])
    return trial, outputs, labels


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tmp_path_factory.mktemp("exact")


def test_regression_rmse_r2_mae_equal_sklearn_over_the_split(store):
    space = {"hidden_units": [16], "lr": 0.01, "batch_size": 16}
    result = run(store, "sklearn:diabetes", space)
    config, _ = load_state(str(store), result.experiment_id)
    assert config.objective == ("rmse", "min")  # the default for a regression dataset
    trial, outputs, labels = predictions(store, result)
    predicted = outputs.reshape(-1).double().numpy()
    y = labels.astype(np.float64)
    assert trial.metrics["rmse"] == pytest.approx(math.sqrt(skm.mean_squared_error(y, predicted)))
    assert trial.metrics["mse"] == pytest.approx(skm.mean_squared_error(y, predicted))
    assert trial.metrics["mae"] == pytest.approx(skm.mean_absolute_error(y, predicted))
    assert trial.metrics["r2"] == pytest.approx(skm.r2_score(y, predicted))
    assert trial.metrics["loss"] == pytest.approx(trial.metrics["mse"], rel=1e-5)  # MSE loss
    assert len(trial.history) == 2 and set(trial.history[-1]) == set(trial.metrics)


def test_classification_auc_f1_log_loss_equal_sklearn_over_the_split(store):
    space = {"hidden_units": [16], "lr": 0.003, "batch_size": 16}
    result = run(store, "sklearn:breast_cancer", space)
    config, _ = load_state(str(store), result.experiment_id)
    assert config.objective == ("accuracy", "max")
    trial, outputs, labels = predictions(store, result)
    probability = torch.softmax(outputs, dim=1)
    predicted = outputs.argmax(dim=1).numpy()
    assert trial.metrics["accuracy"] == pytest.approx(skm.accuracy_score(labels, predicted))
    assert trial.metrics["roc_auc"] == pytest.approx(
        sklearn_auc(labels, auc_bins(outputs.numpy()), 2)  # the binned AUC, and near the exact one
    )
    assert trial.metrics["roc_auc"] == pytest.approx(
        skm.roc_auc_score(labels, probability[:, 1].numpy()), abs=5e-3
    )
    assert trial.metrics["f1_macro"] == pytest.approx(
        skm.f1_score(labels, predicted, average="macro", zero_division=0)
    )
    assert trial.metrics["f1_class_1"] == pytest.approx(
        skm.f1_score(labels, predicted, zero_division=0)
    )
    exact = torch.softmax(outputs.double(), dim=1).numpy()
    assert trial.metrics["log_loss"] == pytest.approx(skm.log_loss(labels, exact), rel=1e-6)
    assert trial.metrics["loss"] == pytest.approx(trial.metrics["log_loss"], rel=1e-5)
