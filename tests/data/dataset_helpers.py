"""Small tables and dataset surgery shared by the tests in tests/data."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

import numpy as np
import pyarrow as pa

from cerebro_spark.data import MANIFEST_NAME, Manifest, content_hash, encode_partition
from cerebro_spark.store import open_store


def make_table(rows: int = 100, *, classes: int = 3, seed: int = 0) -> pa.Table:
    """A table with a row id, a scalar, a 6-value array feature, a label and a flag."""
    rng = np.random.default_rng(seed)
    vec = rng.normal(size=(rows, 6)).astype(np.float32)
    return pa.table(
        {
            "rowid": pa.array(np.arange(rows, dtype=np.int64)),
            "x": pa.array(rng.normal(size=rows)),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec.reshape(-1)), 6),
            "y": pa.array(np.arange(rows, dtype=np.int64) % classes),
            "is_val": pa.array(np.arange(rows) % 4 == 0),
            "unused": pa.array([f"s{i}" for i in range(rows)]),
        }
    )


def dataset_files(directory: Any) -> dict[str, bytes]:
    """Return ``{relative path: bytes}`` of every file below ``directory`` (a Path)."""
    return {
        str(path.relative_to(directory)): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def replace_partition(dataset_uri: str, split: str, index: int, table: pa.Table) -> Manifest:
    """Overwrite one partition with ``table`` and fix the manifest's rows, bytes and hash,
    so the reader's content checks (not its size/hash checks) see the new data."""
    store = open_store(dataset_uri)
    manifest = Manifest.from_json(store.get(MANIFEST_NAME).decode())
    data = encode_partition(table)
    parts = []
    for part in manifest.partitions:
        if part.split == split and part.index == index:
            store.put(part.path, data)
            part = dataclasses.replace(
                part, rows=table.num_rows, bytes=len(data), sha256=hashlib.sha256(data).hexdigest()
            )
        parts.append(part)
    manifest = dataclasses.replace(
        manifest, partitions=tuple(parts), content_hash=content_hash(parts)
    )
    store.put(MANIFEST_NAME, manifest.to_json().encode())
    return manifest
