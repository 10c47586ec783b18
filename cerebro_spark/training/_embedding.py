"""A ready spec for tabular data: categorical columns embedded, numbers standardized, an MLP."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from cerebro_spark.data import ColumnInfo, DatasetInfo
from cerebro_spark.errors import ConfigError
from cerebro_spark.training._models import (
    _ACTIVATIONS,
    _SHARED_HYPERPARAMETERS,
    _bool,
    _choice,
    _dropout,
    _int_list,
    _outputs,
    _standardize_layers,
    _TrainingParams,
)

#: Largest dimension ``embedding_dim: "auto"`` gives a column.
MAX_AUTO_EMBEDDING_DIM = 64


def auto_embedding_dim(cardinality: int) -> int:
    """The embedding size ``"auto"`` gives a column of ``cardinality`` ids.

    ``min(64, round(1.6 * cardinality ** 0.56))``: fast.ai's empirical rule
    (``fastai.tabular.model.emb_sz_rule``, which caps at 600), capped here at 64.
    """
    return int(min(MAX_AUTO_EMBEDDING_DIM, round(1.6 * cardinality**0.56)))


class EmbeddingMLP(nn.Module):
    """Embeds each categorical column, concatenates the numbers, then runs an MLP.

    Takes a dict of columns (``number``/``array`` ``float32`` ``(N, *shape)``, flattened and
    concatenated in column order, then ``norm``; ``categorical`` ``int64`` ``(N,)`` ids,
    each through its own ``nn.Embedding``), or a tensor of numbers only (``norm``, then
    flattened).

    Args:
        dense: Names of the numeric columns, in column order.
        categorical: Names of the categorical columns, in column order.
        embeddings: One embedding per categorical column, in the same order.
        norm: Applied to the numbers (a :class:`~cerebro_spark.training.Standardize`), or
            ``None``.
        mlp: The layers after the concatenation.
    """

    def __init__(
        self,
        dense: list[str],
        categorical: list[str],
        embeddings: list[nn.Embedding],
        norm: nn.Module | None,
        mlp: nn.Sequential,
    ) -> None:
        super().__init__()
        self.dense = dense
        self.categorical = categorical
        self.norm = nn.Identity() if norm is None else norm
        self.embeddings = nn.ModuleList(embeddings)
        self.mlp = mlp

    def forward(self, x: torch.Tensor | Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Return ``(N, outputs)``."""
        if isinstance(x, torch.Tensor):
            flat: torch.Tensor = self.mlp(torch.flatten(self.norm(x), 1))
            return flat
        parts: list[torch.Tensor] = []
        if self.dense:
            numbers = [x[name].reshape(x[name].shape[0], -1) for name in self.dense]
            parts.append(self.norm(torch.cat(numbers, dim=1)))
        parts += [
            embedding(x[name])
            for name, embedding in zip(self.categorical, self.embeddings, strict=True)
        ]
        outputs: torch.Tensor = self.mlp(torch.cat(parts, dim=1))
        return outputs


class EmbeddingMLPSpec(_TrainingParams):
    """An MLP over embedded categorical columns and standardized numeric columns.

    Each ``categorical`` column's ids (``[0, cardinality)``, 0 for unknown values) go
    through their own ``nn.Embedding``; the ``number`` and ``array`` columns are flattened
    and concatenated in column order and standardized (``standardize``, with the dataset's
    statistics, which cover exactly those elements); all of it, numbers first then the
    embeddings in column order, feeds ``[Linear -> activation -> Dropout]* -> Linear``.
    With only numeric columns (the features are one tensor) it is :class:`MLPSpec`'s
    model. ``image`` and ``sequence`` columns are refused (use :class:`ResNetSpec` or
    :class:`SequenceSpec`).

    Params (besides the shared ones of :mod:`cerebro_spark.training._models`):

    * ``embedding_dim``: an int >= 1 for every categorical column, or ``"auto"``
      (default): per column, ``min(64, round(1.6 * cardinality ** 0.56))``, fast.ai's
      rule of thumb (``fastai.tabular.model.emb_sz_rule``, capped there at 600).
    * ``hidden_units`` (list of positive ints, default ``[128]``), ``activation``
      (``"relu"`` default, ``"tanh"``, ``"gelu"``), ``dropout`` (float in [0, 1), default
      0, after every hidden layer): as :class:`MLPSpec`.
    * ``standardize`` (bool, default true): the numeric columns only.
    * ``sparse_embeddings`` (bool, default true): the tables get sparse gradients, and
      the optimizer steps only the rows a batch looked up (:mod:`._lazy_optim`: lazy
      Adam, AdamW or SGD; a Criteo-like table of 10^6 rows costs its batch's rows a step,
      not 10^6). ``false``: dense gradients and torch's optimizers, every row every step
      (and the trials can pack).
    """

    hyperparameters: ClassVar[frozenset[str] | None] = _SHARED_HYPERPARAMETERS | {
        "hidden_units",
        "activation",
        "embedding_dim",
        "sparse_embeddings",
    }

    def build_model(self, params: Mapping[str, Any], info: DatasetInfo) -> nn.Module:
        """Return the :class:`EmbeddingMLP` for ``info``'s columns."""
        hidden = _int_list(params, "hidden_units", [128])
        activation = _ACTIVATIONS[_choice(params, "activation", "relu", tuple(_ACTIVATIONS))]
        dropout = _dropout(params)
        dims = _embedding_dims(params, info)
        outputs = _outputs(info)
        refused = [c.name for c in info.features if c.feature_kind in ("image", "sequence")]
        if refused:
            raise ConfigError(
                f"EmbeddingMLPSpec takes number, array and categorical columns; dataset "
                f"{info.dataset_id} has image or sequence columns {refused}"
            )
        dense = [column for column in info.features if column.dense]
        categorical = info.columns_of("categorical")
        if info.tensor_input:
            shape = tuple(info.feature_shape)
            if not shape or any(d < 1 for d in shape):
                raise ConfigError(
                    f"EmbeddingMLPSpec needs a non-empty feature_shape of positive sizes, "
                    f"got {shape!r}"
                )
            width = math.prod(shape)
            norm = _standardize_layers(params, info)
        else:
            width = sum(column.size for column in dense)
            flat = dataclasses.replace(info, feature_shape=(width,))
            norm = _standardize_layers(params, flat) if dense else []
            _bool(params, "standardize", True)
        sparse = _bool(params, "sparse_embeddings", True)
        embeddings = [
            nn.Embedding(_cardinality(column), dim, sparse=sparse)
            for column, dim in zip(categorical, dims, strict=True)
        ]
        width += sum(dims)
        layers: list[nn.Module] = []
        for units in hidden:
            layers += [nn.Linear(width, units), activation(), nn.Dropout(dropout)]
            width = units
        layers.append(nn.Linear(width, outputs))
        return EmbeddingMLP(
            [column.name for column in dense],
            [column.name for column in categorical],
            embeddings,
            norm[0] if norm else None,
            nn.Sequential(*layers),
        )


def _cardinality(column: ColumnInfo) -> int:
    if not isinstance(column.cardinality, int) or column.cardinality < 1:
        raise ConfigError(
            f"categorical column {column.name!r} needs a cardinality >= 1 (its number of "
            f"ids), got {column.cardinality!r}"
        )
    return column.cardinality


def _embedding_dims(params: Mapping[str, Any], info: DatasetInfo) -> list[int]:
    """The ``embedding_dim`` of each categorical column, in column order."""
    value = params.get("embedding_dim", "auto")
    columns = info.columns_of("categorical")
    if value == "auto":
        return [auto_embedding_dim(_cardinality(column)) for column in columns]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"embedding_dim must be an int >= 1 or 'auto', got {value!r}")
    return [value for _ in columns]
