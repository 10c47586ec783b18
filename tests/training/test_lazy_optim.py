"""Lazy optimizers: sparse embedding gradients stepped row by row, dense ones as torch does."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cerebro_spark.data import ColumnInfo, DatasetInfo
from cerebro_spark.errors import ConfigError
from cerebro_spark.training import EmbeddingMLPSpec, SequenceSpec, pack_fingerprint
from cerebro_spark.training._lazy_optim import (
    LazyAdam,
    LazyAdamW,
    LazySGD,
    has_sparse_gradients,
)

pytestmark = pytest.mark.torch

LAZY = [
    (LazyAdam, torch.optim.Adam, {"lr": 0.1, "weight_decay": 0.01}),
    (LazyAdamW, torch.optim.AdamW, {"lr": 0.1, "weight_decay": 0.01}),
    (LazySGD, torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}),
    (LazySGD, torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
]


class Tiny(nn.Module):
    def __init__(self, sparse: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.table = nn.Embedding(6, 3, sparse=sparse)
        self.head = nn.Linear(3, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.table(ids))
        return out


def train(model: nn.Module, optimizer: torch.optim.Optimizer, batches: list[list[int]]) -> None:
    for ids in batches:
        optimizer.zero_grad(set_to_none=True)
        model(torch.tensor(ids)).pow(2).sum().backward()
        optimizer.step()


@pytest.mark.parametrize(("lazy", "dense", "options"), LAZY)
def test_rows_looked_up_every_step_train_as_torchs_dense_step(lazy, dense, options):
    every_row = [[0, 1, 2, 3, 4, 5, 1], [5, 4, 3, 2, 1, 0, 0], [2, 2, 0, 1, 3, 4, 5]]
    sparse_model, dense_model = Tiny(sparse=True), Tiny(sparse=False)
    sparse_optimizer = lazy(sparse_model.parameters(), **options)
    dense_optimizer = dense(dense_model.parameters(), **options)
    train(sparse_model, sparse_optimizer, every_row)
    train(dense_model, dense_optimizer, every_row)
    for (name, a), b in zip(sparse_model.named_parameters(), dense_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=name)
    # torch's state keys and shapes: the lazy state loads into torch's class
    dense_optimizer.load_state_dict(sparse_optimizer.state_dict())
    for a, b in zip(sparse_optimizer.state.values(), dense_optimizer.state.values(), strict=True):
        assert a.keys() == b.keys()


@pytest.mark.parametrize(("lazy", "dense", "options"), LAZY)
def test_rows_not_looked_up_keep_their_weights_and_state(lazy, dense, options):
    model = Tiny(sparse=True)
    optimizer = lazy(model.parameters(), **options)
    before = model.table.weight.detach().clone()
    train(model, optimizer, [[1, 3], [3, 1, 1]])
    after = model.table.weight.detach()
    assert not torch.equal(after[[1, 3]], before[[1, 3]])
    torch.testing.assert_close(after[[0, 2, 4, 5]], before[[0, 2, 4, 5]], rtol=0, atol=0)
    for key, value in optimizer.state[model.table.weight].items():
        if value.dim():
            assert not value[[0, 2, 4, 5]].any(), key
            assert value[[1, 3]].any(), key


@pytest.mark.parametrize(("lazy", "dense", "options"), LAZY)
def test_without_sparse_gradients_it_is_torchs_optimizer(lazy, dense, options):
    batches = [[0, 1], [4, 5, 5], [2]]
    a, b = Tiny(sparse=False), Tiny(sparse=False)
    train(a, lazy(a.parameters(), **options), batches)
    train(b, dense(b.parameters(), **options), batches)
    for x, y in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize(("lazy", "dense", "options"), LAZY)
def test_a_restored_state_goes_on_as_if_never_stopped(lazy, dense, options):
    batches = [[0, 1], [4, 5, 5], [2, 1], [1]]
    whole = Tiny(sparse=True)
    train(whole, lazy(whole.parameters(), **options), batches)
    first = Tiny(sparse=True)
    optimizer = lazy(first.parameters(), **options)
    train(first, optimizer, batches[:2])
    second = Tiny(sparse=True)
    second.load_state_dict(first.state_dict())
    restored = lazy(second.parameters(), **options)
    restored.load_state_dict(optimizer.state_dict())
    train(second, restored, batches[2:])
    for x, y in zip(whole.parameters(), second.parameters(), strict=True):
        assert torch.equal(x, y)


def test_options_a_sparse_step_does_not_implement_are_refused():
    model = Tiny(sparse=True)
    optimizer = LazyAdam(model.parameters(), lr=0.1, amsgrad=True)
    with pytest.raises(ValueError, match="LazyAdam steps sparse gradients only with amsgrad=False"):
        train(model, optimizer, [[1]])


def test_the_step_leaves_each_gradient_where_it_was():
    model = Tiny(sparse=True)
    optimizer = LazyAdam(model.parameters(), lr=0.1)
    model(torch.tensor([1, 2])).sum().backward()
    grads = [p.grad for p in model.parameters()]
    optimizer.step()
    assert [p.grad for p in model.parameters()] == grads
    assert model.table.weight.grad is not None and model.table.weight.grad.is_sparse


CATEGORIES = DatasetInfo(
    (),
    "classification",
    2,
    features=(
        ColumnInfo("c", "int32", kind="categorical", hash_buckets=99, cardinality=100),
        ColumnInfo("x", "float32", kind="number"),
    ),
    dataset_id="t",
)
TOKENS = DatasetInfo(
    (),
    "classification",
    2,
    features=(ColumnInfo("w", "int32", kind="sequence", cardinality=50, max_length=8),),
    dataset_id="t",
)


@pytest.mark.parametrize(
    ("spec", "dataset", "params"),
    [
        (EmbeddingMLPSpec(), CATEGORIES, {"standardize": False}),
        (SequenceSpec(), TOKENS, {}),
        (SequenceSpec(), TOKENS, {"encoder": "transformer", "dim": 8, "heads": 2}),
    ],
)
@pytest.mark.parametrize(
    ("optimizer", "lazy", "dense"),
    [
        ("adam", LazyAdam, torch.optim.Adam),
        ("adamw", LazyAdamW, torch.optim.AdamW),
        ("sgd", LazySGD, torch.optim.SGD),
    ],
)
def test_the_families_embed_sparsely_by_default(spec, dataset, params, optimizer, lazy, dense):
    params = {**params, "optimizer": optimizer}
    model = spec.build_model(params, dataset)
    assert has_sparse_gradients(model)
    assert type(spec.build_optimizer(model, params)) is lazy
    off = {**params, "sparse_embeddings": False}
    model = spec.build_model(off, dataset)
    assert not has_sparse_gradients(model)
    assert type(spec.build_optimizer(model, off)) is dense
    with pytest.raises(ConfigError, match="sparse_embeddings must be true or false, got 'yes'"):
        spec.build_model({**params, "sparse_embeddings": "yes"}, dataset)


def test_sparse_embeddings_do_not_pack_and_say_how_to():
    with pytest.raises(ConfigError, match="set sparse_embeddings: false to pack"):
        pack_fingerprint(EmbeddingMLPSpec(), {"standardize": False}, CATEGORIES)
    dense = {"standardize": False, "sparse_embeddings": False}
    assert pack_fingerprint(EmbeddingMLPSpec(), dense, CATEGORIES)
