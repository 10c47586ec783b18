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

from cerebro_spark.errors import DataError

if TYPE_CHECKING:
    import torch

#: 2: rows ordered by a seeded content hash (see ``_row_order``); 1 is still read.
FORMAT_VERSION = 2
#: Every format version this release reads.
READABLE_FORMAT_VERSIONS: tuple[int, ...] = (1, 2)
#: Feature statistics are recorded only up to this many flattened elements per row (beyond
#: it, per-element statistics would make the manifest and every checkpoint large).
MAX_STATISTICS_ELEMENTS = 1 << 16
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
class FeatureStatistics:
    """Per-feature statistics of a dataset's train split, one value per flattened element.

    The features of one row, flattened in the order the model sees them (the feature
    columns in order, each flattened in C order), give ``len(mean)`` elements; statistic
    ``i`` describes element ``i`` over every train row. ``prepare`` computes them in the
    pass that writes the train partitions (both writers give bit-identical values: each
    train partition's moments are computed in float64 and combined in partition order).

    Attributes:
        count: Number of train rows they were computed over.
        mean: Mean of each element.
        std: Population standard deviation (``ddof=0``) of each element; ``0.0`` for an
            element that is constant over the train split.
        min: Smallest value of each element.
        max: Largest value of each element.
    """

    count: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    min: tuple[float, ...]
    max: tuple[float, ...]

    @property
    def size(self) -> int:
        """Number of flattened feature elements described."""
        return len(self.mean)

    def to_dict(self) -> dict[str, Any]:
        """Return the JSON form (plain lists of floats; floats round-trip exactly)."""
        return {
            "count": self.count,
            "mean": list(self.mean),
            "std": list(self.std),
            "min": list(self.min),
            "max": list(self.max),
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> FeatureStatistics:
        """Parse the JSON form written by :meth:`to_dict`.

        Raises:
            DataError: A field is missing or the lists have different lengths.
        """
        try:
            stats = cls(
                count=int(raw["count"]),
                mean=tuple(float(x) for x in raw["mean"]),
                std=tuple(float(x) for x in raw["std"]),
                min=tuple(float(x) for x in raw["min"]),
                max=tuple(float(x) for x in raw["max"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(
                f"feature statistics must hold count, mean, std, min and max: {exc!r}"
            ) from exc
        lengths = {len(stats.mean), len(stats.std), len(stats.min), len(stats.max)}
        if len(lengths) != 1:
            raise DataError(
                f"feature statistics lists have different lengths {sorted(lengths)}; "
                "mean, std, min and max must have one value per feature element"
            )
        return stats


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a model spec needs to know about the data to build a model.

    Only the first three fields are required; the others are filled in from the manifest
    (:attr:`Manifest.info`) and are ``None`` or empty where unknown (a hand-built info,
    a dataset prepared before they were recorded).

    Attributes:
        feature_shape: Shape of one example's feature tensor (without the batch axis).
        task: ``"classification"`` (integer labels ``0..num_classes-1``) or ``"regression"``.
        num_classes: Number of classes for classification, else ``None``.
        statistics: Per-feature statistics of the train split (see
            :class:`FeatureStatistics`), ``None`` when the dataset has none (prepared
            before statistics were recorded, or more than
            ``MAX_STATISTICS_ELEMENTS`` elements per row).
        dataset_id: The dataset's id.
        features: The feature columns, in the order they are concatenated.
        label: The label column's name.
        classes: Classification: the original label values, class ``k`` first at index
            ``k``.
    """

    feature_shape: tuple[int, ...]
    task: Task
    num_classes: int | None
    statistics: FeatureStatistics | None = dataclasses.field(default=None, repr=False)
    dataset_id: str | None = None
    features: tuple[ColumnInfo, ...] = ()
    label: str | None = None
    classes: tuple[Any, ...] | None = None


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
        statistics: Per-feature statistics of the train split (:class:`FeatureStatistics`);
            ``None`` when absent (optional field: manifests written before it still load).
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
    statistics: FeatureStatistics | None = None

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
        return DatasetInfo(
            self.feature_shape,
            self.task,
            self.num_classes,
            statistics=self.statistics,
            dataset_id=self.dataset_id,
            features=self.features,
            label=self.label.name,
            classes=self.classes,
        )

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
            format_version=raw.get("format_version", 1),
            classes=None if raw.get("classes") is None else tuple(raw["classes"]),
            statistics=(
                None
                if raw.get("statistics") is None
                else FeatureStatistics.from_dict(raw["statistics"])
            ),
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
