"""The dataset reader: ``manifest.json`` and one partition at a time, with pyarrow.

Reads files written by any writer of the format (this package's or the Spark job's):
array features may be fixed-size or variable-size (but uniform) list columns, nested or
flat; their values must add up to the manifest's shape.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from cerebro_spark.data import _validate as v
from cerebro_spark.data._format import (
    MANIFEST_NAME,
    READABLE_FORMAT_VERSIONS,
    SPLITS,
    ColumnInfo,
    HeldColumn,
    Manifest,
    PartitionData,
    stack_dense,
)
from cerebro_spark.errors import DataError
from cerebro_spark.store import Store, open_store

logger = logging.getLogger(__name__)


#: Decoded bytes a partition is read in at a time, about (see :func:`_decode`).
_DECODE_BYTES = 8 << 20


def _decode(parquet: pq.ParquetFile, names: list[str], row_bytes: int) -> pa.Table:
    """The file's ``names`` columns; with array or sequence columns, a few MiB at a time.

    Decoding a Parquet column of arrays whole needs many times its bytes at once (an
    ``int32`` and nesting levels per element for a ``uint8`` array: about 20x a file of
    pixel rows); :data:`_DECODE_BYTES` of rows at a time need that only for those rows.
    The values are the same. Measured on 23,750 rows of 3x32x32 ``uint8`` (a 149 MiB
    file): peak RSS growth 1,223 -> 270 MiB, 4.9 -> 3.2 s.
    """
    schema = pa.schema([parquet.schema_arrow.field(name) for name in names])
    if not any(v.is_list_type(field.type) for field in schema):
        return parquet.read(columns=names)  # flat columns decode at about their size
    rows = max(1, _DECODE_BYTES // max(row_bytes, 1))
    batches = list(parquet.iter_batches(batch_size=rows, columns=names))
    return pa.Table.from_batches(batches, schema=schema)


def read_manifest(dataset_uri: str | Store) -> Manifest:
    """Read and check ``<dataset_uri>/manifest.json``.

    Args:
        dataset_uri: The dataset directory (local path, ``file://`` or ``s3://`` URI) or a
            store rooted there.

    Raises:
        DataError: The manifest is missing (the dataset does not exist or was not
            completely written), is not valid JSON, lacks a field, has another
            ``format_version`` or is inconsistent.
    """
    store = open_store(dataset_uri)
    where = store.url(MANIFEST_NAME)
    try:
        text = store.get(MANIFEST_NAME)
    except FileNotFoundError as exc:
        raise DataError(
            f"no {MANIFEST_NAME} at {where}: the dataset does not exist or was not "
            "completely written"
        ) from exc
    try:
        raw = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{where} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise DataError(f"{where} holds a JSON {type(raw).__name__}, not an object")
    version = raw.get("format_version")
    if version not in READABLE_FORMAT_VERSIONS:
        raise DataError(
            f"{where} has format_version {version!r}; this version of cerebro-spark reads "
            f"format_version {', '.join(map(str, READABLE_FORMAT_VERSIONS))}"
        )
    try:
        manifest = Manifest.from_json(text.decode())
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{where} is corrupt: missing or malformed field {exc}") from exc
    v.check_manifest(manifest)
    return manifest


def _dense_column(array: pa.Array, column: ColumnInfo, rows: int) -> np.ndarray:
    """A number/array column as ``(rows, *shape)`` of its stored dtype (zero-copy if it can)."""
    v.check_feature_type(column.name, array.type)
    shape = v.element_shape(column.name, array)
    size = math.prod(shape) if shape else 1
    if size != column.size:
        raise DataError(
            f"feature column {column.name!r} has {size} values per row (shape {shape}), but "
            f"the manifest says shape {column.shape} ({column.size} values)"
        )
    values = v.flat_values(array)
    if np.dtype(values.type.to_pandas_dtype()).name != column.dtype:
        values = values.cast(pa.from_numpy_dtype(np.dtype(column.dtype)), safe=False)
    if pa.types.is_floating(values.type):
        v.check_finite(column.name, values.cast(pa.float32()), "feature column")
    flat = np.asarray(values.to_numpy(zero_copy_only=False))
    return flat.reshape(rows, *column.shape)


def _offsets(array: pa.Array) -> np.ndarray:
    """``int64`` row offsets (rows + 1) of a binary or list array, into its own values."""
    lengths = (
        pc.binary_length(array) if not v.is_list_type(array.type) else pc.list_value_length(array)
    )
    offsets = np.zeros(len(array) + 1, dtype=np.int64)
    np.cumsum(lengths.to_numpy(zero_copy_only=False), out=offsets[1:])
    return offsets


def hold_column(table: pa.Table, column: ColumnInfo, rows: int) -> HeldColumn:
    """One feature column of a partition as it is held: as stored, nothing decoded."""
    array = v.as_array(table.column(column.name))
    kind = column.feature_kind
    if kind in ("number", "array"):
        return HeldColumn(column, _dense_column(array, column, rows))
    v.check_no_nulls(column.name, array, "feature column")
    if kind == "image":
        if not (pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type)):
            raise DataError(
                f"image column {column.name!r} has type {array.type}; it must be binary"
            )
        data = pa.concat_arrays([array]) if array.offset else array
        values = np.frombuffer(data.buffers()[2] or b"", dtype=np.uint8)
        start = int(np.frombuffer(data.buffers()[1], dtype=_offset_type(data))[0])
        offsets = _offsets(data) + start
        return HeldColumn(column, values, offsets)
    if kind == "categorical":
        ids = np.asarray(array.cast(pa.int32()).to_numpy(zero_copy_only=False))
        _check_ids(column, ids, "id")
        return HeldColumn(column, ids)
    if not v.is_list_type(array.type) or not pa.types.is_integer(array.type.value_type):
        raise DataError(
            f"sequence column {column.name!r} has type {array.type}; it must be a list of int32"
        )
    tokens = np.asarray(array.flatten().cast(pa.int32()).to_numpy(zero_copy_only=False))
    _check_ids(column, tokens, "token id")
    return HeldColumn(column, tokens, _offsets(array))


def _offset_type(array: pa.Array) -> type[np.integer[Any]]:
    return np.int64 if pa.types.is_large_binary(array.type) else np.int32


def _check_ids(column: ColumnInfo, ids: np.ndarray, what: str) -> None:
    """Raise if an id lies outside ``0..cardinality-1``, naming the first such row value."""
    limit = column.cardinality
    if limit is None or not len(ids):
        return
    bad = (ids < 0) | (ids >= limit)
    if bad.any():
        raise DataError(
            f"{column.feature_kind} column {column.name!r} holds {int(bad.sum())} {what}s "
            f"outside 0..{limit - 1} (e.g. {int(ids[bad][0])}); the manifest says "
            f"cardinality {limit}"
        )


def _labels(table: pa.Table, manifest: Manifest) -> np.ndarray:
    name = manifest.label.name
    array = v.as_array(table.column(name))
    v.check_no_nulls(name, array, "label column")
    if manifest.task == "classification":
        if not pa.types.is_integer(array.type):
            raise DataError(
                f"label column {name!r} has type {array.type}; a classification dataset "
                "stores integer class indices"
            )
        array = array.cast(pa.int64())
        v.check_label_range(name, array, manifest.num_classes or 0)
        return np.array(array.to_numpy(zero_copy_only=False), dtype=np.int64)
    if not (pa.types.is_floating(array.type) or pa.types.is_integer(array.type)):
        raise DataError(
            f"label column {name!r} has type {array.type}; a regression label must be numeric"
        )
    array = array.cast(pa.float32(), safe=False)
    v.check_finite(name, array, "label column")
    return np.array(array.to_numpy(zero_copy_only=False), dtype=np.float32)


def read_partition(
    dataset_uri: str | Store,
    split: str,
    index: int,
    *,
    manifest: Manifest | None = None,
    verify: bool = True,
) -> PartitionData:
    """Read one partition into numpy arrays.

    Args:
        dataset_uri: The dataset directory or a store rooted there.
        split: ``"train"`` or ``"validation"``.
        index: Partition index, ``0 <= index < num_partitions``.
        manifest: The dataset's manifest, if already read (saves one read).
        verify: Check the file's SHA-256 against the manifest.

    Returns:
        The partition as stored: each feature column a :class:`HeldColumn` (numbers and
        arrays ``(rows, *shape)`` in their stored dtype, images still encoded, categories
        ``int32`` ids, sequences ragged ``int32``), ``labels`` int64 (classification) or
        float32 (regression). ``bytes_read`` is the size of the file.

    Raises:
        DataError: Bad split or index, or the file disagrees with the manifest (missing,
            size, hash, columns, rows, shapes, nulls, NaN/inf, label range).
    """
    store = open_store(dataset_uri)
    if manifest is None:
        manifest = read_manifest(store)
    if split not in SPLITS:
        raise DataError(f"split must be one of {SPLITS}, got {split!r}")
    if isinstance(index, bool) or not isinstance(index, int):
        raise DataError(f"partition index must be an integer, got {index!r}")
    if not 0 <= index < manifest.num_partitions:
        raise DataError(
            f"partition index {index} is out of range: dataset {manifest.dataset_id} has "
            f"partitions 0..{manifest.num_partitions - 1}"
        )
    info = manifest.partition(split, index)
    where = store.url(info.path)
    try:
        data = store.get(info.path)
    except FileNotFoundError as exc:
        raise DataError(f"{split} partition {index} file {where} is missing") from exc
    if len(data) != info.bytes:
        raise DataError(
            f"{split} partition {index} file {where} has {len(data)} bytes, the manifest "
            f"says {info.bytes}"
        )
    if verify and hashlib.sha256(data).hexdigest() != info.sha256:
        raise DataError(f"{split} partition {index} file {where} does not match its SHA-256")
    try:
        parquet = pq.ParquetFile(pa.BufferReader(data))
        names = [column.name for column in (*manifest.features, manifest.label)]
        v.check_columns(parquet.schema_arrow.names, names)
        table = _decode(parquet, names, info.bytes // max(info.rows, 1))
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(
            f"{split} partition {index} file {where} is not valid Parquet: {exc}"
        ) from exc
    rows = table.num_rows
    v.check_partition_rows(split, index, rows)
    if rows != info.rows:
        raise DataError(
            f"{split} partition {index} file {where} has {rows} rows, the manifest says {info.rows}"
        )
    columns, block = stack_dense(
        [hold_column(table, column, rows) for column in manifest.features], rows
    )
    labels = _labels(table, manifest)
    logger.debug("read %s partition %d: %d rows, %d bytes", split, index, rows, len(data))
    return PartitionData(split, index, columns, labels, len(data), dense_block=block)


def damaged_partitions(dataset: Store, manifest: Manifest, *, verify: bool = False) -> list[str]:
    """Return the partition files of a dataset that must be written again, sorted.

    A file is damaged when it is missing or its size differs from the manifest's (a
    writer or a copy cut short: a truncated Parquet file); with ``verify`` also when its
    SHA-256 differs (each file is then read whole). A complete dataset gives ``[]``;
    preparing the same data again rewrites it when anything is listed.

    Args:
        dataset: The dataset directory's store.
        manifest: Its manifest.
        verify: Also compare every file's SHA-256 with the manifest's.

    Returns:
        The damaged files' paths relative to ``dataset``.
    """
    listed = set(dataset.list())
    damaged = {part.path for part in manifest.partitions if part.path not in listed}
    present = [part for part in manifest.partitions if part.path not in damaged]
    filesystem = getattr(dataset, "filesystem", None)
    path_of = getattr(dataset, "path", None)
    if filesystem is not None and path_of is not None and present:
        infos = filesystem.get_file_info([path_of(part.path) for part in present])
        damaged |= {
            part.path for part, info in zip(present, infos, strict=True) if info.size != part.bytes
        }
    elif present:  # a store without file sizes: read the files to size them
        verify = True
    if verify:
        for part in present:
            if part.path in damaged:
                continue
            data = dataset.get(part.path)
            if len(data) != part.bytes or hashlib.sha256(data).hexdigest() != part.sha256:
                damaged.add(part.path)
    for path in sorted(damaged):
        logger.warning("partition file %s is missing or damaged", dataset.url(path))
    return sorted(damaged)
