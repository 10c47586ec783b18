"""Turning a user's rows into the feature tensor a model was trained on.

The rules are those of ``prepare``: each feature column holds numbers or fixed-size
(nested) arrays of numbers with as many values per row as at training; no nulls, no NaN
or infinite values. Columns are concatenated in the model's order and reshaped to its
feature shape. Every violation raises :class:`~cerebro_spark.errors.DataError` naming the
column and the rule.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from cerebro_spark.data import ColumnInfo
from cerebro_spark.data import _validate as v
from cerebro_spark.data._writer import _to_arrow
from cerebro_spark.errors import DataError


def column_block(name: str, array: pa.Array | pa.ChunkedArray, expected: ColumnInfo) -> np.ndarray:
    """Return one feature column as a ``(rows, expected.size)`` float32 array."""
    array = v.as_array(array)
    v.check_feature_type(name, array.type)
    shape = v.element_shape(name, array)
    size = math.prod(shape) if shape else 1
    if size != expected.size:
        raise DataError(
            f"feature column {name!r} has {size} values per row (shape {shape}), but the "
            f"model was trained on shape {expected.shape} ({expected.size} values)"
        )
    values = v.flat_values(array).cast(pa.float32(), safe=False)
    v.check_finite(name, values, "feature column")
    matrix = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float32)
    return matrix.reshape(len(array), size)


def arrow_features(
    table: pa.Table | pa.RecordBatch,
    features: Sequence[ColumnInfo],
    feature_shape: Sequence[int],
    names: Sequence[str] | None = None,
) -> np.ndarray:
    """Return the features of Arrow rows as ``(rows, *feature_shape)`` float32.

    Args:
        table: The rows.
        features: The model's feature columns, in order.
        feature_shape: The model's feature shape.
        names: The columns of ``table`` holding each feature (default: the features' names).
    """
    columns = list(names) if names is not None else [c.name for c in features]
    v.check_columns(list(table.schema.names), columns)
    blocks = [
        column_block(info.name, table.column(column), info)
        for info, column in zip(features, columns, strict=True)
    ]
    matrix = blocks[0] if len(blocks) == 1 else np.concatenate(blocks, axis=1)
    return matrix.reshape(table.num_rows, *feature_shape)


def _vectors_to_arrays(frame: Any, names: Sequence[str]) -> Any:
    """Replace Spark ML vectors (``toArray()``) in pandas object columns by numpy arrays."""
    for name in names:
        series = frame[name]
        if series.dtype == object:
            first = next((x for x in series if x is not None), None)
            if first is not None and hasattr(first, "toArray"):
                frame = frame.assign(
                    **{name: series.map(lambda x: None if x is None else x.toArray())}
                )
    return frame


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
    bad = int(np.count_nonzero(~np.isfinite(matrix)))
    if bad:
        raise DataError(
            f"features hold {bad} NaN or infinite values of {matrix.size}; scoring needs "
            "finite numbers (as training did)"
        )
    return matrix


def to_features(data: Any, features: Sequence[ColumnInfo], feature_shape: Sequence[int]) -> Any:
    """Return the feature array of ``data`` (see :meth:`ScoringModel.predict` for the forms)."""
    if isinstance(data, np.ndarray):
        return numpy_features(data, feature_shape)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(data, torch.Tensor):
        return numpy_features(data.detach().cpu().numpy(), feature_shape)
    if isinstance(data, (pa.Table, pa.RecordBatch)):
        return arrow_features(data, features, feature_shape)
    pandas = sys.modules.get("pandas")
    if pandas is not None and isinstance(data, pandas.DataFrame):
        names = [c.name for c in features]
        v.check_columns([str(c) for c in data.columns], names)
        table, _ = _to_arrow(_vectors_to_arrays(data, names), names)
        return arrow_features(table, features, feature_shape)
    kind = f"{type(data).__module__}.{type(data).__name__}"
    hint = ""
    if kind.startswith("pyspark."):
        hint = "; to score a Spark DataFrame use cerebro_spark.scoring.ModelTransformer"
    raise TypeError(
        "data must be a pandas DataFrame, a pyarrow Table or RecordBatch, a numpy array or "
        f"a torch tensor, got {kind}{hint}"
    )
