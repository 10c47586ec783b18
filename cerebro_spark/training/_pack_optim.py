"""Optimizer steps of a packed unit: each trial's own optimizer, on stacked parameters.

A packed unit (:mod:`._pack`) keeps the ``k`` trials' parameters stacked, one tensor of
shape ``(k, *shape)`` per parameter name. Each trial keeps the optimizer its spec built
(its own learning rate, weight decay, momentum, betas, state); two ways to step them:

* :class:`StackedAdam` and :class:`StackedSGD` step all trials at once on the stacked
  tensors, with each trial's hyperparameters as a ``(k, 1, ...)`` tensor. They apply the
  formulas of torch's own single-tensor ``Adam``/``AdamW`` and ``SGD`` step, operation for
  operation (the per-trial scalars are rounded to the parameter dtype as torch rounds its
  Python scalars), so the update is torch's up to float rounding. Each steps the trials
  whose optimizer is exactly one of its classes with one param group of the model's
  parameters and no option it does not implement (:func:`step_kind`); a pack of several
  kinds steps each kind's slice with its own stepper (:func:`stacked_optimizer`), so a
  trial's update does not depend on its pack mates.
* :class:`PerTrialSteps` (every other optimizer) points each trial's parameters at their
  slice of the stacked storage (``param.data = stacked[i]``) and calls each trial's own
  ``optimizer.step()``: any optimizer works, at the price of ``k`` Python steps.

Either way :meth:`~PackStepper.finish` gives every trial back parameters and optimizer
state of its own (compact tensors, torch's state keys in torch's order), so a trial's
``optimizer.state_dict()`` is the one its unpacked twin would have.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence

import torch
from torch import nn

#: Adam/AdamW options the stacked step implements (values other than these fall back).
_ADAM_PLAIN = {"amsgrad": False, "maximize": False, "capturable": False, "differentiable": False}
_SGD_PLAIN = {"maximize": False, "differentiable": False}


def _scalar_dtype() -> torch.dtype:
    """The dtype torch gives an optimizer's ``step`` counter (``_get_scalar_dtype``)."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


class PackStepper(abc.ABC):
    """Steps the ``k`` optimizers of a pack on its stacked parameters.

    Args:
        optimizers: Each trial's optimizer, in pack order.
        params: Each trial's parameters by name (the model's ``named_parameters``).
        stacked: The pack's stacked parameters by name, ``(k, *shape)`` leaves.
    """

    def __init__(
        self,
        optimizers: Sequence[torch.optim.Optimizer],
        params: Sequence[Mapping[str, nn.Parameter]],
        stacked: Mapping[str, torch.Tensor],
    ) -> None:
        self.optimizers = list(optimizers)
        self.params = [dict(p) for p in params]
        self.stacked = dict(stacked)
        self.errors: dict[int, Exception] = {}
        self.configure()

    @abc.abstractmethod
    def configure(self) -> None:
        """Prepare the pass (called once the pack's objects are set)."""

    @abc.abstractmethod
    def step(self, grads: Mapping[str, torch.Tensor | None], live: Sequence[int]) -> list[int]:
        """Apply one optimizer step of every trial in ``live``; return trials that raised.

        ``grads`` holds the stacked gradient ``(k, *shape)`` of each parameter name, or
        ``None`` where no trial's loss reached it (the optimizer skips it, as torch does).
        """

    @abc.abstractmethod
    def finish(self) -> None:
        """Give each trial its parameters and optimizer state back as tensors of its own."""


class PerTrialSteps(PackStepper):
    """Each trial's own ``optimizer.step()`` on views of the stacked storage (any optimizer).

    Errors a trial's step raises are kept in :attr:`errors` (by trial), and the trial is
    reported by :meth:`step`: its pack goes on without it.
    """

    def configure(self) -> None:
        """Point each trial's parameters at their slice of the stacked storage."""
        for index, own in enumerate(self.params):
            for name, param in own.items():
                param.data = self.stacked[name].detach()[index]

    def step(self, grads: Mapping[str, torch.Tensor | None], live: Sequence[int]) -> list[int]:
        """Set each live trial's ``.grad`` to its slice and call its optimizer's step."""
        failed = []
        for index in live:
            for name, param in self.params[index].items():
                grad = grads.get(name)
                param.grad = None if grad is None else grad[index]
            try:
                self.optimizers[index].step()
            except Exception as error:
                self.errors[index] = error
                failed.append(index)
        return failed

    def finish(self) -> None:
        """Copy each trial's parameters out of the stacked storage; drop the gradients."""
        for own in self.params:
            for param in own.values():
                param.data = param.data.clone()
                param.grad = None


def _plain(group: Mapping[str, object], plain: Mapping[str, object]) -> bool:
    if any(group.get(key) != value for key, value in plain.items()):
        return False
    if group.get("fused"):
        return False
    numbers = [group["lr"], group["weight_decay"]]
    betas = group.get("betas")
    if isinstance(betas, tuple):
        numbers += list(betas)
    return not any(isinstance(number, torch.Tensor) for number in numbers)


def step_kind(
    optimizer: torch.optim.Optimizer, params: Mapping[str, nn.Parameter]
) -> tuple[object, ...]:
    """Which stepper steps a trial (:func:`stacked_optimizer`), as a sortable key.

    ``(0,)`` stacked Adam/AdamW, ``(1, nesterov, dampening)`` stacked SGD, ``(2,)`` its
    own step. Stacked only where the optimizer is exactly ``torch.optim.Adam``/``AdamW`` or ``SGD``,
    has one param group holding the model's parameters in order, and uses none of
    ``amsgrad``, ``maximize``, ``capturable``, ``differentiable``, ``fused`` or tensor
    hyperparameters.
    """
    group = optimizer.param_groups[0]
    shaped = len(optimizer.param_groups) == 1 and [id(p) for p in group["params"]] == [
        id(p) for p in params.values()
    ]
    adam = type(optimizer) in (torch.optim.Adam, torch.optim.AdamW)
    if shaped and adam and _plain(group, _ADAM_PLAIN):
        return (0,)
    if shaped and type(optimizer) is torch.optim.SGD and _plain(group, _SGD_PLAIN):
        return (1, bool(group["nesterov"]), float(group["dampening"]))
    return (2,)


def stacked_optimizer(
    optimizers: Sequence[torch.optim.Optimizer],
    params: Sequence[Mapping[str, nn.Parameter]],
    stacked: Mapping[str, torch.Tensor],
) -> PackStepper:
    """The fastest steppers that reproduce every trial's optimizer (see the module docs).

    Trials of one :func:`step_kind` step together (Adam and AdamW mixed, each keeping its
    own weight decay rule; SGD of one ``nesterov`` and ``dampening``), every other trial
    alone (:class:`PerTrialSteps`), so a trial's step is the same whatever its pack mates
    are. The trials of a kind must be contiguous in the pack (the pack ordered by kind).

    Raises:
        ValueError: The trials of a kind are not contiguous.
    """
    kinds = [step_kind(opt, own) for opt, own in zip(optimizers, params, strict=True)]
    runs: list[tuple[int, int]] = []
    for index, kind in enumerate(kinds):
        if runs and kinds[runs[-1][0]] == kind:
            runs[-1] = (runs[-1][0], index + 1)
        else:
            runs.append((index, index + 1))
    if len({kinds[a] for a, _ in runs}) != len(runs):
        raise ValueError(f"a pack's trials must be ordered by optimizer kind, got {kinds}")
    parts = [
        (
            a,
            _stepper(kinds[a])(
                optimizers[a:b], params[a:b], {n: t[a:b] for n, t in stacked.items()}
            ),
        )
        for a, b in runs
    ]
    return parts[0][1] if len(parts) == 1 else _Split(parts, optimizers, params, stacked)


def _stepper(kind: tuple[object, ...]) -> type[PackStepper]:
    steppers: dict[object, type[PackStepper]] = {0: StackedAdam, 1: StackedSGD}
    return steppers.get(kind[0], PerTrialSteps)


class _Split(PackStepper):
    """Steppers of contiguous slices of the pack, one per optimizer kind."""

    def __init__(
        self,
        parts: Sequence[tuple[int, PackStepper]],
        optimizers: Sequence[torch.optim.Optimizer],
        params: Sequence[Mapping[str, nn.Parameter]],
        stacked: Mapping[str, torch.Tensor],
    ) -> None:
        self.parts = list(parts)
        super().__init__(optimizers, params, stacked)

    def configure(self) -> None:
        """Nothing: each part configured itself."""

    def step(self, grads: Mapping[str, torch.Tensor | None], live: Sequence[int]) -> list[int]:
        """Step each part with its slice of the gradients and of ``live``."""
        failed = []
        for start, part in self.parts:
            size = len(part.optimizers)
            mine = [i - start for i in live if start <= i < start + size]
            sliced = {n: None if g is None else g[start : start + size] for n, g in grads.items()}
            for index in part.step(sliced, mine):
                self.errors[start + index] = part.errors[index]
                failed.append(start + index)
        return failed

    def finish(self) -> None:
        """Finish every part."""
        for _, part in self.parts:
            part.finish()


class _Stacked(PackStepper):
    """What the stacked steppers share: per-trial scalars as ``(k, 1, ...)`` tensors."""

    def configure(self) -> None:
        """Read each trial's param group (one per optimizer) and hyperparameters."""
        self.groups = [opt.param_groups[0] for opt in self.optimizers]
        self._columns: dict[tuple[str, int, torch.dtype], torch.Tensor] = {}
        self.hyperparameters()

    @abc.abstractmethod
    def hyperparameters(self) -> None:
        """Read each trial's hyperparameters (fixed for the pass)."""

    def step(self, grads: Mapping[str, torch.Tensor | None], live: Sequence[int]) -> list[int]:
        """One step of every trial (a failed trial's slice steps too, unread)."""
        with torch.no_grad():
            for name, grad in grads.items():
                if grad is not None:
                    self.step_one(name, grad)
        for optimizer in self.optimizers:
            # what torch's wrapped optimizer.step() records for its LR scheduler, which
            # otherwise warns at its first step that the optimizer never stepped
            optimizer._opt_called = True  # type: ignore[attr-defined]
        return []

    @abc.abstractmethod
    def step_one(self, name: str, grad: torch.Tensor) -> None:
        """Step parameter ``name`` of every trial with its stacked gradient."""

    def column(self, values: Sequence[float], like: torch.Tensor) -> torch.Tensor:
        """``values`` (one per trial) as a tensor broadcasting over ``like``'s trial rows.

        Rounded to ``like``'s dtype, as torch rounds a Python scalar in an operation with
        a tensor of that dtype.
        """
        shape = (len(values),) + (1,) * (like.dim() - 1)
        return torch.tensor(values, dtype=like.dtype).reshape(shape).to(like.device)

    def constant(self, key: str, values: Sequence[float], like: torch.Tensor) -> torch.Tensor:
        """:meth:`column` of values fixed for the pass, built once per key and shape."""
        cache_key = (key, like.dim(), like.dtype)
        if cache_key not in self._columns:
            self._columns[cache_key] = self.column(values, like)
        return self._columns[cache_key]

    def state_of(self, index: int, name: str) -> dict[str, object]:
        """Trial ``index``'s optimizer state for parameter ``name`` (created if absent)."""
        state: dict[str, object] = self.optimizers[index].state[self.params[index][name]]
        return state

    def held(self, index: int, name: str, key: str) -> object:
        """Trial ``index``'s state ``key`` for ``name``, or ``None`` (creates no entry)."""
        state = self.optimizers[index].state.get(self.params[index][name])
        return None if state is None else state.get(key)

    def finish(self) -> None:
        """Copy the stacked parameters back into each trial's own parameters."""
        with torch.no_grad():
            for name, stacked in self.stacked.items():
                for index, own in enumerate(self.params):
                    own[name].copy_(stacked[index])
        self.write_state()

    @abc.abstractmethod
    def write_state(self) -> None:
        """Write the stacked optimizer state back into each trial's optimizer."""


def _own(target: object, value: torch.Tensor) -> torch.Tensor:
    """``value`` copied into ``target`` when it is a tensor of the trial's, else a copy."""
    if isinstance(target, torch.Tensor) and target.shape == value.shape:
        return target.copy_(value)
    return value.clone()


class StackedAdam(_Stacked):
    """``torch.optim.Adam``/``AdamW``'s single-tensor step for all trials at once."""

    def hyperparameters(self) -> None:
        """Read each trial's hyperparameters (fixed for the pass)."""
        groups = self.groups
        self.lr = [float(g["lr"]) for g in groups]
        self.beta1 = [float(g["betas"][0]) for g in groups]
        self.beta2 = [float(g["betas"][1]) for g in groups]
        self.eps = [float(g["eps"]) for g in groups]
        decoupled = [bool(g.get("decoupled_weight_decay", False)) for g in groups]
        decay = [float(g["weight_decay"]) for g in groups]
        self.coupled = [0.0 if d else w for d, w in zip(decoupled, decay, strict=True)]
        self.shrink = [
            1 - lr * w if d else 1.0 for lr, d, w in zip(self.lr, decoupled, decay, strict=True)
        ]
        self.steps: dict[str, list[float]] = {}
        self.exp_avg: dict[str, torch.Tensor] = {}
        self.exp_avg_sq: dict[str, torch.Tensor] = {}
        self._bias: dict[tuple[object, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def _open(self, name: str) -> None:
        """Stack the trials' state of ``name`` (zeros and step 0 where there is none)."""
        like = self.stacked[name].detach()
        steps: list[float] = []
        firsts: list[torch.Tensor] = []
        seconds: list[torch.Tensor] = []
        for index in range(len(self.optimizers)):
            state = self.state_of(index, name)
            step = state.get("step")
            steps.append(float(step) if isinstance(step, torch.Tensor) else 0.0)
            for key, out in (("exp_avg", firsts), ("exp_avg_sq", seconds)):
                held = state.get(key)
                out.append(held if isinstance(held, torch.Tensor) else torch.zeros_like(like[0]))
        self.steps[name] = steps
        self.exp_avg[name] = torch.stack([t.to(like.device) for t in firsts])
        self.exp_avg_sq[name] = torch.stack([t.to(like.device) for t in seconds])

    def step_one(self, name: str, grad: torch.Tensor) -> None:
        """One Adam step of parameter ``name`` of every trial."""
        if name not in self.steps:
            self._open(name)
        param = self.stacked[name].detach()
        steps = self.steps[name]
        for index in range(len(steps)):
            steps[index] += 1
        exp_avg, exp_avg_sq = self.exp_avg[name], self.exp_avg_sq[name]
        if any(self.coupled):  # grad.add(param, alpha=weight_decay)
            grad = grad + self.constant("coupled", self.coupled, param) * param
        if any(s != 1.0 for s in self.shrink):  # param.mul_(1 - lr * weight_decay)
            param.mul_(self.constant("shrink", self.shrink, param))
        exp_avg.lerp_(grad, self.constant("1-beta1", [1 - b for b in self.beta1], param))
        exp_avg_sq.mul_(self.constant("beta2", self.beta2, param))
        exp_avg_sq.add_(self.constant("1-beta2", [1 - b for b in self.beta2], param) * grad * grad)
        step_size, correction = self._bias_columns(steps, param)
        denom = (exp_avg_sq.sqrt() / correction).add_(self.constant("eps", self.eps, param))
        param.add_(step_size * exp_avg / denom)

    def _bias_columns(
        self, steps: Sequence[float], like: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The step sizes ``-lr / (1 - beta1^step)`` and ``sqrt(1 - beta2^step)`` columns.

        Every parameter of a trial usually has the same step count, so the columns of one
        step are built once and shared by the parameters of the same rank (a step's
        Python scalars and two small tensors per parameter were a tenth of a pack's step
        on the CPU, measured on a pack of 8 MLPs).
        """
        key = (tuple(steps), like.dim(), like.dtype, like.device)
        held = self._bias.get(key)
        if held is None:
            step_size, correction = [], []
            for lr, beta1, beta2, step in zip(self.lr, self.beta1, self.beta2, steps, strict=True):
                step_size.append(-(lr / (1 - beta1**step)))
                correction.append((1 - beta2**step) ** 0.5)
            if len(self._bias) > 8:  # an earlier step's columns
                self._bias.clear()
            held = self._bias[key] = (self.column(step_size, like), self.column(correction, like))
        return held

    def write_state(self) -> None:
        """Each trial's ``step``, ``exp_avg``, ``exp_avg_sq`` (in torch's key order)."""
        for name, steps in self.steps.items():
            for index, step in enumerate(steps):
                state = self.state_of(index, name)
                held = state.get("step")
                if isinstance(held, torch.Tensor):
                    held.fill_(step)
                else:
                    state["step"] = torch.tensor(step, dtype=_scalar_dtype())
                own = self.params[index][name]
                for key, stacked in (("exp_avg", self.exp_avg), ("exp_avg_sq", self.exp_avg_sq)):
                    value = stacked[name][index].to(own.device)
                    state[key] = _own(state.get(key), value)


class StackedSGD(_Stacked):
    """``torch.optim.SGD``'s single-tensor step (momentum, dampening, Nesterov) at once."""

    def hyperparameters(self) -> None:
        """Read each trial's hyperparameters (fixed for the pass)."""
        groups = self.groups
        self.lr = [float(g["lr"]) for g in groups]
        self.decay = [float(g["weight_decay"]) for g in groups]
        self.momentum = [float(g["momentum"]) for g in groups]
        self.dampening = float(groups[0]["dampening"])
        self.nesterov = bool(groups[0]["nesterov"])
        self.buffers: dict[str, torch.Tensor] = {}
        self.started: dict[str, list[bool]] = {}

    def step_one(self, name: str, grad: torch.Tensor) -> None:
        """One SGD step of parameter ``name`` of every trial."""
        param = self.stacked[name].detach()
        if any(self.decay):  # grad.add(param, alpha=weight_decay)
            grad = grad + self.constant("decay", self.decay, param) * param
        direction = self._momentum(name, grad, param) if any(self.momentum) else grad
        param.add_(self.constant("-lr", [-lr for lr in self.lr], param) * direction)

    def _momentum(self, name: str, grad: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
        """The momentum buffers' update; the direction each trial steps in."""
        if name not in self.buffers:
            held = [self.held(i, name, "momentum_buffer") for i in range(len(self.lr))]
            self.started[name] = [isinstance(b, torch.Tensor) for b in held]
            self.buffers[name] = torch.stack(
                [
                    b.to(param.device)
                    if isinstance(b, torch.Tensor)
                    else torch.zeros_like(param[0])
                    for b in held
                ]
            )
        started = self.started[name]
        buffer = self.buffers[name]
        # buf.mul_(momentum).add_(grad, alpha=1 - dampening); a first step clones grad
        keep = [m if s else 0.0 for m, s in zip(self.momentum, started, strict=True)]
        take = [1 - self.dampening if s else 1.0 for s in started]
        buffer.mul_(self.column(keep, param)).add_(self.column(take, param) * grad)
        for index, momentum in enumerate(self.momentum):
            started[index] = started[index] or momentum != 0
        if self.nesterov:  # grad.add(buf, alpha=momentum)
            moved = grad + self.constant("momentum", self.momentum, param) * buffer
        else:
            moved = buffer
        uses = self.constant("uses", [float(m != 0) for m in self.momentum], param)
        return torch.where(uses != 0, moved, grad)

    def write_state(self) -> None:
        """Each momentum trial's ``momentum_buffer`` (trials without momentum keep none)."""
        for name, buffer in self.buffers.items():
            for index, momentum in enumerate(self.momentum):
                if momentum == 0:
                    continue
                state = self.state_of(index, name)
                own = self.params[index][name]
                state["momentum_buffer"] = _own(
                    state.get("momentum_buffer"), buffer[index].to(own.device)
                )
