"""Per-batch image ops: decode a held image column, augment, and make the model's tensor.

A worker holds an image column as stored (:class:`~cerebro_spark.data.HeldColumn`: the
encoded JPEG/PNG bytes end to end) and builds each mini-batch from it:

1. :func:`decode_images`: the batch's rows, decoded exactly with PIL into one ``uint8``
   ``(N, C, H, W)`` array (PIL releases the GIL while it decodes, so batches decoded by
   several threads, :class:`~cerebro_spark.training._prefetch.Prefetcher`, scale);
2. :func:`augment`: random crop and horizontal flip (:class:`Augmentation`), vectorized
   with numpy, drawing from the batch's own generator (:func:`batch_seed`), so any thread
   may build any batch in any order and a replay is bit-exact;
3. :func:`to_tensor`: ``float32``, scaled to [0, 1] and normalized with the dataset's
   per-channel statistics (:func:`normalization`), optionally in pinned memory.

:func:`decode_on_device` decodes a JPEG batch on a CUDA device with torchvision where both
are available, and returns ``None`` otherwise (the caller takes the CPU path). nvJPEG's
pixels may differ from libjpeg's: replay is bit-exact on the same path, not across paths.
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from PIL import Image

from cerebro_spark.data import ColumnInfo, HeldColumn
from cerebro_spark.errors import ConfigError, DataError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

#: The ``SeedSequence`` stream of batch augmentation (``training/_unit.py`` uses 0 for
#: initial weights and 1 for torch's per-pass seed).
AUGMENT_STREAM = 2
#: PIL mode an image is converted to, by the decoded channel count.
_MODES = {1: "L", 3: "RGB"}
#: What PIL raises on bytes it cannot decode (``UnidentifiedImageError`` is an ``OSError``).
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError)
#: JPEG start-of-frame markers (SOF0-SOF15 less DHT, JPG and DAC), as PIL reads them.
_FRAME_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
#: JPEG markers without a length field (TEM, RST0-RST7, SOI, EOI).
_STANDALONE_MARKERS = frozenset({0x01, *range(0xD0, 0xDA)})


def _image_geometry(column: HeldColumn) -> tuple[int, int, int]:
    """The column's decoded ``(C, H, W)``, checking it is an image column held as bytes."""
    info = column.info
    if info.feature_kind != "image" or column.offsets is None:
        raise DataError(
            f"column {info.name!r} is a {info.feature_kind} column held without offsets; "
            "image ops need an image column held as its encoded bytes"
        )
    if len(info.shape) != 3 or info.shape[0] not in _MODES or min(info.shape) < 1:
        raise DataError(
            f"image column {info.name!r} has shape {info.shape}; it must be (C, H, W) with "
            "C 1 (grayscale) or 3 (RGB) and H, W >= 1"
        )
    channels, height, width = info.shape
    return channels, height, width


def _row_indices(rows: np.ndarray, column: HeldColumn) -> np.ndarray:
    indices = np.asarray(rows)
    if indices.ndim != 1 or (indices.size and not np.issubdtype(indices.dtype, np.integer)):
        raise DataError(
            f"rows of image column {column.info.name!r} must be a 1-D integer array, got "
            f"dtype {indices.dtype} shape {indices.shape}"
        )
    if indices.size and (int(indices.min()) < 0 or int(indices.max()) >= column.rows):
        bad = int(indices.min()) if int(indices.min()) < 0 else int(indices.max())
        raise DataError(
            f"row {bad} of image column {column.info.name!r} is out of range: the column "
            f"holds rows 0..{column.rows - 1}"
        )
    return indices.astype(np.int64, copy=False)


def _jpeg_frame(data: bytes) -> tuple[int, int, int, int] | None:
    """``(bits, height, width, components)`` of a JPEG's frame header, read as PIL does.

    Walks the marker segments up to the first start of scan and returns the last start of
    frame's fields; ``None`` when ``data`` is not a well-formed JPEG header (the caller
    then lets ``Image.open`` decide).
    """
    if data[:3] != b"\xff\xd8\xff":
        return None
    frame = None
    position, size = 2, len(data)
    while position + 4 <= size:
        if data[position] != 0xFF:
            return None
        marker = data[position + 1]
        if marker == 0xFF:  # fill byte
            position += 1
            continue
        if marker == 0xDA:  # start of scan: the header is over
            return frame
        if marker in _STANDALONE_MARKERS:
            position += 2
            continue
        length = int.from_bytes(data[position + 2 : position + 4], "big")
        if marker in _FRAME_MARKERS:
            if length < 8 or position + 10 > size:
                return None
            bits = data[position + 4]
            height = int.from_bytes(data[position + 5 : position + 7], "big")
            width = int.from_bytes(data[position + 7 : position + 9], "big")
            frame = (bits, height, width, data[position + 9])
        position += 2 + length
    return None


def _decode_jpeg(data: bytes, mode: str, height: int, width: int) -> np.ndarray | None:
    """A JPEG decoded without ``Image.open``'s header parsing in Python, or ``None``.

    Only when the frame is 8-bit, ``width x height``, with as many components as ``mode``
    has channels: then ``Image.open(...)`` would decode it with the same libjpeg call
    (``("jpeg", (mode, ""))`` over the whole file) and no conversion, so the pixels are
    the same. ``None`` for anything else, or when the decoder fails.
    """
    if _jpeg_frame(data) != (8, height, width, len(mode)):
        return None
    try:
        image = Image.frombytes(mode, (width, height), data, "jpeg", mode, "")
    except (ValueError, OSError):
        return None
    return np.asarray(image)


def _decode_pil(
    data: bytes, mode: str, height: int, width: int, row: int, info: ColumnInfo
) -> np.ndarray:
    """Decode one value with ``Image.open`` and ``convert(mode)``; DataError if it fails."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.size != (width, height):
                raise DataError(
                    f"row {row} of image column {info.name!r} decodes to {image.width}x"
                    f"{image.height} (width x height); every image of the column must "
                    f"be {width}x{height}, as its shape {info.shape} says"
                )
            return np.asarray(image if image.mode == mode else image.convert(mode))
    except _DECODE_ERRORS as exc:
        raise DataError(
            f"row {row} of image column {info.name!r} ({len(data)} bytes) does not decode as "
            f"an image: {type(exc).__name__}: {exc}"
        ) from exc


def decode_images(column: HeldColumn, rows: np.ndarray) -> np.ndarray:
    """Decode some rows of a held image column into one ``uint8`` batch.

    Each value is decoded exactly (no ``draft`` downscaling) with PIL and converted to
    ``"L"`` or ``"RGB"`` by the column's channel count; the pixels are written into one
    preallocated array. PIL releases the GIL while it decodes, so batches decoded by
    several threads run in parallel.

    A JPEG whose frame header (read here, in a few microseconds) says it is 8-bit, of the
    column's size and with one component per channel goes straight to PIL's JPEG decoder
    (``Image.frombytes(mode, size, data, "jpeg", mode, "")``: the call ``Image.open``
    makes, without its header parsing in Python, which holds the GIL and costs as much
    as decoding a small image); anything else (PNG, a grayscale JPEG in an RGB column,
    CMYK, a value the fast path cannot decode) goes through ``Image.open`` and
    ``convert``. Both give the same pixels.

    Args:
        column: An ``image`` column held as encoded bytes (``values`` ``uint8``, flat;
            ``offsets`` ``int64`` ``(rows + 1,)``); ``column.info.shape`` is ``(C, H, W)``.
        rows: 1-D integer array of row indices, in batch order.

    Returns:
        ``uint8`` array ``(len(rows), C, H, W)``.

    Raises:
        DataError: The column is not an image column held as bytes, a row index is out of
            range, or a value does not decode or decodes to another size than
            ``column.info.shape`` (the message names the column and the row index).
    """
    channels, height, width = _image_geometry(column)
    indices = _row_indices(rows, column)
    mode = _MODES[channels]
    offsets = column.offsets
    assert offsets is not None  # checked by _image_geometry
    maybe_jpeg = column.info.encoding != "png"
    out = np.empty((len(indices), channels, height, width), dtype=np.uint8)
    # Decoded rows are (H, W) or (H, W, C); write them into the (N, C, H, W) batch.
    target = out[:, 0] if channels == 1 else out.transpose(0, 2, 3, 1)
    for position, row in enumerate(indices.tolist()):
        data = column.values[int(offsets[row]) : int(offsets[row + 1])].tobytes()
        pixels = _decode_jpeg(data, mode, height, width) if maybe_jpeg else None
        if pixels is None:
            pixels = _decode_pil(data, mode, height, width, row, column.info)
        target[position] = pixels
    return out


@dataclasses.dataclass(frozen=True)
class Augmentation:
    """The random transforms and normalization of an image column's training batches.

    Attributes:
        crop_padding: Pad each image with this many zero pixels on each side, then crop a
            random ``H x W`` window (torchvision's ``RandomCrop((H, W), padding=p)``);
            0: no crop.
        flip: Flip each image horizontally with probability 0.5.
        normalize: After scaling pixels to [0, 1], subtract the dataset's per-channel mean
            and divide by its per-channel standard deviation (:func:`normalization`); when
            ``False`` the pixels are only scaled to [0, 1].
    """

    crop_padding: int = 0
    flip: bool = False
    normalize: bool = True

    def __post_init__(self) -> None:
        padding = self.crop_padding
        if isinstance(padding, bool) or not isinstance(padding, (int, np.integer)):
            raise ConfigError(f"augmentation crop_padding must be an integer >= 0, got {padding!r}")
        if padding < 0:
            raise ConfigError(f"augmentation crop_padding must be >= 0, got {padding}")
        for field in ("flip", "normalize"):
            value = getattr(self, field)
            if not isinstance(value, (bool, np.bool_)):
                raise ConfigError(f"augmentation {field} must be true or false, got {value!r}")

    @property
    def random(self) -> bool:
        """Whether :func:`augment` changes anything (a crop or a flip)."""
        return self.crop_padding > 0 or bool(self.flip)


def batch_seed(trial_seed: int, epoch: int, partition: int, batch: int) -> np.random.Generator:
    """The generator one training batch's augmentation draws from.

    ``default_rng(SeedSequence((trial_seed, epoch, partition, batch),
    spawn_key=(AUGMENT_STREAM,)))``: a function of the batch's identity only, so batches
    can be built by any thread in any order and a replay draws the same crops and flips.

    Args:
        trial_seed: The trial's seed.
        epoch: The epoch.
        partition: The train partition.
        batch: The batch's index within the unit's pass.

    Returns:
        A fresh generator.

    Raises:
        ConfigError: A value is not an integer >= 0.
    """
    entropy = {"trial_seed": trial_seed, "epoch": epoch, "partition": partition, "batch": batch}
    for field, value in entropy.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ConfigError(f"batch_seed {field} must be an integer >= 0, got {value!r}")
    sequence = np.random.SeedSequence(
        tuple(int(value) for value in entropy.values()), spawn_key=(AUGMENT_STREAM,)
    )
    return np.random.default_rng(sequence)


def augment(
    images: np.ndarray, augmentation: Augmentation, generator: np.random.Generator
) -> np.ndarray:
    """Randomly crop and flip a batch of images.

    Draws, in this order: when ``crop_padding`` is ``p > 0``, one ``(top, left)`` offset
    per image, each uniform in ``0..2p``; then, when ``flip``, one uniform ``[0, 1)`` per
    image (< 0.5 flips). The result depends only on the images, the augmentation and the
    generator's state. Image ``n`` is the ``H x W`` window at ``(top, left)`` of the image
    zero-padded by ``p`` on each side, mirrored left to right when flipped.

    Args:
        images: ``uint8`` ``(N, C, H, W)``.
        augmentation: What to apply (``normalize`` is :func:`to_tensor`'s business).
        generator: The batch's generator (:func:`batch_seed`); advanced by the draws.

    Returns:
        A new ``(N, C, H, W)`` array of the same dtype; ``images`` itself when the
        augmentation neither crops nor flips.

    Raises:
        DataError: ``images`` is not 4-D.
    """
    if images.ndim != 4:
        raise DataError(f"augment needs an (N, C, H, W) batch of images, got shape {images.shape}")
    if not augmentation.random:
        return images
    count, channels, height, width = images.shape
    padding = augmentation.crop_padding
    out: np.ndarray
    if padding > 0:
        offsets = generator.integers(0, 2 * padding + 1, size=(count, 2))
        padded = np.zeros(
            (count, channels, height + 2 * padding, width + 2 * padding), dtype=images.dtype
        )
        padded[:, :, padding : padding + height, padding : padding + width] = images
        windows = np.lib.stride_tricks.sliding_window_view(padded, (height, width), axis=(2, 3))
        # windows: (N, C, 2p+1, 2p+1, H, W); one window per image: (N, C, H, W).
        out = windows[np.arange(count), :, offsets[:, 0], offsets[:, 1]]
    else:
        out = images.copy()
    if augmentation.flip:
        flipped = generator.random(count) < 0.5
        out[flipped] = out[flipped][..., ::-1]
    return out


def normalization(
    info: ColumnInfo, augmentation: Augmentation
) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None]:
    """The ``(mean, std)`` :func:`to_tensor` normalizes an image column's batches with.

    Args:
        info: The image column (its ``statistics`` hold per-channel ``mean`` and ``std`` of
            pixels scaled to [0, 1]).
        augmentation: ``normalize`` says whether to normalize.

    Returns:
        The per-channel statistics, or ``(None, None)`` when ``augmentation.normalize`` is
        off.

    Raises:
        DataError: Normalizing, but the column has no per-channel ``mean`` and ``std`` of
            one value per channel.
    """
    if not augmentation.normalize:
        return None, None
    channels = info.shape[0] if info.shape else 0
    statistics = info.statistics or {}
    try:
        mean = tuple(float(x) for x in statistics["mean"])
        std = tuple(float(x) for x in statistics["std"])
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(
            f"image column {info.name!r} has no per-channel mean and std statistics "
            f"({exc!r}); normalize needs them (prepare records them; or set normalize off)"
        ) from exc
    if len(mean) != channels or len(std) != channels:
        raise DataError(
            f"image column {info.name!r} has {len(mean)} means and {len(std)} stds; "
            f"normalize needs one of each per channel ({channels})"
        )
    return mean, std


def to_tensor(
    images: np.ndarray | torch.Tensor,
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
    *,
    pin: bool = False,
) -> torch.Tensor:
    """The model's ``float32`` batch: pixels scaled to [0, 1], normalized per channel.

    ``x / 255``, then ``(x - mean[c]) / std[c]`` when ``mean`` and ``std`` are given (a
    ``std`` of 0, a constant channel, divides by 1).

    Args:
        images: ``uint8`` ``(N, C, H, W)``: a numpy array, or a tensor (on any device, as
            :func:`decode_on_device` returns; the result stays there).
        mean: Per-channel means of pixels scaled to [0, 1], or ``None``: no normalization.
        std: Per-channel standard deviations, or ``None``.
        pin: Put a CPU result in pinned (page-locked) memory, for fast, asynchronous
            copies to a CUDA device; ignored when CUDA is unavailable or the images are
            already on a device.

    Returns:
        ``float32`` tensor ``(N, C, H, W)``.

    Raises:
        DataError: ``images`` is not 4-D, or ``mean``/``std`` do not hold one value per
            channel (or only one of them is given).
    """
    import torch

    source = (
        torch.from_numpy(np.ascontiguousarray(images)) if isinstance(images, np.ndarray) else images
    )
    if source.ndim != 4:
        raise DataError(f"to_tensor needs an (N, C, H, W) batch, got shape {tuple(source.shape)}")
    channels = int(source.shape[1])
    if (mean is None) != (std is None):
        raise DataError("to_tensor needs both mean and std to normalize, or neither")
    pinned = pin and source.device.type == "cpu" and torch.cuda.is_available()
    out = torch.empty(source.shape, dtype=torch.float32, device=source.device, pin_memory=pinned)
    out.copy_(source).div_(255.0)
    if mean is not None and std is not None:
        if len(mean) != channels or len(std) != channels:
            raise DataError(
                f"to_tensor got {len(mean)} means and {len(std)} stds for {channels} channels; "
                "give one of each per channel"
            )
        shape = (1, channels, 1, 1)
        means = torch.tensor([float(m) for m in mean], dtype=torch.float32).reshape(shape)
        stds = torch.tensor([float(s) or 1.0 for s in std], dtype=torch.float32).reshape(shape)
        out.sub_(means.to(out.device)).div_(stds.to(out.device))
    return out


def decode_on_device(column: HeldColumn, rows: np.ndarray, device: Any) -> torch.Tensor | None:
    """Decode a JPEG batch on a CUDA device with torchvision, where that is possible.

    Args:
        column: An ``image`` column held as encoded bytes whose ``encoding`` is ``"jpeg"``.
        rows: 1-D integer array of row indices, in batch order.
        device: The device the batch goes to (``torch.device`` or its name).

    Returns:
        ``uint8`` ``(N, C, H, W)`` on ``device``; ``None`` when the device is not CUDA,
        torchvision does not import, the column is not JPEG, or torchvision fails on the
        batch (the caller then decodes on the CPU with :func:`decode_images`, which names
        a bad row).
    """
    import torch

    target = torch.device(device)
    if target.type != "cuda" or column.info.encoding != "jpeg" or not torch.cuda.is_available():
        return None
    channels, height, width = _image_geometry(column)
    indices = _row_indices(rows, column)
    if not len(indices):
        return None
    try:  # by name: torchvision is optional (its wheel needs CUDA libraries)
        vision_io = importlib.import_module("torchvision.io")
    except Exception:  # not installed, or installed without its CUDA libraries
        logger.debug("torchvision does not import; decoding images on the CPU", exc_info=True)
        return None
    modes = vision_io.ImageReadMode
    mode = modes.GRAY if channels == 1 else modes.RGB
    data = [torch.from_numpy(column.row(int(row)).copy()) for row in indices]
    try:
        decoded = vision_io.decode_jpeg(data, mode=mode, device=target)
    except RuntimeError:
        logger.warning("decode on %s failed; decoding on the CPU", target, exc_info=True)
        return None
    if any(tuple(image.shape) != (channels, height, width) for image in decoded):
        return None
    return torch.stack(decoded)
