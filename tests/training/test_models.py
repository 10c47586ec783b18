"""The ready specs: MLPSpec and CNNSpec learn digits; params are validated with clear errors."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from training_fixtures import CNN, MLP, blobs, train_epochs, validate_task

from cerebro_spark.data import DatasetInfo, PartitionData
from cerebro_spark.errors import ConfigError
from cerebro_spark.training import CNNSpec, MLPSpec, run_unit

pytestmark = pytest.mark.torch

DIGITS = DatasetInfo(feature_shape=(8, 8), task="classification", num_classes=10)


@pytest.fixture(scope="module")
def digits():
    """Digits scaled to [0, 1], shuffled once: 2 train partitions and 1 validation one."""
    bunch = load_digits()
    order = np.random.default_rng(0).permutation(len(bunch.target))
    features = (bunch.images[order] / 16.0).astype(np.float32)
    labels = bunch.target[order].astype(np.int64)

    def part(split, index, rows):
        return PartitionData.from_arrays(split, index, features[rows], labels[rows], 0)

    train = [part("train", 0, slice(0, 750)), part("train", 1, slice(750, 1500))]
    return train, part("validation", 0, slice(1500, None))


COSINE = {"lr": 0.01, "batch_size": 32, "lr_schedule": "cosine", "lr_cosine_epochs": 4}


# Over trial seeds 1-6 these reach 0.963-0.973 (MLP) and 0.946-0.973 (CNN) on validation.
@pytest.mark.parametrize(
    ("spec", "params", "epochs"),
    [
        (MLP, dict(COSINE, hidden_units=[64], dropout=0.1), 4),
        (CNN, dict(COSINE, channels=[8, 16], dense_units=32), 4),
    ],
)
def test_ready_specs_learn_digits(store, digits, spec, params, epochs):
    train, validation = digits
    key, results = train_epochs(store, DIGITS, train, epochs=epochs, spec=spec, params=params)
    result = run_unit(validate_task(results[-1].task, key), validation, store, DIGITS)
    assert result.rows == 297
    assert result.metrics()["accuracy"] > 0.9, result.metrics()


def test_mlp_regression_has_one_output_and_learns(store):
    info = DatasetInfo(feature_shape=(4,), task="regression", num_classes=None)
    rng = np.random.default_rng(3)
    features = rng.normal(size=(300, 4)).astype(np.float32)
    target = (features @ np.array([1.0, -2.0, 0.5, 0.0], np.float32)).astype(np.float32)
    parts = [PartitionData.from_arrays("train", 0, features, target, 0)]
    params = {"hidden_units": [16], "lr": 0.01, "batch_size": 16, "optimizer": "adamw"}
    _, results = train_epochs(store, info, parts, epochs=5, params=params)
    maes = [r.metric_sums["mae"] / r.rows for r in results]
    assert maes[-1] < maes[0] / 3, maes
    assert MLPSpec().build_model({}, info)(torch.zeros(2, 4)).shape == (2, 1)


@pytest.mark.parametrize("shape", [(8, 8), (1, 8, 8), (3, 5, 7), (1, 1), (2, 1, 9)])
def test_cnn_accepts_image_shapes(shape):
    info = DatasetInfo(feature_shape=shape, task="classification", num_classes=4)
    for channels in (8, [4], [4, 4, 4, 4]):
        model = CNNSpec().build_model({"channels": channels, "kernel_size": 5}, info)
        assert model(torch.zeros(3, *shape)).shape == (3, 4)


def test_mlp_flattens_any_feature_shape_and_has_the_asked_layers():
    info = DatasetInfo(feature_shape=(2, 3, 4), task="classification", num_classes=3)
    model = MLPSpec().build_model({"hidden_units": [5, 6], "activation": "gelu"}, info)
    assert model(torch.zeros(2, 2, 3, 4)).shape == (2, 3)
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(24, 5), (5, 6), (6, 3)]
    assert sum(isinstance(m, torch.nn.GELU) for m in model) == 2
    linear = MLPSpec().build_model({"hidden_units": []}, info)
    assert [type(m).__name__ for m in linear] == ["Flatten", "Linear"]


def test_optimizer_and_schedule_params():
    spec = MLPSpec()
    model = spec.build_model({}, DIGITS)
    sgd = spec.build_optimizer(model, {"optimizer": "sgd", "momentum": 0.9, "lr": 0.2})
    assert isinstance(sgd, torch.optim.SGD)
    assert sgd.param_groups[0]["momentum"] == 0.9 and sgd.param_groups[0]["lr"] == 0.2
    adamw = spec.build_optimizer(model, {"optimizer": "adamw", "weight_decay": 0.01})
    assert type(adamw) is torch.optim.AdamW and adamw.param_groups[0]["weight_decay"] == 0.01
    assert type(spec.build_optimizer(model, {})) is torch.optim.Adam
    assert spec.build_lr_scheduler(adamw, {}) is None
    cosine = spec.build_lr_scheduler(adamw, {"lr_schedule": "cosine", "lr_cosine_epochs": 4})
    assert isinstance(cosine, torch.optim.lr_scheduler.CosineAnnealingLR) and cosine.T_max == 4
    step = spec.build_lr_scheduler(sgd, {"lr_schedule": "step", "lr_step_gamma": 0.5})
    assert isinstance(step, torch.optim.lr_scheduler.StepLR) and step.gamma == 0.5
    assert spec.batch_size({"batch_size": 16.0}) == 16 and spec.batch_size({}) == 64
    assert spec.validation_batch_size({"batch_size": 16}) == 16  # default: the batch size
    assert spec.validation_batch_size({"batch_size": 16, "validation_batch_size": 512}) == 512


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"hidden_units": [0]}, "hidden_units must be a list of positive ints, got [0]"),
        ({"hidden_units": 128}, "hidden_units must be a list of positive ints, got 128"),
        ({"hidden_units": [True]}, "hidden_units must be a list of positive ints, got [True]"),
        ({"activation": "sigmoid"}, "activation must be one of ['relu', 'tanh', 'gelu']"),
        ({"dropout": 1.0}, "dropout must be a float in [0, 1), got 1.0"),
        ({"dropout": "0.1"}, "dropout must be a float in [0, 1), got '0.1'"),
        ({"lr": 0}, "lr must be a float > 0, got 0"),
        ({"lr": float("nan")}, "lr must be a float > 0, got nan"),
        ({"weight_decay": -1e-4}, "weight_decay must be a float >= 0"),
        ({"batch_size": 0}, "batch_size must be an int >= 1, got 0"),
        ({"batch_size": 2.5}, "batch_size must be an int >= 1, got 2.5"),
        ({"validation_batch_size": 0}, "validation_batch_size must be an int >= 1, got 0"),
        ({"optimizer": "rmsprop"}, "optimizer must be one of ['adam', 'adamw', 'sgd']"),
        ({"optimizer": "sgd", "momentum": 1.0}, "momentum must be a float in [0, 1)"),
        ({"lr_schedule": "linear"}, "lr_schedule must be one of ['none', 'cosine', 'step']"),
        ({"lr_schedule": "step", "lr_step_gamma": 0}, "lr_step_gamma must be a float in (0, 1]"),
        ({"lr_schedule": "cosine", "lr_cosine_epochs": 0}, "lr_cosine_epochs must be an int >= 1"),
    ],
)
def test_mlp_params_are_validated(params, message):
    with pytest.raises(ConfigError) as caught:
        MLPSpec().check_params(params, DIGITS)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("params", "shape", "message"),
    [
        ({"channels": [0]}, (8, 8), "channels must be a list of positive ints, got [0]"),
        ({"channels": []}, (8, 8), "channels must be a non-empty list"),
        ({"channels": 0}, (8, 8), "channels must be an int >= 1, got 0"),
        ({"kernel_size": 2}, (8, 8), "kernel_size must be an odd int >= 1, got 2"),
        ({"kernel_size": 0}, (8, 8), "kernel_size must be an int >= 1, got 0"),
        ({"dense_units": 0}, (8, 8), "dense_units must be an int >= 1, got 0"),
        ({}, (64,), "CNNSpec needs feature_shape (C, H, W) or (H, W) of positive sizes, got (64,)"),
        ({}, (1, 2, 8, 8), "got (1, 2, 8, 8)"),
    ],
)
def test_cnn_params_and_shapes_are_validated(params, shape, message):
    info = DatasetInfo(feature_shape=shape, task="classification", num_classes=10)
    with pytest.raises(ConfigError) as caught:
        CNNSpec().check_params(params, info)
    assert message in str(caught.value)


def test_classification_needs_classes():
    info = DatasetInfo(feature_shape=(4,), task="classification", num_classes=None)
    with pytest.raises(ConfigError, match="num_classes >= 2, got None"):
        MLPSpec().build_model({}, info)


def test_unknown_params_are_ignored_and_valid_params_pass():
    params = {"model": MLP, "epochs": 3, "hidden_units": [8], "optimizer": "sgd"}
    MLPSpec().check_params(params, DIGITS)
    assert blobs(0).rows == 200  # the fixture data is what the other tests assume
