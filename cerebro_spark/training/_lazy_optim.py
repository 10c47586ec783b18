"""Optimizers that step only the rows of an embedding a batch looked up.

An ``nn.Embedding(sparse=True)`` gives its weight a sparse gradient: the rows the batch
used. torch's ``Adam`` and ``AdamW`` refuse sparse gradients and its ``SGD`` refuses them
with weight decay, while a dense gradient makes every step read and write every row of
every table: with Criteo's cardinalities (tables of 10^6 rows) the optimizer step costs
far more than the model.

:class:`LazyAdam`, :class:`LazyAdamW` and :class:`LazySGD` are torch's classes. A dense
gradient is stepped by torch's own code, so a model without sparse embeddings trains
exactly as with torch's class. A sparse gradient is stepped *lazily*: only its rows'
weights and state change, by the same formula applied to those rows, with the
parameter's step counter counting the steps in which it had a gradient (the rule of
``torch.optim.SparseAdam`` and of TensorFlow Addons' ``LazyAdam``). That is not dense
Adam: a row no batch looked up keeps its moments and does not move, where dense Adam
decays its moments and moves it by its momentum; weight decay, too, reaches only the
rows looked up. State keys and shapes are torch's (``step``, ``exp_avg``,
``exp_avg_sq``; ``momentum_buffer``), so checkpoints keep their form and a lazy
optimizer's state loads into torch's class and back.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

#: Options a sparse gradient's step does not implement: the value each must have.
_ADAM_PLAIN = {"amsgrad": False, "capturable": False, "differentiable": False, "fused": None}
_SGD_PLAIN = {"differentiable": False, "fused": None}


def sparse_parameters(model: nn.Module) -> set[int]:
    """The ``id`` of each parameter of ``model`` whose gradient is sparse: sparse tables."""
    return {
        id(module.weight)
        for module in model.modules()
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.sparse
    }


def has_sparse_gradients(model: nn.Module) -> bool:
    """Whether any layer of ``model`` gives its weight a sparse gradient."""
    return bool(sparse_parameters(model))


class _LazyRows(torch.optim.Optimizer):
    """Steps sparse gradients itself, then the dense ones with torch's own ``step``.

    Mixed in before one of torch's optimizer classes, whose ``step`` it calls.
    """

    _plain: dict[str, Any]

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Step every parameter: sparse gradients row by row, dense ones as torch does."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        held: list[tuple[torch.Tensor, torch.Tensor]] = []
        try:
            with torch.no_grad():
                for group in self.param_groups:
                    for param in group["params"]:
                        grad = param.grad
                        if grad is None or not grad.is_sparse:
                            continue
                        self._check_plain(group)
                        self._step_rows(group, param, grad.coalesce())
                        held.append((param, grad))
                        param.grad = None  # torch's step skips a parameter without gradient
            super().step()
        finally:
            for param, grad in held:
                param.grad = grad
        return loss

    def _check_plain(self, group: dict[str, Any]) -> None:
        for option, plain in self._plain.items():
            if group.get(option, plain) != plain:
                raise ValueError(
                    f"{type(self).__name__} steps sparse gradients only with {option}="
                    f"{plain!r}, got {group[option]!r}"
                )

    def _step_rows(self, group: dict[str, Any], param: torch.Tensor, grad: torch.Tensor) -> None:
        raise NotImplementedError


class _LazyAdamRows(_LazyRows):
    _plain = _ADAM_PLAIN

    def _step_rows(self, group: dict[str, Any], param: torch.Tensor, grad: torch.Tensor) -> None:
        """Adam's single-tensor step (torch's formula) on the rows of ``grad``."""
        state = self.state[param]
        if not state:
            dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
            state["step"] = torch.tensor(0.0, dtype=dtype)
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        state["step"] += 1
        step = float(state["step"])
        beta1, beta2 = group["betas"]
        lr, decay, eps = group["lr"], group["weight_decay"], group["eps"]
        rows, values = grad.indices()[0], grad.values()
        if group["maximize"]:
            values = -values
        weights = param.index_select(0, rows)
        if decay:
            if group.get("decoupled_weight_decay", False):
                weights.mul_(1 - lr * decay)
            else:
                values = values.add(weights, alpha=decay)
        exp_avg = state["exp_avg"].index_select(0, rows).lerp_(values, 1 - beta1)
        exp_avg_sq = state["exp_avg_sq"].index_select(0, rows)
        exp_avg_sq.mul_(beta2).addcmul_(values, values, value=1 - beta2)
        correction1 = 1 - beta1**step
        correction2 = 1 - beta2**step
        denominator = (exp_avg_sq.sqrt() / math.sqrt(correction2)).add_(eps)
        weights.addcdiv_(exp_avg, denominator, value=-lr / correction1)
        state["exp_avg"].index_copy_(0, rows, exp_avg)
        state["exp_avg_sq"].index_copy_(0, rows, exp_avg_sq)
        param.index_copy_(0, rows, weights)


class LazyAdam(_LazyAdamRows, torch.optim.Adam):
    """``torch.optim.Adam`` that steps sparse gradients lazily (see the module docs)."""


class LazyAdamW(_LazyAdamRows, torch.optim.AdamW):
    """``torch.optim.AdamW`` that steps sparse gradients lazily (see the module docs)."""


class LazySGD(_LazyRows, torch.optim.SGD):
    """``torch.optim.SGD`` that steps sparse gradients lazily (see the module docs).

    A row's momentum buffer starts at zero, so with ``dampening`` its first step is damped
    where torch's buffer starts at the first gradient.
    """

    _plain = _SGD_PLAIN

    def _step_rows(self, group: dict[str, Any], param: torch.Tensor, grad: torch.Tensor) -> None:
        """SGD's single-tensor step (torch's formula) on the rows of ``grad``."""
        rows, values = grad.indices()[0], grad.values()
        if group["maximize"]:
            values = -values
        weights = param.index_select(0, rows)
        if group["weight_decay"]:
            values = values.add(weights, alpha=group["weight_decay"])
        momentum = group["momentum"]
        if momentum:
            state = self.state[param]
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = torch.zeros_like(param)
            buffer = state["momentum_buffer"].index_select(0, rows)
            buffer.mul_(momentum).add_(values, alpha=1 - group["dampening"])
            state["momentum_buffer"].index_copy_(0, rows, buffer)
            values = values.add(buffer, alpha=momentum) if group["nesterov"] else buffer
        weights.add_(values, alpha=-group["lr"])
        param.index_copy_(0, rows, weights)
