"""Spark ML vectors (``VectorAssembler`` output) as feature columns, dense and sparse.

Spark writes a ``pyspark.ml.linalg`` vector to Parquet as a struct
``{type: int8, size: int32, indices: list<int32>, values: list<double>}``: ``type`` 1 is a
dense vector (``values`` holds every element; ``size`` and ``indices`` are null), ``type``
0 a sparse one (``size`` elements, zero but at ``indices``). Spark JSON output keeps only
the fields that are set (``{type, values}`` for dense vectors). Spark reading its own
Parquet sees ``VectorUDT``; any other reader (pyarrow, pandas, Spark on JSON or on files
without Spark's schema metadata) sees the struct.

Each writer turns such a column into a fixed-length array of doubles, once, before its
checks, so a vector column is prepared exactly like an array column of the same values:

* pyarrow (the plain-Python engine and config ``source:`` files): :func:`decode_vectors`;
* pandas (``DataFrame.toPandas()`` of vectors holds ``DenseVector`` / ``SparseVector``
  objects): :func:`decode_pandas_vectors`;
* Spark (:func:`~cerebro_spark.data.prepare_with_spark`): :func:`spark_vector_array`.

The prepared format stores every feature densely. A sparse vector column that would not
fit in memory densified is refused by the in-memory engine with what to do instead.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cerebro_spark.data import _validate as v
from cerebro_spark.errors import DataError

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import Column
    from pyspark.sql.types import DataType

logger = logging.getLogger(__name__)

#: ``type`` of a sparse and of a dense vector in Spark's vector struct.
SPARSE, DENSE = 0, 1

#: Parquet metadata key of the schema Spark wrote (it names the vector type).
_SPARK_SCHEMA = b"org.apache.spark.sql.parquet.row.metadata"

_FIELDS = frozenset({"type", "size", "indices", "values"})

#: Most bytes a densified vector column may take in memory in the plain-Python engine
#: (float64 while decoding); larger ones are refused with advice, not left to the OOM killer.
MAX_DENSE_BYTES = 8 * 2**30


def _is_number(arrow_type: pa.DataType) -> bool:
    return bool(pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type))


def _is_list(arrow_type: pa.DataType) -> bool:
    return bool(pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type))


def is_vector_type(arrow_type: pa.DataType) -> bool:
    """Whether an Arrow type is Spark's vector struct (as Parquet or JSON hold it).

    A struct with an integer ``type`` and a list of numbers ``values``, and optionally an
    integer ``size`` and a list of integer ``indices``, and no other field.
    """
    if not pa.types.is_struct(arrow_type):
        return False
    fields = {
        arrow_type.field(i).name: arrow_type.field(i).type for i in range(arrow_type.num_fields)
    }
    if not {"type", "values"} <= set(fields) <= _FIELDS:
        return False
    checks = [
        pa.types.is_integer(fields["type"]),
        _is_list(fields["values"]) and _is_number(fields["values"].value_type),
        "size" not in fields or pa.types.is_integer(fields["size"]),
        "indices" not in fields
        or (_is_list(fields["indices"]) and pa.types.is_integer(fields["indices"].value_type)),
    ]
    return all(checks)


def _field(array: pa.StructArray, name: str) -> pa.Array | None:
    if array.type.get_field_index(name) < 0:
        return None
    return pc.struct_field(array, name)


def _ints(array: pa.Array) -> np.ndarray:
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=np.int64)


def decode_vector_array(name: str, array: pa.Array | pa.ChunkedArray) -> pa.FixedSizeListArray:
    """Decode a column of Spark ML vector structs into fixed-size lists of ``float64``.

    Args:
        name: The column's name (for messages).
        array: The struct column (see :func:`is_vector_type`).

    Returns:
        One fixed-size list of ``size`` doubles per row; sparse vectors are zero but at
        their indices.

    Raises:
        DataError: Null vectors or elements, an unknown ``type``, vectors of different
            sizes, a sparse vector whose indices and values disagree or fall outside its
            size, empty vectors, or a sparse column too large to densify in memory.
    """
    array = v.as_array(array)
    rows = len(array)
    v.check_null_count(name, array.null_count, rows, "feature column")
    kinds = _ints(_field(array, "type"))
    values = _field(array, "values")
    assert values is not None  # ok: is_vector_type requires it
    unknown = sorted(set(np.unique(kinds).tolist()) - {SPARSE, DENSE})
    if unknown:
        raise DataError(
            f"feature column {name!r} looks like a Spark ML vector column but has vector "
            f"type(s) {unknown}; type must be {SPARSE} (sparse) or {DENSE} (dense)"
        )
    dense_rows = np.flatnonzero(kinds == DENSE)
    sparse_rows = np.flatnonzero(kinds == SPARSE)
    sizes = np.empty(rows, dtype=np.int64)
    dense_values = values.take(pa.array(dense_rows))
    v.check_null_count(name, dense_values.null_count, len(dense_rows), "dense vectors of column")
    sizes[dense_rows] = _ints(pc.list_value_length(dense_values))
    if len(sparse_rows):
        size_field = _field(array, "size")
        index_field = _field(array, "indices")
        if size_field is None or index_field is None:
            raise DataError(
                f"feature column {name!r} holds sparse vectors (type {SPARSE}) without the "
                "'size' or 'indices' field"
            )
        sparse_sizes = size_field.take(pa.array(sparse_rows))
        v.check_null_count(
            name, sparse_sizes.null_count, len(sparse_rows), "sparse vectors' size in"
        )
        sizes[sparse_rows] = _ints(sparse_sizes)
    distinct = np.unique(sizes).tolist()
    v.check_lengths(name, [int(n) for n in distinct], 0)
    size = int(distinct[0]) if distinct else 0
    if size == 0 and rows:
        raise DataError(f"feature column {name!r} holds empty vectors (size 0)")
    if len(sparse_rows):
        needed = rows * size * 8
        if needed > MAX_DENSE_BYTES:
            raise DataError(
                f"feature column {name!r} holds sparse vectors of size {size}: {rows} rows "
                f"take {needed / 2**30:.1f} GiB densified, more than the plain-Python engine "
                f"holds ({MAX_DENSE_BYTES / 2**30:.0f} GiB); prepared datasets store features "
                "densely, so reduce the dimension first (e.g. HashingTF(numFeatures=...), "
                "ChiSqSelector or PCA) or prepare with Spark (cerebro-spark prepare "
                "--engine spark), which writes partition by partition"
            )
    flat_all = values.flatten()
    v.check_null_elements(name, flat_all.null_count, 1, "feature column")
    out = np.zeros((rows, size), dtype=np.float64)
    if len(dense_rows):
        flat = dense_values.flatten().to_numpy(zero_copy_only=False)
        out[dense_rows] = np.asarray(flat, dtype=np.float64).reshape(len(dense_rows), size)
    if len(sparse_rows):
        _scatter_sparse(name, array, values, sparse_rows, size, out)
    flat_out = pa.array(out.reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat_out, size)


def _scatter_sparse(
    name: str,
    array: pa.StructArray,
    values: pa.Array,
    sparse_rows: np.ndarray,
    size: int,
    out: np.ndarray,
) -> None:
    """Write the sparse rows' values at their indices into ``out`` (zeros elsewhere)."""
    taken = pa.array(sparse_rows)
    index_field = _field(array, "indices")
    assert index_field is not None  # ok: checked by the caller
    indices = index_field.take(taken)
    sparse_values = values.take(taken)
    v.check_null_count(name, indices.null_count, len(sparse_rows), "sparse vectors' indices in")
    v.check_null_count(
        name, sparse_values.null_count, len(sparse_rows), "sparse vectors' values in"
    )
    index_lengths = _ints(pc.list_value_length(indices))
    value_lengths = _ints(pc.list_value_length(sparse_values))
    disagree = int(np.count_nonzero(index_lengths != value_lengths))
    if disagree:
        raise DataError(
            f"feature column {name!r} has {disagree} sparse vectors whose indices and values "
            "differ in length; they are not valid Spark ML vectors"
        )
    flat_indices = indices.flatten()
    v.check_null_elements(name, flat_indices.null_count, 1, "feature column")
    columns = _ints(flat_indices)
    outside = int(np.count_nonzero((columns < 0) | (columns >= size)))
    if outside:
        raise DataError(
            f"feature column {name!r} has {outside} sparse vector indices outside 0..{size - 1}"
        )
    parents = _ints(pc.list_parent_indices(indices))
    flat_values = sparse_values.flatten().to_numpy(zero_copy_only=False)
    out[sparse_rows[parents], columns] = np.asarray(flat_values, dtype=np.float64)


def decode_vectors(table: pa.Table, columns: Sequence[str] | None = None) -> pa.Table:
    """Return ``table`` with its Spark ML vector columns as fixed-size lists of ``float64``.

    Args:
        table: Any Arrow table; columns that are not vectors are kept as they are.
        columns: Only look at these columns (default: all).

    Raises:
        DataError: A vector column that cannot be decoded (see :func:`decode_vector_array`).
    """
    names = (
        table.column_names if columns is None else [c for c in columns if c in table.column_names]
    )
    for name in names:
        index = table.column_names.index(name)
        column = table.column(index)
        if not is_vector_type(column.type):
            continue
        decoded = decode_vector_array(name, column)
        logger.info(
            "decoded Spark ML vector column %r: %d values per row", name, decoded.type.list_size
        )
        table = table.set_column(index, table.schema.field(index).with_type(decoded.type), decoded)
        metadata = dict(table.schema.metadata or {})
        if metadata.pop(_SPARK_SCHEMA, None) is not None:  # it still says VectorUDT
            table = table.replace_schema_metadata(metadata or None)
    return table


def _is_ml_vector(value: Any) -> bool:
    kind = type(value)
    return kind.__name__ in ("DenseVector", "SparseVector") and kind.__module__.startswith(
        "pyspark.ml"
    )


def decode_pandas_vectors(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """Return ``frame`` with ``pyspark.ml.linalg`` vector objects as numpy arrays.

    ``DataFrame.toPandas()`` of a vector column holds ``DenseVector`` and ``SparseVector``
    objects; their ``toArray()`` values (``float64``) replace them. Other columns and
    values are kept. ``frame`` itself is not modified.
    """
    changed: dict[str, Any] = {}
    for name in columns:
        series = frame[name]
        if series.dtype != object:
            continue
        first = next((value for value in series if value is not None), None)
        if _is_ml_vector(first):
            changed[name] = [
                value.toArray() if _is_ml_vector(value) else value for value in series.tolist()
            ]
    if not changed:
        return frame
    frame = frame.copy(deep=False)
    for name, values in changed.items():
        frame[name] = values
    return frame


def _spark_struct_is_vector(data_type: DataType) -> bool:
    from pyspark.sql.types import ArrayType, IntegralType, StructType

    if not isinstance(data_type, StructType):
        return False
    fields = {field.name: field.dataType for field in data_type.fields}
    if not {"type", "values"} <= set(fields) <= _FIELDS:
        return False
    values, indices = fields["values"], fields.get("indices")
    return (
        isinstance(fields["type"], IntegralType)
        and isinstance(values, ArrayType)
        and not isinstance(values.elementType, (ArrayType, StructType))
        and ("size" not in fields or isinstance(fields["size"], IntegralType))
        and (
            indices is None
            or (isinstance(indices, ArrayType) and isinstance(indices.elementType, IntegralType))
        )
    )


def spark_vector_array(column: Column, data_type: DataType) -> Column | None:
    """A Spark expression turning a vector column into ``array<double>``; ``None`` if not one.

    ``VectorUDT`` columns go through :func:`pyspark.ml.functions.vector_to_array`; vector
    structs (JSON output, files without Spark's schema metadata) are decoded with SQL
    expressions (a sparse vector's ``size`` elements, zero but at its ``indices``).
    """
    from pyspark.sql import functions as F

    if type(data_type).__name__ == "VectorUDT":
        from pyspark.ml.functions import vector_to_array

        return vector_to_array(column, "float64")
    if not _spark_struct_is_vector(data_type):
        return None
    names = {field.name for field in data_type.fields}  # type: ignore[attr-defined]
    values = column["values"].cast("array<double>")
    decoded = F.when(column["type"] == F.lit(DENSE), values)
    if {"size", "indices"} <= names:
        by_index = F.map_from_arrays(column["indices"].cast("array<int>"), values)
        size = column["size"].cast("int")
        sparse = F.when(
            size > F.lit(0),
            F.transform(
                F.sequence(F.lit(0), size - F.lit(1)),
                lambda i: F.coalesce(F.try_element_at(by_index, i), F.lit(0.0)),
            ),
        ).otherwise(F.array().cast("array<double>"))
        decoded = decoded.when(column["type"] == F.lit(SPARSE), sparse)
    return decoded
