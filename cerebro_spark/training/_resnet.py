"""A ready ResNet spec: ResNet-18/34/50 for image features, with pretrained weights.

The network is He et al., "Deep Residual Learning for Image Recognition" (CVPR 2016),
Table 1: basic blocks (two 3x3 convs) for 18 and 34 layers, bottleneck blocks (1x1, 3x3,
1x1, four times wider out) for 50; stride 2 on the 3x3 conv of a bottleneck (the
"ResNet v1.5" torchvision uses). It is built here, not imported from torchvision, with
exactly torchvision's module names and parameter shapes (``conv1``, ``bn1``,
``layer1``..``layer4`` of blocks ``conv1``/``bn1``/``conv2``/``bn2`` [``conv3``/``bn3``]
and ``downsample.0``/``downsample.1``, ``fc``), so a torchvision ``resnet18/34/50``
state_dict loads into ``depth: 18/34/50, width: 1.0, stem: imagenet`` unchanged.
"""

from __future__ import annotations

import functools
import io
import logging
import urllib.parse
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from cerebro_spark.data import DatasetInfo
from cerebro_spark.errors import ConfigError
from cerebro_spark.training._images import Augmentation
from cerebro_spark.training._models import (
    _SHARED_HYPERPARAMETERS,
    _bool,
    _choice,
    _dropout,
    _float,
    _int,
    _outputs,
    _standardize_layers,
    _TrainingParams,
)

logger = logging.getLogger(__name__)

#: Blocks per stage (layer1..layer4) by depth (He et al. 2016, Table 1).
_STAGES: dict[int, tuple[int, int, int, int]] = {
    18: (2, 2, 2, 2),
    34: (3, 4, 6, 3),
    50: (3, 4, 6, 3),
}
#: Channels of the four stages at ``width: 1.0`` (a bottleneck's output is 4 times more).
_STAGE_CHANNELS = (64, 128, 256, 512)
#: Images whose sides are both at most this many pixels get the small stem under ``auto``.
SMALL_STEM_MAX_SIDE = 64
#: Names of the modules of each ``freeze`` stage: 1 is the stem, 2..5 are layer1..layer4.
_FREEZE_STAGES: tuple[tuple[str, ...], ...] = (
    ("conv1", "bn1"),
    ("layer1",),
    ("layer2",),
    ("layer3",),
    ("layer4",),
)


def _conv3x3(inputs: int, outputs: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(inputs, outputs, kernel_size=3, stride=stride, padding=1, bias=False)


def _conv1x1(inputs: int, outputs: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(inputs, outputs, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convs with a shortcut (ResNet-18/34); ``downsample`` projects the shortcut."""

    expansion: ClassVar[int] = 1

    def __init__(self, inputs: int, channels: int, stride: int, downsample: nn.Module | None):
        super().__init__()
        self.conv1 = _conv3x3(inputs, channels, stride)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(channels, channels)
        self.bn2 = nn.BatchNorm2d(channels)
        self.downsample = downsample

    def last_bn(self) -> nn.BatchNorm2d:
        """The BatchNorm closing the residual branch (zeroed by ``zero_init_residual``)."""
        return self.bn2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``relu(branch(x) + shortcut(x))``."""
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        result: torch.Tensor = self.relu(out + shortcut)
        return result


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (with the stride), 1x1 expand by 4, with a shortcut (ResNet-50)."""

    expansion: ClassVar[int] = 4

    def __init__(self, inputs: int, channels: int, stride: int, downsample: nn.Module | None):
        super().__init__()
        self.conv1 = _conv1x1(inputs, channels)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = _conv3x3(channels, channels, stride)
        self.bn2 = nn.BatchNorm2d(channels)
        self.conv3 = _conv1x1(channels, channels * self.expansion)
        self.bn3 = nn.BatchNorm2d(channels * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def last_bn(self) -> nn.BatchNorm2d:
        """The BatchNorm closing the residual branch (zeroed by ``zero_init_residual``)."""
        return self.bn3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``relu(branch(x) + shortcut(x))``."""
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        result: torch.Tensor = self.relu(out + shortcut)
        return result


class ResNet(nn.Module):
    """ResNet with torchvision's module names; takes a tensor or a dict holding one image.

    Args:
        depth: 18, 34 or 50.
        in_channels: Channels of the input images.
        outputs: Size of the final ``fc`` layer.
        width: Multiplier of every stage's channels (and the stem's).
        small_stem: A 3x3 stride-1 ``conv1`` and no max-pool (small images) instead of the
            ImageNet stem (7x7 stride 2, then a 3x3 stride-2 max-pool).
        zero_init_residual: Zero the weight of the last BatchNorm of each block.
        dropout: Dropout before ``fc``.
        image_shape: ``(C, H, W)`` of one image, as the convs see it.
        image_column: For dict input: the key of the image. ``None``: the input is a tensor.
        input_norm: Applied to a tensor input before it is shaped as an image (a
            :class:`~cerebro_spark.training.Standardize`, or ``None``).
        freeze: The first ``freeze`` stages (1: the stem, 2..5: ``layer1``..``layer4``)
            are not trained: their parameters do not require gradients and their
            BatchNorm layers stay in eval mode (running statistics unchanged) while the
            model trains.
    """

    def __init__(
        self,
        depth: int,
        in_channels: int,
        outputs: int,
        *,
        width: float = 1.0,
        small_stem: bool = False,
        zero_init_residual: bool = False,
        dropout: float = 0.0,
        image_shape: tuple[int, int, int],
        image_column: str | None = None,
        input_norm: nn.Module | None = None,
        freeze: int = 0,
    ) -> None:
        super().__init__()
        block: type[BasicBlock | Bottleneck] = Bottleneck if depth == 50 else BasicBlock
        channels = [max(1, round(c * width)) for c in _STAGE_CHANNELS]
        self.image_column = image_column
        self.image_shape = image_shape
        self.input_norm = nn.Identity() if input_norm is None else input_norm
        if small_stem:
            self.conv1 = _conv3x3(in_channels, channels[0])
        else:
            self.conv1 = nn.Conv2d(
                in_channels, channels[0], kernel_size=7, stride=2, padding=3, bias=False
            )
        self.bn1 = nn.BatchNorm2d(channels[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool: nn.Module = (
            nn.Identity() if small_stem else nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        )
        inputs = channels[0]
        stages: list[nn.Sequential] = []
        for index, (count, planes) in enumerate(zip(_STAGES[depth], channels, strict=True)):
            stride = 1 if index == 0 else 2
            out = planes * block.expansion
            downsample: nn.Module | None = None
            if stride != 1 or inputs != out:
                downsample = nn.Sequential(_conv1x1(inputs, out, stride), nn.BatchNorm2d(out))
            blocks: list[nn.Module] = [block(inputs, planes, stride, downsample)]
            blocks += [block(out, planes, 1, None) for _ in range(count - 1)]
            stages.append(nn.Sequential(*blocks))
            inputs = out
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(inputs, outputs)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        if zero_init_residual:
            for module in self.modules():
                if isinstance(module, (BasicBlock, Bottleneck)):
                    nn.init.zeros_(module.last_bn().weight)
        self.frozen_stages = 0
        self.freeze(freeze)

    def freeze(self, stages: int) -> None:
        """Stop training the first ``stages`` stages (see the class docstring)."""
        self.frozen_stages = stages
        for module in self._frozen_modules():
            for parameter in module.parameters():
                parameter.requires_grad_(False)
        self.train(self.training)

    def _frozen_modules(self) -> list[nn.Module]:
        names = [name for stage in _FREEZE_STAGES[: self.frozen_stages] for name in stage]
        return [getattr(self, name) for name in names]

    def train(self, mode: bool = True) -> ResNet:
        """Set training mode; the BatchNorm layers of frozen stages always stay in eval."""
        super().train(mode)
        for module in self._frozen_modules():
            module.train(False)
        return self

    def forward(self, x: torch.Tensor | Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Return ``(N, outputs)`` for an image batch ``(N, C, H, W)`` (or a dict holding it)."""
        if isinstance(x, Mapping):
            if self.image_column is None:
                raise TypeError("this ResNet takes a tensor, got a dict of features")
            x = x[self.image_column]
        x = self.input_norm(x).reshape(x.shape[0], *self.image_shape)
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        logits: torch.Tensor = self.fc(self.dropout(torch.flatten(self.avgpool(x), 1)))
        return logits


def _split_uri(uri: str) -> tuple[str, str]:
    """``(parent directory URI, file name)`` of a file URI or local path (options kept)."""
    parts = urllib.parse.urlsplit(uri)
    if len(parts.scheme) > 1 and parts.netloc + parts.path:
        head, _, name = parts.path.rpartition("/")
        parent = urllib.parse.urlunsplit((parts.scheme, parts.netloc, head, parts.query, ""))
    else:
        head, _, name = uri.rpartition("/")
        parent = head or "."
    if not name:
        raise ConfigError(f"pretrained must be the URI of a file, got {uri!r}")
    return parent, name


@functools.lru_cache(maxsize=2)
def _read_state_dict(uri: str) -> Mapping[str, torch.Tensor]:
    """The state_dict saved at ``uri``, read once per process (the last two are kept)."""
    from cerebro_spark.store import open_store

    parent, name = _split_uri(uri)
    try:
        data = open_store(parent).get(name)
    except FileNotFoundError as exc:
        raise ConfigError(f"pretrained {uri!r} does not exist") from exc
    try:
        loaded = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:
        raise ConfigError(
            f"pretrained {uri!r} is not a state_dict saved with torch.save "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    if not isinstance(loaded, Mapping) or not all(
        isinstance(key, str) and isinstance(value, torch.Tensor) for key, value in loaded.items()
    ):
        raise ConfigError(
            f"pretrained {uri!r} must hold a state_dict (a mapping of names to tensors), "
            f"got a {type(loaded).__name__}"
        )
    return dict(loaded)


def load_pretrained(model: ResNet, uri: str) -> list[str]:
    """Copy the weights saved at ``uri`` into ``model``; return the keys skipped.

    A key whose shape differs from the model's (the ``fc`` of another class count, the
    ``conv1`` of another stem or channel count) is skipped and the skipped keys are logged
    once at INFO; so are ``input_norm`` buffers (they come from this dataset's statistics).
    A ``num_batches_tracked`` the file lacks (files saved before torch 0.4.1) is left as
    built.

    Raises:
        ConfigError: The file is missing or not a state_dict, holds a key the model does not
            have, or lacks one it has (the message names them).
    """
    loaded = _read_state_dict(uri)
    own = model.state_dict()
    unexpected = sorted(key for key in loaded if key not in own and not _is_input_norm(key))
    missing = sorted(
        key
        for key in own
        if key not in loaded and not _is_input_norm(key) and not key.endswith("num_batches_tracked")
    )
    if unexpected or missing:
        raise ConfigError(
            f"pretrained {uri!r} does not fit this ResNet: unexpected keys {unexpected}, "
            f"missing keys {missing} (depth, width and stem must be those it was saved with)"
        )
    skipped = sorted(
        key for key in loaded if _is_input_norm(key) or loaded[key].shape != own[key].shape
    )
    if skipped:
        logger.info(
            "pretrained %s: skipped %d keys whose shape differs from this model's: %s",
            uri,
            len(skipped),
            ", ".join(skipped),
        )
    kept = {key: value for key, value in loaded.items() if key not in skipped}
    model.load_state_dict(kept, strict=False)
    return skipped


def _is_input_norm(key: str) -> bool:
    return key.startswith("input_norm.")


class ResNetSpec(_TrainingParams):
    """ResNet-18/34/50 (He et al. 2016) for images, optionally from pretrained weights.

    Input: one tensor (:attr:`DatasetInfo.tensor_input`): an image column's ``(N, C, H, W)``
    batch (already scaled and normalized per channel by the input pipeline: the model does
    not normalize it again), or numbers of ``feature_shape`` ``(C, H, W)`` or ``(H, W)``
    (one channel), standardized by the ``standardize`` param as :class:`MLPSpec` does;
    or a dict of columns, of which the model takes the image column: the only one, or the
    one the ``image_column`` param names. Any number of channels works (1 for grayscale,
    3 for RGB). One output per class, or one for regression.

    Params (besides the shared ones of :mod:`cerebro_spark.training._models`):

    * ``depth``: 18 (default), 34 or 50.
    * ``width`` (float > 0, default 1.0): multiplies every stage's channels (64, 128, 256,
      512 at 1.0; a bottleneck's output is 4 times its stage's channels), rounded, at
      least 1.
    * ``stem``: ``"auto"`` (default: ``"small"`` when height and width are both at most
      64 px, else ``"imagenet"``), ``"imagenet"`` (7x7 stride-2 conv, 3x3 stride-2
      max-pool) or ``"small"`` (3x3 stride-1 conv, no max-pool: CIFAR-sized images keep
      their resolution).
    * ``pretrained`` (default none): the URI (local path, ``file://``, ``s3://``, any
      store) of a ``state_dict`` saved with ``torch.save``, e.g. a torchvision
      ``resnet50().state_dict()`` for ``depth: 50, width: 1.0, stem: imagenet``. Keys
      whose shape differs (the ``fc`` of another class count, a ``conv1`` of another stem
      or channel count) are skipped with one INFO log naming them; any other missing or
      unexpected key is a :class:`~cerebro_spark.errors.ConfigError`. It is read once per
      process and URI (``build_model`` runs for every unit, and when a saved model is
      loaded for scoring: the URI must stay readable; the checkpoint's weights then
      replace it).
    * ``freeze`` (int in [0, 5], default 0): the first ``freeze`` stages (1: the stem
      ``conv1``/``bn1``, 2..5: ``layer1``..``layer4``) are not trained: no gradients, and
      their BatchNorm layers stay in eval mode while training.
    * ``zero_init_residual`` (bool, default false): zero the last BatchNorm's weight of
      each block, so each block starts as the identity (Goyal et al. 2017).
    * ``image_column``: the image column to use when the features are a dict with
      several.
    * ``dropout`` (float in [0, 1), default 0): before ``fc``.
    * ``standardize`` (bool, default true): numeric (not image) tensor input only.
    * ``crop_padding`` (int >= 0, default 0) and ``flip`` (bool, default false): the
      training batches' image augmentation (:meth:`augmentation`): a random crop of the
      image zero-padded by ``crop_padding`` pixels, a horizontal flip with p = 0.5; both
      seeded by (trial, epoch, partition, batch), so a replay is bit-exact.
    * ``normalize`` (bool, default true): images are normalized by the train split's
      per-channel mean and std (else only scaled to [0, 1]).
    """

    hyperparameters: ClassVar[frozenset[str] | None] = _SHARED_HYPERPARAMETERS | {
        "depth",
        "width",
        "stem",
        "pretrained",
        "freeze",
        "zero_init_residual",
        "image_column",
        "crop_padding",
        "flip",
        "normalize",
    }

    def augmentation(self, params: Mapping[str, Any], info: DatasetInfo) -> Augmentation | None:
        """Random crop with padding and horizontal flip, from ``crop_padding`` and ``flip``."""
        return Augmentation(
            crop_padding=_int(params, "crop_padding", 0, 0),
            flip=_bool(params, "flip", False),
            normalize=_bool(params, "normalize", True),
        )

    def build_model(self, params: Mapping[str, Any], info: DatasetInfo) -> nn.Module:
        """Return the :class:`ResNet` the params describe, with pretrained weights if asked."""
        depth = params.get("depth", 18)
        if isinstance(depth, bool) or depth not in _STAGES:
            raise ConfigError(f"depth must be one of {sorted(_STAGES)}, got {depth!r}")
        width = _float(params, "width", 1.0, "> 0", 0.0, low_open=True)
        stem = _choice(params, "stem", "auto", ("auto", "imagenet", "small"))
        freeze = _int(params, "freeze", 0, 0)
        if freeze > len(_FREEZE_STAGES):
            raise ConfigError(f"freeze must be an int in [0, {len(_FREEZE_STAGES)}], got {freeze}")
        zero_init = _bool(params, "zero_init_residual", False)
        dropout = _dropout(params)
        pretrained = params.get("pretrained")
        if pretrained is not None and (not isinstance(pretrained, str) or not pretrained):
            raise ConfigError(f"pretrained must be a URI string or null, got {pretrained!r}")
        standardize = _bool(params, "standardize", True)
        image_column, shape, input_norm = self._input(params, info, standardize)
        model = ResNet(
            int(depth),
            shape[0],
            _outputs(info),
            width=width,
            small_stem=stem == "small"
            or (stem == "auto" and max(shape[1:]) <= SMALL_STEM_MAX_SIDE),
            zero_init_residual=zero_init,
            dropout=dropout,
            image_shape=shape,
            image_column=image_column,
            input_norm=input_norm,
        )
        if pretrained is not None:
            load_pretrained(model, pretrained)
        model.freeze(freeze)
        return model

    @staticmethod
    def _input(
        params: Mapping[str, Any], info: DatasetInfo, standardize: bool
    ) -> tuple[str | None, tuple[int, int, int], nn.Module | None]:
        """``(image column or None for a tensor, (C, H, W), input standardization)``."""
        images = info.columns_of("image")
        named = params.get("image_column")
        if named is not None and (
            not isinstance(named, str) or named not in {column.name for column in images}
        ):
            raise ConfigError(
                f"image_column must name one of the image columns "
                f"{[column.name for column in images]}, got {named!r}"
            )
        if info.tensor_input:
            if images:  # the only feature column: normalized by the input pipeline
                return None, _image_shape(images[0].shape, images[0].name), None
            shape = tuple(info.feature_shape)
            if len(shape) not in (2, 3) or any(d < 1 for d in shape):
                raise ConfigError(
                    f"ResNetSpec needs an image column or feature_shape (C, H, W) or (H, W) "
                    f"of positive sizes, got {shape!r}"
                )
            image = (1, *shape) if len(shape) == 2 else shape
            norm = _standardize_layers({"standardize": standardize}, info)
            return None, (image[0], image[1], image[2]), norm[0] if norm else None
        if named is None:
            if len(images) != 1:
                raise ConfigError(
                    f"ResNetSpec needs one image column, or the image_column param naming one; "
                    f"dataset {info.dataset_id} has {[column.name for column in images]}"
                )
            named = images[0].name
        return named, _image_shape(info.column(named).shape, named), None


def _image_shape(shape: tuple[int, ...], name: str) -> tuple[int, int, int]:
    if len(shape) != 3 or any(d < 1 for d in shape):
        raise ConfigError(f"image column {name!r} must have shape (C, H, W), got {shape!r}")
    return (shape[0], shape[1], shape[2])
