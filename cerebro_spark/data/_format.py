"""The prepared-dataset format: a directory with a manifest and Parquet partitions.

Layout (any pyarrow filesystem URI)::

    <dataset>/manifest.json
    <dataset>/train/part-00000.parquet ... part-<P-1>.parquet
    <dataset>/validation/part-00000.parquet ... part-<P-1>.parquet

Train partition ``i`` and validation partition ``i`` are always placed on the same worker.
The plain-Python writer (this package) and the Spark writer (``jobs/prepare.py``) produce
the same format; the reader reads either.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    import torch

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
SPLITS: tuple[str, str] = ("train", "validation")
Split = Literal["train", "validation"]
Task = Literal["classification", "regression"]


def partition_path(split: str, index: int) -> str:
    """Return the path of a partition file relative to the dataset directory."""
    return f"{split}/part-{index:05d}.parquet"


@dataclasses.dataclass(frozen=True)
class ColumnInfo:
    """One feature or label column.

    Attributes:
        name: Column name.
        dtype: Element type as numpy names it (``"float32"``, ``"int64"`` ...).
        shape: ``()`` for a scalar column, e.g. ``(8, 8)`` for a fixed-size array column.
    """

    name: str
    dtype: str
    shape: tuple[int, ...] = ()

    @property
    def size(self) -> int:
        """Number of scalar values per row."""
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1


@dataclasses.dataclass(frozen=True)
class PartitionInfo:
    """One Parquet file of a prepared dataset."""

    split: Split
    index: int
    path: str
    rows: int
    bytes: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a model spec needs to know about the data to build a model.

    Attributes:
        feature_shape: Shape of one example's feature tensor (without the batch axis).
        task: ``"classification"`` (integer labels ``0..num_classes-1``) or ``"regression"``.
        num_classes: Number of classes for classification, else ``None``.
    """

    feature_shape: tuple[int, ...]
    task: Task
    num_classes: int | None


@dataclasses.dataclass(frozen=True)
class Manifest:
    """Everything known about a prepared dataset, stored as ``manifest.json``.

    Attributes:
        dataset_id: Content-derived id: same input, columns, split and seed give the same id.
        features: Feature columns, in the order they are concatenated.
        label: The label column.
        task: Classification or regression.
        num_classes: Number of classes (classification only).
        num_partitions: P; there are P train and P validation partitions.
        seed: Seed of the one shuffle and of the split.
        partitions: Every partition file, both splits.
        content_hash: SHA-256 over the partition files' hashes, in order.
        schema: The Arrow schema of the partition files, as ``{column: type string}``.
        source: Free-text description of where the data came from.
        format_version: Version of this format.
        classes: Classification only: the original label values, sorted; class ``k`` of the
            partition files stands for ``classes[k]``. ``None`` when unknown (optional
            field: manifests without it still load).
    """

    dataset_id: str
    features: tuple[ColumnInfo, ...]
    label: ColumnInfo
    task: Task
    num_classes: int | None
    num_partitions: int
    seed: int
    partitions: tuple[PartitionInfo, ...]
    content_hash: str
    schema: Mapping[str, str]
    source: str = ""
    format_version: int = FORMAT_VERSION
    classes: tuple[Any, ...] | None = None

    @property
    def feature_shape(self) -> tuple[int, ...]:
        """Shape of one example's features.

        An array column's own shape when it is the only feature column, else the flat
        concatenation of all feature columns.
        """
        if len(self.features) == 1 and self.features[0].shape:
            return self.features[0].shape
        return (sum(column.size for column in self.features),)

    @property
    def info(self) -> DatasetInfo:
        """The :class:`DatasetInfo` handed to model specs."""
        return DatasetInfo(self.feature_shape, self.task, self.num_classes)

    def partition(self, split: str, index: int) -> PartitionInfo:
        """Return the :class:`PartitionInfo` of one partition."""
        for part in self.partitions:
            if part.split == split and part.index == index:
                return part
        raise KeyError(f"dataset {self.dataset_id} has no {split} partition {index}")

    def rows(self, split: str) -> int:
        """Total rows in one split."""
        return sum(part.rows for part in self.partitions if part.split == split)

    def to_json(self) -> str:
        """Serialise to the canonical ``manifest.json`` text (sorted keys, stable)."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Parse ``manifest.json`` text."""
        raw: dict[str, Any] = json.loads(text)

        def column(data: Mapping[str, Any]) -> ColumnInfo:
            return ColumnInfo(data["name"], data["dtype"], tuple(data["shape"]))

        return cls(
            dataset_id=raw["dataset_id"],
            features=tuple(column(c) for c in raw["features"]),
            label=column(raw["label"]),
            task=raw["task"],
            num_classes=raw["num_classes"],
            num_partitions=raw["num_partitions"],
            seed=raw["seed"],
            partitions=tuple(PartitionInfo(**p) for p in raw["partitions"]),
            content_hash=raw["content_hash"],
            schema=dict(raw["schema"]),
            source=raw.get("source", ""),
            format_version=raw.get("format_version", FORMAT_VERSION),
            classes=None if raw.get("classes") is None else tuple(raw["classes"]),
        )


@dataclasses.dataclass(frozen=True)
class PartitionData:
    """One partition loaded into memory.

    Attributes:
        split: ``"train"`` or ``"validation"``.
        index: Partition index.
        features: ``float32`` array of shape ``(rows, *feature_shape)``.
        labels: ``int64`` (classification) or ``float32`` (regression), shape ``(rows,)``.
        bytes_read: Bytes read from storage to load it.
    """

    split: str
    index: int
    features: np.ndarray
    labels: np.ndarray
    bytes_read: int

    @property
    def rows(self) -> int:
        """Number of rows."""
        return int(self.labels.shape[0])

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(features, labels)`` as torch tensors sharing this partition's memory."""
        import torch

        return torch.from_numpy(self.features), torch.from_numpy(self.labels)


def feature_names(columns: Sequence[ColumnInfo]) -> list[str]:
    """Return the names of the given columns."""
    return [column.name for column in columns]
