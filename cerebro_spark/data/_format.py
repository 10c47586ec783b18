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
import functools
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from cerebro_spark.errors import DataError

if TYPE_CHECKING:
    import torch

#: 3: feature kinds (``ColumnInfo.kind``): arrays keep their stored dtype, images are
#: stored encoded, categories as ``int32`` ids, sequences ragged; 2: rows ordered by a
#: seeded content hash (see ``_row_order``); 1 and 2 are still read.
FORMAT_VERSION = 3
#: Every format version this release reads.
READABLE_FORMAT_VERSIONS: tuple[int, ...] = (1, 2, 3)
#: Feature statistics are recorded only up to this many flattened elements per row (beyond
#: it, per-element statistics would make the manifest and every checkpoint large).
MAX_STATISTICS_ELEMENTS = 1 << 16
MANIFEST_NAME = "manifest.json"
SPLITS: tuple[str, str] = ("train", "validation")
Split = Literal["train", "validation"]
Task = Literal["classification", "regression"]
#: What a feature column holds (see :class:`ColumnInfo`).
Kind = Literal["number", "array", "image", "categorical", "sequence"]
KINDS: tuple[Kind, ...] = ("number", "array", "image", "categorical", "sequence")
#: Element types a ``number`` or ``array`` column keeps as stored (anything else is
#: written as ``float32``).
DENSE_DTYPES: tuple[str, ...] = ("uint8", "int8", "int16", "float16", "float32")
#: The id a categorical value outside the vocabulary (and its hash buckets) maps to.
UNKNOWN_ID = 0


def mask_key(column: str) -> str:
    """The key of a sequence column's mask in a batch's feature dict (``"<column>:mask"``)."""
    return f"{column}:mask"


def partition_path(split: str, index: int) -> str:
    """Return the path of a partition file relative to the dataset directory."""
    return f"{split}/part-{index:05d}.parquet"


@dataclasses.dataclass(frozen=True)
class ColumnInfo:
    """One feature or label column.

    A feature column is of one **kind** (format 3; earlier formats hold ``number`` and
    ``array`` columns of ``float32`` only):

    * ``number``: one number per row, ``shape ()``, stored as ``dtype`` (one of
      :data:`DENSE_DTYPES`, kept as stored on disk and in memory).
    * ``array``: a fixed-shape array of numbers per row (``shape``), stored flat as ``dtype``.
    * ``image``: an encoded JPEG or PNG per row (Parquet ``binary``); ``shape`` is the
      decoded ``(channels, height, width)``, ``dtype`` the decoded ``uint8``, ``encoding``
      ``"jpeg"``, ``"png"`` or ``"mixed"``.
    * ``categorical``: an ``int32`` id per row, ``shape ()``. Ids: :data:`UNKNOWN_ID` (0) for
      a value outside the vocabulary when there are no hash buckets (at scoring time, a
      value never seen), ``1..len(vocabulary)`` for ``vocabulary[id - 1]``, then
      ``hash_buckets`` ids for the values beyond the vocabulary's limit, by a stable hash
      of the value. ``cardinality`` is the number of ids (``1 + len(vocabulary) +
      hash_buckets``).
    * ``sequence``: a variable-length list of ``int32`` token ids per row (Parquet
      ``list<int32>``), at most ``max_length`` long; ``cardinality`` is the number of token
      ids (the largest id + 1, or as given). Batches pad them with 0 and carry a mask.

    Attributes:
        name: Column name.
        dtype: Element type as numpy names it (``"float32"``, ``"int64"`` ...).
        shape: ``()`` for a scalar column, e.g. ``(8, 8)`` for a fixed-size array column,
            ``(C, H, W)`` for an image column.
        kind: One of :data:`KINDS`; ``""`` (manifests before format 3) reads as ``number``
            or ``array`` by the shape (see :attr:`feature_kind`).
        encoding: ``image`` only: the images' encoding.
        vocabulary: ``categorical`` only: the values with their own id, most frequent
            first (ties by value).
        hash_buckets: ``categorical`` only: ids shared by hashing the values beyond the
            vocabulary.
        cardinality: ``categorical`` and ``sequence`` only: the number of ids.
        max_length: ``sequence`` only: the longest sequence kept (longer ones were cut).
        statistics: Per-kind statistics of the train split (``image``: per-channel
            ``mean`` and ``std`` of pixel values scaled to [0, 1]; ``categorical``:
            ``rows``, ``distinct`` values, ``unknown`` and ``hashed`` rows; ``sequence``:
            ``min_length``, ``max_length``, ``mean_length``, ``truncated`` rows), or
            ``None``.
    """

    name: str
    dtype: str
    shape: tuple[int, ...] = ()
    kind: str = ""
    encoding: str | None = None
    vocabulary: tuple[Any, ...] | None = None
    hash_buckets: int = 0
    cardinality: int | None = None
    max_length: int | None = None
    statistics: Mapping[str, Any] | None = None

    @property
    def feature_kind(self) -> Kind:
        """The column's kind (``number``/``array`` by the shape when not recorded)."""
        if self.kind:
            return self.kind  # type: ignore[return-value]
        return "array" if self.shape else "number"

    @property
    def dense(self) -> bool:
        """Whether the column holds numbers (``number`` or ``array``): statistics, one tensor."""
        return self.feature_kind in ("number", "array")

    @property
    def size(self) -> int:
        """Number of scalar values per row (a sequence: 1, its length varies)."""
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: name, dtype and shape, and the kind's own fields when set."""
        raw: dict[str, Any] = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        if self.kind:
            raw["kind"] = self.kind
        for field in ("encoding", "vocabulary", "cardinality", "max_length", "statistics"):
            value = getattr(self, field)
            if value is not None:
                raw[field] = list(value) if field == "vocabulary" else value
        if self.hash_buckets:
            raw["hash_buckets"] = self.hash_buckets
        return raw

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ColumnInfo:
        """Parse :meth:`to_dict`'s form (older manifests hold only name, dtype and shape)."""
        vocabulary = raw.get("vocabulary")
        statistics = raw.get("statistics")
        return cls(
            raw["name"],
            raw["dtype"],
            tuple(int(d) for d in raw["shape"]),
            kind=str(raw.get("kind", "")),
            encoding=raw.get("encoding"),
            vocabulary=None if vocabulary is None else tuple(vocabulary),
            hash_buckets=int(raw.get("hash_buckets", 0)),
            cardinality=None if raw.get("cardinality") is None else int(raw["cardinality"]),
            max_length=None if raw.get("max_length") is None else int(raw["max_length"]),
            statistics=None if statistics is None else dict(statistics),
        )


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


def tensor_input(features: Sequence[ColumnInfo]) -> bool:
    """Whether a batch's features reach the model as one tensor, not a dict by column.

    One tensor when every feature column holds numbers (``number``/``array``: ``float32``,
    flattened and concatenated in column order; a single array column keeps its shape)
    or the only feature column is an image (``float32`` ``(N, C, H, W)``). Otherwise a
    ``dict`` by column name: ``number``/``array`` ``float32`` ``(N, *shape)``, ``image``
    ``float32`` ``(N, C, H, W)``, ``categorical`` ``int64`` ``(N,)`` ids, ``sequence``
    ``int64`` ``(N, L)`` ids padded with 0 (``L``: the batch's longest) and its mask,
    ``bool`` ``(N, L)``, under :func:`mask_key`.
    """
    kinds = [column.feature_kind for column in features]
    return all(kind in ("number", "array") for kind in kinds) or kinds == ["image"]


def feature_shape(features: Sequence[ColumnInfo]) -> tuple[int, ...]:
    """Shape of one example's features when they are one tensor (:func:`tensor_input`).

    An array or image column's own shape when it is the only feature column, else the
    flat concatenation of all feature columns; ``()`` when the features are a dict.
    """
    if not tensor_input(features):
        return ()
    if len(features) == 1 and features[0].shape:
        return features[0].shape
    return (sum(column.size for column in features),)


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a model spec needs to know about the data to build a model.

    Only the first three fields are required; the others are filled in from the manifest
    (:attr:`Manifest.info`) and are ``None`` or empty where unknown (a hand-built info,
    a dataset prepared before they were recorded).

    What a model receives is one tensor or a dict of tensors by column
    (:func:`tensor_input`; :attr:`tensor_input` here); each column's kind and its fields
    (vocabulary, cardinality, image shape and statistics) are in :attr:`features`.

    Attributes:
        feature_shape: Shape of one example's feature tensor (without the batch axis);
            ``()`` when the features reach the model as a dict.
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

    @property
    def tensor_input(self) -> bool:
        """Whether the model receives one tensor (else a dict by column).

        See :func:`tensor_input`; a hand-built info without columns: one tensor.
        """
        return tensor_input(self.features) if self.features else True

    def column(self, name: str) -> ColumnInfo:
        """The feature column called ``name``."""
        for column in self.features:
            if column.name == name:
                return column
        raise KeyError(f"dataset {self.dataset_id} has no feature column {name!r}")

    def columns_of(self, kind: Kind) -> tuple[ColumnInfo, ...]:
        """The feature columns of one kind, in column order."""
        return tuple(column for column in self.features if column.feature_kind == kind)


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
        """Shape of one example's features: :func:`feature_shape` of :attr:`features`."""
        return feature_shape(self.features)

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
        raw = dataclasses.asdict(self)
        raw["features"] = [column.to_dict() for column in self.features]
        raw["label"] = self.label.to_dict()
        return json.dumps(raw, sort_keys=True, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Parse ``manifest.json`` text."""
        raw: dict[str, Any] = json.loads(text)
        return cls(
            dataset_id=raw["dataset_id"],
            features=tuple(ColumnInfo.from_dict(c) for c in raw["features"]),
            label=ColumnInfo.from_dict(raw["label"]),
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
class HeldColumn:
    """One feature column of a loaded partition, held as stored (numpy, maybe memory-mapped).

    Nothing is widened or decoded: a worker keeps its partitions in this form and
    decodes per batch.

    Attributes:
        info: The column.
        values: ``number``/``array``: ``(rows, *shape)`` of the stored dtype;
            ``categorical``: ``(rows,)`` ``int32`` ids; ``image``: the encoded images'
            bytes end to end (``uint8``, flat); ``sequence``: the token ids end to end
            (``int32``, flat).
        offsets: ``image``/``sequence`` only: ``int64`` ``(rows + 1,)``; row ``i`` is
            ``values[offsets[i]:offsets[i + 1]]``.
    """

    info: ColumnInfo
    values: np.ndarray
    offsets: np.ndarray | None = None

    @property
    def rows(self) -> int:
        """Number of rows."""
        return len(self.offsets) - 1 if self.offsets is not None else int(self.values.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        return int(self.values.nbytes) + (0 if self.offsets is None else int(self.offsets.nbytes))

    def row(self, index: int) -> np.ndarray:
        """Row ``index``'s values (a view): its bytes, tokens, id or array."""
        if self.offsets is None:
            return self.values[index]  # type: ignore[no-any-return]
        row: np.ndarray = self.values[self.offsets[index] : self.offsets[index + 1]]
        return row


@dataclasses.dataclass(frozen=True)
class PartitionData:
    """One partition loaded into memory, each feature column as stored.

    Attributes:
        split: ``"train"`` or ``"validation"``.
        index: Partition index.
        columns: The feature columns in manifest order (:class:`HeldColumn`).
        labels: ``int64`` (classification) or ``float32`` (regression), shape ``(rows,)``.
        bytes_read: Bytes read from storage to load it.
        dense_block: When every ``number``/``array`` column has one dtype and there are
            several: all of them side by side, ``(rows, their values)``, of which their
            :class:`HeldColumn` values are views (:func:`stack_dense`), so a batch gathers
            its rows once, not once per column. ``None`` otherwise.
    """

    split: str
    index: int
    columns: tuple[HeldColumn, ...]
    labels: np.ndarray
    bytes_read: int
    dense_block: np.ndarray | None = None

    @property
    def rows(self) -> int:
        """Number of rows."""
        return int(self.labels.shape[0])

    @classmethod
    def from_arrays(
        cls,
        split: str,
        index: int,
        features: np.ndarray,
        labels: np.ndarray,
        bytes_read: int = 0,
        *,
        name: str = "features",
    ) -> PartitionData:
        """A partition of one dense feature column ``(rows, *shape)`` (tests, benchmarks)."""
        shape = tuple(int(d) for d in features.shape[1:])
        kind = "array" if shape else "number"
        info = ColumnInfo(name, features.dtype.name, shape, kind=kind)
        return cls(split, index, (HeldColumn(info, features),), labels, bytes_read)

    @property
    def nbytes(self) -> int:
        """Bytes held (feature columns and labels)."""
        return sum(column.nbytes for column in self.columns) + int(self.labels.nbytes)

    @property
    def infos(self) -> tuple[ColumnInfo, ...]:
        """The feature columns' :class:`ColumnInfo`, in order."""
        return tuple(column.info for column in self.columns)

    @functools.cached_property
    def features(self) -> np.ndarray:
        """The features as one ``float32`` array ``(rows, *feature_shape)``.

        Only for features that reach a model as one dense tensor (every column a
        ``number`` or ``array``): a view when the only column is ``float32``, else a
        ``float32`` copy made once (prefer :func:`cerebro_spark.training` batches, which
        widen per batch).

        Raises:
            DataError: A column is an image, categorical or sequence column.
        """
        infos = self.infos
        if not all(info.dense for info in infos):
            raise DataError(
                f"{self.split} partition {self.index} has image, categorical or sequence "
                "columns: its features are decoded per batch, not held as one array"
            )
        shape = feature_shape(infos)
        if self.dense_block is not None and self.dense_block.dtype == np.float32:
            return self.dense_block.reshape(self.rows, *shape)
        blocks = [column.values.reshape(self.rows, -1) for column in self.columns]
        if len(blocks) == 1 and blocks[0].dtype == np.float32:
            return self.columns[0].values.reshape(self.rows, *shape)
        return np.concatenate([b.astype(np.float32) for b in blocks], axis=1).reshape(
            self.rows, *shape
        )

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(features, labels)`` as torch tensors sharing this partition's memory."""
        import torch

        return torch.from_numpy(self.features), torch.from_numpy(self.labels)


def stack_dense(
    columns: Sequence[HeldColumn], rows: int
) -> tuple[tuple[HeldColumn, ...], np.ndarray | None]:
    """Put several ``number``/``array`` columns of one dtype side by side in one block.

    Returns the columns, each dense one's values now a view of the block, and the block
    (:attr:`PartitionData.dense_block`); the columns unchanged and ``None`` when there are
    fewer than two dense columns or their dtypes differ. The block holds the same bytes as
    the columns did: nothing is widened.
    """
    dense = [column for column in columns if column.info.dense]
    dtypes = {column.values.dtype for column in dense}
    if len(dense) < 2 or len(dtypes) != 1:
        return tuple(columns), None
    widths = [column.info.size for column in dense]
    block = np.empty((rows, sum(widths)), dtype=dtypes.pop())
    stacked: list[HeldColumn] = []
    at = 0
    for column in columns:
        if not column.info.dense:
            stacked.append(column)
            continue
        width = column.info.size
        block[:, at : at + width] = column.values.reshape(rows, width)
        view = block[:, at : at + width].reshape(rows, *column.info.shape)
        stacked.append(HeldColumn(column.info, view))
        at += width
    return tuple(stacked), block


def feature_names(columns: Sequence[ColumnInfo]) -> list[str]:
    """Return the names of the given columns."""
    return [column.name for column in columns]
