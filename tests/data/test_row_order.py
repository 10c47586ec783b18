"""The content-hash row order (format 2) and the parallel plan the Spark writer follows.

The Spark writer never sorts all rows in one place: tasks count rows per bucket, the
driver plans each partition's bucket range, rows are routed by bucket and each writing
task sorts its range. These tests run that plan in plain numpy over many "tasks" and check
it places every row exactly where the one-process order does, also with duplicate rows,
key ties, a validation column and partitions smaller than a bucket.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from dataset_helpers import dataset_files, make_table

from cerebro_spark.data import (
    FORMAT_VERSION,
    dataset_id_for,
    prepare_dataset,
    read_manifest,
    read_partition,
)
from cerebro_spark.data import _row_order as ro
from cerebro_spark.errors import DataError

KW = {"features": ["rowid", "x", "vec"], "label": "y", "num_partitions": 3, "seed": 7}
FORMAT1 = Path(__file__).parent / "fixtures" / "format1"
FORMAT2 = Path(__file__).parent / "fixtures" / "format2"


def table_of(rows: int, *, duplicates: int = 0, seed: int = 0) -> tuple[list[pa.Array], int]:
    """Normalised-looking columns: a float32 list feature and an int64 label."""
    rng = np.random.default_rng(seed)
    vec = rng.normal(size=(rows, 3)).astype(np.float32)
    label = rng.integers(0, 3, rows)
    if duplicates:
        vec[-duplicates:] = vec[0]
        label[-duplicates:] = label[0]
    feature = pa.FixedSizeListArray.from_arrays(pa.array(vec.reshape(-1)), 3)
    return [feature, pa.array(label, pa.int64())], rows


def distributed_slices(
    columns: list[pa.Array],
    flags: np.ndarray | None,
    keys: np.ndarray,
    n_val: int,
    parts: int,
    bits: int,
    tasks: int,
) -> dict[str, list[np.ndarray]]:
    """The Spark writer's plan in numpy: bucket counts per task, routing, per-range sort."""
    rows = len(keys)
    words = ro.row_words(columns, flags)
    groups = np.zeros(rows, dtype=np.int64) if flags is None else flags.astype(np.int64)
    counts = np.zeros((2 if flags is not None else 1) << bits, dtype=np.int64)
    cuts = np.linspace(0, rows, tasks + 1).astype(int)
    routed: dict[int, list[np.ndarray]] = {}
    for begin, end in itertools.pairwise(cuts):  # "staging" tasks
        found = ro.buckets(keys[begin:end], bits) + (groups[begin:end] << bits)
        counts += np.bincount(found, minlength=len(counts))
    plan = ro.plan_destinations(
        counts.reshape(len(counts) >> bits, -1), n_val, parts, flags is not None
    )
    for begin, end in itertools.pairwise(cuts):  # "routing" tasks
        local, dests = ro.route(plan, groups[begin:end], ro.buckets(keys[begin:end], bits))
        for dest in np.unique(dests).tolist():
            routed.setdefault(dest, []).append(local[dests == dest] + begin)
    slices: dict[str, list[np.ndarray]] = {"train": [], "validation": []}
    for where in plan:  # "writing" tasks
        received = np.concatenate(routed[where.dest])
        assert len(received) == where.bucket_rows
        order = ro.sort_order(keys[received], words[received])
        mine = received[order][where.begin - where.bucket_begin : where.end - where.bucket_begin]
        slices["train" if where.dest < parts else "validation"].append(mine)
    return slices


def assert_same_rows(
    expected: dict[str, list[np.ndarray]], got: dict[str, list[np.ndarray]], words: np.ndarray
) -> None:
    """Same partitions row for row (duplicates may swap: compare their content)."""
    for split in ("train", "validation"):
        assert len(got[split]) == len(expected[split])
        for want, have in zip(expected[split], got[split], strict=True):
            np.testing.assert_array_equal(words[want], words[have])


@pytest.mark.parametrize(
    ("rows", "parts", "bits", "tasks", "duplicates", "by_column"),
    [
        (600, 4, 10, 3, 0, False),
        (5000, 7, 10, 5, 40, False),  # many rows per bucket, a duplicated row
        (5000, 7, 10, 5, 40, True),
        (60, 3, 2, 4, 0, False),  # 4 buckets: every bucket spans partitions
        (900, 2, 4, 9, 300, True),  # a third of the rows identical
    ],
)
def test_parallel_plan_places_rows_as_the_one_process_order(
    rows: int, parts: int, bits: int, tasks: int, duplicates: int, by_column: bool
) -> None:
    columns, _ = table_of(rows, duplicates=duplicates)
    flags = (np.arange(rows) % 5 == 0) if by_column else None
    words = ro.row_words(columns, flags)
    keys, _ = ro.row_hashes(words, seed=11)
    n_val = int(flags.sum()) if flags is not None else round(rows * 0.2)
    expected = ro.split_slices(ro.sort_order(keys, words), flags, n_val, parts)
    got = distributed_slices(columns, flags, keys, n_val, parts, bits, tasks)
    assert_same_rows(expected, got, words)


def test_key_ties_between_different_rows_are_broken_by_content() -> None:
    columns, rows = table_of(400)
    words = ro.row_words(columns, None)
    keys = np.arange(rows, dtype=np.uint64) % np.uint64(3) << np.uint64(62)  # 3 keys only
    order = ro.sort_order(keys, words)
    again = ro.sort_order(keys[::-1].copy(), words[::-1].copy())
    np.testing.assert_array_equal(words[order], words[::-1][again])  # input order is irrelevant
    expected = ro.split_slices(order, None, 80, 3)
    got = distributed_slices(columns, None, keys, 80, 3, bits=10, tasks=4)
    assert_same_rows(expected, got, words)


def test_sums_merge_in_any_order_and_depend_on_every_row() -> None:
    columns, rows = table_of(300)
    keys, lane2 = ro.row_hashes(ro.row_words(columns, None), seed=3)
    whole = ro.IdSums()
    whole.add(keys, lane2)
    parts = [ro.IdSums() for _ in range(3)]
    for part, index in zip(parts, np.array_split(np.arange(rows)[::-1], 3), strict=True):
        part.add(keys[index], lane2[index])
    merged = ro.IdSums()
    for part in reversed(parts):
        merged.merge(part)
    assert merged == whole
    assert merged.dataset_id(b"p") == whole.dataset_id(b"p") != whole.dataset_id(b"q")
    fewer = ro.IdSums()
    fewer.add(keys[1:], lane2[1:])
    assert fewer.dataset_id(b"p") != whole.dataset_id(b"p")
    other_keys, _ = ro.row_hashes(ro.row_words(columns, None), seed=4)
    assert not np.array_equal(other_keys, keys)  # the seed changes the order


def test_bucket_bits_grow_with_partitions_and_stay_bounded() -> None:
    assert ro.bucket_bits(1) == ro.MIN_BUCKET_BITS
    assert ro.bucket_bits(64) == 15
    assert ro.bucket_bits(100_000) == ro.MAX_BUCKET_BITS


def test_plain_writer_ignores_input_order_and_is_byte_identical(tmp_path: Path) -> None:
    table = make_table(120)
    shuffled = table.take(pa.array(np.random.default_rng(5).permutation(120)))
    one = prepare_dataset(table, str(tmp_path / "a"), **KW)
    two = prepare_dataset(shuffled, str(tmp_path / "b"), **KW)
    assert one == two and one.format_version == FORMAT_VERSION == 3
    assert dataset_files(tmp_path / "a") == dataset_files(tmp_path / "b")


def test_format1_dataset_still_reads_and_is_never_rewritten(tmp_path: Path) -> None:
    store = tmp_path / "store"
    old = read_manifest(str(FORMAT1))
    assert old.format_version == 1
    shutil.copytree(FORMAT1, store / "datasets" / old.dataset_id)
    uri = str(store / "datasets" / old.dataset_id)
    before = dataset_files(Path(uri))
    rows = sum(read_partition(uri, s, i).rows for s in ("train", "validation") for i in range(2))
    assert rows == 40
    kw = {**KW, "num_partitions": 2}
    new = prepare_dataset(make_table(40), str(store), **kw)  # the rows the fixture holds
    assert new.format_version == 3 and new.dataset_id != old.dataset_id
    assert new.dataset_id == dataset_id_for(make_table(40), **kw)
    assert dataset_files(Path(uri)) == before  # the old dataset is left as it was


def test_format2_dataset_still_reads_as_float32_numbers_and_arrays(tmp_path: Path) -> None:
    """A dataset the format-2 writer wrote (the fixture: its files as written then)."""
    old = read_manifest(str(FORMAT2))
    assert old.format_version == 2
    assert [c.feature_kind for c in old.features] == ["number", "number", "array"]
    part = read_partition(str(FORMAT2), "train", 0)
    assert [c.values.dtype for c in part.columns] == [np.float32] * 3
    assert part.features.shape == (part.rows, 8)  # rowid, x and the 6 values of vec
    new = prepare_dataset(make_table(40), str(tmp_path), **{**KW, "num_partitions": 2})
    assert new.dataset_id != old.dataset_id  # format 3 ids differ: never mistaken for it


def test_unknown_format_version_is_refused(tmp_path: Path) -> None:
    shutil.copytree(FORMAT1, tmp_path / "ds")
    manifest = tmp_path / "ds" / "manifest.json"
    raw = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**raw, "format_version": 4}))
    with pytest.raises(DataError, match=r"format_version 4; .* reads format_version 1, 2, 3"):
        read_manifest(str(tmp_path / "ds"))
