"""The Spark prepare path: :func:`prepare_with_spark` (``jobs/prepare.py``, ``prepare``).

Design's data flow, step 1: a Spark DataFrame, a table or a path (Parquet, CSV, JSON; Delta
when ``delta-spark`` is installed) becomes the same prepared dataset the plain-Python
:func:`~cerebro_spark.data.prepare_dataset` writes for the same rows: the same dataset id
and byte-identical partition files (and manifest, given the same ``source`` text). The
data is read, checked, normalised and written by Spark tasks; the driver only sees
counts, class values, categorical vocabularies, per-chunk facts and file hashes.

Pipeline (each step a Spark job; nothing is visible in the store until the commit):

0. **Feature kinds** (:class:`~cerebro_spark.data.KindOptions`), decided on the driver
   from the Spark schema as :func:`~cerebro_spark.data._writer.column_kind` decides them
   from the data: a kind named in ``kinds`` wins; ``binary`` is ``image`` when a sample of
   16 non-null values (one small job) carries JPEG/PNG magic, else refused with the plain
   writer's message; Spark's image struct is ``image``; ``string`` is ``categorical``; a
   one-level array of integers is ``sequence`` when its lengths differ (the checks'
   min/max length), else ``array``; numbers and other arrays are ``number``/``array``.
1. **Checks** (one Spark aggregation; the classes by ``collect_set`` in it): row count,
   nulls per column and per nesting depth, array lengths per depth (ragged arrays are
   listed by a second query only when they occur), NaN and infinite counts (after the
   ``float32`` conversion the plain writer checks them in; integer dtypes have none),
   label classes, validation-flag count, and per categorical column its nulls and
   distinct values. Errors are the plain writer's :class:`~cerebro_spark.errors.DataError`
   messages (:mod:`cerebro_spark.data._validate`), raised before anything is written.
   Number/array columns keep their dtype as the plain writer keeps it (``tinyint`` ->
   ``int8``, ``smallint`` -> ``int16``, else ``float32``; a local Parquet input's
   ``uint8`` columns, which Spark reads as ``smallint``, are cast back to ``uint8``).
   Then one job per categorical column (``groupBy().count()``, the ``vocabulary_limit``
   most frequent values) gives its vocabulary and statistics, and, with image or
   sequence columns, one job counts the rows of each Spark partition, so that every chunk
   knows its first row in input order (messages name the plain writer's row numbers).
2. **Staging**: ``mapInArrow`` tasks normalise their rows with the plain writer's own
   functions (dense columns in their dtype, images, category ids through the shipped
   vocabulary and sequences by the kind encoders of :mod:`cerebro_spark.data._kinds`,
   class indices) and report each chunk's image and sequence facts, which the driver
   merges in input order (:func:`~cerebro_spark.data._kinds.merge_facts`: images of
   several sizes without ``image_size`` raise the plain writer's error here); compute each row's
   seeded content-hash key (:mod:`cerebro_spark.data._row_order`) and write the rows with
   their keys as *chunks* (up to 64 MiB of one Spark partition) under a temporary prefix
   ``<store>/datasets/.prepare-<uuid>/``. Each chunk reports its row count, its rows per
   key *bucket* and two 64-bit id sums. There is no serial step: the driver adds the
   sums up (the dataset id, the plain writer's) and plans, from the bucket counts alone,
   each partition's rank range and the buckets that hold it.
3. **Reuse**: a complete dataset ``<store>/datasets/<id>/`` (manifest present, every file
   listed) is returned as it is; nothing in it is rewritten. The id depends on all the
   data, so a reused dataset still costs steps 1-2; only the shuffle and the writes are
   skipped.
4. **Shuffle and write**: tasks route every chunk's rows (as Arrow IPC pieces) to the
   partitions whose bucket range holds them (a boundary bucket goes to both sides) with
   ``repartitionById`` (min(2 * P, default parallelism) write tasks, each receiving whole
   partitions, grouped); a task checks it got every row of its buckets, sorts them by
   ``(key, row bytes)``, keeps its own ranks and writes the Parquet file with
   :func:`~cerebro_spark.data.encode_partition` through pyarrow, straight to the store's
   file system (``s3://...?endpoint_override=...`` works without ``hadoop-aws``). A train
   partition's task also returns its per-feature moments and its images' pixel moments,
   which the driver folds in partition order into the manifest's statistics and the
   image columns' statistics, as the plain writer does.
5. **Commit**: the manifest is written last. Local disk: the manifest goes into the
   temporary dataset directory, which is then renamed to ``datasets/<id>`` in one step
   (or, when that directory exists, every file is moved over it and the manifest comes
   last). Object stores: each file is copied to ``datasets/<id>/``, then the manifest is
   written. The temporary prefix is deleted on success and on failure; a dataset
   directory without ``manifest.json`` is invisible to the reader and to reuse.

**What "same input" means.** Since format 2 a dataset depends only on the *multiset* of
its normalised rows (and the parameters): rows are ordered by a seeded hash of their
content, so input order, file layout and partitioning (a DataFrame after an unsorted
shuffle included) change nothing. ``order`` (``"input"`` or ``"sorted"``) is still
accepted for compatibility; both give the same dataset.

**Known differences from the plain writer** (errors only, never the dataset): an error
found inside a staging task (a null image, a bad token id ...) is the one of whichever
task fails first, not necessarily of the first bad row; a sequence column's null-row count
in its message is that of one chunk; a binary column whose first 16 non-null values (in
Spark's order) are images but a later one is not fails in staging on that row instead.

Every read is checked against the others (row counts, classes, rows per bucket): an input
that changes between reads raises :class:`DataError` instead of writing a wrong dataset.

Executors need ``cerebro-spark`` installed and, for S3, credentials in their environment
(``spark.executorEnv.AWS_ACCESS_KEY_ID`` ...; in local mode they inherit the driver's).
The RDD API is not used; the path runs on classic Spark (it uses ``sparkContext`` only to
name its jobs, when there is one).

pyspark is imported only inside functions, so this module imports without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.util
import json
import logging
import math
import os
import re
import time
import urllib.parse
import uuid
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.ipc as paipc

from cerebro_spark.data import _kinds as kd
from cerebro_spark.data import _row_order as ro
from cerebro_spark.data import _statistics as st
from cerebro_spark.data import _validate as v
from cerebro_spark.data import _writer as w
from cerebro_spark.data._format import (
    DENSE_DTYPES,
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
from cerebro_spark.data._vectors import spark_vector_array
from cerebro_spark.errors import CerebroError, ConfigError, DataError, StoreError
from cerebro_spark.spark_session import spark_session
from cerebro_spark.store import FileSystemStore, Store, open_store

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType

logger = logging.getLogger(__name__)

#: How rows are ordered before the shuffle (see the module docstring).
Order = Literal["input", "sorted"]

#: File formats :func:`prepare_with_spark` reads (``"delta"`` needs ``delta-spark``).
FILE_FORMATS: tuple[str, ...] = ("parquet", "csv", "json", "delta")

_SUFFIXES: dict[str, str] = {
    ".parquet": "parquet",
    ".parq": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
}
_CSV_DEFAULTS: dict[str, str] = {"header": "true", "inferSchema": "true"}
_KEY_COL = "__cerebro_key"
_TMP_PREFIX = ".prepare-"
_PIECE_BYTES = 8 << 20
#: ``float64`` magnitudes at or above this become infinite as ``float32`` (round to even).
_FLOAT32_OVERFLOW = 2.0**128 - 2.0**103
_CHUNK_BYTES = 64 << 20
_TABLE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*){0,2}")
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)): (.*)$")

_T = TypeVar("_T")


# -- plans shipped to tasks (small, picklable) -------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _StagePlan:
    """What a staging task needs: how to normalise, hash and where to put its chunks."""

    tmp_uri: str
    env: Mapping[str, str]
    features: tuple[str, ...]
    hints: Mapping[str, tuple[int, ...]]
    shapes: Mapping[str, tuple[int, ...]]
    label: str
    task: Task
    classes: pa.Array | None
    validation_column: str | None
    schema: pa.Schema
    seed: int
    bucket_bits: int
    kinds: Mapping[str, str] = dataclasses.field(default_factory=dict)
    options: KindOptions = dataclasses.field(default_factory=KindOptions)
    vocabularies: Mapping[str, tuple[tuple[Any, ...], int]] = dataclasses.field(
        default_factory=dict
    )
    offsets: Mapping[int, int] = dataclasses.field(default_factory=dict)
    narrow: Mapping[str, pa.DataType] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class _Chunk:
    """One staged chunk of ``rows`` rows."""

    name: str
    rows: int


@dataclasses.dataclass(frozen=True)
class _WritePlan:
    """What the routing and writing tasks need."""

    tmp_uri: str
    env: Mapping[str, str]
    chunks: tuple[_Chunk, ...]
    schema: pa.Schema
    num_partitions: int
    validation_column: str | None
    bucket_bits: int
    destinations: tuple[ro.Destination, ...]
    statistics_of: tuple[ColumnInfo, ...] = ()
    images: tuple[ColumnInfo, ...] = ()


@dataclasses.dataclass(frozen=True)
class _Checked:
    """Result of the checks: everything the dataset id needs except the data."""

    rows: int
    features: tuple[ColumnInfo, ...]
    inferred_shapes: Mapping[str, tuple[int, ...]]
    label: ColumnInfo
    task: Task
    classes: pa.Array | None
    n_val: int
    kinds: Mapping[str, str] = dataclasses.field(default_factory=dict)
    distinct: Mapping[str, int] = dataclasses.field(default_factory=dict)


# -- small helpers ----------------------------------------------------------------------------


def _require_pyspark() -> None:
    if importlib.util.find_spec("pyspark") is None:
        raise ConfigError(
            "prepare_with_spark needs pyspark (pip install 'cerebro-spark[spark]'); "
            "without it use prepare_dataset (the plain-Python writer)"
        )


def _require_delta() -> None:
    if importlib.util.find_spec("delta") is None:
        raise ConfigError(
            "reading a Delta table needs the delta-spark package (pip install delta-spark, "
            "the release matching your Spark) and a session configured with "
            "spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension and "
            "spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog"
        )


def _task_error(exc: BaseException) -> str:
    """Return the last ``SomeError: message`` line of a (Spark task) exception's text."""
    found = ""
    for line in str(exc).splitlines():
        match = _EXCEPTION_LINE.match(line.strip())
        if match:
            found = line.strip()
    return found


def _run_job(spark: SparkSession, description: str, action: Callable[[], _T]) -> _T:
    """Run a Spark action; turn a failed task into a clear :class:`CerebroError`.

    A :class:`DataError` raised in a task stays a :class:`DataError` (message kept);
    anything else becomes a :class:`StoreError` naming the step and the task's error.
    """
    context = None
    with contextlib.suppress(Exception):  # Spark Connect has no SparkContext
        context = spark.sparkContext
        context.setJobDescription(f"cerebro-spark prepare: {description}")
    started = time.perf_counter()
    try:
        result = action()
    except CerebroError:
        raise
    except Exception as exc:
        line = _task_error(exc)
        if line.split(":", 1)[0].rsplit(".", 1)[-1] == "DataError":
            raise DataError(line.split(": ", 1)[1]) from exc
        detail = line or f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        raise StoreError(f"prepare step {description!r} failed in Spark: {detail}") from exc
    finally:
        if context is not None:
            context.setJobDescription(None)  # type: ignore[arg-type]
    logger.info("prepare: %s took %.2f s", description, time.perf_counter() - started)
    return result


def _fs_store(store: Store) -> FileSystemStore:
    if not isinstance(store, FileSystemStore):
        raise ConfigError(
            f"prepare_with_spark writes with pyarrow and needs a FileSystemStore (a local "
            f"path, file://, s3:// ... URI), got {type(store).__name__}"
        )
    return store


def _task_store(uri: str, env: Mapping[str, str]) -> FileSystemStore:
    """In a task: apply the forwarded environment, then open the store at ``uri``."""
    for key, value in env.items():
        if os.environ.get(key) != value:
            os.environ[key] = value
    return _fs_store(open_store(uri))


def _task_env(session: SparkSession, given: Mapping[str, str] | None) -> dict[str, str]:
    """The environment forwarded to tasks: the driver's ``AWS_*`` in local mode, + ``given``."""
    env: dict[str, str] = {}
    master = ""
    with contextlib.suppress(Exception):
        master = str(session.conf.get("spark.master", ""))
    if master.startswith("local"):
        env.update({k: val for k, val in os.environ.items() if k.startswith("AWS_")})
    env.update(given or {})
    return env


def _is_local(store: FileSystemStore) -> bool:
    return isinstance(store.filesystem, pafs.LocalFileSystem)


# -- input ------------------------------------------------------------------------------------


def _path_format(path: str, given: str | None) -> str:
    """Return the file format of ``path`` (given, or from its name or contents)."""
    if given is not None:
        fmt = given.lower()
        if fmt not in FILE_FORMATS:
            raise ConfigError(
                f"format must be one of {', '.join(FILE_FORMATS)} or 'table', got {given!r}"
            )
        return fmt
    local = _local_path(path)
    if local is not None and os.path.isdir(local):
        if os.path.isdir(os.path.join(local, "_delta_log")):
            return "delta"
        names: list[str] = []
        for folder, dirs, files in os.walk(local):
            dirs[:] = [name for name in dirs if not name.startswith(("_", "."))]
            names += [os.path.join(folder, f) for f in files if not f.startswith(("_", "."))]
        names.sort()
        if not names:
            raise DataError(f"directory {path} holds no data files")
        path = names[0]
    for suffix, fmt in _SUFFIXES.items():
        if path.lower().endswith(suffix):
            return fmt
    raise ConfigError(
        f"cannot tell the format of {path!r} from its name (known endings: "
        f"{', '.join(_SUFFIXES)}); pass format= one of {', '.join(FILE_FORMATS)}"
    )


def _local_path(path: str) -> str | None:
    """Return the local path ``path`` names (plain path or ``file:`` URI), else ``None``."""
    if "://" not in path and not path.startswith("file:"):
        return os.path.abspath(path)
    parts = urllib.parse.urlsplit(path)
    if parts.scheme == "file":
        return os.path.abspath(urllib.parse.unquote(parts.path))
    return None


def _read_path(
    spark: SparkSession, path: str, fmt: str | None, options: Mapping[str, str]
) -> DataFrame:
    local = _local_path(path)
    if local is None:
        if "?" in path:
            raise ConfigError(
                f"Spark cannot read {path!r}: its query options are pyarrow's (stores take "
                "them, Spark's readers do not); give Spark a path it can read (local, "
                "hdfs://, s3a:// with hadoop-aws), or use the plain-Python engine"
            )
        target = path
    else:
        if not os.path.exists(local):
            raise FileNotFoundError(f"no file or directory at {path}")
        target = local
    fmt = _path_format(path, fmt)
    if fmt == "delta":
        _require_delta()
    settings = dict(_CSV_DEFAULTS) if fmt == "csv" else {}
    settings.update(options)
    try:
        return spark.read.format(fmt).options(**settings).load(target)
    except Exception as exc:
        if fmt == "delta":
            raise ConfigError(
                f"cannot read the Delta table at {path}: {exc}; is the session configured "
                "for Delta (io.delta.sql.DeltaSparkSessionExtension)?"
            ) from exc
        raise DataError(f"Spark cannot read {fmt} data at {path}: {exc}") from exc


def load_frame(
    spark: SparkSession,
    data: DataFrame | str,
    fmt: str | None,
    options: Mapping[str, str],
) -> tuple[DataFrame, str]:
    """Return ``(frame, description)`` for the input."""
    from pyspark.sql import DataFrame

    if isinstance(data, DataFrame):
        if fmt is not None:
            raise ConfigError(f"format={fmt!r} is for a path or a table name, not a DataFrame")
        return data, "spark DataFrame"
    if not isinstance(data, str) or not data:
        raise ConfigError(
            "data must be a Spark DataFrame, a table name or a path, got "
            f"{type(data).__name__} {data!r}"
        )
    is_table = fmt == "table" or (
        fmt is None
        and _TABLE_NAME.fullmatch(data) is not None
        and not os.path.exists(data)
        and _table_exists(spark, data)
    )
    if is_table:
        if not _table_exists(spark, data):
            raise DataError(f"no table named {data!r} in the Spark catalog")
        return spark.table(data), f"table {data}"
    return _read_path(spark, data, fmt, options), data


def _table_exists(spark: SparkSession, name: str) -> bool:
    try:
        return bool(spark.catalog.tableExists(name))
    except Exception as exc:  # a name Spark cannot parse
        logger.debug("%r is not a table name: %s", name, exc)
        return False


def _col(name: str) -> Column:
    """A reference to column ``name`` (dots and backticks taken literally)."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _spark_type_name(data_type: DataType) -> str:
    return str(data_type.simpleString())


def _arrow_type(name: str, data_type: DataType, role: str) -> pa.DataType:
    from pyspark.sql.pandas.types import to_arrow_type

    try:
        return to_arrow_type(data_type)
    except Exception as exc:
        raise DataError(
            f"{role} {name!r} has Spark type {_spark_type_name(data_type)}, which has no Arrow "
            "equivalent; features must be numbers, arrays of numbers or ML vectors, a label "
            "integer, boolean, string or floating point"
        ) from exc


# -- checks (Spark aggregations) --------------------------------------------------------------


def _array_depth(data_type: DataType) -> tuple[int, DataType]:
    from pyspark.sql.types import ArrayType

    depth = 0
    while isinstance(data_type, ArrayType):
        data_type = data_type.elementType
        depth += 1
    return depth, data_type


def _levels(column: Column, depth: int) -> list[Column]:
    """``levels[d]``: per row, the arrays whose elements sit at nesting depth ``d + 1``."""
    from pyspark.sql import functions as F

    levels = [column]
    for _ in range(1, depth):
        levels.append(F.flatten(levels[-1]))
    return levels


def _count(expr: Column) -> Column:
    from pyspark.sql import functions as F

    return F.coalesce(F.sum(F.coalesce(expr, F.lit(0))), F.lit(0))


class _Aggs:
    """Named aggregate expressions, evaluated in one Spark job."""

    def __init__(self) -> None:
        self.exprs: list[Column] = []
        self.names: list[str] = []

    def add(self, key: str, expr: Column) -> None:
        self.names.append(key)
        self.exprs.append(expr.alias(f"a{len(self.exprs)}"))

    def run(self, frame: DataFrame) -> dict[str, Any]:
        row = frame.agg(*self.exprs).collect()[0]
        return {key: row[index] for index, key in enumerate(self.names)}


def _float_threshold(element: DataType, cast_to_float32: bool) -> float | None:
    """Magnitude from which a value counts as infinite; ``None`` for non-floating types."""
    from pyspark.sql.types import DoubleType, FloatType

    if isinstance(element, FloatType):
        return math.inf
    if isinstance(element, DoubleType):
        return _FLOAT32_OVERFLOW if cast_to_float32 else math.inf
    return None


def _add_finite(aggs: _Aggs, key: str, flat: Column, depth: int, threshold: float) -> None:
    from pyspark.sql import functions as F

    limit = F.lit(threshold)

    def infinite(x: Column) -> Column:  # Spark orders NaN above every number: exclude it
        return ~F.isnan(x) & (F.abs(x) >= limit)

    if depth:
        aggs.add(f"{key}:nan", _count(F.size(F.filter(flat, lambda x: F.isnan(x)))))
        aggs.add(f"{key}:inf", _count(F.size(F.filter(flat, infinite))))
    else:
        aggs.add(f"{key}:nan", F.count_if(F.isnan(flat)))
        aggs.add(f"{key}:inf", F.count_if(infinite(flat)))


def _add_feature_aggs(aggs: _Aggs, name: str, column: Column, data_type: DataType) -> None:
    from pyspark.sql import functions as F

    depth, element = _array_depth(data_type)
    aggs.add(f"{name}:nulls", F.count_if(column.isNull()))
    levels = _levels(column, depth)
    for d in range(1, depth + 1):
        aggs.add(f"{name}:nulls{d}", _count(F.size(F.filter(levels[d - 1], lambda x: x.isNull()))))
    for d in range(depth):
        if d == 0:
            lengths = F.when(column.isNotNull(), F.size(column))
            aggs.add(f"{name}:min0", F.min(lengths))
            aggs.add(f"{name}:max0", F.max(lengths))
        else:
            sizes = F.transform(levels[d - 1], lambda x: F.size(x))
            aggs.add(f"{name}:min{d}", F.min(F.array_min(sizes)))
            aggs.add(f"{name}:max{d}", F.max(F.array_max(sizes)))
    threshold = _float_threshold(element, cast_to_float32=True)
    if threshold is not None:
        _add_finite(aggs, name, levels[-1] if depth else column, depth, threshold)


def _distinct_lengths(frame: DataFrame, column: Column, depth: int) -> list[int]:
    """The distinct array lengths at nesting ``depth`` (only run to report ragged arrays)."""
    from pyspark.sql import functions as F

    if depth == 0:
        lengths = frame.where(column.isNotNull()).select(F.size(column).alias("n"))
    else:
        level = _levels(column, depth)[depth - 1]
        lengths = frame.select(F.explode(F.transform(level, lambda x: F.size(x))).alias("n"))
    return sorted(int(row["n"]) for row in lengths.distinct().limit(1000).collect())


def _dense_dtype(element: pa.DataType) -> str:
    """The stored dtype of a number/array column whose elements arrive as ``element``."""
    return str(np.dtype(w.dense_type(pa.array([], type=element)).to_pandas_dtype()).name)


def _check_feature(
    frame: DataFrame,
    name: str,
    column: Column,
    data_type: DataType,
    stats: Mapping[str, Any],
    rows: int,
    hint: Sequence[int] | None,
    narrow: pa.DataType | None = None,
) -> tuple[ColumnInfo, tuple[int, ...]]:
    """Raise the plain writer's errors for one feature; return its info and inferred shape.

    ``narrow``: the element type the staging tasks cast to first (a Parquet ``uint8`` that
    Spark reads as ``smallint``), else ``None``.
    """
    depth, element = _array_depth(data_type)
    v.check_null_count(name, int(stats[f"{name}:nulls"]), rows, "feature column")
    for d in range(1, depth + 1):
        v.check_null_elements(name, int(stats[f"{name}:nulls{d}"]), d, "feature column")
    shape: list[int] = []
    for d in range(depth):
        low, high = stats[f"{name}:min{d}"], stats[f"{name}:max{d}"]
        if low != high:
            v.check_lengths(name, _distinct_lengths(frame, column, d), d)
            raise DataError(  # not reached: the lengths differ
                f"feature column {name!r} has arrays of different lengths: {low} to {high}"
            )
        if not low:
            raise DataError(f"feature column {name!r} holds empty arrays")
        shape.append(int(low))
    inferred = tuple(shape)
    final = v.check_shape_hint(name, inferred, hint) if hint is not None else inferred
    if _float_threshold(element, cast_to_float32=True) is not None:
        values = rows * math.prod(inferred)
        v.check_finite_counts(
            name, int(stats[f"{name}:nan"]), int(stats[f"{name}:inf"]), values, "feature column"
        )
    dtype = _dense_dtype(narrow or _arrow_type(name, element, "feature column"))
    kind = "array" if final else "number"
    return ColumnInfo(name, dtype, final, kind=kind), inferred


#: A one-level list of integers not named in the kind options: a ``sequence`` when its
#: lengths differ (the checks' min/max length per row tell), else an ``array``.
_MAYBE_SEQUENCE = "array or sequence"


def _check_kind_type(name: str, kind: str, arrow_type: pa.DataType, options: KindOptions) -> None:
    """Raise the plain writer's error when a column's type cannot be of ``kind``."""
    empty = pa.array([], type=arrow_type)
    if kind == "image":
        kd.image_column(name, empty, size=options.image_size, channels=options.image_channels)
    elif kind == "categorical":
        kd.category_values(name, empty)
    elif kind == "sequence":
        kd.sequence_column(name, empty, max_length=options.max_length)


def _decide_kind(frame: DataFrame, name: str, data_type: DataType, options: KindOptions) -> str:
    """A feature's kind from the Spark schema, as :func:`~cerebro_spark.data._writer.column_kind`.

    Named kinds win; a binary column is read as images when a sample of 16 of its
    non-null values carries JPEG/PNG magic (one small Spark job); a one-level list of
    integers may be a sequence (:data:`_MAYBE_SEQUENCE`, decided by the checks).
    """
    from pyspark.sql.types import IntegralType

    arrow_type = _arrow_type(name, data_type, "feature column")
    named = options.named().get(name)
    if named is not None:
        _check_kind_type(name, named, arrow_type, options)
        return named
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        column = _col(name)
        sample = frame.select(column).where(column.isNotNull()).limit(16).toArrow()
        kind = kd.infer_kind(name, arrow_type, sample.column(0))
    else:
        kind = kd.infer_kind(name, arrow_type)
    depth, element = _array_depth(data_type)
    if kind == "array" and depth == 1 and isinstance(element, IntegralType):
        return _MAYBE_SEQUENCE
    if kind not in ("number", "array"):
        _check_kind_type(name, kind, arrow_type, options)
        logger.info("feature column %r (%s) is read as %s", name, arrow_type, kind)
    return kind


def _categorical_nulls(name: str, nulls: int, rows: int) -> None:
    """Raise :func:`~cerebro_spark.data._kinds.category_values`'s error for nulls."""
    if nulls:
        raise DataError(
            f"categorical column {name!r} has {nulls} null values of {rows} "
            "rows; nulls are not allowed: fill them with a value of their own (e.g. 'missing')"
        )


def _check(
    frame: DataFrame,
    *,
    features: Sequence[str],
    label: str,
    num_partitions: int,
    validation_fraction: float,
    validation_column: str | None,
    task: Task | None,
    hints: Mapping[str, Sequence[int]],
    options: KindOptions | None = None,
    narrow: Mapping[str, pa.DataType] | None = None,
) -> _Checked:
    """Check the selected columns with Spark aggregations, in the plain writer's order."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType

    options = options or KindOptions()
    narrow = narrow or {}
    types = {field.name: field.dataType for field in frame.schema.fields}
    kinds = {name: _decide_kind(frame, name, types[name], options) for name in features}
    for name in features:
        if kinds[name] in ("number", "array"):
            v.check_feature_type(name, _arrow_type(name, types[name], "feature column"))
    label_type = _arrow_type(label, types[label], "label column")
    if pa.types.is_decimal(label_type):
        label_type = pa.float64()
    resolved: Task = task if task is not None else v.infer_task(label, label_type)
    v.check_label_type(label, label_type, resolved)
    if validation_column is not None and not isinstance(types[validation_column], BooleanType):
        raise DataError(
            f"validation_column {validation_column!r} has type "
            f"{_arrow_type(validation_column, types[validation_column], 'validation_column')}; "
            "it must be boolean (true = validation row)"
        )

    aggs = _Aggs()
    aggs.add("rows", F.count(F.lit(1)))
    for name in features:
        if kinds[name] in ("number", "array", _MAYBE_SEQUENCE):
            _add_feature_aggs(aggs, name, _col(name), types[name])
        elif kinds[name] == "categorical":
            aggs.add(f"{name}:nulls", F.count_if(_col(name).isNull()))
            aggs.add(f"{name}:distinct", F.count_distinct(_col(name)))
    label_col = _col(label)
    aggs.add("label:nulls", F.count_if(label_col.isNull()))
    threshold = _float_threshold(_array_depth(types[label])[1], resolved == "regression")
    if threshold is not None:
        _add_finite(aggs, "label", label_col, 0, threshold)
    if resolved == "classification":
        aggs.add("label:classes", F.collect_set(label_col))
    if validation_column is not None:
        flag = _col(validation_column)
        aggs.add("val:nulls", F.count_if(flag.isNull()))
        aggs.add("val:true", F.count_if(flag))
    stats = aggs.run(frame)

    rows = int(stats["rows"])
    v.check_total_rows(rows, num_partitions)
    infos: list[ColumnInfo] = []
    inferred: dict[str, tuple[int, ...]] = {}
    distinct: dict[str, int] = {}
    for name in features:
        kind = kinds[name]
        if kind == _MAYBE_SEQUENCE:
            low, high = stats[f"{name}:min0"], stats[f"{name}:max0"]
            kind = "sequence" if low is not None and low != high else "array"
            if kind == "sequence":
                arrow_type = _arrow_type(name, types[name], "feature column")
                _check_kind_type(name, kind, arrow_type, options)
                logger.info("feature column %r (%s) is read as %s", name, arrow_type, kind)
            kinds[name] = kind
        if kind in ("number", "array"):
            info, shape = _check_feature(
                frame, name, _col(name), types[name], stats, rows, hints.get(name), narrow.get(name)
            )
            infos.append(info)
            inferred[name] = shape
            continue
        if hints.get(name) is not None:
            raise DataError(
                f"feature_shapes gives a shape for {kind} column {name!r}; only "
                "number and array columns take one"
            )
        if kind == "categorical":
            _categorical_nulls(name, int(stats[f"{name}:nulls"]), rows)
            distinct[name] = int(stats[f"{name}:distinct"])
        infos.append(ColumnInfo(name, "", kind=kind))  # completed after staging
    v.check_null_count(label, int(stats["label:nulls"]), rows, "label column")
    if threshold is not None:
        v.check_finite_counts(
            label, int(stats["label:nan"]), int(stats["label:inf"]), rows, "label column"
        )
    classes = None
    if resolved == "classification":
        raw = pa.array(list(stats["label:classes"]), type=_arrow_type(label, types[label], ""))
        classes = w.sorted_classes(w.label_input(raw))
        v.check_classes(label, classes.to_pylist())
        label_info = ColumnInfo(label, "int64")
    else:
        label_info = ColumnInfo(label, "float32")
    count = None
    if validation_column is not None:
        v.check_null_count(validation_column, int(stats["val:nulls"]), rows, "validation_column")
        count = int(stats["val:true"])
    n_val = w.validation_rows(rows, count, validation_fraction, num_partitions)
    return _Checked(
        rows, tuple(infos), inferred, label_info, resolved, classes, n_val, kinds, distinct
    )


def _vocabulary(
    frame: DataFrame,
    name: str,
    data_type: DataType,
    rows: int,
    distinct: int,
    options: KindOptions,
) -> tuple[tuple[Any, ...], int, dict[str, Any]]:
    """A categorical column's vocabulary, hash buckets and statistics, from Spark counts.

    One Spark job: the ``vocabulary_limit`` most frequent values (``groupBy().count()``,
    ordered by descending count, then ascending value: Spark's string order is the code
    point order Python sorts by). The distinct count comes from the checks, the rows
    beyond the vocabulary are the rest of the rows: the numbers of
    :func:`~cerebro_spark.data._writer.column_vocabulary`, without collecting every value.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    column = _col(name)
    value = column if isinstance(data_type, StringType) else column.cast("long")
    counts = frame.groupBy(value.alias("value")).count()
    top = counts.orderBy(F.desc("count"), F.asc("value")).limit(options.vocabulary_limit)
    found = {row["value"]: int(row["count"]) for row in top.collect()}
    # At most `limit` values: the same ranking and checks, nothing beyond it to log.
    words, _ = kd.build_vocabulary(
        name, found, limit=options.vocabulary_limit, hash_buckets=options.hash_buckets
    )
    beyond = distinct > len(words)
    buckets = options.hash_buckets if beyond else 0
    rest = rows - sum(found.values())
    if beyond:
        logger.info(
            "categorical column %r: %d values (%d rows) beyond the vocabulary of %d %s",
            name,
            distinct - len(words),
            rest,
            len(words),
            f"share {buckets} hash buckets" if buckets else "map to the unknown id 0",
        )
    statistics = {
        "rows": rows,
        "distinct": distinct,
        "unknown": 0 if buckets else rest,
        "hashed": rest if buckets else 0,
    }
    return words, buckets, statistics


# -- tasks ------------------------------------------------------------------------------------


class _SizeMismatch(Exception):
    """A chunk's images have several sizes: the facts of its first two runs of one size."""

    def __init__(self, name: str, runs: list[kd.ImageFacts]) -> None:
        super().__init__(name)
        self.name = name
        self.runs = runs


def _image_runs(
    name: str, column: pa.ChunkedArray, options: KindOptions, first_row: int
) -> list[kd.ImageFacts]:
    """The facts of the first two runs of one image size in a chunk (row by row).

    Only called when the whole chunk failed; raises the row's own error (a null, a bad
    image) if one comes before the size changes, as the plain writer would.
    """
    size, channels = options.image_size, options.image_channels
    current: kd.ImageFacts | None = None
    for i in range(len(column)):
        _, facts = kd.image_column(
            name, column.slice(i, 1), size=size, channels=channels, first_row=first_row + i
        )
        if current is not None and facts.shape[1:] != current.shape[1:]:
            return [current, facts]
        current = facts if current is None else kd.merge_facts(name, current, facts)
    return [] if current is None else [current]


def _normalize_chunk(
    table: pa.Table, plan: _StagePlan, first_row: int = 0
) -> tuple[pa.Table, dict[str, Any]]:
    """Normalise one chunk exactly as the plain writer normalises a table.

    Returns the chunk and its facts, JSON-ready: ``{"image": {column: [facts]},
    "sequence": {column: facts}}``.

    Raises:
        _SizeMismatch: The chunk's images have several sizes (and no ``image_size``).
    """
    arrays: list[pa.Array] = []
    facts: dict[str, dict[str, Any]] = {"image": {}, "sequence": {}}
    for name in plan.features:
        kind = plan.kinds.get(name, "number")
        column = table.column(name)
        if kind in ("number", "array"):
            if name in plan.narrow:
                column = column.cast(_with_element(column.type, plan.narrow[name]))
            array, _ = w.feature_column(name, column, plan.shapes[name], plan.hints.get(name))
        elif kind == "categorical":
            array, _ = w.kind_column(
                name, column, kind, plan.options, vocabulary=plan.vocabularies[name]
            )
        elif kind == "image":
            try:
                array, info = w.kind_column(name, column, kind, plan.options, first_row=first_row)
            except DataError:
                if plan.options.image_size is not None:
                    raise
                runs = _image_runs(name, column, plan.options, first_row)
                if len(runs) < 2:
                    raise
                raise _SizeMismatch(name, runs) from None
            shape = [int(d) for d in info.shape]
            facts["image"][name] = [[info.encoding or "", shape, first_row]]
        else:
            array, seq = kd.sequence_column(
                name, column, max_length=plan.options.max_length, first_row=first_row
            )
            facts["sequence"][name] = dataclasses.asdict(seq)
        arrays.append(array)
    labels = w.label_input(table.column(plan.label))
    v.check_no_nulls(plan.label, labels, "label column")
    classes = None if plan.classes is None else plan.classes.cast(labels.type)
    encoded = w.encode_label(labels, plan.task, classes)
    if encoded.null_count:
        raise DataError(
            f"label column {plan.label!r} has values that the class scan did not see: the "
            "input changed between two reads; make it deterministic (e.g. write it to a "
            "table first) and prepare again"
        )
    if plan.task == "regression":
        v.check_finite(plan.label, encoded, "label column")
    arrays.append(encoded)
    if plan.validation_column is not None:
        flags = v.as_array(table.column(plan.validation_column))
        v.check_no_nulls(plan.validation_column, flags, "validation_column")
        arrays.append(flags)
    return pa.Table.from_arrays(arrays, schema=plan.schema), facts


def _with_element(arrow_type: pa.DataType, element: pa.DataType) -> pa.DataType:
    """``arrow_type`` (a number or nested lists of numbers) with its numbers of ``element``."""
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        inner = _with_element(arrow_type.value_type, element)
        return pa.list_(inner) if pa.types.is_list(arrow_type) else pa.large_list(inner)
    return element


def _encode_staging(table: pa.Table) -> bytes:
    """A staged chunk as an uncompressed Arrow IPC file (read back column by column).

    Not Parquet: the staging files live for one prepare, and encoding and compressing
    them (features rarely compress) cost more than the bytes they save.
    """
    sink = pa.BufferOutputStream()
    with paipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    data: bytes = sink.getvalue().to_pybytes()
    return data


def _flags(table: pa.Table, validation_column: str | None) -> np.ndarray | None:
    """The validation flags of a staged table, or ``None`` without a validation column."""
    if validation_column is None:
        return None
    return np.asarray(table.column(validation_column).to_numpy(), dtype=bool)


def _signed(value: int) -> int:
    """A 64-bit unsigned value as Spark's signed ``long``."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _stage(batches: Iterator[pa.RecordBatch], plan: _StagePlan) -> Iterator[pa.RecordBatch]:
    """Staging task: normalise and hash this partition's rows and write them as chunks.

    A chunk (an Arrow IPC file) holds at most about :data:`_CHUNK_BYTES` of input rows of
    this partition plus each row's order key; it is named after its position (partition,
    sequence number) so a retried task rewrites the same chunks. Each chunk's result row
    carries its row count, its bucket counts per group (zlib-compressed ``int64``) and its
    id sums.
    """
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    store: FileSystemStore | None = None
    groups = 1 if plan.validation_column is None else 2
    results: list[tuple[str, int, bytes, int, int, int, int, str]] = []
    pending: list[pa.RecordBatch] = []
    pending_bytes = 0
    first_row = plan.offsets.get(partition, 0)

    def flush() -> None:
        nonlocal store, pending, pending_bytes, first_row
        if not pending:
            return
        sequence = len(results)
        name = hashlib.sha256(f"partition {partition}\n{sequence}".encode()).hexdigest()[:32]
        rows = sum(batch.num_rows for batch in pending)
        try:
            chunk, facts = _normalize_chunk(pa.Table.from_batches(pending), plan, first_row)
        except _SizeMismatch as mismatch:  # the driver merges the facts: the plain error
            runs = [[f.encoding, list(f.shape), f.first_row] for f in mismatch.runs]
            facts = {"image": {mismatch.name: runs}, "sequence": {}, "failed": True}
            results.append((name, 0, b"", 0, 0, partition, sequence, json.dumps(facts)))
            pending, pending_bytes = [], 0
            first_row += rows
            return
        flags = _flags(chunk, plan.validation_column)
        columns = [chunk.column(n) for n in plan.schema.names if n != plan.validation_column]
        keys, lane2 = ro.row_hashes(ro.row_words(columns, flags), plan.seed)
        sums = ro.IdSums()
        sums.add(keys, lane2)
        group = np.zeros(len(keys), dtype=np.int64) if flags is None else flags.astype(np.int64)
        found = ro.buckets(keys, plan.bucket_bits) + (group << plan.bucket_bits)
        counts = np.bincount(found, minlength=groups << plan.bucket_bits).astype("<i8")
        chunk = chunk.append_column(_KEY_COL, pa.array(keys, pa.uint64()))
        if store is None:
            store = _task_store(plan.tmp_uri, plan.env)
        store.put(f"staging/{name}.arrow", _encode_staging(chunk))
        results.append(
            (
                name,
                chunk.num_rows,
                zlib.compress(counts.tobytes(), 1),
                _signed(sums.keys),
                _signed(sums.lane2),
                partition,
                sequence,
                json.dumps(facts),
            )
        )
        pending, pending_bytes = [], 0
        first_row += rows

    for batch in batches:
        if batch.num_rows == 0:
            continue
        pending.append(batch)
        pending_bytes += batch.nbytes
        if pending_bytes >= _CHUNK_BYTES:
            flush()
    flush()
    if results:
        names, counts, histograms, key_sums, lane_sums, parts, seqs, facts = zip(
            *results, strict=True
        )
        yield pa.record_batch(
            [
                pa.array(names, pa.string()),
                pa.array(counts, pa.int64()),
                pa.array(histograms, pa.binary()),
                pa.array(key_sums, pa.int64()),
                pa.array(lane_sums, pa.int64()),
                pa.array(parts, pa.int32()),
                pa.array(seqs, pa.int32()),
                pa.array(facts, pa.string()),
            ],
            names=_STAGE_NAMES,
        )


_STAGE_NAMES = ["chunk", "rows", "buckets", "key_sum", "lane_sum", "partition", "seq", "facts"]
_STAGE_SCHEMA = (
    "chunk string, rows long, buckets binary, key_sum long, lane_sum long, partition int, "
    "seq int, facts string"
)


def _staging_path(store: FileSystemStore, name: str) -> str:
    return store.path(f"staging/{name}.arrow")


def _route(batches: Iterator[pa.RecordBatch], plan: _WritePlan) -> Iterator[pa.RecordBatch]:
    """Routing task: send each staged row to the partition(s) whose buckets hold it.

    A row in a bucket on a partition boundary goes to every partition the bucket touches;
    the writing task keeps only its own ranks. Rows travel as Arrow IPC pieces.
    """
    store = _task_store(plan.tmp_uri, plan.env)
    filesystem = store.filesystem
    names = [*plan.schema.names, _KEY_COL]
    if plan.validation_column is not None:
        names.append(plan.validation_column)
    for batch in batches:
        for index in batch.column(0).to_pylist():
            chunk = plan.chunks[int(index)]
            with filesystem.open_input_file(_staging_path(store, chunk.name)) as source:
                table = paipc.open_file(source).read_all().select(names)
            if table.num_rows != chunk.rows:
                raise DataError(
                    f"staged chunk {chunk.name} has {table.num_rows} rows, expected {chunk.rows}"
                )
            # Rows of images or sequences vary in size: pieces by the chunk's mean row size.
            piece_rows = max(1, _PIECE_BYTES * max(table.num_rows, 1) // max(table.nbytes, 1))
            keys = np.asarray(table.column(_KEY_COL).to_numpy(), dtype=np.uint64)
            flags = _flags(table, plan.validation_column)
            groups = np.zeros(len(keys), dtype=np.int64) if flags is None else flags.astype(int)
            rows, dests = ro.route(plan.destinations, groups, ro.buckets(keys, plan.bucket_bits))
            order = np.argsort(dests, kind="stable")
            rows, dests = rows[order], dests[order]
            bounds = np.flatnonzero(np.diff(dests)) + 1
            for group in np.split(np.arange(len(rows)), bounds):
                if not len(group):
                    continue
                for begin in range(0, len(group), piece_rows):
                    part = group[begin : begin + piece_rows]
                    piece = table.take(pa.array(rows[part]))
                    sink = pa.BufferOutputStream()
                    with paipc.new_stream(sink, piece.schema) as writer:
                        writer.write_table(piece)
                    yield pa.record_batch(
                        [
                            pa.array([int(dests[part[0]])], pa.int32()),
                            pa.array([sink.getvalue().to_pybytes()], pa.binary()),
                        ],
                        names=["dest", "payload"],
                    )


def _write_partitions(
    batches: Iterator[pa.RecordBatch], plan: _WritePlan
) -> Iterator[pa.RecordBatch]:
    """Writing task: write every partition routed here, one at a time (rows come grouped)."""
    store = _task_store(plan.tmp_uri, plan.env)
    current: int | None = None
    pieces: list[pa.Table] = []
    for batch in batches:
        for dest, payload in zip(
            batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True
        ):
            if dest != current:
                if current is not None:
                    yield _write_partition(store, plan, current, pieces)
                current, pieces = int(dest), []
            pieces.append(paipc.open_stream(payload).read_all())
    if current is not None:
        yield _write_partition(store, plan, current, pieces)


def _write_partition(
    store: FileSystemStore, plan: _WritePlan, dest: int, pieces: list[pa.Table]
) -> pa.RecordBatch:
    """Order one partition's bucket range by key, keep its ranks, write the file."""
    where = plan.destinations[dest]
    table = pa.concat_tables(pieces)
    if table.num_rows != where.bucket_rows:
        raise DataError(
            f"partition {dest} received {table.num_rows} rows of its buckets, expected "
            f"{where.bucket_rows}: the input changed between two reads"
        )
    columns = [table.column(name) for name in plan.schema.names]
    flags = _flags(table, plan.validation_column)
    keys = np.asarray(table.column(_KEY_COL).to_numpy(), dtype=np.uint64)
    order = ro.sort_order(keys, ro.row_words(columns, flags))
    mine = order[where.begin - where.bucket_begin : where.end - where.bucket_begin]
    table = pa.Table.from_arrays(
        [v.as_array(column).take(pa.array(mine)) for column in columns], schema=plan.schema
    )
    split = "train" if dest < plan.num_partitions else "validation"
    index = dest % plan.num_partitions
    moments = b""
    pixels = b""
    if split == "train" and plan.statistics_of:
        moments = st.partition_moments(table, plan.statistics_of).to_bytes()
    if split == "train" and plan.images:
        found = st.image_moments(table, plan.images)
        pixels = b"".join(found[info.name].astype("<f8").tobytes() for info in plan.images)
    data = w.encode_partition(table)
    path = partition_path(split, index)
    store.put(f"dataset/{path}", data)
    return pa.record_batch(
        [
            pa.array([split]),
            pa.array([index], pa.int64()),
            pa.array([table.num_rows], pa.int64()),
            pa.array([len(data)], pa.int64()),
            pa.array([hashlib.sha256(data).hexdigest()]),
            pa.array([moments], pa.binary()),
            pa.array([pixels], pa.binary()),
        ],
        names=["split", "index", "rows", "bytes", "sha256", "moments", "pixels"],
    )


# -- driver -----------------------------------------------------------------------------------


def _narrowed(
    data: object, fmt: str | None, frame: DataFrame, features: Sequence[str]
) -> dict[str, pa.DataType]:
    """Number/array features whose file type is a kept dtype Spark widens when reading.

    Spark reads a Parquet ``uint8`` as ``smallint`` (it has no unsigned types); the plain
    writer keeps ``uint8``. For a local Parquet path the files' Arrow schema (footers
    only) names such columns, and the staging tasks cast them back (the values fit).
    Returns ``{column: element type}``; empty for any other input.
    """
    if not isinstance(data, str):
        return {}
    local = _local_path(data)
    try:
        if local is None or not os.path.exists(local) or _path_format(data, fmt) != "parquet":
            return {}
        import pyarrow.dataset as pads

        schema = pads.dataset(
            local, format="parquet", partitioning="hive", ignore_prefixes=["_", "."]
        ).schema
    except (CerebroError, OSError, pa.ArrowException) as exc:
        logger.debug("no Arrow schema of %s: %s", data, exc)
        return {}
    spark_types = {field.name: field.dataType for field in frame.schema.fields}
    narrow: dict[str, pa.DataType] = {}
    for name in features:
        if name not in schema.names or name not in spark_types:
            continue
        element = schema.field(name).type
        while v.is_list_type(element):
            element = element.value_type
        if not (pa.types.is_integer(element) or pa.types.is_floating(element)):
            continue
        if np.dtype(element.to_pandas_dtype()).name not in DENSE_DTYPES:
            continue
        spark_element = _array_depth(spark_types[name])[1]
        try:
            seen = _arrow_type(name, spark_element, "feature column")
        except DataError:
            continue
        if seen != element and (pa.types.is_integer(seen) or pa.types.is_floating(seen)):
            narrow[name] = element
    return narrow


def _select(
    frame: DataFrame,
    features: Sequence[str],
    label: str,
    validation_column: str | None,
) -> DataFrame:
    """Select the columns in their roles; ML vectors become arrays of doubles."""
    types = {field.name: field.dataType for field in frame.schema.fields}
    columns: list[Column] = []
    for name in features:
        column = _col(name)
        vector = spark_vector_array(column, types[name])
        columns.append((column if vector is None else vector).alias(name))
    columns.append(_col(label).alias(label))
    if validation_column is not None:
        columns.append(_col(validation_column).alias(validation_column))
    return frame.select(*columns)


def _complete(target: FileSystemStore, dataset_id: str) -> Manifest | None:
    """The manifest of a complete dataset ``dataset_id`` at ``target``, else ``None``."""
    if not target.exists(MANIFEST_NAME):
        return None
    manifest = read_manifest(target)
    if manifest.dataset_id != dataset_id:
        raise DataError(
            f"{target.url(MANIFEST_NAME)} describes dataset {manifest.dataset_id}, "
            f"not {dataset_id}; remove the directory to prepare the data again"
        )
    missing = damaged_partitions(target, manifest)  # missing, or truncated
    if missing:
        logger.warning(
            "dataset %s at %s lacks %d whole partition files; writing it again",
            dataset_id,
            target.uri,
            len(missing),
        )
        return None
    return manifest


def _commit(
    root: FileSystemStore, tmp: FileSystemStore, dataset_id: str, manifest: Manifest
) -> Manifest:
    """Make the dataset visible: files first, ``manifest.json`` last (see module docstring)."""
    target = _fs_store(root.child(f"datasets/{dataset_id}"))
    filesystem = root.filesystem
    text = manifest.to_json().encode()
    if _is_local(root) and not os.path.lexists(target.root):
        tmp.put(f"dataset/{MANIFEST_NAME}", text)
        os.makedirs(os.path.dirname(target.root), exist_ok=True)
        try:
            os.rename(tmp.path("dataset"), target.root)
            return manifest
        except OSError as exc:  # another writer committed first
            logger.info("dataset directory %s appeared meanwhile (%s)", target.root, exc)
            tmp.delete(f"dataset/{MANIFEST_NAME}")
            done = _complete(target, dataset_id)
            if done is not None:
                return done
    old_keys = w.clear_target(target, overwrite=True)  # drops an old manifest first
    created: list[str] = []
    try:
        for part in manifest.partitions:
            source = tmp.path(f"dataset/{part.path}")
            destination = target.path(part.path)
            if _is_local(root):
                os.makedirs(os.path.dirname(destination), exist_ok=True)
                os.replace(source, destination)
            else:
                filesystem.copy_file(source, destination)
            if part.path not in old_keys:
                created.append(part.path)
        for stale in sorted(old_keys - {part.path for part in manifest.partitions}):
            target.delete(stale)
        target.put(MANIFEST_NAME, text)
    except BaseException:
        for key in created:  # best effort: leave no new files without a manifest
            with contextlib.suppress(OSError):
                target.delete(key)
        raise
    return manifest


def _remove_tmp(tmp: FileSystemStore) -> None:
    try:
        tmp.filesystem.delete_dir(tmp.root)
    except FileNotFoundError:
        pass
    except OSError as exc:
        logger.warning("could not remove the temporary prefix %s: %s", tmp.uri, exc)


def prepare_with_spark(
    data: DataFrame | str,
    store: str | Store,
    *,
    features: Sequence[str],
    label: str,
    num_partitions: int,
    seed: int,
    validation_fraction: float = 0.2,
    validation_column: str | None = None,
    task: Task | None = None,
    source: str | None = None,
    feature_shapes: Mapping[str, Sequence[int]] | None = None,
    format: str | None = None,
    options: Mapping[str, str] | None = None,
    order: Order = "input",
    spark: SparkSession | None = None,
    task_env: Mapping[str, str] | None = None,
    kinds: KindOptions | None = None,
) -> Manifest:
    """Shuffle, split and write ``data`` with Spark to ``<store>/datasets/<dataset_id>/``.

    Gives the dataset :func:`~cerebro_spark.data.prepare_dataset` gives for the same rows
    in any order (same id, byte-identical files and manifest), and reuses a complete
    dataset with that id instead of rewriting it. See the module docstring for the steps
    and for what "the same order" means.

    Args:
        data: A Spark DataFrame, a table name (``format="table"``, or any name that is
            not an existing path but a table in the catalog), or a path to a Parquet, CSV
            (header row, types inferred), JSON-lines or Delta file or directory.
        store: The store (local path, ``file://`` or ``s3://`` URI, or a
            :class:`~cerebro_spark.store.FileSystemStore`).
        features: Feature columns (numbers, arrays of numbers, Spark ML vectors), in the
            order they are concatenated.
        label: The label column.
        num_partitions: P, the number of partitions of each split.
        seed: Seed of the one shuffle (a non-negative integer).
        validation_fraction: Share of validation rows, in (0, 1) (without
            ``validation_column``).
        validation_column: A boolean column: true marks a validation row.
        task: ``"classification"`` or ``"regression"``; inferred from the label type
            when ``None``.
        source: Text recorded in the manifest (default: the path, ``table NAME`` or
            ``spark DataFrame``).
        feature_shapes: Per-row shapes of array features, e.g. ``{"image": (1, 8, 8)}``.
        format: ``"parquet"``, ``"csv"``, ``"json"``, ``"delta"`` or ``"table"``; from the
            path's name (or a directory's files, or ``_delta_log``) when ``None``.
        options: Spark reader options (for CSV ``header`` and ``inferSchema`` default to
            ``"true"``).
        order: ``"input"`` or ``"sorted"``; kept for compatibility, both give the same
            dataset (the row order comes from a content hash, see the module docstring).
        spark: The session (default: the active one, or a new one from
            :func:`~cerebro_spark.spark_session.spark_session`).
        task_env: Environment variables set in every task before it opens the store
            (e.g. S3 credentials executors lack). They travel with the tasks, so pass
            secrets only on a trusted cluster; prefer ``spark.executorEnv.*`` or instance
            roles. With a ``local`` master the driver's ``AWS_*`` variables are always
            forwarded (same machine, same user), so credentials set after the session
            started still reach the tasks.
        kinds: Which columns are images, categories or sequences and how they are
            prepared (:class:`~cerebro_spark.data.KindOptions`), as for
            :func:`~cerebro_spark.data.prepare_dataset`; other columns' kinds are inferred
            from their Spark types (see the module docstring).

    Returns:
        The manifest of the new or reused dataset.

    Raises:
        DataError: Bad parameters or data, with the column and the counts (missing
            columns, wrong types, nulls, NaN/inf, ragged arrays, one class, too few rows
            for 2 * P partitions), raised before anything is written.
        ConfigError: Bad format, an unreadable path form, Delta without delta-spark, no
            pyspark, or a store that is not a :class:`FileSystemStore`.
        FileNotFoundError: No file or directory at ``data``.
        StoreError: A Spark task failed to read or write the store (nothing is left
            visible).
    """
    _require_pyspark()
    started = time.perf_counter()
    seed, validation_fraction, hints = w.check_params(
        features=features,
        label=label,
        num_partitions=num_partitions,
        seed=seed,
        validation_fraction=validation_fraction,
        validation_column=validation_column,
        task=task,
        feature_shapes=feature_shapes,
    )
    if order not in ("input", "sorted"):
        raise ConfigError(f"order must be 'input' or 'sorted', got {order!r}")
    features = list(features)
    kind_options = kinds or KindOptions()
    kind_options.check_features(features)
    root = _fs_store(open_store(store))
    session = spark if spark is not None else spark_session()
    frame, description = load_frame(session, data, format, dict(options or {}))
    required = [*features, label] + ([validation_column] if validation_column else [])
    v.check_columns(frame.columns, required)
    selected = _select(frame, features, label, validation_column)
    narrow = _narrowed(data, format, selected, features)
    checked = _run_job(
        session,
        "checks",
        lambda: _check(
            selected,
            features=features,
            label=label,
            num_partitions=num_partitions,
            validation_fraction=validation_fraction,
            validation_column=validation_column,
            task=task,
            hints=hints,
            options=kind_options,
            narrow=narrow,
        ),
    )
    types = {field.name: field.dataType for field in selected.schema.fields}
    vocabularies: dict[str, tuple[tuple[Any, ...], int]] = {}
    categories: dict[str, ColumnInfo] = {}
    for name, kind in checked.kinds.items():
        if kind == "categorical":
            words, buckets, statistics = _run_job(
                session,
                f"count the values of categorical column {name!r}",
                functools.partial(
                    _vocabulary,
                    selected,
                    name,
                    types[name],
                    checked.rows,
                    checked.distinct[name],
                    kind_options,
                ),
            )
            vocabularies[name] = (words, buckets)
            categories[name] = w.categorical_info(name, words, buckets, statistics)
    offsets: dict[int, int] = {}
    if any(kind in ("image", "sequence") for kind in checked.kinds.values()):
        offsets = _run_job(session, "count rows per partition", lambda: _offsets(selected, label))
    fields = [_stored_field(info) for info in checked.features]
    label_type = pa.int64() if checked.task == "classification" else pa.float32()
    schema = pa.schema([*fields, pa.field(label, label_type)])
    staged_schema = (
        schema.append(pa.field(validation_column, pa.bool_())) if validation_column else schema
    )

    env = _task_env(session, task_env)
    tmp = _fs_store(root.child(f"datasets/{_TMP_PREFIX}{uuid.uuid4().hex}"))
    try:
        stage_plan = _StagePlan(
            tmp_uri=tmp.uri,
            env=env,
            features=tuple(features),
            hints={name: tuple(int(d) for d in hint) for name, hint in hints.items()},
            shapes=dict(checked.inferred_shapes),
            label=label,
            task=checked.task,
            classes=checked.classes,
            validation_column=validation_column,
            schema=staged_schema,
            seed=seed,
            bucket_bits=ro.bucket_bits(num_partitions),
            kinds=dict(checked.kinds),
            options=kind_options,
            vocabularies=vocabularies,
            offsets=offsets,
            narrow=narrow,
        )
        staged = _run_job(
            session,
            f"stage {checked.rows} rows to {tmp.uri}",
            lambda: selected.mapInArrow(
                functools.partial(_stage, plan=stage_plan), _STAGE_SCHEMA
            ).collect(),
        )
        infos = _kind_infos(staged, checked, categories, kind_options)
        checked = dataclasses.replace(checked, features=infos)
        chunks, counts, sums = _gather(staged, checked.rows, stage_plan)
        dataset_id = sums.dataset_id(
            w.id_params(
                checked.features,
                label=label,
                task=checked.task,
                classes=None if checked.classes is None else checked.classes.to_pylist(),
                num_partitions=num_partitions,
                seed=seed,
                validation_fraction=validation_fraction,
                validation_column=validation_column,
                rows=checked.rows,
                kinds=kind_options,
            )
        )
        target = _fs_store(root.child(f"datasets/{dataset_id}"))
        reused = _complete(target, dataset_id)
        if reused is not None:
            logger.info("dataset %s already prepared at %s; reusing it", dataset_id, target.uri)
            return reused
        manifest = _write(
            session,
            root,
            tmp,
            dataset_id=dataset_id,
            checked=checked,
            chunks=chunks,
            counts=counts,
            bucket_bits=stage_plan.bucket_bits,
            validation_column=validation_column,
            schema=schema,
            num_partitions=num_partitions,
            seed=seed,
            source=description if source is None else source,
            env=env,
        )
    finally:
        _remove_tmp(tmp)
    logger.info(
        "prepared dataset %s (%d rows, %d + %d partitions) at %s in %.1f s",
        manifest.dataset_id,
        checked.rows,
        num_partitions,
        num_partitions,
        target.uri,
        time.perf_counter() - started,
    )
    return manifest


def _count_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Task: this partition's id and row count."""
    from pyspark import TaskContext

    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    rows = sum(batch.num_rows for batch in batches)
    yield pa.record_batch(
        [pa.array([partition], pa.int32()), pa.array([rows], pa.int64())], names=["p", "n"]
    )


def _offsets(frame: DataFrame, column: str) -> dict[int, int]:
    """Each Spark partition's first row in the input order (for messages naming rows).

    Counted by ``mapInArrow`` tasks over one column (the label): the staging tasks, also
    ``mapInArrow`` over the same scan, read the same partitions in the same order, so
    ``offset + row within the partition`` is the row number the plain writer gives a row
    of the input read in order (files in Spark's order, a DataFrame as it is). (Spark's
    ``spark_partition_id()`` is no substitute: over a local relation it is 0 everywhere.)
    """
    counts = frame.select(_col(column)).mapInArrow(_count_rows, "p int, n long").collect()
    offsets: dict[int, int] = {}
    total = 0
    for row in sorted(counts, key=lambda row: int(row["p"])):
        offsets[int(row["p"])] = total
        total += int(row["n"])
    return offsets


def _stored_field(info: ColumnInfo) -> pa.Field:
    """The stored Arrow field of a feature column of any kind."""
    if info.feature_kind == "image":
        return pa.field(info.name, pa.binary())
    if info.feature_kind == "categorical":
        return pa.field(info.name, pa.int32())
    if info.feature_kind == "sequence":
        return pa.field(info.name, pa.list_(pa.int32()))
    element = pa.from_numpy_dtype(np.dtype(info.dtype))
    return pa.field(info.name, pa.list_(element, info.size) if info.shape else element)


def _kind_infos(
    staged: Sequence[Any],
    checked: _Checked,
    categories: Mapping[str, ColumnInfo],
    options: KindOptions,
) -> tuple[ColumnInfo, ...]:
    """The feature infos with the image and sequence facts of every chunk merged.

    Chunks are merged in input order (partition, then sequence), as the plain writer
    sees the rows; a size mismatch raises its :class:`DataError` here, before anything
    is visible.
    """
    ordered = sorted(staged, key=lambda row: (int(row["partition"]), int(row["seq"])))
    images: dict[str, kd.ImageFacts] = {}
    sequences: dict[str, kd.SequenceFacts] = {}
    failed = False
    for row in ordered:
        facts = json.loads(row["facts"])
        failed = failed or bool(facts.get("failed"))
        for name, runs in facts["image"].items():
            for encoding, shape, first_row in runs:
                item = kd.ImageFacts(encoding, (shape[0], shape[1], shape[2]), int(first_row))
                images[name] = kd.merge_facts(name, images.get(name, item), item)
        for name, raw in facts["sequence"].items():
            seq = kd.SequenceFacts(**raw)
            sequences[name] = kd.merge_sequence_facts(sequences.get(name, kd.NO_SEQUENCES), seq)
    if failed:  # not reached: a chunk fails only on a size change that the merge raises
        raise DataError("a staging task found images of several sizes")
    infos: list[ColumnInfo] = []
    for info in checked.features:
        kind = info.feature_kind
        if kind == "categorical":
            info = categories[info.name]
        elif kind == "image":
            merged = images[info.name]
            info = ColumnInfo(
                info.name, "uint8", merged.shape, kind="image", encoding=merged.encoding
            )
        elif kind == "sequence":
            seq = sequences.get(info.name, kd.NO_SEQUENCES)
            info = ColumnInfo(
                info.name,
                "int32",
                kind="sequence",
                cardinality=seq.max_id + 1,
                max_length=options.max_length or seq.max_length,
                statistics=kd.sequence_statistics(seq, checked.rows),
            )
        infos.append(info)
    return tuple(infos)


def _gather(
    staged: Sequence[Any], rows: int, plan: _StagePlan
) -> tuple[tuple[_Chunk, ...], np.ndarray, ro.IdSums]:
    """Combine the staging results: the chunks, the bucket counts and the id sums."""
    groups = 1 if plan.validation_column is None else 2
    counts = np.zeros(groups << plan.bucket_bits, dtype=np.int64)
    sums = ro.IdSums()
    chunks: list[_Chunk] = []
    for row in sorted(staged, key=lambda row: str(row["chunk"])):
        chunks.append(_Chunk(str(row["chunk"]), int(row["rows"])))
        counts += np.frombuffer(zlib.decompress(row["buckets"]), dtype="<i8")
        sums.merge(
            ro.IdSums(
                int(row["rows"]), int(row["key_sum"]) % (1 << 64), int(row["lane_sum"]) % (1 << 64)
            )
        )
    if len({chunk.name for chunk in chunks}) != len(chunks):
        raise DataError(
            "two staging tasks wrote the same chunk: the input's partitioning changed "
            "between two reads; make it deterministic (e.g. write it to a table first)"
        )
    if sums.rows != rows or int(counts.sum()) != rows:
        raise DataError(
            f"the input had {rows} rows when checked and {sums.rows} when staged: it changed "
            "between two reads; make it deterministic (e.g. write it to a table first)"
        )
    logger.info("staged %d rows in %d chunks", rows, len(chunks))
    return tuple(chunks), counts.reshape(groups, -1), sums


def _write(
    session: SparkSession,
    root: FileSystemStore,
    tmp: FileSystemStore,
    *,
    dataset_id: str,
    checked: _Checked,
    chunks: tuple[_Chunk, ...],
    counts: np.ndarray,
    bucket_bits: int,
    validation_column: str | None,
    schema: pa.Schema,
    num_partitions: int,
    seed: int,
    source: str,
    env: Mapping[str, str],
) -> Manifest:
    """Shuffle the staged rows into 2 * P partition files, then commit with the manifest."""
    by_column = validation_column is not None
    with_stats = st.statistics_size(checked.features) is not None
    plan = _WritePlan(
        tmp.uri,
        env,
        chunks,
        schema,
        num_partitions,
        validation_column,
        bucket_bits,
        tuple(ro.plan_destinations(counts, checked.n_val, num_partitions, by_column)),
        checked.features if with_stats else (),
        tuple(info for info in checked.features if info.feature_kind == "image"),
    )
    parallelism = 2 * num_partitions
    with contextlib.suppress(Exception):  # no SparkContext on Spark Connect
        parallelism = max(1, int(session.sparkContext.defaultParallelism))
    results = _run_job(
        session,
        f"write {2 * num_partitions} partitions to {tmp.uri}",
        lambda: (
            session.range(len(chunks), numPartitions=min(len(chunks), 2 * parallelism))
            .mapInArrow(functools.partial(_route, plan=plan), "dest int, payload binary")
            .repartitionById(min(2 * num_partitions, parallelism), "dest")
            .sortWithinPartitions("dest")
            .mapInArrow(
                functools.partial(_write_partitions, plan=plan),
                "split string, index long, rows long, bytes long, sha256 string, "
                "moments binary, pixels binary",
            )
            .collect()
        ),
    )
    found = {(row["split"], int(row["index"])): row for row in results}
    splits: tuple[Split, Split] = ("train", "validation")
    partitions: list[PartitionInfo] = []
    for split in splits:
        for index in range(num_partitions):
            row = found.get((split, index))
            if row is None or len(results) != 2 * num_partitions:
                raise StoreError(
                    f"writing dataset {dataset_id} returned {len(results)} partition files, "
                    f"expected {2 * num_partitions}"
                )
            partitions.append(
                PartitionInfo(
                    split=split,
                    index=index,
                    path=partition_path(split, index),
                    rows=int(row["rows"]),
                    bytes=int(row["bytes"]),
                    sha256=str(row["sha256"]),
                )
            )
    classes = None if checked.classes is None else tuple(checked.classes.to_pylist())
    train = range(num_partitions)
    pixels: list[dict[str, np.ndarray]] = []
    for index in train:
        data = np.frombuffer(found[("train", index)]["pixels"] or b"", dtype="<f8")
        moments: dict[str, np.ndarray] = {}
        at = 0
        for info in plan.images:
            size = info.shape[0] * 3
            moments[info.name] = data[at : at + size].astype(np.float64).reshape(-1, 3)
            at += size
        pixels.append(moments)
    manifest = Manifest(
        dataset_id=dataset_id,
        features=st.with_image_statistics(checked.features, pixels),
        label=checked.label,
        task=checked.task,
        num_classes=len(classes) if classes is not None else None,
        num_partitions=num_partitions,
        seed=seed,
        partitions=tuple(partitions),
        content_hash=w.content_hash(partitions),
        schema={field.name: str(field.type) for field in schema},
        source=source,
        classes=classes,
        statistics=(
            st.combine([st.Moments.from_bytes(found[("train", i)]["moments"]) for i in train])
            if with_stats
            else None
        ),
    )
    try:
        return _commit(root, tmp, dataset_id, manifest)
    except OSError as exc:
        if isinstance(exc, (CerebroError, FileExistsError)):
            raise  # FileExistsError: the target holds foreign files (as the plain writer)
        raise StoreError(
            f"committing dataset {dataset_id} to {root.url(f'datasets/{dataset_id}')} failed: {exc}"
        ) from exc
