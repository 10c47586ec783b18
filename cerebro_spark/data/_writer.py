"""The plain-Python dataset writer: one seeded shuffle, a split, P Parquet partitions each.

What :func:`write_dataset` does, in order:

1. checks the arguments and the columns (:mod:`cerebro_spark.data._validate`);
2. normalises the selected columns: features become ``float32`` scalars or fixed-size
   lists of ``float32`` (with :attr:`ColumnInfo.shape`), a classification label becomes
   ``int64`` class indices ``0..K-1`` (sorted unique values, kept as ``Manifest.classes``),
   a regression label ``float32``; every other column is dropped;
3. derives the dataset id from the normalised data and the parameters
   (:func:`dataset_id_for`), before anything is written;
4. orders the rows by a seeded hash of their normalised content
   (:mod:`cerebro_spark.data._row_order`; the dataset depends only on the multiset of
   rows, not their input order), takes the validation rows (the first
   ``round(rows * validation_fraction)`` rows of that order, or the rows where
   ``validation_column`` is true) and cuts each split into P contiguous slices whose sizes
   differ by at most one;
5. writes every partition with fixed Parquet options (:data:`PARQUET_OPTIONS`) through
   atomic :meth:`Store.put` calls, computing the per-feature statistics of the train
   partitions on the way (:mod:`cerebro_spark.data._statistics`), then ``manifest.json``
   last: a directory without a manifest is an incomplete dataset and is never read.

Reruns with the same input and pyarrow version give byte-identical files (Parquet's
``created_by`` names the pyarrow version, nothing in the files depends on time), so two
processes preparing the same dataset at once write identical bytes.

The Spark writer (:mod:`._spark_prepare`) applies the same rules with the same functions,
public here for it: the parameters' check (:func:`check_params`) and the dataset id's
(:func:`id_params`), the validation split's size (:func:`validation_rows`), the target's
clearing (:func:`clear_target`), the labels (:func:`label_input`, :func:`sorted_classes`,
:func:`encode_label`) and the features (:func:`column_kind`, :func:`kind_column`,
:func:`feature_column`, :func:`dense_type`, :func:`categorical_info`,
:func:`column_vocabulary`); scoring selects its columns as the writer does
(:func:`select_columns`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import re
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cerebro_spark.data import _kinds as kd
from cerebro_spark.data import _row_order as ro
from cerebro_spark.data import _statistics as stats
from cerebro_spark.data import _validate as v
from cerebro_spark.data._format import (
    DENSE_DTYPES,
    FORMAT_VERSION,
    MANIFEST_NAME,
    ColumnInfo,
    Manifest,
    PartitionInfo,
    Split,
    Task,
    partition_path,
)
from cerebro_spark.data._options import KindOptions
from cerebro_spark.data._reader import damaged_partitions, read_manifest
from cerebro_spark.data._vectors import decode_pandas_vectors, decode_vectors
from cerebro_spark.errors import DataError
from cerebro_spark.store import Store, open_store

if TYPE_CHECKING:
    import pandas as pd

logger = logging.getLogger(__name__)

#: Options of every Parquet file the writers produce (fixed, so reruns are byte-identical).
PARQUET_OPTIONS: Mapping[str, Any] = {
    "compression": "snappy",
    "use_dictionary": False,
    "write_statistics": False,
    "version": "2.6",
    "data_page_version": "1.0",
    "store_schema": True,
}

#: Bumped whenever the writer's output for a given input changes, so dataset ids change
#: (2: rows ordered by a seeded content hash, ids from order-independent sums; 3: feature
#: kinds, arrays in their own dtype).
WRITER_VERSION = 3

_PART_KEY = re.compile(r"(train|validation)/part-\d{5}\.parquet")

DataLike: TypeAlias = "pa.Table | pd.DataFrame"


@dataclasses.dataclass(frozen=True)
class _Normalized:
    """The selected columns in their written types, plus the split mask and the id."""

    table: pa.Table
    features: tuple[ColumnInfo, ...]
    label: ColumnInfo
    task: Task
    classes: tuple[Any, ...] | None
    validation_mask: np.ndarray | None
    dataset_id: str
    keys: np.ndarray


# -- input conversion -------------------------------------------------------------------------


def select_columns(
    data: DataLike, columns: Sequence[str]
) -> tuple[pa.Table, dict[str, tuple[int, ...]]]:
    """Select ``columns`` as an Arrow table; also return shapes of pandas ndarray columns."""
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if isinstance(data, pa.Table):
        v.check_columns(data.column_names, columns)
        return decode_vectors(data.select(list(columns))), {}
    pandas = sys.modules.get("pandas")  # not imported: data cannot be a DataFrame
    if pandas is None or not isinstance(data, pandas.DataFrame):
        raise TypeError(
            f"data must be a pyarrow.Table or a pandas.DataFrame, got {type(data).__name__}"
        )
    v.check_columns([str(name) for name in data.columns], columns)
    data = decode_pandas_vectors(data, columns)
    arrays: dict[str, pa.Array] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for name in columns:
        series = data[name]
        try:
            if isinstance(series.dtype, np.dtype) and series.dtype.kind in "biuf":
                # Keep NaN as NaN (from_pandas would turn it into null).
                arrays[name] = pa.array(series.to_numpy())
            elif series.dtype == object and _holds_ndarrays(series):
                arrays[name], shapes[name] = _ndarray_column(name, series)
            else:
                arrays[name] = pa.Array.from_pandas(series)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise DataError(f"column {name!r} cannot be converted to Arrow: {exc}") from exc
    return pa.table(arrays), shapes


def _holds_ndarrays(series: pd.Series) -> bool:
    for value in series:
        if value is not None:
            return isinstance(value, np.ndarray)
    return False


def _ndarray_column(name: str, series: pd.Series) -> tuple[pa.Array, tuple[int, ...]]:
    """Convert a pandas column of numpy arrays (any number of dimensions).

    Returns a flat fixed-size list column and the arrays' shape.
    """
    values = series.tolist()
    nulls = sum(1 for value in values if not isinstance(value, np.ndarray))
    if nulls:
        raise DataError(
            f"feature column {name!r} has {nulls} null (or non-array) values of {len(values)} "
            "rows; nulls are not allowed"
        )
    shapes = sorted({value.shape for value in values})
    if len(shapes) > 1:
        raise DataError(
            f"feature column {name!r} has arrays of different shapes: "
            f"{', '.join(str(s) for s in shapes[:10])}; every row must have the same shape"
        )
    stacked = np.stack(values)
    if stacked.dtype.kind not in "biuf":
        raise DataError(
            f"feature column {name!r} holds numpy arrays of dtype {stacked.dtype}; features "
            "must be numbers"
        )
    shape = shapes[0]
    if not shape:
        return pa.array(stacked), ()
    size = math.prod(shape)
    if size == 0:
        raise DataError(f"feature column {name!r} holds empty arrays of shape {shape}")
    flat = pa.array(stacked.reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, size), shape


# -- normalisation ----------------------------------------------------------------------------


def dense_type(values: pa.Array) -> pa.DataType:
    """The stored element type of a number/array column.

    Its own when one of :data:`DENSE_DTYPES`, else ``float32``.
    """
    numeric = pa.types.is_integer(values.type) or pa.types.is_floating(values.type)
    if numeric and np.dtype(values.type.to_pandas_dtype()).name in DENSE_DTYPES:
        return values.type
    return pa.float32()


def feature_column(
    name: str, column: pa.ChunkedArray, known_shape: tuple[int, ...] | None, hint: Any
) -> tuple[pa.Array, ColumnInfo]:
    """A ``number``/``array`` column as stored: its dtype kept (:data:`DENSE_DTYPES`)."""
    v.check_feature_type(name, column.type)
    shape = v.element_shape(name, column)
    if known_shape is not None:
        shape = known_shape
    if hint is not None:
        shape = v.check_shape_hint(name, shape, hint)
    flat = v.flat_values(column)
    values = flat.cast(dense_type(flat), safe=False)
    if pa.types.is_floating(values.type):
        v.check_finite(name, values.cast(pa.float32()), "feature column")
    dtype = np.dtype(values.type.to_pandas_dtype()).name
    if not shape:
        return values, ColumnInfo(name, dtype, kind="number")
    array = pa.FixedSizeListArray.from_arrays(values, math.prod(shape))
    return array, ColumnInfo(name, dtype, shape, kind="array")


def column_kind(name: str, column: pa.Array | pa.ChunkedArray, options: KindOptions) -> str:
    """The kind of feature column ``name``: named in ``options``, else inferred (logged)."""
    named = options.named().get(name)
    if named is not None:
        return named
    kind = kd.infer_kind(name, column.type, column)
    if kind not in ("number", "array"):
        logger.info("feature column %r (%s) is read as %s", name, column.type, kind)
    return kind


def kind_column(
    name: str,
    column: pa.Array | pa.ChunkedArray,
    kind: str,
    options: KindOptions,
    *,
    vocabulary: tuple[tuple[Any, ...], int] | None = None,
    first_row: int = 0,
) -> tuple[pa.Array, ColumnInfo]:
    """An ``image``, ``categorical`` or ``sequence`` column as stored, and its info.

    Args:
        name: The column.
        column: Its input values.
        kind: ``"image"``, ``"categorical"`` or ``"sequence"``.
        options: The kind options.
        vocabulary: Categorical only: ``(vocabulary, hash_buckets)`` from the whole
            column's counts (:func:`cerebro_spark.data._kinds.build_vocabulary`).
        first_row: The row number of ``column``'s first row, for errors.

    Returns:
        The stored array and the column's info (without statistics; for an image and a
        sequence, the facts of these rows only: a writer of chunks merges them).
    """
    array = v.as_array(column)
    if kind == "image":
        images, facts = kd.image_column(
            name,
            array,
            size=options.image_size,
            channels=options.image_channels,
            first_row=first_row,
        )
        info = ColumnInfo(name, "uint8", facts.shape, kind="image", encoding=facts.encoding)
        return images, info
    if kind == "categorical":
        if vocabulary is None:
            raise ValueError("a categorical column needs its vocabulary")
        words, buckets = vocabulary
        return kd.encode_categories(name, array, words, buckets), categorical_info(
            name, words, buckets
        )
    if kind == "sequence":
        tokens, seq = kd.sequence_column(
            name, array, max_length=options.max_length, first_row=first_row
        )
        info = ColumnInfo(
            name,
            "int32",
            kind="sequence",
            cardinality=seq.max_id + 1,
            max_length=options.max_length or seq.max_length,
            statistics=kd.sequence_statistics(seq, len(tokens)),
        )
        return tokens, info
    raise ValueError(f"not a kind of its own: {kind!r}")


def _any_feature_column(
    name: str,
    column: pa.ChunkedArray,
    options: KindOptions,
    known_shape: tuple[int, ...] | None,
    hint: Any,
) -> tuple[pa.Array, ColumnInfo]:
    """Any feature column of a whole table as stored, with its info (plain writer)."""
    kind = column_kind(name, column, options)
    if kind in ("number", "array"):
        return feature_column(name, column, known_shape, hint)
    if hint is not None:
        raise DataError(
            f"feature_shapes gives a shape for {kind} column {name!r}; only "
            "number and array columns take one"
        )
    if kind == "categorical":
        words, buckets, statistics = column_vocabulary(name, column, options)
        array, info = kind_column(name, column, kind, options, vocabulary=(words, buckets))
        return array, dataclasses.replace(info, statistics=statistics)
    return kind_column(name, column, kind, options)


def categorical_info(
    name: str,
    vocabulary: tuple[Any, ...],
    hash_buckets: int,
    statistics: dict[str, Any] | None = None,
) -> ColumnInfo:
    """A categorical column's info: ids 0 (unknown), the vocabulary's, the buckets'."""
    return ColumnInfo(
        name,
        "int32",
        kind="categorical",
        vocabulary=vocabulary,
        hash_buckets=hash_buckets,
        cardinality=1 + len(vocabulary) + hash_buckets,
        statistics=statistics,
    )


def column_vocabulary(
    name: str, column: pa.Array | pa.ChunkedArray, options: KindOptions
) -> tuple[tuple[Any, ...], int, dict[str, Any]]:
    """A categorical column's vocabulary, hash buckets and statistics, from all its rows."""
    counts = kd.count_categories(kd.category_values(name, v.as_array(column)))
    words, buckets = kd.build_vocabulary(
        name, counts, limit=options.vocabulary_limit, hash_buckets=options.hash_buckets
    )
    return words, buckets, kd.category_statistics(counts, words, buckets)


def label_input(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Return a label column as the label rules see it: dictionaries decoded, decimals float64."""
    array = v.as_array(column)
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if pa.types.is_decimal(array.type):
        array = array.cast(pa.float64())
    return array


def sorted_classes(array: pa.Array) -> pa.Array:
    """Return the distinct values of a classification label, sorted (class ``k`` = item ``k``)."""
    unique = pc.unique(array)
    return unique.take(pc.array_sort_indices(unique))


def encode_label(array: pa.Array, task: Task, classes: pa.Array | None) -> pa.Array:
    """Return the written label: ``float32`` (regression) or ``int64`` class indices."""
    if task == "regression":
        return array.cast(pa.float32(), safe=False)
    return pc.index_in(array, value_set=classes).cast(pa.int64())


def _label_column(
    name: str, column: pa.ChunkedArray, task: Task | None
) -> tuple[pa.Array, ColumnInfo, Task, tuple[Any, ...] | None]:
    array = label_input(column)
    v.check_no_nulls(name, array, "label column")
    if task is None:
        task = v.infer_task(name, array.type)
    v.check_label_type(name, array.type, task)
    if task == "regression":
        labels = encode_label(array, task, None)
        v.check_finite(name, labels, "label column")
        return labels, ColumnInfo(name, "float32"), task, None
    v.check_finite(name, array, "label column")
    classes = sorted_classes(array)
    v.check_classes(name, classes.to_pylist())
    labels = encode_label(array, task, classes)
    return labels, ColumnInfo(name, "int64"), task, tuple(classes.to_pylist())


def _validation_mask(name: str, column: pa.ChunkedArray) -> np.ndarray:
    array = v.as_array(column)
    if not pa.types.is_boolean(array.type):
        raise DataError(
            f"validation_column {name!r} has type {array.type}; it must be boolean "
            "(true = validation row)"
        )
    v.check_no_nulls(name, array, "validation_column")
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=bool)


def _check_seed(seed: object) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise DataError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def check_params(
    *,
    features: Sequence[str],
    label: str,
    num_partitions: int,
    seed: int,
    validation_fraction: float,
    validation_column: str | None,
    task: Task | None,
    feature_shapes: Mapping[str, Sequence[int]] | None,
) -> tuple[int, float, dict[str, Sequence[int]]]:
    """Check the writer's parameters (not the data).

    Returns:
        ``(seed, validation_fraction, shape hints)``, checked.
    """
    v.check_num_partitions(num_partitions)
    seed = _check_seed(seed)
    v.check_roles(features, label, validation_column)
    if validation_column is None:
        validation_fraction = v.check_validation_fraction(validation_fraction)
    if task is not None and task not in ("classification", "regression"):
        raise DataError(f"task must be 'classification', 'regression' or None, got {task!r}")
    hints = dict(feature_shapes or {})
    unknown = [name for name in hints if name not in features]
    if unknown:
        raise DataError(
            f"feature_shapes names {', '.join(map(repr, unknown))}, which are not features "
            f"(features: {', '.join(features)})"
        )
    return seed, validation_fraction, hints


def id_params(
    features: Sequence[ColumnInfo],
    *,
    label: str,
    task: Task,
    classes: Sequence[Any] | None,
    num_partitions: int,
    seed: int,
    validation_fraction: float,
    validation_column: str | None,
    rows: int,
    kinds: KindOptions | None = None,
) -> bytes:
    """Return the parameter part of the dataset id's hash input (canonical JSON bytes).

    The id is ``sha256(this + the row count + two order-independent sums of row hashes)``,
    first 24 hex digits (:meth:`cerebro_spark.data._row_order.IdSums.dataset_id`).
    """
    params = {
        "writer_version": WRITER_VERSION,
        "format_version": FORMAT_VERSION,
        "features": [_id_column(info) for info in features],
        "label": label,
        "task": task,
        "classes": list(classes) if classes is not None else None,
        "num_partitions": num_partitions,
        "seed": seed,
        "split": (
            {"validation_column": validation_column}
            if validation_column
            else {"validation_fraction": validation_fraction}
        ),
        "rows": rows,
        "kinds": (kinds or KindOptions()).id_params(),
    }
    return json.dumps(params, sort_keys=True).encode()


def _id_column(info: ColumnInfo) -> list[Any]:
    """What of a column's info goes into the dataset id (its vocabulary is in its bytes)."""
    return [info.name, list(info.shape), info.feature_kind, info.dtype]


def _normalize(
    data: DataLike,
    *,
    features: Sequence[str],
    label: str,
    num_partitions: int,
    seed: int,
    validation_fraction: float,
    validation_column: str | None,
    task: Task | None,
    feature_shapes: Mapping[str, Sequence[int]] | None,
    kinds: KindOptions | None = None,
) -> _Normalized:
    """Check everything and return the normalised columns and the dataset id."""
    seed, validation_fraction, hints = check_params(
        features=features,
        label=label,
        num_partitions=num_partitions,
        seed=seed,
        validation_fraction=validation_fraction,
        validation_column=validation_column,
        task=task,
        feature_shapes=feature_shapes,
    )
    columns = [*features, label] + ([validation_column] if validation_column else [])
    table, pandas_shapes = select_columns(data, columns)
    v.check_total_rows(table.num_rows, num_partitions)

    options = kinds or KindOptions()
    options.check_features(features)
    arrays: dict[str, pa.Array] = {}
    infos: list[ColumnInfo] = []
    for name in features:
        array, info = _any_feature_column(
            name, table.column(name), options, pandas_shapes.get(name), hints.get(name)
        )
        arrays[name] = array
        infos.append(info)
    labels, label_info, task, classes = _label_column(label, table.column(label), task)
    arrays[label] = labels
    mask = (
        _validation_mask(validation_column, table.column(validation_column))
        if validation_column
        else None
    )
    _split_sizes(table.num_rows, mask, validation_fraction, num_partitions)
    schema = pa.schema([pa.field(name, array.type) for name, array in arrays.items()])
    normalized = pa.Table.from_arrays(list(arrays.values()), schema=schema)

    keys, lane2 = ro.row_hashes(ro.row_words(normalized.columns, mask), seed)
    sums = ro.IdSums()
    sums.add(keys, lane2)
    dataset_id = sums.dataset_id(
        id_params(
            infos,
            label=label,
            task=task,
            classes=classes,
            num_partitions=num_partitions,
            seed=seed,
            validation_fraction=validation_fraction,
            validation_column=validation_column,
            rows=normalized.num_rows,
            kinds=options,
        )
    )
    return _Normalized(
        table=normalized,
        features=tuple(infos),
        label=label_info,
        task=task,
        classes=classes,
        validation_mask=mask,
        dataset_id=dataset_id,
        keys=keys,
    )


# -- split and write --------------------------------------------------------------------------


def _split_sizes(
    rows: int, mask: np.ndarray | None, validation_fraction: float, num_partitions: int
) -> int:
    """Return the number of validation rows; raise if a split cannot fill P partitions."""
    count = None if mask is None else int(np.count_nonzero(mask))
    return validation_rows(rows, count, validation_fraction, num_partitions)


def validation_rows(
    rows: int, validation_count: int | None, validation_fraction: float, num_partitions: int
) -> int:
    """Return the number of validation rows; raise if a split cannot fill P partitions.

    Args:
        rows: Total rows.
        validation_count: Rows flagged by the validation column, or ``None`` to split by
            ``validation_fraction``.
        validation_fraction: Share of validation rows (used when ``validation_count`` is
            ``None``).
        num_partitions: P.
    """
    if validation_count is None:
        n_val = round(rows * validation_fraction)
        how = f" ({rows} rows, validation_fraction={validation_fraction})"
    else:
        n_val = validation_count
        how = f" ({rows} rows, by the validation column)"
    v.check_split_rows({"train": rows - n_val, "validation": n_val}, num_partitions, how)
    return n_val


def _split(
    norm: _Normalized, num_partitions: int, validation_fraction: float
) -> dict[str, list[np.ndarray]]:
    """Order the rows by key (seeded) and cut each split into P slices (sizes differ by <= 1)."""
    rows = norm.table.num_rows
    n_val = _split_sizes(rows, norm.validation_mask, validation_fraction, num_partitions)
    words = ro.row_words(norm.table.columns, norm.validation_mask)
    order = ro.sort_order(norm.keys, words)
    return ro.split_slices(order, norm.validation_mask, n_val, num_partitions)


def narrow_integer_leaves(schema: pa.Schema) -> list[str]:
    """The Parquet paths of 8- and 16-bit integer leaves (numbers, and arrays' elements).

    Parquet has no integer narrower than 32 bits: such a column is stored as ``int32``
    (a ``uint8`` image array at 4x its bytes before compression). Dictionary-encoded, its
    values are stored as indices of at most their own width, so nothing is widened on
    disk (a 3x32x32 ``uint8`` photo partition: 1.69x -> 0.87x its pixel bytes); readers
    get the same values and types back.
    """
    paths = []
    for field in schema:
        arrow_type, path = field.type, field.name
        while v.is_list_type(arrow_type):
            arrow_type, path = arrow_type.value_type, f"{path}.list.element"
        if pa.types.is_integer(arrow_type) and arrow_type.bit_width <= 16:
            paths.append(path)
    return paths


def encode_partition(table: pa.Table) -> bytes:
    """Serialise one partition table to Parquet bytes with :data:`PARQUET_OPTIONS`.

    8- and 16-bit integer columns are dictionary-encoded (:func:`narrow_integer_leaves`).
    """
    sink = pa.BufferOutputStream()
    options = dict(PARQUET_OPTIONS)
    options["use_dictionary"] = narrow_integer_leaves(table.schema) or False
    pq.write_table(table, sink, row_group_size=max(table.num_rows, 1), **options)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def content_hash(partitions: Sequence[PartitionInfo]) -> str:
    """Return the SHA-256 over the partitions' hex hashes, newline-joined, in manifest order."""
    return hashlib.sha256("\n".join(part.sha256 for part in partitions).encode()).hexdigest()


def clear_target(store: Store, *, overwrite: bool) -> set[str]:
    """Make ``store`` ready to receive a dataset; return the old partition keys."""
    keys = store.list()
    foreign = [key for key in keys if key != MANIFEST_NAME and not _PART_KEY.fullmatch(key)]
    if foreign:
        raise FileExistsError(
            f"{store.uri} holds files that are not part of a dataset "
            f"({', '.join(foreign[:5])}{', ...' if len(foreign) > 5 else ''}); "
            "refusing to write a dataset there"
        )
    if MANIFEST_NAME in keys:
        if not overwrite:
            raise FileExistsError(
                f"a dataset already exists at {store.uri}; pass overwrite=True to replace it"
            )
        store.delete(MANIFEST_NAME)  # first: the old dataset is incomplete from now on
    return {key for key in keys if key != MANIFEST_NAME}


def _write(
    norm: _Normalized,
    store: Store,
    *,
    num_partitions: int,
    seed: int,
    validation_fraction: float,
    source: str,
    overwrite: bool,
) -> Manifest:
    old_keys = clear_target(store, overwrite=overwrite)
    slices = _split(norm, num_partitions, validation_fraction)
    logger.info(
        "writing dataset %s: %d rows into %d train + %d validation partitions at %s",
        norm.dataset_id,
        norm.table.num_rows,
        num_partitions,
        num_partitions,
        store.uri,
    )
    partitions: list[PartitionInfo] = []
    moments: list[stats.Moments] = []
    pixels: list[dict[str, np.ndarray]] = []
    with_stats = stats.statistics_size(norm.features) is not None
    splits: tuple[Split, Split] = ("train", "validation")
    for split in splits:  # the order of SPLITS: train first, then validation
        for index, rows in enumerate(slices[split]):
            table = norm.table.take(pa.array(rows, type=pa.int64()))
            if split == "train" and with_stats:
                moments.append(stats.partition_moments(table, norm.features))
            if split == "train":
                pixels.append(stats.image_moments(table, norm.features))
            data = encode_partition(table)
            path = partition_path(split, index)
            store.put(path, data)
            partitions.append(
                PartitionInfo(
                    split=split,
                    index=index,
                    path=path,
                    rows=len(rows),
                    bytes=len(data),
                    sha256=hashlib.sha256(data).hexdigest(),
                )
            )
    for stale in sorted(old_keys - {part.path for part in partitions}):
        store.delete(stale)
    manifest = Manifest(
        dataset_id=norm.dataset_id,
        features=stats.with_image_statistics(norm.features, pixels),
        label=norm.label,
        task=norm.task,
        num_classes=len(norm.classes) if norm.classes is not None else None,
        num_partitions=num_partitions,
        seed=seed,
        partitions=tuple(partitions),
        content_hash=content_hash(partitions),
        schema={field.name: str(field.type) for field in norm.table.schema},
        source=source,
        classes=norm.classes,
        statistics=stats.combine(moments) if with_stats else None,
    )
    store.put(MANIFEST_NAME, manifest.to_json().encode())
    logger.info(
        "wrote dataset %s: %d files, %d bytes",
        manifest.dataset_id,
        len(partitions),
        sum(part.bytes for part in partitions),
    )
    return manifest


# -- public API -------------------------------------------------------------------------------


def dataset_id_for(
    data: DataLike,
    *,
    features: Sequence[str],
    label: str,
    num_partitions: int,
    seed: int,
    validation_fraction: float = 0.2,
    validation_column: str | None = None,
    task: Task | None = None,
    feature_shapes: Mapping[str, Sequence[int]] | None = None,
    kinds: KindOptions | None = None,
) -> str:
    """Return the id :func:`write_dataset` would give this input, without writing anything.

    The id is the first 24 hex digits of a SHA-256 over the normalised rows (as a multiset:
    input order does not matter) and the parameters (features and their shapes, label, task,
    classes, P, seed, split rule, writer version). The ``source`` text is not part of it.

    Raises:
        DataError: The input or a parameter breaks a rule (see :func:`write_dataset`).
    """
    return _normalize(
        data,
        features=features,
        label=label,
        num_partitions=num_partitions,
        seed=seed,
        validation_fraction=validation_fraction,
        validation_column=validation_column,
        task=task,
        feature_shapes=feature_shapes,
        kinds=kinds,
    ).dataset_id


def write_dataset(
    data: DataLike,
    dataset_uri: str | Store,
    *,
    features: Sequence[str],
    label: str,
    num_partitions: int,
    seed: int,
    validation_fraction: float = 0.2,
    validation_column: str | None = None,
    task: Task | None = None,
    source: str = "",
    feature_shapes: Mapping[str, Sequence[int]] | None = None,
    kinds: KindOptions | None = None,
    overwrite: bool = False,
) -> Manifest:
    """Shuffle, split and write ``data`` as a prepared dataset at ``dataset_uri``.

    Args:
        data: The rows (a ``pyarrow.Table`` or ``pandas.DataFrame``; array features may be
            list columns or, in pandas, columns of numpy arrays of any dimension).
        dataset_uri: Directory (local path, ``file://`` or ``s3://`` URI) or a store.
        features: Feature columns, in the order they are concatenated.
        label: The label column.
        num_partitions: P, the number of partitions of each split (>= 1).
        seed: Seed of the shuffle (a non-negative integer).
        validation_fraction: Share of rows that go to validation, in (0, 1); ignored when
            ``validation_column`` is given.
        validation_column: A boolean column: true marks a validation row.
        task: ``"classification"`` or ``"regression"``; inferred from the label type when
            ``None`` (integer, boolean, string: classification; floating: regression).
        source: Free text recorded in the manifest.
        feature_shapes: Per-row shapes of array features, e.g. ``{"image": (1, 8, 8)}`` for
            a 64-value column; the product must match the arrays' length.
        kinds: Which columns are images, categories or sequences and how they are
            prepared (:class:`~cerebro_spark.data.KindOptions`); other columns' kinds are
            inferred from their types (logged).
        overwrite: Replace a complete dataset already at ``dataset_uri``.

    Returns:
        The manifest written (last) to ``<dataset_uri>/manifest.json``.

    Raises:
        DataError: Bad parameters or data (missing columns, wrong types, nulls, NaN/inf,
            ragged arrays, a single class, too few rows for 2 * P non-empty partitions).
        FileExistsError: A dataset is already there (and not ``overwrite``), or the
            directory holds other files.
    """
    norm = _normalize(
        data,
        features=features,
        label=label,
        num_partitions=num_partitions,
        seed=seed,
        validation_fraction=validation_fraction,
        validation_column=validation_column,
        task=task,
        feature_shapes=feature_shapes,
        kinds=kinds,
    )
    return _write(
        norm,
        open_store(dataset_uri),
        num_partitions=num_partitions,
        seed=seed,
        validation_fraction=validation_fraction,
        source=source,
        overwrite=overwrite,
    )


def prepare_dataset(
    data: DataLike,
    store: str | Store,
    *,
    features: Sequence[str],
    label: str,
    num_partitions: int,
    seed: int,
    validation_fraction: float = 0.2,
    validation_column: str | None = None,
    task: Task | None = None,
    source: str = "",
    feature_shapes: Mapping[str, Sequence[int]] | None = None,
    kinds: KindOptions | None = None,
) -> Manifest:
    """Write ``data`` to ``<store>/datasets/<dataset_id>/`` unless it is already there.

    Takes the arguments of :func:`write_dataset`. A complete dataset with the same id
    (manifest present, every partition file listed) is reused without rewriting; an
    incomplete one (a writer died before the manifest) is written over.

    Returns:
        The manifest of the (new or reused) dataset.
    """
    norm = _normalize(
        data,
        features=features,
        label=label,
        num_partitions=num_partitions,
        seed=seed,
        validation_fraction=validation_fraction,
        validation_column=validation_column,
        task=task,
        feature_shapes=feature_shapes,
        kinds=kinds,
    )
    target = open_store(store).child(f"datasets/{norm.dataset_id}")
    overwrite = False
    if target.exists(MANIFEST_NAME):
        manifest = read_manifest(target)
        if manifest.dataset_id != norm.dataset_id:
            raise DataError(
                f"{target.url(MANIFEST_NAME)} describes dataset {manifest.dataset_id}, "
                f"not {norm.dataset_id}; remove the directory to prepare the data again"
            )
        missing = damaged_partitions(target, manifest)  # missing, or truncated
        if not missing:
            logger.info(
                "dataset %s already prepared at %s; reusing it", norm.dataset_id, target.uri
            )
            return manifest
        logger.warning(
            "dataset %s at %s lacks %d whole partition files; writing it again",
            norm.dataset_id,
            target.uri,
            len(missing),
        )
        overwrite = True
    return _write(
        norm,
        target,
        num_partitions=num_partitions,
        seed=seed,
        validation_fraction=validation_fraction,
        source=source,
        overwrite=overwrite,
    )
