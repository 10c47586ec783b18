"""Turning a user's raw rows into the partition a model scores: :func:`raw_partition`.

Scoring reads rows as ``prepare`` read them and holds them as the dataset stores them (a
:class:`~cerebro_spark.data.PartitionData`), with the prepare-time encoders of
:mod:`cerebro_spark.data._kinds` and each column's trained :class:`ColumnInfo`:

* ``number`` / ``array``: numbers, or fixed-size (nested) arrays of numbers with as many
  values per row as at training (lists, numpy arrays of any shape, Spark ML vectors),
  held in the column's stored dtype (integers must fit it); no NaN or infinite values.
* ``image``: encoded JPEG or PNG bytes of any size and mode, or the struct of Spark's
  image source; each image is converted to the column's channels and resized to its
  trained ``(H, W)`` exactly as ``prepare`` did (:func:`~cerebro_spark.data._kinds.
  image_column`). An image that does not decode is refused.
* ``categorical``: strings or integers (as at training), mapped to ids with the column's
  vocabulary; a value never seen gets its hash bucket when the column has hash buckets,
  else the reserved unknown id 0.
* ``sequence``: lists of integer token ids (lists, or numpy arrays in pandas), cut to the
  column's ``max_length``; a kept token id ``>=`` the column's ``cardinality`` (a token
  beyond the vocabulary the model embeds) is refused.

No nulls anywhere. Every violation raises :class:`~cerebro_spark.errors.DataError` naming
the column, the row (its 0-based position in the input, plus ``first_row``) and the rule;
nothing is written anywhere. The model's batches are then built from the partition by
:class:`~cerebro_spark.training._batches.BatchMaker`, as in validation.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cerebro_spark.data import ColumnInfo, HeldColumn, PartitionData
from cerebro_spark.data import _kinds as kd
from cerebro_spark.data import _validate as v
from cerebro_spark.data._format import feature_shape as features_shape
from cerebro_spark.data._reader import hold_column
from cerebro_spark.data._writer import select_columns
from cerebro_spark.errors import DataError

#: The ``split`` of a partition built from rows to score.
SCORING_SPLIT = "scoring"


def _first_true(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _check_no_null_rows(name: str, array: pa.Array, kind: str, first_row: int) -> None:
    if array.null_count:
        nulls = array.is_null().to_numpy(zero_copy_only=False)
        raise DataError(
            f"{kind} column {name!r} row {first_row + _first_true(nulls)} is null "
            f"({array.null_count} null rows of {len(array)}); every row needs a value"
        )


def _dense_values(name: str, array: pa.Array, expected: ColumnInfo, first_row: int) -> np.ndarray:
    """A number/array column as ``(rows, *shape)`` of the column's stored dtype."""
    rows = len(array)
    v.check_feature_type(name, array.type)
    _check_no_null_rows(name, array, "feature", first_row)
    shape = v.element_shape(name, array)
    size = math.prod(shape) if shape else 1
    if size != expected.size:
        raise DataError(
            f"feature column {name!r} has {size} values per row (shape {shape}), but the "
            f"model was trained on shape {expected.shape} ({expected.size} values)"
        )
    values = v.flat_values(array)
    if pa.types.is_decimal(values.type):
        values = values.cast(pa.float64())
    if pa.types.is_floating(values.type):
        wide = values.cast(pa.float32(), safe=False)
        finite = pc.is_finite(wide).to_numpy(zero_copy_only=False)
        if not finite.all():
            row = first_row + _first_true(~finite) // size
            raise DataError(
                f"feature column {name!r} row {row} holds a NaN or infinite value (as float32; "
                f"{int((~finite).sum())} of {len(finite)} values); scoring needs finite "
                "numbers, as training did"
            )
    dtype = np.dtype(expected.dtype)
    target = pa.from_numpy_dtype(dtype)
    try:
        stored = values.cast(target, safe=dtype.kind in "iu")
    except pa.ArrowInvalid as exc:
        flat = np.asarray(values.cast(pa.float64()).to_numpy(zero_copy_only=False))
        limits = np.iinfo(dtype)
        bad = (flat < limits.min) | (flat > limits.max) | (flat != np.floor(flat))
        row = first_row + (_first_true(bad) // size if bad.any() else 0)
        raise DataError(
            f"feature column {name!r} row {row} holds a value that is not an integer in "
            f"{limits.min}..{limits.max}; the column is stored as {dtype.name}, as at "
            f"training ({exc})"
        ) from exc
    flat_stored = np.asarray(stored.to_numpy(zero_copy_only=False))
    return flat_stored.reshape(rows, *expected.shape)


def _check_tokens(name: str, info: ColumnInfo, stored: pa.Array, first_row: int) -> None:
    """Refuse a kept token id at or beyond the column's cardinality, naming its row."""
    limit = info.cardinality
    if limit is None or not len(stored):
        return
    tokens = np.asarray(stored.flatten().to_numpy(zero_copy_only=False))
    bad = tokens >= limit
    if bad.any():
        lengths = pc.list_value_length(stored).to_numpy(zero_copy_only=False).astype(np.int64)
        rows = np.repeat(np.arange(len(stored)), lengths)
        first = _first_true(bad)
        raise DataError(
            f"sequence column {name!r} row {first_row + int(rows[first])} holds token id "
            f"{int(tokens[first])}, a token beyond the vocabulary: the model embeds ids "
            f"0..{limit - 1} (cardinality {limit}); {int(bad.sum())} such tokens in all"
        )


def _empty_type(info: ColumnInfo) -> pa.DataType:
    """The input type of a column with no rows whose values had no type."""
    kind = info.feature_kind
    if kind == "image":
        return pa.binary()
    if kind == "categorical":
        words = info.vocabulary or ()
        return pa.string() if any(isinstance(w, str) for w in words) else pa.int64()
    if kind == "sequence":
        return pa.list_(pa.int32())
    if info.shape:
        return pa.list_(pa.float32(), info.size)
    return pa.float32()


def held_column(
    info: ColumnInfo,
    array: pa.Array | pa.ChunkedArray,
    *,
    first_row: int = 0,
) -> HeldColumn:
    """One raw input column as the dataset holds it (see the module docstring).

    Args:
        info: The model's column (its kind, shape, dtype, vocabulary, ...).
        array: The raw values.
        first_row: The row number of ``array[0]``, for messages.

    Raises:
        DataError: A value breaks the column's rule (the message names column and row).
    """
    array = v.as_array(array)
    if len(array) == 0 and pa.types.is_null(array.type):  # e.g. an empty pandas object column
        array = pa.array([], type=_empty_type(info))
    label = info.name
    kind = info.feature_kind
    if kind in ("number", "array"):
        return HeldColumn(info, _dense_values(label, array, info, first_row))
    _check_no_null_rows(label, array, kind, first_row)
    stored: pa.Array
    if kind == "image":
        channels, height, width = (int(d) for d in info.shape)
        stored, _ = kd.image_column(
            label, array, size=(height, width), channels=channels, first_row=first_row
        )
    elif kind == "categorical":
        stored = kd.encode_categories(label, array, info.vocabulary or (), info.hash_buckets)
    else:
        stored, _ = kd.sequence_column(
            label, array, max_length=info.max_length, first_row=first_row
        )
        _check_tokens(label, info, stored, first_row)
    table = pa.table({info.name: stored})
    return hold_column(table, info, len(stored))


def placeholder_labels(rows: int, classification: bool) -> np.ndarray:
    """Labels of rows to score (zeros, typed as in training: the spec's transform sees them)."""
    return np.zeros(rows, dtype=np.int64 if classification else np.float32)


def raw_partition(
    table: pa.Table | pa.RecordBatch,
    features: Sequence[ColumnInfo],
    names: Sequence[str] | None = None,
    *,
    classification: bool = True,
    first_row: int = 0,
) -> PartitionData:
    """Hold Arrow rows as the dataset stores them (see the module docstring).

    Args:
        table: The rows.
        features: The model's feature columns, in order.
        names: The columns of ``table`` holding each feature (default: the features' names;
            messages name the features).
        classification: Whether the model classifies (the placeholder labels' type).
        first_row: The row number of the table's first row, for messages.

    Returns:
        A partition (split :data:`SCORING_SPLIT`) with one :class:`HeldColumn` per feature
        and placeholder labels.

    Raises:
        DataError: A missing column or a value that breaks its column's rule.
    """
    columns = list(names) if names is not None else [c.name for c in features]
    v.check_columns(list(table.schema.names), columns)
    held = tuple(
        held_column(info, table.column(column), first_row=first_row)
        for info, column in zip(features, columns, strict=True)
    )
    labels = placeholder_labels(table.num_rows, classification)
    return PartitionData(SCORING_SPLIT, 0, held, labels, bytes_read=0)


def _pandas_table(frame: Any, features: Sequence[ColumnInfo]) -> pa.Table:
    """The feature columns of a pandas DataFrame as Arrow (dense ones as ``prepare`` reads)."""
    names = [c.name for c in features]
    v.check_columns([str(c) for c in frame.columns], names)
    dense = [c.name for c in features if c.dense]
    arrays: dict[str, pa.Array] = {}
    if dense:
        table, _ = select_columns(frame[dense], dense)
        arrays.update({name: v.as_array(table.column(name)) for name in dense})
    for info in features:
        if info.dense:
            continue
        series = frame[info.name]
        try:
            if info.feature_kind == "sequence" and series.dtype == object:
                rows = [x.tolist() if isinstance(x, np.ndarray) else x for x in series]
                arrays[info.name] = pa.array(rows, from_pandas=True)
            else:
                arrays[info.name] = pa.Array.from_pandas(series)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise DataError(
                f"{info.feature_kind} column {info.name!r} cannot be converted to Arrow: {exc}"
            ) from exc
    return pa.table({name: arrays[name] for name in names})


def numpy_features(array: np.ndarray, feature_shape: Sequence[int]) -> np.ndarray:
    """Return a numpy array of features, ``(rows, *shape)`` or ``(rows, size)``, as float32."""
    shape = tuple(feature_shape)
    size = math.prod(shape)
    if array.dtype.kind not in "biuf":
        raise DataError(f"features must be numbers, got a numpy array of dtype {array.dtype}")
    if array.ndim == 1 and size == 1:
        array = array.reshape(-1, 1)
    if tuple(array.shape[1:]) != shape and (array.ndim != 2 or array.shape[1] != size):
        raise DataError(
            f"features have shape {tuple(array.shape)}; the model takes (rows, *{shape}) or "
            f"(rows, {size})"
        )
    matrix = np.asarray(array, dtype=np.float32).reshape(len(array), *shape)
    finite = np.isfinite(matrix).reshape(len(matrix), -1)
    if not finite.all():
        row = _first_true(np.asarray(~finite.all(axis=1)))
        raise DataError(
            f"features hold {int((~finite).sum())} NaN or infinite values of {matrix.size} "
            f"(the first in row {row}); scoring needs finite numbers (as training did)"
        )
    return matrix


def dense_partition(
    array: np.ndarray, feature_shape: Sequence[int], *, classification: bool = True
) -> PartitionData:
    """A partition of already concatenated dense features ``(rows, *shape)``/``(rows, n)``."""
    matrix = numpy_features(array, feature_shape)
    labels = placeholder_labels(len(matrix), classification)
    return PartitionData.from_arrays(SCORING_SPLIT, 0, matrix, labels)


def _check_held(data: PartitionData, features: Sequence[ColumnInfo]) -> PartitionData:
    """``data`` if it holds the model's columns (or :func:`dense_partition`'s one array)."""
    infos = data.infos
    if (
        len(infos) == 1
        and infos[0].dense
        and all(c.dense for c in features)
        and infos[0].shape == features_shape(features)
    ):
        return data
    held = [(c.name, c.feature_kind) for c in infos]
    wanted = [(c.name, c.feature_kind) for c in features]
    if held != wanted:
        raise DataError(
            f"the partition holds columns {held}; the model reads {wanted} (name, kind), in order"
        )
    return data


def to_partition(
    data: Any, features: Sequence[ColumnInfo], *, classification: bool = True
) -> PartitionData:
    """Return ``data``'s rows held as the dataset stores them (see :meth:`ScoringModel.predict`).

    Raises:
        DataError: A missing column or a value that breaks its column's rule.
        TypeError: ``data`` is of an unsupported type (numpy and torch: dense models only).
    """
    if isinstance(data, PartitionData):
        return _check_held(data, features)
    dense = all(c.dense for c in features)
    torch = sys.modules.get("torch")
    if isinstance(data, np.ndarray) or (torch is not None and isinstance(data, torch.Tensor)):
        if not dense:
            kinds = sorted({c.feature_kind for c in features if not c.dense})
            raise TypeError(
                f"the model reads {', '.join(kinds)} columns: pass its rows as a pandas "
                "DataFrame or a pyarrow Table with the feature columns by name, not an array"
            )
        array = data if isinstance(data, np.ndarray) else data.detach().cpu().numpy()
        return dense_partition(array, features_shape(features), classification=classification)
    if isinstance(data, (pa.Table, pa.RecordBatch)):
        return raw_partition(data, features, classification=classification)
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(data, pandas.DataFrame):
        table = _pandas_table(data, features)
        return raw_partition(table, features, classification=classification)
    kind = f"{type(data).__module__}.{type(data).__name__}"
    hint = ""
    if kind.startswith("pyspark."):
        hint = "; to score a Spark DataFrame use cerebro_spark.scoring.ModelTransformer"
    raise TypeError(
        "data must be a pandas DataFrame, a pyarrow Table or RecordBatch, a numpy array or "
        f"a torch tensor, got {kind}{hint}"
    )
