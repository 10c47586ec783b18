"""Built-in specs standardize raw features with the dataset's statistics by default.

breast_cancer, unscaled (values in the thousands beside values below one), prepared as a
user would: the built-in MLP reaches >= 0.9 validation accuracy in 5 epochs with the
default; ``standardize: false`` builds exactly the model of earlier versions.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from training_fixtures import train_epochs, train_task, validate_task

from cerebro_spark.data import (
    DatasetInfo,
    FeatureStatistics,
    load_source,
    prepare_dataset,
    read_partition,
)
from cerebro_spark.errors import ConfigError
from cerebro_spark.store import open_store
from cerebro_spark.training import CNNSpec, MLPSpec, Standardize, decode_checkpoint, run_unit

pytestmark = pytest.mark.torch

PARAMS = {"hidden_units": [64], "lr": 0.01}


@pytest.fixture(scope="module")
def breast_cancer(tmp_path_factory):
    root = tmp_path_factory.mktemp("bc")
    table, meta = load_source("sklearn:breast_cancer")
    manifest = prepare_dataset(
        table, str(root), features=meta["features"], label="label", num_partitions=2, seed=0
    )
    uri = f"{root}/datasets/{manifest.dataset_id}"
    train = [read_partition(uri, "train", i, manifest=manifest) for i in range(2)]
    validation = [read_partition(uri, "validation", i, manifest=manifest) for i in range(2)]
    return manifest, train, validation, open_store(str(root / "checkpoints"))


def accuracy(setup, info, params, seed):
    manifest, train, validation, store = setup
    trial = f"{seed}-{sorted(params.items())}-{info.statistics is not None}"
    key, _ = train_epochs(store, info, train, epochs=5, trial_id=trial, params=params, seed=seed)
    task = train_task(trial, params=params, seed=seed)
    correct = sum(
        run_unit(validate_task(task, key, i), part, store, info).metric_sums["accuracy"]
        for i, part in enumerate(validation)
    )
    return correct / manifest.rows("validation"), decode_checkpoint(store.get(key))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_default_mlp_learns_raw_breast_cancer(breast_cancer, seed):
    manifest = breast_cancer[0]
    value, checkpoint = accuracy(breast_cancer, manifest.info, PARAMS, seed)
    assert value >= 0.9, value
    assert torch.equal(
        checkpoint["model"]["0.mean"],
        torch.tensor(manifest.statistics.mean, dtype=torch.float32),
    )


def test_standardize_false_is_the_raw_model_of_earlier_versions(breast_cancer):
    manifest = breast_cancer[0]
    raw = dict(PARAMS, standardize=False)
    without_stats = dataclasses.replace(manifest.info, statistics=None)
    scores = []
    for seed in (1, 2, 3):
        off, checkpoint = accuracy(breast_cancer, manifest.info, raw, seed)
        # the same weights as a model built for a dataset with no statistics at all
        _, old = accuracy(breast_cancer, without_stats, PARAMS, seed)
        assert checkpoint["model"].keys() == old["model"].keys()
        assert all(torch.equal(checkpoint["model"][k], old["model"][k]) for k in old["model"])
        assert "0.mean" not in checkpoint["model"]
        on, _ = accuracy(breast_cancer, manifest.info, PARAMS, seed)
        scores.append((off, on))
    off_mean, on_mean = np.mean(scores, axis=0)
    assert on_mean - off_mean > 0.05, scores


def stats(mean, std):
    return FeatureStatistics(len(mean), tuple(mean), tuple(std), tuple(mean), tuple(mean))


def test_standardize_layer_centres_scales_and_never_divides_by_zero():
    layer = Standardize(stats([1.0, 2.0, 1e6, 3.0], [2.0, 0.0, 1e-12, 4.0]), (2, 2))
    assert set(layer.state_dict()) == {"mean", "std"}
    x = torch.tensor([[[3.0, 5.0], [1e6 + 1.0, 7.0]]])
    out = layer(x)
    assert torch.isfinite(out).all()
    expected = torch.tensor([[[1.0, 3.0], [1.0, 1.0]]])  # constant elements only centred
    torch.testing.assert_close(out, expected)
    with pytest.raises(ConfigError, match="describe 4 values"):
        Standardize(stats([1.0] * 4, [1.0] * 4), (3,))


def test_specs_put_standardize_first_and_validate_the_param():
    info = DatasetInfo((2, 4, 4), "classification", 3, statistics=stats([0.5] * 32, [2.0] * 32))
    for spec in (MLPSpec(), CNNSpec()):
        model = spec.build_model({}, info)
        assert isinstance(model[0], Standardize)
        assert not isinstance(spec.build_model({"standardize": False}, info)[0], Standardize)
        with pytest.raises(ConfigError, match="standardize must be true or false"):
            spec.build_model({"standardize": "yes"}, info)
    no_stats = DatasetInfo((2, 4, 4), "classification", 3)
    assert not isinstance(MLPSpec().build_model({}, no_stats)[0], Standardize)
