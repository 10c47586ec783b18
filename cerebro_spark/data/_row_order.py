"""The row order of a prepared dataset (format 2): a seeded hash of each row's content.

Both writers (:mod:`cerebro_spark.data._writer` in one process,
:mod:`cerebro_spark.data._spark_prepare` in Spark tasks) place rows with these functions,
so they produce the same dataset without any serial step:

* **Row identity** is the row's *normalised content*: the bytes of every written column
  (``float32`` features, the ``int64`` class index or ``float32`` label) followed by the
  validation flag when a ``validation_column`` splits the data. Content is the one identity
  that is stable for every source (files, tables, DataFrames after a shuffle, pandas): the
  dataset depends only on the *multiset* of rows, never on input order or partitioning.
* **Row key**: a 64-bit hash of those bytes seeded by ``seed`` (SplitMix64 steps over the
  row's little-endian 64-bit words), computed vectorised per batch. Rows are ordered by
  ``(key, row bytes)``: the bytes break the (rare) ties between different rows, and rows
  that tie on both are identical, so their order cannot change a byte of the output.
* **Split and partitions**: without a validation column the first ``n_val`` rows of that
  order are the validation rows and the rest the train rows; with one, each split keeps its
  rows in that order. Each split is cut into P contiguous slices whose sizes differ by at
  most one (``numpy.array_split``'s sizes), as in format 1.
* **Dataset id**: SHA-256 of the parameters, the row count and two order-independent
  64-bit sums (the keys, and a second, polynomial hash of the same words), first 24 hex
  digits. Sums combine partial results from any number of tasks in any order.

Heavily duplicated rows share one key, hence one bucket: a bucket holding many rows on a
partition boundary is sent to every partition it spans (correct, but each of their
writing tasks then sorts the whole bucket).

In Spark the order is never materialised in one place: every task counts its rows per
*bucket* (the key's top bits); the driver turns the counts into each partition's bucket
range and first rank (:func:`plan_destinations`); rows travel to every partition whose
bucket range holds their bucket (a bucket on a boundary goes to both sides), and each
writing task sorts what it received and keeps its own ranks.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cerebro_spark.data import _validate as v

_MASK64 = (1 << 64) - 1
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_POLY = np.uint64(0x100000001B3)  # FNV-1a 64-bit prime: the second lane's multiplier
_LANE2_IV = 0xCBF29CE484222325
#: Bucket bits: at least 2**10 buckets, about 256 per partition, at most 2**20.
MIN_BUCKET_BITS = 10
MAX_BUCKET_BITS = 20


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, elementwise on ``uint64`` (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _MUL1
    x = x ^ (x >> np.uint64(27))
    x = x * _MUL2
    mixed: np.ndarray = x ^ (x >> np.uint64(31))
    return mixed


def seed_word(seed: int) -> int:
    """The 64-bit start value of the row hash for ``seed`` (any non-negative integer)."""
    return int.from_bytes(
        hashlib.sha256(f"cerebro-row-order:{seed}".encode()).digest()[:8], "little"
    )


def row_words(
    columns: Sequence[pa.Array | pa.ChunkedArray], flags: np.ndarray | None
) -> np.ndarray:
    """Return every row's content as little-endian 64-bit words, shape ``(rows, words)``.

    Args:
        columns: The normalised columns in written order (fixed-size lists of ``float32``,
            ``float32``, ``int64``).
        flags: The validation flags when a validation column splits the data, else ``None``.
    """
    rows = len(columns[0]) if columns else (0 if flags is None else len(flags))
    blocks: list[np.ndarray] = []
    for column in columns:
        if _variable(column.type):
            blocks.append(_digests(v.as_array(column)))
            continue
        values = np.ascontiguousarray(v.flat_values(column).to_numpy(zero_copy_only=False))
        blocks.append(values.reshape(rows, -1).view(np.uint8).reshape(rows, -1))
    if flags is not None:
        blocks.append(np.asarray(flags, dtype=np.uint8).reshape(rows, 1))
    width = sum(block.shape[1] for block in blocks)
    padded = -(-width // 8) * 8
    content = np.zeros((rows, padded), dtype=np.uint8)
    at = 0
    for block in blocks:
        content[:, at : at + block.shape[1]] = block
        at += block.shape[1]
    return content.view("<u8")


def _variable(arrow_type: pa.DataType) -> bool:
    """Whether a stored column's rows vary in size (images' bytes, sequences' ids)."""
    return bool(
        pa.types.is_binary(arrow_type)
        or pa.types.is_large_binary(arrow_type)
        or pa.types.is_list(arrow_type)
        or pa.types.is_large_list(arrow_type)
    )


def _digests(array: pa.Array) -> np.ndarray:
    """A 16-byte BLAKE2b digest of each row's bytes (a binary value, or a list's values)."""
    out = np.empty((len(array), 16), dtype=np.uint8)
    if pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type):
        for row, value in enumerate(array.to_pylist()):
            out[row] = np.frombuffer(hashlib.blake2b(value, digest_size=16).digest(), np.uint8)
        return out
    lengths = pc.list_value_length(array).to_numpy(zero_copy_only=False)
    values = np.ascontiguousarray(array.flatten().to_numpy(zero_copy_only=False))
    data = values.view(np.uint8)
    ends = np.cumsum(lengths) * values.itemsize
    start = 0
    for row, end in enumerate(ends.tolist()):
        out[row] = np.frombuffer(
            hashlib.blake2b(data[start:end].tobytes(), digest_size=16).digest(), np.uint8
        )
        start = end
    return out


def row_hashes(words: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(keys, lane2)``: each row's seeded order key and its second id hash.

    ``keys`` chains SplitMix64 steps over the words from :func:`seed_word`; ``lane2`` is a
    polynomial hash of the same words (multiplier :data:`_POLY`) passed through the
    finaliser, independent of the first, for the dataset id.
    """
    rows, width = words.shape
    columns = np.ascontiguousarray(words.T).astype(np.uint64, copy=False)
    start = np.uint64(seed_word(seed))
    keys = np.full(rows, _mix(np.array([start ^ np.uint64(width)]))[0], dtype=np.uint64)
    lane2 = np.full(rows, np.uint64(_LANE2_IV), dtype=np.uint64)
    for word in columns:
        keys = _mix((keys ^ word) + _GOLDEN)
        lane2 = lane2 * _POLY + word
    return keys, _mix(lane2 ^ start)


def sort_order(keys: np.ndarray, words: np.ndarray) -> np.ndarray:
    """Return the row indices ordered by ``(key, row bytes)`` (see the module docstring)."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    same = ordered[1:] == ordered[:-1]
    if same.any():
        # runs of equal keys: rows [first, last] of the ordered keys
        edges = np.flatnonzero(np.diff(np.r_[0, same.astype(np.int8), 0]))
        for first, last in edges.reshape(-1, 2).tolist():
            run = order[first : last + 1].tolist()
            run.sort(key=lambda index: words[index].tobytes())
            order[first : last + 1] = run
    return order


@dataclasses.dataclass
class IdSums:
    """The order-independent part of a dataset id: row count and two 64-bit sums."""

    rows: int = 0
    keys: int = 0
    lane2: int = 0

    def add(self, keys: np.ndarray, lane2: np.ndarray) -> None:
        """Add a batch of rows' hashes."""
        self.rows += len(keys)
        self.keys = (self.keys + int(keys.sum(dtype=np.uint64))) & _MASK64
        self.lane2 = (self.lane2 + int(lane2.sum(dtype=np.uint64))) & _MASK64

    def merge(self, other: IdSums) -> None:
        """Add another partial result (any order gives the same total)."""
        self.rows += other.rows
        self.keys = (self.keys + other.keys) & _MASK64
        self.lane2 = (self.lane2 + other.lane2) & _MASK64

    def dataset_id(self, params: bytes) -> str:
        """Return the dataset id: first 24 hex digits of SHA-256(params, count, sums)."""
        digest = hashlib.sha256(params)
        for value in (self.rows, self.keys, self.lane2):
            digest.update(value.to_bytes(8, "little"))
        return digest.hexdigest()[:24]


def split_slices(
    order: np.ndarray, flags: np.ndarray | None, n_val: int, num_partitions: int
) -> dict[str, list[np.ndarray]]:
    """Cut rows in key order into the splits and P slices each: ``{split: [P arrays]}``."""
    if flags is None:
        chosen = {"train": order[n_val:], "validation": order[:n_val]}
    else:
        in_val = flags[order]
        chosen = {"train": order[~in_val], "validation": order[in_val]}
    return {split: np.array_split(idx, num_partitions) for split, idx in chosen.items()}


def bucket_bits(num_partitions: int) -> int:
    """Bits of the key that name a row's bucket for P partitions (see the module docstring)."""
    wanted = max(1, 512 * num_partitions - 1).bit_length()
    return min(MAX_BUCKET_BITS, max(MIN_BUCKET_BITS, wanted))


def buckets(keys: np.ndarray, bits: int) -> np.ndarray:
    """Each key's bucket (its top ``bits`` bits) as ``int64``."""
    return (keys >> np.uint64(64 - bits)).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class Destination:
    """Where one partition's rows are in its group's order, and which buckets hold them.

    Attributes:
        dest: ``split_index * P + index`` (train ``0..P-1``, validation ``P..2P-1``).
        group: ``0`` (all rows; or train rows with a validation column) or ``1``
            (validation rows with a validation column).
        begin: First rank of the partition in its group's order.
        end: One past its last rank.
        first_bucket: Bucket of rank ``begin``.
        last_bucket: Bucket of rank ``end - 1``.
        bucket_begin: Rank of the first row of ``first_bucket``.
        bucket_rows: Rows in buckets ``first_bucket..last_bucket`` (what its task receives).
    """

    dest: int
    group: int
    begin: int
    end: int
    first_bucket: int
    last_bucket: int
    bucket_begin: int
    bucket_rows: int


def _sizes(rows: int, parts: int) -> list[int]:
    base, extra = divmod(rows, parts)
    return [base + 1 if index < extra else base for index in range(parts)]


def plan_destinations(
    counts: np.ndarray, n_val: int, num_partitions: int, by_column: bool
) -> list[Destination]:
    """Turn per-group bucket counts into every partition's :class:`Destination`.

    Args:
        counts: ``(groups, buckets)`` row counts (1 group without a validation column,
            2 with one: train, validation).
        n_val: Validation rows.
        num_partitions: P.
        by_column: Whether a validation column splits the data.
    """
    ranges: list[tuple[int, int, int, int]] = []  # dest, group, begin, end
    if by_column:
        for group in (0, 1):
            begin = 0
            for index, size in enumerate(_sizes(int(counts[group].sum()), num_partitions)):
                ranges.append((group * num_partitions + index, group, begin, begin + size))
                begin += size
    else:
        total = int(counts[0].sum())
        begin = 0
        for index, size in enumerate(_sizes(n_val, num_partitions)):
            ranges.append((num_partitions + index, 0, begin, begin + size))
            begin += size
        for index, size in enumerate(_sizes(total - n_val, num_partitions)):
            ranges.append((index, 0, begin, begin + size))
            begin += size
    cumulative = np.cumsum(counts, axis=1)
    found: list[Destination] = []
    for dest, group, begin, end in ranges:
        ends = cumulative[group]
        first = int(np.searchsorted(ends, begin, side="right"))
        last = int(np.searchsorted(ends, end - 1, side="right"))
        start = int(ends[first] - counts[group, first])
        found.append(
            Destination(dest, group, begin, end, first, last, start, int(ends[last]) - start)
        )
    return sorted(found, key=lambda d: d.dest)


def route(
    destinations: Sequence[Destination], groups: np.ndarray, row_buckets: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(rows, dests)``: each row index once per partition whose buckets hold it."""
    all_rows: list[np.ndarray] = []
    all_dests: list[np.ndarray] = []
    for group in np.unique(groups).tolist():
        mine = sorted((d for d in destinations if d.group == group), key=lambda d: d.begin)
        firsts = np.array([d.first_bucket for d in mine])
        lasts = np.array([d.last_bucket for d in mine])
        ids = np.array([d.dest for d in mine])
        rows = np.flatnonzero(groups == group)
        found = row_buckets[rows]
        low = np.searchsorted(lasts, found, side="left")
        high = np.searchsorted(firsts, found, side="right")
        repeats = high - low
        index = np.repeat(rows, repeats)
        step = np.arange(len(index)) - np.repeat(np.cumsum(repeats) - repeats, repeats)
        all_rows.append(index)
        all_dests.append(ids[np.repeat(low, repeats) + step])
    if not all_rows:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(all_rows), np.concatenate(all_dests)
