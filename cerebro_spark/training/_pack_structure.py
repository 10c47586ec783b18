"""Which trials may share a packed unit: the structure fingerprint of their models.

Trials pack (:mod:`._pack`) when one ``vmap`` can run all their models: the same spec,
the same batch size and models of one structure. :func:`pack_fingerprint` names that
structure, so the driver can group trials before it schedules them; the packed unit
checks the models it built with the same description (:func:`check_same_structure`).

The structure of a model is, module by module (``named_modules``): its type, its
``extra_repr()`` and its public attributes of plain values (``Dropout.p``,
``Linear.in_features``, ``Conv2d.stride`` ...: what changes the forward without being a
tensor), then every parameter's name, shape, dtype and ``requires_grad`` and every
buffer's name, shape and dtype. Values of parameters and buffers are not part of it: they
are what the pack stacks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from cerebro_spark.data import DatasetInfo
from cerebro_spark.errors import ConfigError
from cerebro_spark.training._lazy_optim import has_sparse_gradients
from cerebro_spark.training._spec import ModelSpec, checked_batch_size

_PLAIN = (bool, int, float, str, type(None))


def _plain(value: Any) -> bool:
    if isinstance(value, _PLAIN):
        return True
    return isinstance(value, (tuple, list)) and all(_plain(v) for v in value)


def structure_lines(spec: ModelSpec, model: nn.Module, batch_size: int) -> list[str]:
    """The model's structure as lines of text (see the module docstring), spec first."""
    lines = [
        f"spec {type(spec).__module__}:{type(spec).__qualname__}",
        f"batch_size {batch_size}",
    ]
    for name, module in model.named_modules():
        attributes = sorted(
            (key, repr(value))
            for key, value in vars(module).items()
            if not key.startswith("_") and key != "training" and _plain(value)
        )
        kind = f"{type(module).__module__}.{type(module).__qualname__}"
        lines.append(f"module {name!r} {kind}({module.extra_repr()}) {attributes}")
    for name, param in model.named_parameters():
        grad = "learned" if param.requires_grad else "frozen"
        lines.append(f"parameter {name!r} {tuple(param.shape)} {param.dtype} {grad}")
    for name, buffer in model.named_buffers():
        lines.append(f"buffer {name!r} {tuple(buffer.shape)} {buffer.dtype}")
    return lines


def _digest(lines: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def pack_fingerprint(spec: ModelSpec, params: Mapping[str, Any], info: DatasetInfo) -> str:
    """A digest of the structure a trial's model has: trials with equal ones can pack.

    The model is built on torch's ``meta`` device where the spec allows it (no memory,
    no weights), else on the CPU; torch's global RNG is left as it was.

    Args:
        spec: The trials' spec.
        params: One trial's params.
        info: The dataset.

    Returns:
        A SHA-256 hex digest of the spec, the batch size and the model's structure.

    Raises:
        ConfigError: The params break the spec's rules (from the spec), or the model
            cannot pack (:func:`check_packable_model`).
    """
    size = checked_batch_size(spec, params)
    with torch.random.fork_rng(devices=[]):
        try:
            with torch.device("meta"):
                model = spec.build_model(params, info)
        except ConfigError:
            raise
        except Exception:  # a spec that reads its tensors' values cannot build on meta
            model = spec.build_model(params, info)
    check_packable_model(model)
    return _digest(structure_lines(spec, model, size))


def check_packable_model(model: nn.Module) -> None:
    """Refuse a model a pack cannot step as its unpacked twin: sparse gradients.

    A pack computes dense stacked gradients; a lazy optimizer (:mod:`._lazy_optim`) steps
    a dense gradient's every row, so the trial would train differently than unpacked.

    Raises:
        ConfigError: Naming the rule and the two ways out.
    """
    if has_sparse_gradients(model):
        raise ConfigError(
            f"packed units step dense gradients, and {type(model).__name__} has embeddings "
            "with sparse gradients (the optimizer steps only the rows a batch used): set "
            "sparse_embeddings: false to pack its trials, or pack: off"
        )


def check_same_structure(
    models: Sequence[tuple[str, nn.Module]], spec: ModelSpec, batch_size: int
) -> None:
    """Refuse models of different structure in one pack, naming the first difference.

    Args:
        models: ``(trial_id, model)`` of the pack's trials.
        spec: Their spec.
        batch_size: Their batch size.

    Raises:
        ConfigError: Two models differ (the message names both trials and the lines).
    """
    if not models:
        return
    first_id, first = models[0]
    reference = structure_lines(spec, first, batch_size)
    for trial_id, model in models[1:]:
        lines = structure_lines(spec, model, batch_size)
        if lines == reference:
            continue
        differ = [(a, b) for a, b in zip(reference, lines, strict=False) if a != b]
        a, b = differ[0] if differ else (f"{len(reference)} lines", f"{len(lines)} lines")
        raise ConfigError(
            f"trials {first_id!r} and {trial_id!r} cannot share a pack: their models differ "
            f"({a!r} vs {b!r}); pack only trials with one pack_fingerprint"
        )
