"""Ready model specs: an MLP for any feature shape and a small CNN for images.

Both are configured only through a trial's ``params`` (so a search space can vary them),
validate every param they read, and raise :class:`~cerebro_spark.errors.ConfigError`
naming the param and the rule. Each declares the params it reads
(:attr:`ModelSpec.hyperparameters`): a search space giving one a param it does not know
is refused before the run starts, with the closest known name. Shared params:

* ``lr`` (float > 0, default 1e-3), ``weight_decay`` (float >= 0, default 0),
  ``batch_size`` (int >= 1, default 64), ``validation_batch_size`` (int >= 1, default
  ``batch_size``: rows per validation batch, where no gradient is kept).
* ``optimizer``: ``"adam"`` (default), ``"adamw"`` or ``"sgd"``; ``momentum``
  (float in [0, 1), default 0) is used by ``"sgd"`` only.
* ``lr_schedule``: ``"none"`` (default), ``"cosine"`` (``CosineAnnealingLR`` over
  ``lr_cosine_epochs`` epochs, int >= 1, default 10) or ``"step"`` (multiply the LR by
  ``lr_step_gamma``, float in (0, 1], default 0.1, every ``lr_step_size`` epochs, int >= 1,
  default 1). The unit steps the schedule once per epoch.
* ``standardize`` (bool, default true): the model's first layer is a :class:`Standardize`
  built from the dataset's per-feature statistics (:attr:`DatasetInfo.statistics`, the
  train split's mean and standard deviation), so raw features of very different scales
  train well. Its mean and std are buffers: they travel in the checkpoint's
  ``state_dict`` and scoring applies the same transform. ``false`` builds the model
  without it (exactly the model of earlier versions). A dataset without statistics
  (prepared by an earlier version) gets no standardization, with a warning.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from cerebro_spark.data import DatasetInfo, FeatureStatistics
from cerebro_spark.errors import ConfigError
from cerebro_spark.training._lazy_optim import LazyAdam, LazyAdamW, LazySGD, has_sparse_gradients
from cerebro_spark.training._spec import ModelSpec

logger = logging.getLogger(__name__)

_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU}


def _int(params: Mapping[str, Any], name: str, default: int, minimum: int) -> int:
    value = params.get(name, default)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _float(
    params: Mapping[str, Any],
    name: str,
    default: float,
    rule: str,
    low: float,
    high: float = math.inf,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    value = params.get(name, default)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok:
        number = float(value)
        ok = math.isfinite(number) and (number > low if low_open else number >= low)
        ok = ok and (number < high if high_open else number <= high)
    if not ok:
        raise ConfigError(f"{name} must be a float {rule}, got {value!r}")
    return float(value)


def _choice(params: Mapping[str, Any], name: str, default: str, choices: Sequence[str]) -> str:
    value = params.get(name, default)
    if value not in choices:
        raise ConfigError(f"{name} must be one of {list(choices)}, got {value!r}")
    return str(value)


def _bool(params: Mapping[str, Any], name: str, default: bool) -> bool:
    value = params.get(name, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}")
    return value


def _int_list(params: Mapping[str, Any], name: str, default: list[int]) -> list[int]:
    value = params.get(name, default)
    ok = isinstance(value, (list, tuple)) and all(
        (isinstance(v, int) and not isinstance(v, bool) and v > 0)
        or (isinstance(v, float) and v.is_integer() and v > 0)
        for v in value
    )
    if not ok:
        raise ConfigError(f"{name} must be a list of positive ints, got {value!r}")
    return [int(v) for v in value]


def _outputs(info: DatasetInfo) -> int:
    if info.task == "regression":
        return 1
    if info.task != "classification":
        raise ConfigError(f"task must be 'classification' or 'regression', got {info.task!r}")
    if not isinstance(info.num_classes, int) or info.num_classes < 2:
        raise ConfigError(f"classification needs num_classes >= 2, got {info.num_classes!r}")
    return info.num_classes


def _dropout(params: Mapping[str, Any]) -> float:
    return _float(params, "dropout", 0.0, "in [0, 1)", 0.0, 1.0, high_open=True)


class Standardize(nn.Module):
    """``(x - mean) / std`` per feature element, with mean and std as registered buffers.

    Built from a dataset's :class:`~cerebro_spark.data.FeatureStatistics`; the buffers
    (``mean``, ``std``, shaped like one example's features) are part of the module's
    ``state_dict``, so a checkpoint carries them and a model loaded from it standardizes
    its inputs the same way. An element whose std is zero (constant on the train split) or
    too small to divide by in float32 is only centred (its std is taken as 1).

    Args:
        statistics: The per-element statistics (``statistics.size`` must equal the number
            of values in ``feature_shape``).
        feature_shape: Shape of one example's features.

    Raises:
        ConfigError: The statistics do not match the feature shape.
    """

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, statistics: FeatureStatistics, feature_shape: Sequence[int]) -> None:
        super().__init__()
        shape = tuple(int(d) for d in feature_shape)
        if statistics.size != math.prod(shape):
            raise ConfigError(
                f"feature statistics describe {statistics.size} values, but feature_shape "
                f"{shape} holds {math.prod(shape)}"
            )
        mean = torch.tensor(statistics.mean, dtype=torch.float32).reshape(shape)
        std = torch.tensor(statistics.std, dtype=torch.float32).reshape(shape)
        floor = torch.finfo(torch.float32).eps * mean.abs().clamp(min=1.0)
        std = torch.where(std > floor, std, torch.ones_like(std))
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the standardized batch (same shape as ``x``)."""
        return (x - self.mean) / self.std


_WARNED: set[str | None] = set()
_WARNED_LOCK = threading.Lock()


def _standardize_layers(params: Mapping[str, Any], info: DatasetInfo) -> list[nn.Module]:
    """``[Standardize]`` when the ``standardize`` param and the dataset allow it, else ``[]``."""
    if not _bool(params, "standardize", True):
        return []
    if info.statistics is None:
        with _WARNED_LOCK:
            first = info.dataset_id not in _WARNED
            _WARNED.add(info.dataset_id)
        if first:
            logger.warning(
                "dataset %s has no feature statistics (prepared by an earlier version of "
                "cerebro-spark): the built-in model does not standardize its inputs; "
                "prepare the data again into a new store to get them",
                info.dataset_id or "(unnamed)",
            )
        return []
    return [Standardize(info.statistics, info.feature_shape)]


_SHARED_HYPERPARAMETERS = frozenset(
    {
        "lr",
        "weight_decay",
        "optimizer",
        "momentum",
        "lr_schedule",
        "lr_cosine_epochs",
        "lr_step_gamma",
        "lr_step_size",
        "batch_size",
        "validation_batch_size",
        "dropout",
        "standardize",
    }
)


class _TrainingParams(ModelSpec):
    """The optimizer, LR schedule and batch size params shared by the ready specs."""

    hyperparameters: ClassVar[frozenset[str] | None] = _SHARED_HYPERPARAMETERS

    def build_optimizer(self, model: nn.Module, params: Mapping[str, Any]) -> torch.optim.Optimizer:
        """Return Adam, AdamW or SGD as the ``optimizer`` param says.

        torch's class, or its lazy twin of :mod:`._lazy_optim` when the model has layers
        with sparse gradients (``sparse_embeddings``): those step only the rows a batch
        used, every other parameter exactly as torch's class steps it.
        """
        lr = _float(params, "lr", 1e-3, "> 0", 0.0, low_open=True)
        decay = _float(params, "weight_decay", 0.0, ">= 0", 0.0)
        kind = _choice(params, "optimizer", "adam", ("adam", "adamw", "sgd"))
        lazy = has_sparse_gradients(model)
        if kind == "sgd":
            momentum = _float(params, "momentum", 0.0, "in [0, 1)", 0.0, 1.0, high_open=True)
            sgd = LazySGD if lazy else torch.optim.SGD
            return sgd(model.parameters(), lr=lr, momentum=momentum, weight_decay=decay)
        adam: type[torch.optim.Adam] = {
            ("adam", False): torch.optim.Adam,
            ("adamw", False): torch.optim.AdamW,
            ("adam", True): LazyAdam,
            ("adamw", True): LazyAdamW,
        }[kind, lazy]
        return adam(model.parameters(), lr=lr, weight_decay=decay)

    def build_lr_scheduler(
        self, optimizer: torch.optim.Optimizer, params: Mapping[str, Any]
    ) -> torch.optim.lr_scheduler.LRScheduler | None:
        """Return the schedule named by ``lr_schedule`` (``None`` for ``"none"``)."""
        kind = _choice(params, "lr_schedule", "none", ("none", "cosine", "step"))
        if kind == "cosine":
            epochs = _int(params, "lr_cosine_epochs", 10, 1)
            return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs)
        if kind == "step":
            gamma = _float(params, "lr_step_gamma", 0.1, "in (0, 1]", 0.0, 1.0, low_open=True)
            step_size = _int(params, "lr_step_size", 1, 1)
            return torch.optim.lr_scheduler.StepLR(optimizer, step_size=step_size, gamma=gamma)
        return None

    def batch_size(self, params: Mapping[str, Any]) -> int:
        """Return the ``batch_size`` param (default 64)."""
        return _int(params, "batch_size", 64, 1)

    def validation_batch_size(self, params: Mapping[str, Any]) -> int:
        """Return the ``validation_batch_size`` param (default: :meth:`batch_size`)."""
        return _int(params, "validation_batch_size", self.batch_size(params), 1)

    def check_params(self, params: Mapping[str, Any], info: DatasetInfo) -> None:
        """Validate every param this spec reads without training anything.

        Args:
            params: A trial's params.
            info: The dataset the model is for.

        Raises:
            ConfigError: Naming the first param that breaks its rule.
        """
        model = self.build_model(params, info)
        optimizer = self.build_optimizer(model, params)
        self.build_lr_scheduler(optimizer, params)
        self.batch_size(params)
        self.validation_batch_size(params)
        self.augmentation(params, info)


class MLPSpec(_TrainingParams):
    """A multi-layer perceptron on the flattened features.

    Params (besides the shared ones in the module docstring): ``hidden_units`` (list of
    positive ints, default ``[128]``; ``[]`` gives a linear model), ``activation``
    (``"relu"`` default, ``"tanh"``, ``"gelu"``), ``dropout`` (float in [0, 1), default 0,
    after every hidden layer), ``standardize`` (module docstring). One output per class,
    or one for regression.
    """

    hyperparameters: ClassVar[frozenset[str] | None] = _SHARED_HYPERPARAMETERS | {
        "hidden_units",
        "activation",
    }

    def build_model(self, params: Mapping[str, Any], info: DatasetInfo) -> nn.Module:
        """Return ``[Standardize] -> Flatten -> [Linear -> activation -> Dropout]* -> Linear``."""
        hidden = _int_list(params, "hidden_units", [128])
        activation = _ACTIVATIONS[_choice(params, "activation", "relu", tuple(_ACTIVATIONS))]
        dropout = _dropout(params)
        if not info.feature_shape or any(d < 1 for d in info.feature_shape):
            raise ConfigError(
                f"MLPSpec needs a non-empty feature_shape of positive sizes, "
                f"got {info.feature_shape!r}"
            )
        outputs = _outputs(info)
        layers: list[nn.Module] = [*_standardize_layers(params, info), nn.Flatten()]
        width = math.prod(info.feature_shape)
        for units in hidden:
            layers += [nn.Linear(width, units), activation(), nn.Dropout(dropout)]
            width = units
        layers.append(nn.Linear(width, outputs))
        return nn.Sequential(*layers)


class CNNSpec(_TrainingParams):
    """A small CNN for image-like features of shape ``(C, H, W)`` or ``(H, W)``.

    Each conv block is ``Conv2d(kernel_size, "same" padding) -> ReLU -> MaxPool2d(2)``
    (the pool is skipped once a side is 1, so 8x8 inputs work with any number of blocks),
    then ``Flatten -> Linear(dense_units) -> ReLU -> Dropout -> Linear``.

    Params (besides the shared ones in the module docstring): ``channels`` (positive int
    for two blocks of that width, or a list of positive ints, one block each; default
    16), ``kernel_size`` (odd int >= 1, default 3), ``dense_units`` (int >= 1, default 64),
    ``dropout`` (float in [0, 1), default 0), ``standardize`` (module docstring; per pixel,
    before the first conv block).
    """

    hyperparameters: ClassVar[frozenset[str] | None] = _SHARED_HYPERPARAMETERS | {
        "channels",
        "kernel_size",
        "dense_units",
    }

    def build_model(self, params: Mapping[str, Any], info: DatasetInfo) -> nn.Module:
        """Return the CNN described in the class docstring."""
        raw_channels = params.get("channels", 16)
        if isinstance(raw_channels, (int, float)) and not isinstance(raw_channels, bool):
            width = _int(params, "channels", 16, 1)
            channels = [width, width]
        else:
            channels = _int_list(params, "channels", [16, 16])
            if not channels:
                raise ConfigError("channels must be a non-empty list of positive ints, got []")
        kernel = _int(params, "kernel_size", 3, 1)
        if kernel % 2 == 0:
            raise ConfigError(f"kernel_size must be an odd int >= 1, got {kernel}")
        dense = _int(params, "dense_units", 64, 1)
        dropout = _dropout(params)
        shape = tuple(info.feature_shape)
        if len(shape) not in (2, 3) or any(d < 1 for d in shape):
            raise ConfigError(
                f"CNNSpec needs feature_shape (C, H, W) or (H, W) of positive sizes, got {shape!r}"
            )
        in_channels, height, width_px = (1, *shape) if len(shape) == 2 else shape
        layers: list[nn.Module] = [
            *_standardize_layers(params, info),
            nn.Flatten(),
            nn.Unflatten(1, (in_channels, height, width_px)),
        ]
        for out_channels in channels:
            layers += [
                nn.Conv2d(in_channels, out_channels, kernel, padding=kernel // 2),
                nn.ReLU(),
            ]
            if height >= 2 and width_px >= 2:
                layers.append(nn.MaxPool2d(2))
                height, width_px = height // 2, width_px // 2
            in_channels = out_channels
        layers += [
            nn.Flatten(),
            nn.Linear(in_channels * height * width_px, dense),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(dense, _outputs(info)),
        ]
        return nn.Sequential(*layers)
