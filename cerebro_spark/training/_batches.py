"""A unit's mini-batches, built from a partition held as stored (issue 25, part 3).

A worker holds each partition as it is stored (:class:`~cerebro_spark.data.HeldColumn`):
numbers in their stored dtype, images encoded, categories as ids, sequences ragged.
:class:`BatchMaker` turns a set of rows into what the model receives
(:func:`~cerebro_spark.data.tensor_input`): it gathers the rows, widens numbers to
``float32``, decodes images (PIL, or ``torchvision.io`` on a CUDA device), augments them
(train batches: :class:`~cerebro_spark.training._images.Augmentation`, the spec's
:meth:`~cerebro_spark.training.ModelSpec.augmentation`), scales and normalizes them by the
dataset's per-channel statistics, and pads sequences with their mask.

**Determinism.** A batch depends only on its rows and, for augmentation, on
``(trial_seed, epoch, partition, batch number)``
(:func:`~cerebro_spark.training._images.batch_seed`): batches may be built by any thread in
any order, and a replay gives the same bits.

**Overlap.** :meth:`BatchMaker.batches` builds a pass's batches ahead of the training loop
on a bounded pool of threads (:class:`~cerebro_spark.training._prefetch.Prefetcher`)
when there is decoding to do (an image column); numbers, categories and sequences are
gathered inline, which costs less than handing them to a thread. The time the loop waited
for its batches is :attr:`Batches.wait_seconds`.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Iterator
from typing import Any, TypeAlias

import numpy as np
import torch

from cerebro_spark.data import (
    DatasetInfo,
    HeldColumn,
    PartitionData,
    feature_shape,
    mask_key,
    tensor_input,
)
from cerebro_spark.training._images import (
    Augmentation,
    augment,
    batch_seed,
    decode_images,
    decode_on_device,
    normalization,
    to_tensor,
)
from cerebro_spark.training._prefetch import Prefetcher

#: What a model receives: one tensor, or a dict of tensors by column.
Features: TypeAlias = "torch.Tensor | dict[str, torch.Tensor]"

#: Batches built ahead of the training loop, at most.
PREFETCH_DEPTH = 4


def input_threads() -> int:
    """Threads that decode batches for one worker (``CEREBRO_INPUT_THREADS``, default 2)."""
    raw = os.environ.get("CEREBRO_INPUT_THREADS", "")
    return max(0, int(raw)) if raw.strip().isdigit() else 2


@dataclasses.dataclass(frozen=True)
class BatchSeeds:
    """What augmentation is seeded by, besides the batch's number."""

    trial_seed: int
    epoch: int
    partition: int


class BatchMaker:
    """Builds batches of one partition for one unit.

    Args:
        data: The partition, as held.
        info: The dataset's description (its feature columns decide the batch's form).
        device: Where the batch goes.
        augmentation: The spec's :meth:`~cerebro_spark.training.ModelSpec.augmentation`
            (``None``: images are scaled and normalized, nothing else). Its random crop and
            flip apply to train batches only (with ``seeds``); its ``normalize`` to all.
        seeds: Train batches: what augmentation is seeded by; ``None`` (validation,
            scoring): no random augmentation.
    """

    def __init__(
        self,
        data: PartitionData,
        info: DatasetInfo,
        device: torch.device,
        *,
        augmentation: Augmentation | None = None,
        seeds: BatchSeeds | None = None,
    ) -> None:
        self._data = data
        self._device = device
        self._augmentation = augmentation
        self._seeds = seeds
        self._tensor = tensor_input(data.infos) if data.infos else info.tensor_input
        block = data.dense_block
        dense = [c.values for c in data.columns if c.info.dense]
        self._dense = [_tensor(block)] if block is not None else [_tensor(v) for v in dense]
        self._shape = feature_shape(data.infos)
        self._labels = _tensor(data.labels)
        self._pin = device.type == "cuda"
        self.decodes = any(c.info.feature_kind == "image" for c in data.columns)
        """Whether batches decode images (worth building on other threads)."""

    def __call__(self, rows: np.ndarray, number: int = 0) -> tuple[Features, torch.Tensor]:
        """The batch of ``rows`` (the ``number``-th of its pass), on the device."""
        index = torch.from_numpy(rows)
        labels = self._labels[index]
        if self._tensor and all(column.info.dense for column in self._data.columns):
            features: Features = self._dense_block(index)
        else:
            built = {
                column.info.name: self._column(column, rows, index, number)
                for column in self._data.columns
            }
            features = self._collate(built)
        return self._to_device(features), labels.to(self._device, non_blocking=self._pin)

    def batches(self, order: np.ndarray, size: int, *, threads: int | None = None) -> Batches:
        """The pass's batches: ``order`` cut into batches of ``size`` rows, in order."""
        return Batches(self, order, size, input_threads() if threads is None else threads)

    # -- pieces --------------------------------------------------------------------------

    def _dense_block(self, index: torch.Tensor) -> torch.Tensor:
        """The number/array columns of ``index`` as one float32 tensor (as before kinds)."""
        rows = int(index.shape[0])
        if len(self._dense) == 1:
            block = self._dense[0][index]
            return block if block.dtype == torch.float32 else block.to(torch.float32)
        shape = self._shape
        parts = [d[index].reshape(rows, -1).to(torch.float32) for d in self._dense]
        return torch.cat(parts, dim=1).reshape(rows, *shape)

    def _column(
        self, column: HeldColumn, rows: np.ndarray, index: torch.Tensor, number: int
    ) -> Any:
        kind = column.info.feature_kind
        if kind in ("number", "array"):
            return _tensor(column.values)[index].to(torch.float32)
        if kind == "categorical":
            return _tensor(column.values)[index].to(torch.int64)
        if kind == "sequence":
            return _padded(column, rows)
        return self._images(column, rows, number)

    def _images(self, column: HeldColumn, rows: np.ndarray, number: int) -> torch.Tensor:
        augmentation = self._augmentation
        mean, std = normalization(column.info, augmentation or Augmentation())
        if augmentation is None or not augmentation.random or self._seeds is None:  # nvJPEG
            on_device = decode_on_device(column, rows, self._device)
            if on_device is not None:
                return to_tensor(on_device, mean, std)
        images = decode_images(column, rows)
        if augmentation is not None and augmentation.random and self._seeds is not None:
            seeds = self._seeds
            generator = batch_seed(seeds.trial_seed, seeds.epoch, seeds.partition, number)
            images = augment(images, augmentation, generator)
        return to_tensor(images, mean, std, pin=self._pin)

    def _collate(self, built: dict[str, Any]) -> Features:
        if self._tensor:  # the one image column
            (only,) = built.values()
            return only  # type: ignore[no-any-return]
        features: dict[str, torch.Tensor] = {}
        for name, value in built.items():
            if isinstance(value, tuple):
                features[name], features[mask_key(name)] = value
            else:
                features[name] = value
        return features

    def _to_device(self, features: Features) -> Features:
        if isinstance(features, dict):
            return {k: v.to(self._device, non_blocking=self._pin) for k, v in features.items()}
        return features.to(self._device, non_blocking=self._pin)


def _tensor(values: np.ndarray) -> torch.Tensor:
    """A tensor sharing ``values``' memory, which may be read-only (Arrow's, or mapped).

    Batches only ever read it (rows are gathered into new tensors), so torch's warning
    about read-only arrays does not apply.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        return torch.from_numpy(values)


def _padded(column: HeldColumn, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of ``rows`` padded with 0 to the longest, and their mask."""
    offsets = column.offsets
    assert offsets is not None  # a sequence column is held ragged
    starts = offsets[rows]
    lengths = offsets[rows + 1] - starts
    width = int(lengths.max()) if len(lengths) else 0
    positions = np.arange(width, dtype=np.int64)
    mask = positions[None, :] < lengths[:, None]
    padded = np.zeros((len(rows), width), dtype=np.int64)
    padded[mask] = column.values[(starts[:, None] + positions[None, :])[mask]]
    return torch.from_numpy(padded), torch.from_numpy(mask)


class Batches:
    """One pass's batches in order, built ahead on threads when they decode images.

    Iterate it once; use it as a context manager (or call :meth:`close`) so that the
    threads end when a pass stops early.

    Attributes:
        wait_seconds: Seconds the consumer waited for batches (with no threads, the
            time spent building them).
    """

    def __init__(self, maker: BatchMaker, order: np.ndarray, size: int, threads: int) -> None:
        self._maker = maker
        self._order = order
        self._size = size
        count = -(-len(order) // size)
        self._prefetcher = Prefetcher(
            self._make,
            count,
            threads=threads if maker.decodes else 0,
            depth=PREFETCH_DEPTH,
        )

    def _make(self, number: int) -> tuple[Features, torch.Tensor]:
        first = number * self._size
        return self._maker(self._order[first : first + self._size], number)

    @property
    def wait_seconds(self) -> float:
        """Seconds the consumer waited for its batches."""
        return float(self._prefetcher.wait_seconds)

    def __iter__(self) -> Iterator[tuple[Features, torch.Tensor]]:
        return iter(self._prefetcher)

    def close(self) -> None:
        """Stop building batches (threads end)."""
        self._prefetcher.close()

    def __enter__(self) -> Batches:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def example_features(info: DatasetInfo, rows: int = 2) -> Features:
    """A batch of ``rows`` all-zero examples of the form the model receives (pre-flight).

    Categorical ids are 0, sequences one token long (id 0, mask true).
    """
    if info.tensor_input:
        return torch.zeros((rows, *info.feature_shape), dtype=torch.float32)
    features: dict[str, torch.Tensor] = {}
    for column in info.features:
        kind = column.feature_kind
        if kind == "categorical":
            features[column.name] = torch.zeros(rows, dtype=torch.int64)
        elif kind == "sequence":
            features[column.name] = torch.zeros((rows, 1), dtype=torch.int64)
            features[mask_key(column.name)] = torch.ones((rows, 1), dtype=torch.bool)
        else:
            features[column.name] = torch.zeros((rows, *column.shape), dtype=torch.float32)
    return features
