"""Where input tables come from: built-in sources and files (Parquet, CSV, JSON lines).

Built-in sources return the table and the keyword arguments that describe it, so that
``table, meta = load_source("sklearn:digits")`` can be followed by
``prepare_dataset(table, store, num_partitions=4, seed=0, **meta)``.
"""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from cerebro_spark.data._options import KindOptions
from cerebro_spark.data._vectors import decode_vectors
from cerebro_spark.errors import DataError
from cerebro_spark.store import resolve_filesystem

logger = logging.getLogger(__name__)

_FORMATS: dict[str, str] = {
    ".parquet": "parquet",
    ".parq": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
}


def _snake(name: str) -> str:
    return re.sub(r"[^0-9a-z]+", "_", name.lower()).strip("_")


def _digits() -> tuple[pa.Table, dict[str, Any]]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = (np.asarray(bunch.data, dtype=np.float32) / np.float32(16.0)).reshape(-1)
    image = pa.FixedSizeListArray.from_arrays(pa.array(images), type=pa.list_(pa.float32(), 64))
    labels = pa.array(np.asarray(bunch.target, dtype=np.int64))
    table = pa.table({"image": image, "label": labels})
    meta: dict[str, Any] = {
        "features": ["image"],
        "label": "label",
        "feature_shapes": {"image": (1, 8, 8)},
        "task": "classification",
        "source": "sklearn:digits",
    }
    return table, meta


def _digits_png() -> tuple[pa.Table, dict[str, Any]]:
    """scikit-learn's digits as real PNG images (8x8 grayscale, pixel = value * 255 / 16)."""
    from PIL import Image  # Pillow and scikit-learn: optional, only for this source
    from sklearn.datasets import load_digits

    bunch = load_digits()
    pixels = np.rint(np.asarray(bunch.images) * (255.0 / 16.0)).astype(np.uint8)
    encoded = []
    for image in pixels:
        out = io.BytesIO()
        Image.fromarray(image, mode="L").save(out, format="PNG", compress_level=6)
        encoded.append(out.getvalue())
    table = pa.table(
        {
            "image": pa.array(encoded, pa.binary()),
            "label": pa.array(np.asarray(bunch.target, dtype=np.int64)),
        }
    )
    meta: dict[str, Any] = {
        "features": ["image"],
        "label": "label",
        "task": "classification",
        "source": "sklearn:digits_png",
        "kinds": KindOptions(image_columns=("image",)),
    }
    return table, meta


def _tabular(loader_name: str, task: str) -> Callable[[], tuple[pa.Table, dict[str, Any]]]:
    def load() -> tuple[pa.Table, dict[str, Any]]:
        import sklearn.datasets

        bunch = getattr(sklearn.datasets, loader_name)()
        names = [_snake(str(name)) for name in bunch.feature_names]
        data = np.asarray(bunch.data, dtype=np.float32)
        columns: dict[str, pa.Array] = {name: pa.array(data[:, i]) for i, name in enumerate(names)}
        target_type = np.int64 if task == "classification" else np.float32
        columns["label"] = pa.array(np.asarray(bunch.target, dtype=target_type))
        meta: dict[str, Any] = {
            "features": names,
            "label": "label",
            "task": task,
            "source": f"sklearn:{loader_name.removeprefix('load_')}",
        }
        return pa.table(columns), meta

    return load


_SOURCES: dict[str, Callable[[], tuple[pa.Table, dict[str, Any]]]] = {
    "sklearn:digits": _digits,
    "sklearn:digits_png": _digits_png,
    "sklearn:iris": _tabular("load_iris", "classification"),
    "sklearn:breast_cancer": _tabular("load_breast_cancer", "classification"),
    "sklearn:wine": _tabular("load_wine", "classification"),
    "sklearn:diabetes": _tabular("load_diabetes", "regression"),
}

#: Names accepted by :func:`load_source`.
SOURCES: tuple[str, ...] = tuple(sorted(_SOURCES))


def load_source(name: str) -> tuple[pa.Table, dict[str, Any]]:
    """Load a built-in source (bundled with scikit-learn, no download).

    ``"sklearn:digits"``: 1,797 8x8 digit images; column ``image`` holds 64 float32 values
    in [0, 1] (pixel / 16) with shape hint ``(1, 8, 8)``, column ``label`` int64 0..9.
    ``"sklearn:digits_png"``: the same 1,797 real handwritten digits as 8x8 grayscale PNG
    files (column ``image``, binary; ``kinds`` names it an image column).
    ``"sklearn:iris"``, ``"sklearn:breast_cancer"``, ``"sklearn:wine"``: one float32
    column per measurement (snake_case names) and an int64 ``label``.
    ``"sklearn:diabetes"``: ten float32 columns and a float32 regression ``label``.

    Returns:
        ``(table, meta)``; ``meta`` holds ``features``, ``label``, ``task``, ``source``,
        (for array features) ``feature_shapes`` and (for images) ``kinds``: keyword
        arguments of
        :func:`~cerebro_spark.data.write_dataset`.

    Raises:
        DataError: Unknown source name (the message lists the known ones).
    """
    loader = _SOURCES.get(name)
    if loader is None:
        raise DataError(f"unknown data source {name!r}; known sources: {', '.join(SOURCES)}")
    table, meta = loader()
    logger.info("loaded source %s: %d rows", name, table.num_rows)
    return table, meta


def _format_of(path: str, given: str | None) -> str:
    if given is not None:
        fmt = given.lower()
        if fmt not in ("parquet", "csv", "json"):
            raise DataError(f"format must be 'parquet', 'csv' or 'json', got {given!r}")
        return fmt
    for suffix, fmt in _FORMATS.items():
        if path.lower().endswith(suffix):
            return fmt
    raise DataError(
        f"cannot tell the format of {path!r} from its name (known endings: "
        f"{', '.join(_FORMATS)}); pass format='parquet', 'csv' or 'json'"
    )


def _hidden(path: str, root: str) -> bool:
    """Whether a file below ``root`` is Spark's or Hadoop's bookkeeping (a ``_`` or ``.`` part)."""
    relative = path[len(root.rstrip("/")) + 1 :]
    return any(part.startswith(("_", ".")) for part in relative.split("/"))


def read_table(path_or_uri: str, format: str | None = None) -> pa.Table:
    """Read a Parquet, CSV or JSON-lines file, or a directory of them, into one table.

    Spark ML vector columns (``VectorAssembler`` output, dense or sparse) come back as
    fixed-size lists of ``float64`` (:func:`~cerebro_spark.data.decode_vectors`).

    Args:
        path_or_uri: A local path or any URI :func:`~cerebro_spark.store.resolve_filesystem`
            accepts (``s3://bucket/data.parquet?endpoint_override=...``). Directories are
            read with ``pyarrow.dataset`` (hive partitioning; files and directories whose
            names start with ``_`` or ``.``, such as Spark's ``_SUCCESS``, are skipped).
        format: ``"parquet"``, ``"csv"`` or ``"json"``; inferred from the file name (for a
            directory: from the first data file's name) when ``None``.

    Raises:
        FileNotFoundError: Nothing at ``path_or_uri``.
        DataError: Unknown format, an empty directory, a Delta table (its directory holds
            files of old versions too: Spark reads it), or a vector column that cannot be
            decoded.
    """
    filesystem, path = resolve_filesystem(path_or_uri)
    info = filesystem.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"no file or directory at {path_or_uri}")
    delta = format == "delta" or (
        info.type == pafs.FileType.Directory
        and filesystem.get_file_info(f"{path.rstrip('/')}/_delta_log").type
        == pafs.FileType.Directory
    )
    if delta:
        raise DataError(
            f"{path_or_uri} is a Delta table; its files hold old versions too, so only "
            f"Spark reads it right: prepare it with 'cerebro-spark prepare --input "
            f"{path_or_uri} --format delta --name NAME' (needs delta-spark) and use "
            "data: {dataset: NAME} in the config"
        )
    if info.type == pafs.FileType.Directory and format is None:
        selector = pafs.FileSelector(path, recursive=True)
        files = sorted(
            item.path
            for item in filesystem.get_file_info(selector)
            if item.type == pafs.FileType.File and not _hidden(item.path, path)
        )
        if not files:
            raise DataError(f"directory {path_or_uri} holds no data files")
        fmt = _format_of(files[0], None)
    else:
        fmt = _format_of(path, format)
    import pyarrow.dataset as pads

    partitioning = "hive" if info.type == pafs.FileType.Directory else None
    dataset = pads.dataset(path, filesystem=filesystem, format=fmt, partitioning=partitioning)
    table = decode_vectors(dataset.to_table())
    logger.info("read %d rows (%s) from %s", table.num_rows, fmt, path_or_uri)
    return table
