"""EmbeddingMLPSpec: categorical embeddings beside standardized numbers, then an MLP."""

from __future__ import annotations

import pytest
import torch

from cerebro_spark.data import ColumnInfo, DatasetInfo, FeatureStatistics
from cerebro_spark.errors import ConfigError
from cerebro_spark.training import (
    EmbeddingMLPSpec,
    MLPSpec,
    Standardize,
    accepted_hyperparameters,
)
from cerebro_spark.training._embedding import auto_embedding_dim

pytestmark = pytest.mark.torch

COLUMNS = (
    ColumnInfo(
        "color", "int32", kind="categorical", vocabulary=("r", "g", "b", "y"), cardinality=5
    ),
    ColumnInfo("x", "float32", kind="number"),
    ColumnInfo("city", "int32", kind="categorical", hash_buckets=299, cardinality=300),
    ColumnInfo("v", "float32", (3,), kind="array"),
)
# x then v's three elements: the dense elements in column order.
STATS = FeatureStatistics(
    100, (10.0, 0.0, 1.0, -1.0), (5.0, 1.0, 2.0, 0.5), (0.0,) * 4, (20.0,) * 4
)
PARAMS = {"hidden_units": [16], "lr": 0.03}


@pytest.fixture(autouse=True)
def deterministic():
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(previous)


def info(columns=COLUMNS, statistics=STATS, task="classification"):
    classes = 2 if task == "classification" else None
    return DatasetInfo((), task, classes, statistics=statistics, features=columns, dataset_id="t")


def build(params, dataset, seed=0):
    torch.manual_seed(seed)
    return EmbeddingMLPSpec().build_model(params, dataset)


def batch(rows=64, seed=0):
    """The label is whether the colour id is 1 or 3: learnable only through its embedding."""
    generator = torch.Generator().manual_seed(seed)
    color = torch.randint(0, 5, (rows,), generator=generator)
    features = {
        "color": color,
        "x": 10.0 + 5.0 * torch.randn(rows, generator=generator),
        "city": torch.randint(0, 300, (rows,), generator=generator),
        "v": torch.randn(rows, 3, generator=generator),
    }
    return features, ((color == 1) | (color == 3)).long()


def train(model, dataset, features, labels, steps=25, params=PARAMS):
    spec = EmbeddingMLPSpec()
    optimizer = spec.build_optimizer(model, params)
    model.train()
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = spec.loss(model(features), labels, dataset)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_auto_embedding_dim_is_the_capped_fastai_rule():
    assert [auto_embedding_dim(c) for c in (1, 2, 5, 10, 300, 2000, 100_000)] == [
        2,
        2,
        4,
        6,
        39,
        64,
        64,
    ]
    model = build(PARAMS, info())
    assert [(e.num_embeddings, e.embedding_dim) for e in model.embeddings] == [(5, 4), (300, 39)]
    assert model.mlp[0].in_features == 4 + 4 + 39
    fixed = build({**PARAMS, "embedding_dim": 3.0}, info())
    assert [e.embedding_dim for e in fixed.embeddings] == [3, 3]


def test_learns_a_categorical_rule_deterministically():
    dataset = info()
    features, labels = batch()
    runs = [train(build(PARAMS, dataset), dataset, features, labels) for _ in range(2)]
    assert runs[0] == runs[1]
    assert runs[0][-1] < 0.3 * runs[0][0], runs[0]
    model = build(PARAMS, dataset).eval()
    assert model(features).shape == (64, 2)
    unknown = {**features, "color": torch.zeros(64, dtype=torch.long)}
    assert torch.isfinite(model(unknown)).all()


def test_numbers_are_standardized_with_the_dense_statistics():
    model = build(PARAMS, info())
    assert isinstance(model.norm, Standardize)
    assert model.norm.mean.tolist() == [10.0, 0.0, 1.0, -1.0]
    assert model.norm.std.tolist() == [5.0, 1.0, 2.0, 0.5]
    assert isinstance(build({**PARAMS, "standardize": False}, info()).norm, torch.nn.Identity)
    assert isinstance(build(PARAMS, info(statistics=None)).norm, torch.nn.Identity)
    # Standardizing changes what the MLP sees: same seed, different outputs.
    features, _ = batch(4)
    raw = build({**PARAMS, "standardize": False}, info()).eval()
    assert not torch.allclose(model.eval()(features), raw(features))
    with pytest.raises(ConfigError, match="feature statistics describe 3 values"):
        build(
            PARAMS,
            info(statistics=FeatureStatistics(1, (0.0,) * 3, (1.0,) * 3, (0,) * 3, (0,) * 3)),
        )


def test_categorical_only_and_regression():
    columns = (COLUMNS[0], COLUMNS[2])
    model = build({**PARAMS, "hidden_units": []}, info(columns, None, "regression")).eval()
    assert isinstance(model.norm, torch.nn.Identity) and len(model.mlp) == 1
    features, _ = batch(3)
    assert model({"color": features["color"], "city": features["city"]}).shape == (3, 1)


def test_numeric_tensor_input_is_the_mlp():
    stats = FeatureStatistics(10, (1.0, 2.0, 3.0), (2.0, 2.0, 2.0), (0.0,) * 3, (4.0,) * 3)
    dataset = DatasetInfo((3,), "classification", 3, statistics=stats)
    params = {**PARAMS, "hidden_units": [8, 4], "activation": "tanh", "dropout": 0.1}
    model = build(params, dataset).eval()
    torch.manual_seed(0)
    mlp = MLPSpec().build_model(params, dataset).eval()
    x = torch.randn(5, 3)
    assert torch.equal(model(x), mlp(x))
    assert not model.embeddings


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"embedding_dim": 0}, "embedding_dim must be an int >= 1 or 'auto', got 0"),
        ({"embedding_dim": "big"}, "embedding_dim"),
        ({"embedding_dim": True}, "embedding_dim"),
        ({"hidden_units": [0]}, "hidden_units must be a list of positive ints"),
        ({"activation": "swish"}, "activation must be one of"),
        ({"dropout": -0.1}, "dropout"),
        ({"standardize": 1}, "standardize must be true or false"),
        ({"optimizer": "lbfgs"}, "optimizer must be one of"),
    ],
)
def test_params_are_checked(params, message):
    with pytest.raises(ConfigError, match=message):
        EmbeddingMLPSpec().check_params({**PARAMS, **params}, info())


def test_refuses_images_sequences_and_categories_without_cardinality():
    image = ColumnInfo("photo", "uint8", (3, 8, 8), kind="image")
    words = ColumnInfo("words", "int32", kind="sequence", cardinality=9, max_length=5)
    with pytest.raises(ConfigError, match=r"image or sequence columns \['photo', 'words'\]"):
        build(PARAMS, info((*COLUMNS, image, words)))
    with pytest.raises(ConfigError, match=r"\['photo'\]"):
        build(PARAMS, DatasetInfo(image.shape, "classification", 2, features=(image,)))
    bare = ColumnInfo("kind", "int32", kind="categorical")
    with pytest.raises(ConfigError, match="categorical column 'kind' needs a cardinality"):
        build(PARAMS, info((bare,), None))
    declared = accepted_hyperparameters(EmbeddingMLPSpec)
    assert {"embedding_dim", "hidden_units", "activation", "dropout", "standardize"} <= declared
