"""Grouped layers: a packed MLP's forward pass without ``vmap`` (issue 27).

:mod:`._pack` trains a pack with one ``torch.func.vmap`` of ``functional_call`` over the
trials' stacked parameters: any architecture, but on a CPU a tiny model's step is then
mostly the transforms' Python (flattening and rebuilding the parameter trees, wrapping
every tensor, a decomposed ``cross_entropy``): a pack of 8 MLPs of 64 units took 3.3 ms a
batch, against 0.8 ms for the same arithmetic written out. For the models that are a
plain chain of layers with batched forms, :func:`grouped_forward` builds that arithmetic
directly, one batched kernel per layer for the whole pack (HFTA's horizontal fusion):

* ``nn.Linear``: ``baddbmm`` of the stacked weights ``(k, out, in)`` and biases;
* ``nn.Flatten`` (of one example: ``start_dim=1``), ``nn.Identity``, the element-wise
  activations (``ReLU``, ``Tanh``, ``GELU``, ``Sigmoid``, ``SiLU``, ``LeakyReLU``,
  ``ELU``) and ``nn.Dropout`` (one call over the pack's stacked activations: every
  element's mask is drawn on its own, each trial's from one generator for the pack, as
  ``vmap(randomness="different")`` draws them; pack mates share ``p``, their fingerprint
  says so; ``p == 0`` draws nothing);
* :class:`~._models.Standardize`, with the trials' stacked ``mean`` and ``std``;
* ``nn.Sequential`` of these, nested or not.

Anything else (convolutions, embeddings, user modules, a ``transform``
of the spec, features given as a dict) keeps the ``vmap`` path. The loss is the spec's
own, per trial, unless the spec keeps :meth:`ModelSpec.loss` (cross-entropy of ``(B, C)``
outputs or MSE, by task), computed for the pack at once with ``reduction="none"`` and
each trial's mean.

Same trial, same numbers: every kernel here computes each trial's slice on its own (a
batch of ``k`` matrix products, element-wise operations, a row-wise loss), so a trial's
outputs, loss and gradients do not depend on its pack mates, as with ``vmap``. Against
the unpacked unit (``addmm``, the fused mean of ``cross_entropy``) they are equal within
float rounding (tests/training/test_pack.py states the tolerance).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from cerebro_spark.data import DatasetInfo
from cerebro_spark.training._models import Standardize
from cerebro_spark.training._spec import ModelSpec

Forward = Callable[
    [Mapping[str, torch.Tensor], Mapping[str, torch.Tensor], Any, torch.Tensor],
    tuple[torch.Tensor, torch.Tensor, torch.Tensor],
]
"""``forward(stacked params, stacked buffers, x, y) -> (loss (k,), outputs, labels)``."""

Layer = Callable[
    [torch.Tensor, Mapping[str, torch.Tensor], Mapping[str, torch.Tensor]], torch.Tensor
]
"""``layer(x, stacked params, stacked buffers) -> y``, for the whole pack."""

_ELEMENTWISE = (nn.ReLU, nn.Tanh, nn.GELU, nn.Sigmoid, nn.SiLU, nn.LeakyReLU, nn.ELU, nn.Identity)


def grouped_forward(spec: ModelSpec, skeleton: nn.Module, info: DatasetInfo) -> Forward | None:
    """The pack's forward pass and loss as grouped layers, or ``None`` when it has none.

    Args:
        spec: The trials' spec (its ``transform`` and ``loss`` decide too).
        skeleton: One trial's model (its structure; its tensors are not used).
        info: The dataset (the loss's task).

    Returns:
        ``forward(params, buffers, x, y)`` over the stacked ``(k, ...)`` parameters and
        buffers by name and the stacked batch ``x`` ``(k, B, ...)``, ``y`` ``(k, B, ...)``:
        each trial's mean loss ``(k,)``, the outputs ``(k, B, ...)`` and the labels; or
        ``None``: a module, the spec's ``transform`` or the inputs have no grouped form.
    """
    if type(spec).transform is not ModelSpec.transform:
        return None
    layers = _layers(skeleton, "")
    if layers is None:
        return None
    default_loss = type(spec).loss is ModelSpec.loss

    def forward(
        params: Mapping[str, torch.Tensor],
        buffers: Mapping[str, torch.Tensor],
        x: Any,
        y: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = x
        for layer in layers:
            out = layer(out, params, buffers)
        if default_loss and (info.task != "classification" or out.dim() == 3):
            loss = _default_loss(out, y, info)
        else:
            loss = torch.stack(
                [spec.loss(out[i], y[i], info).reshape(()) for i in range(out.shape[0])]
            )
        return loss, out, y

    return forward


def _default_loss(out: torch.Tensor, y: torch.Tensor, info: DatasetInfo) -> torch.Tensor:
    """:meth:`ModelSpec.loss` of every trial: the mean of its rows' losses, ``(k,)``."""
    k = out.shape[0]
    if info.task == "classification":
        rows = nn.functional.cross_entropy(
            out.reshape(-1, out.shape[-1]), y.reshape(-1), reduction="none"
        )
    else:
        rows = nn.functional.mse_loss(out.reshape(y.shape), y, reduction="none")
    return rows.reshape(k, -1).mean(1)


def _layers(module: nn.Module, prefix: str) -> list[Layer] | None:
    """The grouped form of ``module`` as a list of layers, or ``None``."""
    if isinstance(module, nn.Sequential):
        out: list[Layer] = []
        for name, child in module.named_children():
            inner = _layers(child, f"{prefix}{name}.")
            if inner is None:
                return None
            out += inner
        return out
    if type(module) is nn.Linear:
        return [_linear(prefix, module.bias is not None)]
    if type(module) is Standardize:
        return [_standardize(prefix)]
    if type(module) is nn.Flatten and module.start_dim == 1 and module.end_dim == -1:
        return [lambda x, p, b: x.flatten(2)]
    if type(module) is nn.Dropout:
        return [] if module.p == 0 else [lambda x, p, b: module(x)]
    if type(module) in _ELEMENTWISE:
        return [lambda x, p, b: module(x)]
    return None


def _linear(prefix: str, has_bias: bool) -> Layer:
    weight, bias = f"{prefix}weight", f"{prefix}bias"

    def linear(
        x: torch.Tensor, params: Mapping[str, torch.Tensor], buffers: Mapping[str, torch.Tensor]
    ) -> torch.Tensor:
        w = params[weight]  # (k, out, in)
        flat = x.reshape(x.shape[0], -1, x.shape[-1])  # (k, rows, in)
        if has_bias:
            y = torch.baddbmm(params[bias].unsqueeze(1), flat, w.transpose(1, 2))
        else:
            y = torch.bmm(flat, w.transpose(1, 2))
        return y.reshape(*x.shape[:-1], w.shape[1])

    return linear


def _standardize(prefix: str) -> Layer:
    mean, std = f"{prefix}mean", f"{prefix}std"

    def standardize(
        x: torch.Tensor, params: Mapping[str, torch.Tensor], buffers: Mapping[str, torch.Tensor]
    ) -> torch.Tensor:
        return (x - buffers[mean].unsqueeze(1)) / buffers[std].unsqueeze(1)

    return standardize
