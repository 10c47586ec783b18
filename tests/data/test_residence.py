"""Compact residence: partitions in RAM within a budget, the rest spilled and memory-mapped."""

from __future__ import annotations

import io
import os
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from cerebro_spark.data import KindOptions, PartitionData, prepare_dataset, read_partition
from cerebro_spark.data._format import ColumnInfo, HeldColumn, stack_dense
from cerebro_spark.data._residence import (
    Residence,
    available_memory,
    default_worker_memory,
    local_dir,
    parse_memory,
    spill,
)
from cerebro_spark.errors import ConfigError

ROWS = 80


def _png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A 2-partition dataset of every kind (image, categorical, sequence, uint8 array, float16)."""
    rng = np.random.default_rng(5)
    words = np.array(["red", "green", "blue", "plum"])
    table = pa.table(
        {
            "img": pa.array(
                [_png(rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)) for _ in range(ROWS)],
                pa.binary(),
            ),
            "color": pa.array(words[rng.integers(0, 4, ROWS)].tolist()),
            "tokens": pa.array([list(range(1, 1 + i % 5)) for i in range(ROWS)]),
            "px": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.integers(0, 256, ROWS * 6).astype(np.uint8)), 6
            ),
            "half": pa.array(rng.normal(size=ROWS).astype(np.float16)),
            "label": pa.array(rng.integers(0, 3, ROWS)),
        }
    )
    root = tmp_path_factory.mktemp("residence")
    manifest = prepare_dataset(
        table,
        str(root),
        features=["img", "color", "tokens", "px", "half"],
        label="label",
        num_partitions=2,
        seed=3,
        kinds=KindOptions(image_size=(6, 5), max_length=4),
    )
    return f"{root}/datasets/{manifest.dataset_id}"


def _same(a: PartitionData, b: PartitionData) -> None:
    assert (a.split, a.index, a.rows, a.bytes_read) == (b.split, b.index, b.rows, b.bytes_read)
    assert a.labels.dtype == b.labels.dtype and np.array_equal(a.labels, b.labels)
    for x, y in zip(a.columns, b.columns, strict=True):
        assert x.info == y.info
        assert x.values.dtype == y.values.dtype, x.info.name
        assert [x.row(i).tobytes() for i in range(a.rows)] == [
            y.row(i).tobytes() for i in range(b.rows)
        ], x.info.name


def _mapped_rss(path: str) -> int:
    """Bytes of ``path``'s mapping resident in this process (``/proc/self/smaps``)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
                inside = fields[-1] == path
            elif inside and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


def _touch(data: PartitionData) -> int:
    """Read every byte of every array (as a unit's batches would); return a checksum."""
    total = int(data.labels.sum())
    for column in data.columns:
        total += int(column.values.view(np.uint8).sum())
        if column.offsets is not None:
            total += int(column.offsets.sum())
    return total


# -- sizes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (4096, 4096),
        ("4GiB", 4 << 30),
        ("512MiB", 512 << 20),
        ("512 mib", 512 << 20),
        ("2g", 2 << 30),
        ("1.5GiB", 3 << 29),
        ("100", 100),
        ("64KB", 64 << 10),
    ],
)
def test_sizes_parse_in_binary_units(given: int | str, expected: int) -> None:
    assert parse_memory(given) == expected


@pytest.mark.parametrize("given", [0, -1, True, "lots", "4 parsecs", "0MiB", 1.5, "GiB"])
def test_a_bad_size_names_the_value_and_the_rule(given: object) -> None:
    with pytest.raises(ConfigError) as error:
        parse_memory(given)
    assert str(error.value) == (
        "worker_memory must be a number of bytes (an int ≥ 1) or a size such as '4GiB', "
        f"'512MiB' or '2g', got {given!r}"
    )


def test_the_default_budget_is_sparks_share_or_half_the_available_memory_per_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYSPARK_EXECUTOR_MEMORY_MB", "768")
    assert default_worker_memory(4) == (
        768 << 20,
        "spark.executor.pyspark.memory per Python worker",
    )
    monkeypatch.delenv("PYSPARK_EXECUTOR_MEMORY_MB")
    budget, rule = default_worker_memory(4)
    assert rule == "half of the available memory / 4 workers on this host"
    assert abs(budget - available_memory() // 8) < 256 << 20  # available memory moves a bit
    assert default_worker_memory(None)[1].endswith(f"/ {os.cpu_count()} workers on this host")


def test_spills_go_under_the_first_spark_local_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_LOCAL_DIRS", "/mnt/a, /mnt/b")
    assert local_dir() == "/mnt/a"
    monkeypatch.delenv("SPARK_LOCAL_DIRS")
    import tempfile

    assert local_dir() == tempfile.gettempdir()


# -- one spilled partition -------------------------------------------------------------------


@pytest.mark.parametrize("split", ["train", "validation"])
def test_a_spilled_partition_maps_back_with_the_same_rows_as_zero_copy_views(
    dataset: str, tmp_path: Path, split: str
) -> None:
    held = read_partition(dataset, split, 1)
    spilled = spill(held, str(tmp_path / "p.arrow"))
    data = spilled.data
    assert data is not None
    _same(held, data)
    assert spilled.file_bytes == os.path.getsize(tmp_path / "p.arrow")
    for column in (*data.columns, data):
        values = column.values if hasattr(column, "values") else column.labels
        assert not values.flags.writeable and not values.flags.owndata  # a view of the map
    spilled.close()
    assert not (tmp_path / "p.arrow").exists()


def test_released_pages_leave_the_process_and_read_back_the_same(
    dataset: str, tmp_path: Path
) -> None:
    path = str(tmp_path / "p.arrow")
    spilled = spill(read_partition(dataset, "train", 0), path)
    assert spilled.data is not None
    before = _touch(spilled.data)
    assert _mapped_rss(path) > 0
    spilled.release()
    assert _mapped_rss(path) == 0
    assert _touch(spilled.data) == before  # faulted in again from the file
    spilled.close()


def test_a_dense_block_spills_as_one_block_its_columns_views_of_it(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    infos = [ColumnInfo("a", "float32", (), kind="number"), ColumnInfo("b", "float32", (2, 3))]
    held = (
        HeldColumn(infos[0], rng.normal(size=40).astype(np.float32)),
        HeldColumn(infos[1], rng.normal(size=(40, 2, 3)).astype(np.float32)),
    )
    columns, block = stack_dense(held, 40)
    assert block is not None
    data = PartitionData("train", 0, columns, np.arange(40), 9, dense_block=block)
    spilled = spill(data, str(tmp_path / "b.arrow"))
    mapped = spilled.data
    assert mapped is not None and mapped.dense_block is not None
    _same(data, mapped)
    assert np.array_equal(mapped.dense_block, block) and not mapped.dense_block.flags.owndata
    for column in mapped.columns:
        assert np.shares_memory(column.values, mapped.dense_block)
    assert np.array_equal(mapped.features, data.features)
    spilled.close()


def test_a_dense_partition_spills_as_well(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    held = PartitionData.from_arrays(
        "train", 3, rng.normal(size=(50, 2, 3)).astype(np.float32), np.arange(50), 77
    )
    spilled = spill(held, str(tmp_path / "d.arrow"))
    assert spilled.data is not None
    _same(held, spilled.data)
    assert np.array_equal(spilled.data.features, held.features)
    spilled.close()


# -- a worker's residence ----------------------------------------------------------------------


def test_partitions_stay_in_ram_while_they_fit_and_spill_beyond(
    dataset: str, tmp_path: Path
) -> None:
    parts = [read_partition(dataset, s, i) for i in (0, 1) for s in ("train", "validation")]
    budget = parts[0].nbytes + parts[1].nbytes
    residence = Residence("w3", budget, directory=str(tmp_path))
    admitted = [residence.admit(p) for p in parts]
    assert admitted[0] is parts[0] and admitted[1] is parts[1]  # they fit: kept as read
    assert residence.held_bytes == budget
    assert residence.spilled() == [("train", 1), ("validation", 1)]
    for original, mapped in zip(parts, admitted, strict=True):
        _same(original, mapped)
    directory = residence.directory
    assert directory is not None and Path(directory).parent == tmp_path
    assert Path(directory).name.startswith(f"cerebro-w3-{os.getpid()}-")
    files = sorted(p.name for p in Path(directory).iterdir())
    assert files == ["train-00001.arrow", "validation-00001.arrow"]
    assert residence.spilled_bytes == sum(p.stat().st_size for p in Path(directory).iterdir())
    residence.discard("train", 1)
    assert sorted(p.name for p in Path(directory).iterdir()) == ["validation-00001.arrow"]
    residence.discard("train", 0)
    assert residence.held_bytes == parts[1].nbytes
    residence.close()
    assert not Path(directory).exists() and residence.directory is None
    assert (residence.held_bytes, residence.spilled_bytes) == (0, 0)
    assert list(tmp_path.iterdir()) == []


def test_the_directory_goes_once_nothing_is_spilled(dataset: str, tmp_path: Path) -> None:
    residence = Residence("w0", 1, directory=str(tmp_path))
    residence.admit(read_partition(dataset, "train", 0))
    directory = residence.directory
    assert directory is not None and Path(directory).is_dir()
    residence.discard("train", 0)
    assert not Path(directory).exists() and residence.directory is None
    residence.close()


def test_streaming_releases_the_pages_a_unit_read_periodically_and_at_its_end(
    dataset: str, tmp_path: Path
) -> None:
    residence = Residence("w1", 1, directory=str(tmp_path), release_interval_s=0.5)
    data = residence.admit(read_partition(dataset, "train", 0))
    assert residence.is_spilled(data)
    (path,) = (str(p) for p in Path(str(residence.directory)).iterdir())
    with residence.streaming(data):  # the first release comes 0.5 s after this
        _touch(data)
        assert _mapped_rss(path) > 0
        deadline = time.monotonic() + 5
        while _mapped_rss(path) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _mapped_rss(path) == 0  # released by the thread while the unit runs
        _touch(data)
    assert _mapped_rss(path) == 0  # and at its end
    assert "cerebro-release-w1" in [t.name for t in threading.enumerate()]
    residence.discard("train", 0)  # nothing spilled any more: the release thread ends
    deadline = time.monotonic() + 5
    while "cerebro-release-w1" in [t.name for t in threading.enumerate()]:
        assert time.monotonic() < deadline, "the release thread did not end"
        time.sleep(0.01)
    residence.close()


def test_streaming_a_partition_held_in_ram_changes_nothing(dataset: str, tmp_path: Path) -> None:
    residence = Residence("w2", 1 << 30, directory=str(tmp_path))
    held = read_partition(dataset, "validation", 0)
    assert residence.admit(held) is held and not residence.is_spilled(held)
    with residence.streaming(held):
        checksum = _touch(held)
    assert _touch(held) == checksum and residence.directory is None
    residence.close()
