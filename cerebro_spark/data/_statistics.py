"""Per-feature statistics of the train split, computed while the partitions are written.

Both writers call :func:`partition_moments` on each train partition table just before
encoding it (the plain writer in its loop, the Spark writer in its write tasks, which send
the moments back as :meth:`Moments.to_bytes`), then :func:`combine` folds the partitions'
moments in partition order. Each partition's moments depend only on that partition's
values (float64 sums over fixed row blocks), and the partitions of both writers hold the
same values in the same order, so both give bit-identical statistics.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from cerebro_spark.data import _kinds as kd
from cerebro_spark.data import _validate as v
from cerebro_spark.data._format import MAX_STATISTICS_ELEMENTS, ColumnInfo, FeatureStatistics
from cerebro_spark.errors import DataError

logger = logging.getLogger(__name__)

#: Rows summed at once (bounds the float64 copy of a block; fixed, so sums are reproducible).
_BLOCK_ROWS = 4096


@dataclasses.dataclass(frozen=True)
class Moments:
    """Count, mean, sum of squared deviations, min and max of each feature element."""

    count: int
    mean: np.ndarray
    m2: np.ndarray
    min: np.ndarray
    max: np.ndarray

    def to_bytes(self) -> bytes:
        """Little-endian float64: count, then mean, m2, min and max (``size`` values each)."""
        values = np.concatenate(
            [np.array([self.count], dtype=np.float64), self.mean, self.m2, self.min, self.max]
        )
        return values.astype("<f8").tobytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> Moments:
        """Inverse of :meth:`to_bytes`."""
        values = np.frombuffer(data, dtype="<f8").astype(np.float64)
        size, rest = divmod(len(values) - 1, 4)
        if len(values) < 5 or rest:
            raise DataError(f"feature moments of {len(data)} bytes are malformed")
        parts = [values[1 + k * size : 1 + (k + 1) * size].copy() for k in range(4)]
        return cls(int(values[0]), *parts)


def dense_columns(features: Sequence[ColumnInfo]) -> list[ColumnInfo]:
    """The ``number`` and ``array`` columns: those :class:`FeatureStatistics` describe."""
    return [column for column in features if column.dense]


def statistics_size(features: Sequence[ColumnInfo]) -> int | None:
    """Flattened dense elements per row (``None``: none, or over the limit).

    The limit is ``MAX_STATISTICS_ELEMENTS``.
    """
    size = sum(column.size for column in dense_columns(features))
    if size == 0:
        return None
    if size > MAX_STATISTICS_ELEMENTS:
        logger.info(
            "feature statistics are not recorded: %d values per row is more than %d",
            size,
            MAX_STATISTICS_ELEMENTS,
        )
        return None
    return size


def feature_matrix(table: pa.Table, features: Sequence[ColumnInfo]) -> np.ndarray:
    """Return the dense feature columns of ``table`` as a ``(rows, size)`` float32 array."""
    rows = table.num_rows
    blocks = []
    for column in dense_columns(features):
        values = v.flat_values(table.column(column.name)).to_numpy(zero_copy_only=False)
        blocks.append(np.asarray(values, dtype=np.float32).reshape(rows, column.size))
    matrix = blocks[0] if len(blocks) == 1 else np.concatenate(blocks, axis=1)
    return np.ascontiguousarray(matrix)


def partition_moments(table: pa.Table, features: Sequence[ColumnInfo]) -> Moments:
    """Return the moments of one (normalised) train partition's feature elements."""
    matrix = feature_matrix(table, features)
    rows, size = matrix.shape
    if rows == 0:
        raise DataError("cannot compute feature statistics of an empty partition")
    total = np.zeros(size, dtype=np.float64)
    for first in range(0, rows, _BLOCK_ROWS):
        total += matrix[first : first + _BLOCK_ROWS].astype(np.float64).sum(axis=0)
    mean = total / rows
    m2 = np.zeros(size, dtype=np.float64)
    for first in range(0, rows, _BLOCK_ROWS):
        deviation = matrix[first : first + _BLOCK_ROWS].astype(np.float64) - mean
        m2 += (deviation * deviation).sum(axis=0)
    return Moments(
        count=rows,
        mean=mean,
        m2=m2,
        min=matrix.min(axis=0).astype(np.float64),
        max=matrix.max(axis=0).astype(np.float64),
    )


def combine(moments: Sequence[Moments]) -> FeatureStatistics:
    """Fold partitions' moments in the given order (Chan et al.'s pairwise update)."""
    if not moments:
        raise DataError("cannot combine feature statistics of no partitions")
    count, mean, m2 = moments[0].count, moments[0].mean, moments[0].m2
    low, high = moments[0].min, moments[0].max
    for part in moments[1:]:
        total = count + part.count
        delta = part.mean - mean
        mean = mean + delta * (part.count / total)
        m2 = m2 + part.m2 + delta * delta * (count * part.count / total)
        low, high = np.minimum(low, part.min), np.maximum(high, part.max)
        count = total
    std = np.sqrt(np.maximum(m2, 0.0) / count)
    return FeatureStatistics(
        count=int(count),
        mean=tuple(float(x) for x in mean),
        std=tuple(float(x) for x in std),
        min=tuple(float(x) for x in low),
        max=tuple(float(x) for x in high),
    )


def image_moments(table: pa.Table, features: Sequence[ColumnInfo]) -> dict[str, np.ndarray]:
    """Per-channel pixel moments of each image column of one (stored) train partition."""
    return {
        column.name: kd.image_moments(v.as_array(table.column(column.name)), column.shape)
        for column in features
        if column.feature_kind == "image"
    }


def with_image_statistics(
    features: Sequence[ColumnInfo], moments: Sequence[dict[str, np.ndarray]]
) -> tuple[ColumnInfo, ...]:
    """``features`` with each image column's statistics.

    They come from its train partitions' moments, folded in partition order.
    """
    return tuple(
        dataclasses.replace(
            column, statistics=kd.image_statistics([part[column.name] for part in moments])
        )
        if column.feature_kind == "image" and moments
        else column
        for column in features
    )
