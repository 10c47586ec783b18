"""Checks shared by every dataset writer and the reader.

Each check takes plain values or Arrow arrays (``pyarrow.Array`` or ``ChunkedArray``, so a
Spark writer can run them on Arrow record batches) and raises
:class:`~cerebro_spark.errors.DataError` naming the column, the count and the rule.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cerebro_spark.data._format import KINDS, READABLE_FORMAT_VERSIONS, SPLITS, Manifest, Task
from cerebro_spark.errors import DataError

_MAX_LISTED = 10


def _listing(values: Iterable[Any]) -> str:
    items = [str(value) for value in values]
    shown = ", ".join(items[:_MAX_LISTED])
    return shown + (f", ... ({len(items)} in all)" if len(items) > _MAX_LISTED else "")


def as_array(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Return ``array`` as one contiguous ``pyarrow.Array``."""
    if isinstance(array, pa.ChunkedArray):
        if array.num_chunks == 1:
            return array.chunk(0)
        return array.combine_chunks()
    return array


# -- parameters -------------------------------------------------------------------------------


def check_num_partitions(num_partitions: object) -> int:
    """Return ``num_partitions`` if it is an integer >= 1, else raise :class:`DataError`."""
    if isinstance(num_partitions, bool) or not isinstance(num_partitions, int):
        raise DataError(f"num_partitions must be an integer >= 1, got {num_partitions!r}")
    if num_partitions < 1:
        raise DataError(f"num_partitions must be an integer >= 1, got {num_partitions}")
    return num_partitions


def check_validation_fraction(fraction: object) -> float:
    """Return ``fraction`` if it lies in the open interval (0, 1), else raise."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise DataError(f"validation_fraction must be a number in (0, 1), got {fraction!r}")
    if not (math.isfinite(fraction) and 0.0 < fraction < 1.0):
        raise DataError(
            f"validation_fraction must be in the open interval (0, 1), got {fraction!r}"
        )
    return float(fraction)


def check_roles(features: Sequence[str], label: str, validation_column: str | None = None) -> None:
    """Check that the column roles are well formed: features given, no column twice."""
    if isinstance(features, str):
        raise DataError(f"features must be a sequence of column names, got the string {features!r}")
    if not features:
        raise DataError("features must name at least one column, got none")
    seen: set[str] = set()
    for name in features:
        if not isinstance(name, str) or not name:
            raise DataError(f"feature column names must be non-empty strings, got {name!r}")
        if name in seen:
            raise DataError(f"feature column {name!r} is listed twice in features")
        seen.add(name)
    if not isinstance(label, str) or not label:
        raise DataError(f"label must be a non-empty column name, got {label!r}")
    if label in seen:
        raise DataError(f"column {label!r} cannot be both a feature and the label")
    if validation_column is not None and validation_column in (*features, label):
        raise DataError(
            f"validation_column {validation_column!r} cannot also be a feature or the label"
        )


def check_columns(available: Sequence[str], required: Sequence[str]) -> None:
    """Raise :class:`DataError` naming the missing columns and listing the available ones."""
    have = set(available)
    missing = [name for name in required if name not in have]
    if missing:
        noun = "column" if len(missing) == 1 else "columns"
        raise DataError(
            f"{noun} {_listing(repr(m) for m in missing)} not found; "
            f"the data has columns: {_listing(available) or '(none)'}"
        )


# -- types ------------------------------------------------------------------------------------


def _is_number(arrow_type: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(arrow_type)
        or pa.types.is_floating(arrow_type)
        or pa.types.is_boolean(arrow_type)
        or pa.types.is_decimal(arrow_type)
    )


def is_list_type(arrow_type: pa.DataType) -> bool:
    """Whether ``arrow_type`` is a list type (variable, large or fixed-size)."""
    return bool(
        pa.types.is_list(arrow_type)
        or pa.types.is_large_list(arrow_type)
        or pa.types.is_fixed_size_list(arrow_type)
    )


def unsupported_feature(name: str, arrow_type: pa.DataType) -> DataError:
    """The error for a feature column of a type no feature kind reads (with advice)."""
    structs = (
        "; a struct is read only as a Spark ML vector ({type, size, indices, values}) or "
        "Spark's image struct: select its fields as columns"
        if pa.types.is_struct(arrow_type)
        else ""
    )
    return DataError(
        f"feature column {name!r} has type {arrow_type}; features must be numbers (integer, "
        "floating point, boolean, decimal), fixed-length arrays of numbers or Spark ML "
        "vectors, JPEG or PNG images (binary, or Spark's image struct), strings "
        f"(categorical) or lists of integer token ids (sequence){structs}"
    )


def check_feature_type(name: str, arrow_type: pa.DataType) -> None:
    """Check that a number or array column holds numbers or (nested) arrays of numbers."""
    element = arrow_type
    while is_list_type(element):
        element = element.value_type
    if not _is_number(element):
        raise unsupported_feature(name, arrow_type)


def infer_task(name: str, arrow_type: pa.DataType) -> Task:
    """Infer the task from the label type.

    Integer, boolean and string labels mean classification; floating point, regression.
    """
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    if (
        pa.types.is_integer(arrow_type)
        or pa.types.is_boolean(arrow_type)
        or pa.types.is_string(arrow_type)
        or pa.types.is_large_string(arrow_type)
    ):
        return "classification"
    if pa.types.is_floating(arrow_type) or pa.types.is_decimal(arrow_type):
        return "regression"
    raise DataError(
        f"label column {name!r} has type {arrow_type}; a label must be integer, boolean or "
        "string (classification) or floating point (regression)"
    )


def check_label_type(name: str, arrow_type: pa.DataType, task: str) -> None:
    """Check that a label type suits the task."""
    if task not in ("classification", "regression"):
        raise DataError(f"task must be 'classification' or 'regression', got {task!r}")
    inferred = infer_task(name, arrow_type)
    if task == "regression" and inferred == "classification":
        value_type = arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type
        if not pa.types.is_integer(value_type):
            raise DataError(
                f"label column {name!r} has type {arrow_type}; regression needs numbers"
            )


# -- values -----------------------------------------------------------------------------------


def check_null_count(name: str, nulls: int, rows: int, role: str = "column") -> None:
    """Raise if a column has ``nulls`` null rows (of ``rows``); for counts computed elsewhere."""
    if nulls:
        raise DataError(
            f"{role} {name!r} has {nulls} null values of {rows} rows; nulls are not allowed"
        )


def check_null_elements(name: str, nulls: int, depth: int, role: str = "column") -> None:
    """Raise if an array column has ``nulls`` null elements at nesting ``depth`` (>= 1)."""
    if nulls:
        raise DataError(
            f"{role} {name!r} has {nulls} null array elements "
            f"(at nesting depth {depth}); nulls are not allowed"
        )


def check_no_nulls(name: str, array: pa.Array | pa.ChunkedArray, role: str = "column") -> None:
    """Raise if ``array`` (or any nested array value) holds nulls, naming the count."""
    array = as_array(array)
    check_null_count(name, array.null_count, len(array), role)
    depth = 0
    while is_list_type(array.type):
        array = array.flatten()
        depth += 1
        check_null_elements(name, array.null_count, depth, role)


def check_finite_counts(name: str, nans: int, infs: int, values: int, role: str = "column") -> None:
    """Raise if ``nans`` or ``infs`` (of ``values`` values) is non-zero, with the counts."""
    if nans or infs:
        raise DataError(
            f"{role} {name!r} has {nans} NaN and {infs} infinite values "
            f"(of {values} values); values must be finite"
        )


def check_finite(name: str, values: pa.Array | pa.ChunkedArray, role: str = "column") -> None:
    """Raise if floating-point ``values`` (flat) hold NaN or infinite values, with counts."""
    values = as_array(values)
    if not pa.types.is_floating(values.type) or len(values) == 0:
        return
    nans = pc.sum(pc.is_nan(values)).as_py() or 0
    infs = pc.sum(pc.is_inf(values)).as_py() or 0
    check_finite_counts(name, nans, infs, len(values), role)


def element_shape(name: str, array: pa.Array | pa.ChunkedArray) -> tuple[int, ...]:
    """Return the per-row shape of a feature column.

    ``()`` for scalars, ``(n, ...)`` for (nested) arrays whose lengths agree.

    Raises:
        DataError: Nulls (see :func:`check_no_nulls`) or ragged arrays (lengths seen).
    """
    array = as_array(array)
    check_no_nulls(name, array, "feature column")
    shape: list[int] = []
    depth = 0
    while is_list_type(array.type):
        if pa.types.is_fixed_size_list(array.type):
            length = array.type.list_size
        else:
            lengths = pc.unique(pc.list_value_length(array))
            check_lengths(name, [int(v) for v in lengths.to_pylist()], depth)
            length = int(lengths[0].as_py()) if len(lengths) else 0
        if length == 0 and len(array):
            raise DataError(f"feature column {name!r} holds empty arrays")
        shape.append(length)
        array = array.flatten()
        depth += 1
    return tuple(shape)


def check_lengths(name: str, lengths: Sequence[int], depth: int) -> None:
    """Raise if the arrays of a feature column at nesting ``depth`` have several lengths.

    Args:
        name: The feature column.
        lengths: The distinct lengths seen (any order).
        depth: Nesting depth of the arrays (0: the rows' own arrays).
    """
    if len(lengths) > 1:
        seen = sorted(lengths)
        where = f" at nesting depth {depth}" if depth else ""
        raise DataError(
            f"feature column {name!r} has arrays of different lengths{where}: "
            f"{_listing(seen)}; every row must have the same shape"
        )


def flat_values(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Return the scalar values of a (nested) list column in row order (offsets honoured)."""
    array = as_array(array)
    while is_list_type(array.type):
        array = array.flatten()
    return array


def check_shape_hint(name: str, inferred: tuple[int, ...], hint: Sequence[int]) -> tuple[int, ...]:
    """Return ``hint`` as a shape if it has as many values as the inferred shape."""
    shape = tuple(int(dim) for dim in hint)
    if any(dim < 1 for dim in shape):
        raise DataError(f"shape hint {shape} for feature column {name!r} has a dimension < 1")
    if not inferred:
        if shape in ((), (1,)):
            return ()
        raise DataError(
            f"shape hint {shape} given for feature column {name!r}, which holds scalars"
        )
    if math.prod(shape) != math.prod(inferred):
        raise DataError(
            f"shape hint {shape} for feature column {name!r} has {math.prod(shape)} values "
            f"per row, but the column's arrays have shape {inferred} "
            f"({math.prod(inferred)} values)"
        )
    return shape


def check_classes(name: str, classes: Sequence[Any]) -> None:
    """Raise if a classification label has fewer than two classes."""
    if len(classes) < 2:
        found = f"only one class ({classes[0]!r})" if classes else "no values"
        raise DataError(
            f"classification label {name!r} has {found}; a classifier needs at least two"
        )


def check_label_range(name: str, labels: pa.Array | pa.ChunkedArray, num_classes: int) -> None:
    """Raise if integer class labels fall outside ``0..num_classes-1``, with the count."""
    labels = as_array(labels)
    outside = pc.sum(pc.or_(pc.less(labels, 0), pc.greater_equal(labels, num_classes))).as_py()
    if outside:
        raise DataError(
            f"label column {name!r} has {outside} values outside 0..{num_classes - 1} "
            f"(num_classes={num_classes})"
        )


# -- rows -------------------------------------------------------------------------------------


def check_total_rows(rows: int, num_partitions: int) -> None:
    """Raise if ``rows`` cannot fill P train and P validation partitions."""
    if rows < 2 * num_partitions:
        raise DataError(
            f"the data has {rows} rows, fewer than 2 * num_partitions = {2 * num_partitions}: "
            f"each of the {num_partitions} train and {num_partitions} validation partitions "
            "needs at least one row"
        )


def check_split_rows(split_rows: dict[str, int], num_partitions: int, how: str = "") -> None:
    """Raise if a split has fewer rows than partitions (a partition would be empty)."""
    for split, rows in split_rows.items():
        if rows < num_partitions:
            raise DataError(
                f"the {split} split has {rows} rows{how}, fewer than num_partitions = "
                f"{num_partitions}: a {split} partition would be empty"
            )


def check_partition_rows(split: str, index: int, rows: int) -> None:
    """Raise if a partition is empty."""
    if rows < 1:
        raise DataError(f"{split} partition {index} is empty (0 rows)")


def check_manifest(manifest: Manifest) -> None:
    """Check a manifest's internal consistency (versions, partitions, task, classes)."""
    if manifest.format_version not in READABLE_FORMAT_VERSIONS:
        raise DataError(
            f"dataset {manifest.dataset_id} has format_version {manifest.format_version}; "
            "this version of cerebro-spark reads format_version "
            f"{', '.join(map(str, READABLE_FORMAT_VERSIONS))}"
        )
    check_num_partitions(manifest.num_partitions)
    expected = {(s, i) for s in SPLITS for i in range(manifest.num_partitions)}
    have = [(part.split, part.index) for part in manifest.partitions]
    if len(have) != len(expected) or set(have) != expected:
        raise DataError(
            f"dataset {manifest.dataset_id} manifest lists partitions {_listing(have)}; "
            f"expected partitions 0..{manifest.num_partitions - 1} of each of {SPLITS}"
        )
    for part in manifest.partitions:
        check_partition_rows(part.split, part.index, part.rows)
    if manifest.task == "classification":
        if manifest.num_classes is None or manifest.num_classes < 2:
            raise DataError(
                f"dataset {manifest.dataset_id} is a classification dataset with "
                f"num_classes={manifest.num_classes}; at least 2 are needed"
            )
    elif manifest.task != "regression":
        raise DataError(f"dataset {manifest.dataset_id} has an unknown task {manifest.task!r}")
    if not manifest.features:
        raise DataError(f"dataset {manifest.dataset_id} has no feature columns")
    stats = manifest.statistics
    size = sum(column.size for column in manifest.features if column.dense)
    if stats is not None and stats.size != size:
        raise DataError(
            f"dataset {manifest.dataset_id} has feature statistics for {stats.size} elements, "
            f"but its number and array columns hold {size} values per row"
        )
    for column in manifest.features:
        if column.feature_kind not in KINDS:
            raise DataError(
                f"dataset {manifest.dataset_id} feature column {column.name!r} has kind "
                f"{column.kind!r}; this version of cerebro-spark reads {', '.join(KINDS)}"
            )
