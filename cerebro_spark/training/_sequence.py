"""A ready spec for token sequences: embeddings, masked mean pooling or a small Transformer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from cerebro_spark.data import ColumnInfo, DatasetInfo, mask_key
from cerebro_spark.errors import ConfigError, DataError
from cerebro_spark.training._models import (
    _SHARED_HYPERPARAMETERS,
    _bool,
    _choice,
    _dropout,
    _int,
    _outputs,
    _TrainingParams,
)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` ``(N, L, D)`` over the positions where ``mask`` ``(N, L)`` is true.

    A row without any true position gives zeros.
    """
    weights = mask.unsqueeze(-1).to(values.dtype)
    return (values * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)


class SequenceModel(nn.Module):
    """Token embedding, an optional Transformer encoder, masked mean pooling, a linear head.

    Takes the dict of a batch's columns and reads two entries: the column's ``int64``
    ``(N, L)`` token ids (padded with 0) and its ``bool`` ``(N, L)`` mask (under
    :func:`~cerebro_spark.data.mask_key`). Padding never changes a row's output: the
    encoder ignores padded keys and the pooling averages real tokens only. A row without
    tokens pools to zeros; in the encoder its first (padding) position stays visible, so
    no attention kernel sees a row whose keys are all masked (a NaN on kernels without a
    safe softmax).

    Args:
        column: The sequence column.
        cardinality: Number of token ids.
        dim: Embedding (and model) dimension.
        outputs: Size of the head.
        encoder: The Transformer encoder (``batch_first``), or ``None`` for mean pooling
            of the embeddings.
        max_length: Longest sequence (size of the learned positional embedding); only
            with an encoder.
        dropout: Dropout before the head.
        sparse: Whether the token embedding's gradient is sparse (the rows a batch
            used; :mod:`._lazy_optim`).
    """

    def __init__(
        self,
        column: str,
        cardinality: int,
        dim: int,
        outputs: int,
        *,
        encoder: nn.TransformerEncoder | None = None,
        max_length: int | None = None,
        dropout: float = 0.0,
        sparse: bool = False,
    ) -> None:
        super().__init__()
        self.column = column
        self.max_length = max_length
        self.tokens = nn.Embedding(cardinality, dim, sparse=sparse)
        self.positions = None if encoder is None else nn.Embedding(max_length or 1, dim)
        self.encoder = encoder
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(dim, outputs)

    def forward(self, x: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Return ``(N, outputs)``."""
        if not isinstance(x, Mapping):
            raise TypeError(
                f"SequenceModel takes a dict of columns holding {self.column!r}, "
                f"got {type(x).__name__}"
            )
        tokens = x[self.column]
        mask = x[mask_key(self.column)].to(torch.bool)
        hidden = self.tokens(tokens)
        length = tokens.shape[1]
        if self.encoder is not None and self.positions is not None and length > 0:
            if self.max_length is not None and length > self.max_length:
                raise DataError(
                    f"sequence column {self.column!r}: a batch holds {length} tokens per row, "
                    f"more than its max_length {self.max_length}"
                )
            hidden = hidden + self.positions(torch.arange(length, device=tokens.device))
            padding = ~mask
            empty = ~mask.any(dim=1)
            padding[:, 0] = padding[:, 0] & ~empty
            hidden = self.encoder(hidden, src_key_padding_mask=padding)
        outputs: torch.Tensor = self.head(self.dropout(masked_mean(hidden, mask)))
        return outputs


class SequenceSpec(_TrainingParams):
    """Classify or regress token sequences (text ids, event codes...).

    Model: ``nn.Embedding(cardinality, dim)`` of the tokens, then ``encoder``: ``"mean"``
    (masked mean of the embeddings) or ``"transformer"`` (a learned positional embedding
    up to the column's ``max_length`` added, ``layers`` ``nn.TransformerEncoderLayer``
    (post-norm, ReLU, ``batch_first``) with the batch's mask as key-padding mask, then the
    masked mean of its output), then dropout and a linear head (one output per class, or
    one for regression). Padding does not change a row's output.

    The features must be a dict holding a ``sequence`` column: the only one, or the one
    ``sequence_column`` names. Every other column of the dict (numbers, categories,
    images) is ignored.

    Params (besides the optimizer, schedule and batch ones of
    :mod:`cerebro_spark.training._models`; ``standardize`` does not apply):

    * ``dim`` (int >= 1, default 64): token embedding and model dimension.
    * ``encoder``: ``"mean"`` (default) or ``"transformer"``.
    * ``layers`` (int >= 1, default 2), ``heads`` (int >= 1 dividing ``dim``, default 4),
      ``feedforward`` (int >= 1, default ``4 * dim``): the Transformer's (checked with any
      encoder).
    * ``dropout`` (float in [0, 1), default 0): in the Transformer's layers and before the
      head.
    * ``sequence_column``: the sequence column when there are several.
    * ``sparse_embeddings`` (bool, default true): the token embedding gets sparse
      gradients and the optimizer steps only the rows of the tokens a batch holds
      (:mod:`._lazy_optim`); ``false``: dense gradients, every row every step.
    """

    hyperparameters: ClassVar[frozenset[str] | None] = (
        _SHARED_HYPERPARAMETERS - {"standardize"}
    ) | {"dim", "encoder", "layers", "heads", "feedforward", "sequence_column", "sparse_embeddings"}

    def build_model(self, params: Mapping[str, Any], info: DatasetInfo) -> nn.Module:
        """Return the :class:`SequenceModel` the params describe."""
        dim = _int(params, "dim", 64, 1)
        kind = _choice(params, "encoder", "mean", ("mean", "transformer"))
        layers = _int(params, "layers", 2, 1)
        heads = _int(params, "heads", 4, 1)
        feedforward = _int(params, "feedforward", 4 * dim, 1)
        dropout = _dropout(params)
        sparse = _bool(params, "sparse_embeddings", True)
        if kind == "transformer" and dim % heads:
            raise ConfigError(f"heads must divide dim ({dim}), got {heads}")
        column = _sequence_column(params, info)
        if not isinstance(column.cardinality, int) or column.cardinality < 1:
            raise ConfigError(
                f"sequence column {column.name!r} needs a cardinality >= 1 (its number of "
                f"token ids), got {column.cardinality!r}"
            )
        outputs = _outputs(info)
        if kind == "mean":
            return SequenceModel(
                column.name, column.cardinality, dim, outputs, dropout=dropout, sparse=sparse
            )
        if not isinstance(column.max_length, int) or column.max_length < 1:
            raise ConfigError(
                f"encoder 'transformer' needs the max_length of sequence column "
                f"{column.name!r} (for its positional embedding), got {column.max_length!r}"
            )
        layer = nn.TransformerEncoderLayer(
            dim, heads, dim_feedforward=feedforward, dropout=dropout, batch_first=True
        )
        encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        return SequenceModel(
            column.name,
            column.cardinality,
            dim,
            outputs,
            encoder=encoder,
            max_length=column.max_length,
            dropout=dropout,
            sparse=sparse,
        )


def _sequence_column(params: Mapping[str, Any], info: DatasetInfo) -> ColumnInfo:
    columns = info.columns_of("sequence")
    names = [column.name for column in columns]
    named = params.get("sequence_column")
    if named is not None:
        if named not in names:
            raise ConfigError(
                f"sequence_column must name one of the sequence columns {names}, got {named!r}"
            )
        return info.column(named)
    if len(columns) != 1:
        raise ConfigError(
            f"SequenceSpec needs one sequence column, or the sequence_column param naming "
            f"one; dataset {info.dataset_id} has {names}"
        )
    return columns[0]
