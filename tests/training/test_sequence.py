"""SequenceSpec: token embeddings, masked mean or a Transformer encoder, a linear head."""

from __future__ import annotations

import pytest
import torch

from cerebro_spark.data import ColumnInfo, DatasetInfo, mask_key
from cerebro_spark.errors import ConfigError, DataError
from cerebro_spark.training import SequenceSpec, accepted_hyperparameters

pytestmark = pytest.mark.torch

WORDS = ColumnInfo("words", "int32", kind="sequence", cardinality=12, max_length=10)
OTHERS = (
    ColumnInfo("n", "float32", kind="number"),
    ColumnInfo("c", "int32", kind="categorical", cardinality=3),
)
MEAN = {"dim": 16, "lr": 0.03}
TRANSFORMER = {
    "dim": 16,
    "encoder": "transformer",
    "layers": 1,
    "heads": 2,
    "dropout": 0.1,
    "lr": 0.01,
}


@pytest.fixture(autouse=True)
def deterministic():
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(previous)


def info(columns=(WORDS, *OTHERS), task="classification"):
    classes = 2 if task == "classification" else None
    return DatasetInfo((), task, classes, features=columns, dataset_id="t")


def build(params, dataset=None, seed=0):
    torch.manual_seed(seed)
    return SequenceSpec().build_model(params, dataset or info())


def batch(rows=48, seed=0):
    """Random sequences of 1..10 tokens in 1..11; the label: whether token 5 occurs."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 11, (rows,), generator=generator)
    width = int(lengths.max())
    tokens = torch.randint(1, 12, (rows, width), generator=generator)
    mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
    tokens = tokens.where(mask, torch.zeros_like(tokens))
    labels = ((tokens == 5) & mask).any(dim=1).long()
    features = {
        "words": tokens,
        mask_key("words"): mask,
        "n": torch.randn(rows, generator=generator),
        "c": torch.randint(0, 3, (rows,), generator=generator),
    }
    return features, labels


def padded(features, width, fill=0):
    """The same rows padded to ``width`` tokens with ``fill`` (masked out)."""
    tokens, mask = features["words"], features[mask_key("words")]
    extra = width - tokens.shape[1]
    tokens = torch.nn.functional.pad(tokens.where(mask, fill), (0, extra), value=fill)
    return {
        **features,
        "words": tokens,
        mask_key("words"): torch.nn.functional.pad(mask, (0, extra)),
    }


def train(model, params, features, labels, steps=30):
    spec = SequenceSpec()
    optimizer = spec.build_optimizer(model, params)
    model.train()
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = spec.loss(model(features), labels, info())
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("params", [MEAN, TRANSFORMER], ids=["mean", "transformer"])
def test_learns_deterministically(params):
    features, labels = batch()
    runs = [train(build(params), params, features, labels) for _ in range(2)]
    assert runs[0] == runs[1]
    assert runs[0][-1] < 0.6 * runs[0][0], runs[0]


@pytest.mark.parametrize("params", [MEAN, TRANSFORMER], ids=["mean", "transformer"])
def test_padding_and_other_columns_do_not_change_a_rows_output(params):
    model = build(params).eval()
    features, _ = batch(6, seed=3)
    out = model(features)
    others = {"n": torch.zeros(6), "c": torch.ones(6, dtype=torch.long)}
    assert features["words"].shape[1] < 10
    for wide in (padded(features, 10), {**padded(features, 10, fill=7), **others}):
        assert wide["words"].shape == (6, 10)
        torch.testing.assert_close(model(wide), out, rtol=0, atol=1e-5)


@pytest.mark.parametrize("params", [MEAN, TRANSFORMER], ids=["mean", "transformer"])
def test_empty_sequences_pool_to_zeros(params):
    model = build(params).eval()
    features, _ = batch(4)
    features[mask_key("words")][1] = False
    out = model(features)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[1], model.head.bias)
    empty = {
        "words": torch.zeros(3, 0, dtype=torch.long),
        mask_key("words"): torch.zeros(3, 0, dtype=torch.bool),
    }
    torch.testing.assert_close(model(empty), model.head.bias.expand(3, 2))
    model.train()
    loss = model(features).sum()
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert any(g.is_sparse for g in grads)  # the token embedding's (sparse_embeddings)
    assert all(torch.isfinite(g.coalesce().values() if g.is_sparse else g).all() for g in grads)


def test_transformer_layout_and_regression():
    model = build({"dim": 8, "encoder": "transformer", "heads": 4}, info(task="regression"))
    assert len(model.encoder.layers) == 2
    layer = model.encoder.layers[0]
    assert layer.linear1.out_features == 32 and layer.self_attn.num_heads == 4
    assert layer.self_attn.batch_first
    assert model.positions.num_embeddings == 10 and model.tokens.num_embeddings == 12
    assert (
        build({"dim": 8, "encoder": "transformer", "feedforward": 5})
        .encoder.layers[0]
        .linear1.out_features
        == 5
    )
    features, _ = batch(3)
    assert model.eval()(features).shape == (3, 1)
    too_long = {
        "words": torch.ones(2, 11, dtype=torch.long),
        mask_key("words"): torch.ones(2, 11, dtype=torch.bool),
    }
    with pytest.raises(DataError, match="more than its max_length 10"):
        model(too_long)
    mean = build({"dim": 8}, info(task="regression"))
    assert mean.encoder is None and mean.positions is None
    assert mean.eval()(too_long).shape == (2, 1)


def test_picks_the_sequence_column():
    other = ColumnInfo("tags", "int32", kind="sequence", cardinality=4, max_length=3)
    two = info((WORDS, other))
    with pytest.raises(ConfigError, match="sequence_column param"):
        build(MEAN, two)
    model = build({**MEAN, "sequence_column": "tags"}, two)
    assert model.column == "tags" and model.tokens.num_embeddings == 4
    with pytest.raises(
        ConfigError,
        match=r"sequence_column must name one of the sequence columns \['words', 'tags'\]",
    ):
        build({**MEAN, "sequence_column": "n"}, two)
    with pytest.raises(ConfigError, match="one sequence column"):
        build(MEAN, DatasetInfo((4,), "classification", 2))


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"dim": 0}, "dim must be an int >= 1"),
        ({"encoder": "lstm"}, "encoder must be one of"),
        ({"layers": 0}, "layers must be an int >= 1"),
        ({"heads": 0}, "heads must be an int >= 1"),
        ({"encoder": "transformer", "heads": 3}, r"heads must divide dim \(16\), got 3"),
        ({"feedforward": 0}, "feedforward must be an int >= 1"),
        ({"dropout": 1}, "dropout must be a float in"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
def test_params_are_checked(params, message):
    with pytest.raises(ConfigError, match=message):
        SequenceSpec().check_params({**MEAN, **params}, info())


def test_column_fields_are_required_and_hyperparameters_declared():
    unbounded = ColumnInfo("words", "int32", kind="sequence", cardinality=12)
    build(MEAN, info((unbounded,)))
    with pytest.raises(ConfigError, match="needs the max_length of sequence column 'words'"):
        build(TRANSFORMER, info((unbounded,)))
    with pytest.raises(ConfigError, match="sequence column 'words' needs a cardinality"):
        build(MEAN, info((ColumnInfo("words", "int32", kind="sequence", max_length=4),)))
    declared = accepted_hyperparameters(SequenceSpec)
    assert {
        "dim",
        "encoder",
        "layers",
        "heads",
        "feedforward",
        "sequence_column",
        "dropout",
    } <= declared
    assert "standardize" not in declared
