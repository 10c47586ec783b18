"""Compact residence: partitions in RAM within a budget, the rest spilled and memory-mapped."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

import cerebro_spark.data._residence as residence_module
from cerebro_spark.data import KindOptions, PartitionData, prepare_dataset, read_partition
from cerebro_spark.data._format import ColumnInfo, HeldColumn, stack_dense
from cerebro_spark.data._residence import (
    Residence,
    available_memory,
    default_worker_memory,
    format_bytes,
    local_dir,
    parse_memory,
    spill,
    sweep_stale,
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


def _mapped(path: str) -> bool:
    """Whether ``path`` is mapped in this process (``/proc/self/maps``)."""
    with open("/proc/self/maps") as maps:
        return any(line.rstrip("\n").endswith(" " + path) for line in maps)


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
    monkeypatch.setattr(residence_module, "address_space_limit", lambda: None)
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


def test_under_an_address_space_limit_the_default_is_at_most_half_of_what_is_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PySpark caps a Python worker's address space at its share: that share is no budget."""
    monkeypatch.setattr(residence_module, "address_space_in_use", lambda: 1000 << 20)
    monkeypatch.setattr(residence_module, "address_space_limit", lambda: 1536 << 20)
    monkeypatch.setenv("PYSPARK_EXECUTOR_MEMORY_MB", "1536")
    assert default_worker_memory(4) == (
        268 << 20,  # (1536 - 1000) MiB / 2
        "half of the address space left: (1.5 GiB limit - 1000.0 MiB in use) / 2 (RLIMIT_AS, "
        "set by PySpark from spark.executor.pyspark.memory: 1536 MiB per Python worker)",
    )
    monkeypatch.delenv("PYSPARK_EXECUTOR_MEMORY_MB")
    monkeypatch.setattr(residence_module, "address_space_limit", lambda: 900 << 20)
    assert default_worker_memory(4) == (  # nothing left: every partition is spilled
        1,
        "half of the address space left: (900.0 MiB limit - 1000.0 MiB in use) / 2 "
        "(RLIMIT_AS, ulimit -v)",
    )
    monkeypatch.setattr(residence_module, "address_space_limit", lambda: 1 << 50)
    assert default_worker_memory(4)[1] == "half of the available memory / 4 workers on this host"


def test_spills_go_under_the_first_spark_local_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_LOCAL_DIRS", "/mnt/a, /mnt/b")
    assert local_dir() == "/mnt/a"
    monkeypatch.delenv("SPARK_LOCAL_DIRS")
    import tempfile

    assert local_dir() == tempfile.gettempdir()


# -- one spilled partition -------------------------------------------------------------------


@pytest.mark.parametrize("split", ["train", "validation"])
def test_a_spilled_partition_is_mapped_back_only_while_it_is_read(
    dataset: str, tmp_path: Path, split: str
) -> None:
    held = read_partition(dataset, split, 1)
    path = str(tmp_path / "p.arrow")
    spilled = spill(held, path)
    assert spilled.file_bytes == os.path.getsize(path)
    assert not spilled.mapped and not _mapped(path)  # written, not mapped
    with spilled.reading() as data:
        assert _mapped(path)
        _same(held, data)
        for column in (*data.columns, data):
            values = column.values if hasattr(column, "values") else column.labels
            assert not values.flags.writeable and not values.flags.owndata  # views of the map
    assert not spilled.mapped
    assert _mapped(path)  # ``data`` still refers to the views: unmapped when they go
    del data, column, values
    assert not _mapped(path)
    with spilled.reading() as again:  # mapped again for the next reader
        _same(held, again)
    del again
    assert not _mapped(path)
    spilled.close()
    assert not (tmp_path / "p.arrow").exists()
    with pytest.raises(FileNotFoundError, match="was removed"):
        spilled.open()


def test_released_pages_leave_the_process_and_read_back_the_same(
    dataset: str, tmp_path: Path
) -> None:
    path = str(tmp_path / "p.arrow")
    spilled = spill(read_partition(dataset, "train", 0), path)
    with spilled.reading() as data:
        before = _touch(data)
        assert _mapped_rss(path) > 0
        spilled.release()
        assert _mapped_rss(path) == 0
        assert _touch(data) == before  # faulted in again from the file
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
    with spilled.reading() as mapped:
        assert mapped.dense_block is not None
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
    with spilled.reading() as data:
        _same(held, data)
        assert np.array_equal(data.features, held.features)
    spilled.close()


# -- a worker's residence ----------------------------------------------------------------------


def test_partitions_stay_in_ram_while_they_fit_and_spill_beyond(
    dataset: str, tmp_path: Path
) -> None:
    parts = [read_partition(dataset, s, i) for i in (0, 1) for s in ("train", "validation")]
    budget = parts[0].nbytes + parts[1].nbytes
    residence = Residence("w3", budget, directory=str(tmp_path))
    assert [residence.admit(p) for p in parts] == [True, True, False, False]
    assert residence.held_bytes == budget
    assert residence.spilled() == [("train", 1), ("validation", 1)]
    assert residence.partitions() == [(s, i) for s in ("train", "validation") for i in (0, 1)]
    for original in parts:
        with residence.partition(original.split, original.index) as held:
            if original.index == 0:
                assert held is original  # it fit: kept as read
            _same(original, held)
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
    assert not residence.holds("train", 0) and residence.holds("validation", 1)
    with (
        pytest.raises(KeyError, match="worker w3 holds no train partition 0"),
        residence.partition("train", 0),
    ):
        pass
    residence.close()
    assert not Path(directory).exists() and residence.directory is None
    assert (residence.held_bytes, residence.spilled_bytes) == (0, 0)
    assert list(tmp_path.iterdir()) == []


def test_the_directory_goes_once_nothing_is_spilled(dataset: str, tmp_path: Path) -> None:
    residence = Residence("w0", 1, directory=str(tmp_path))
    assert not residence.admit(read_partition(dataset, "train", 0))
    directory = residence.directory
    assert directory is not None and Path(directory).is_dir()
    residence.discard("train", 0)
    assert not Path(directory).exists() and residence.directory is None
    residence.close()


def test_a_unit_reads_a_spilled_partition_mapped_its_pages_released_as_it_goes(
    dataset: str, tmp_path: Path
) -> None:
    residence = Residence("w1", 1, directory=str(tmp_path), release_interval_s=0.5)
    assert not residence.admit(read_partition(dataset, "train", 0))
    assert residence.is_spilled("train", 0)
    (path,) = (str(p) for p in Path(str(residence.directory)).iterdir())
    assert not _mapped(path)
    with residence.partition("train", 0) as data:  # the first release comes 0.5 s after this
        _touch(data)
        assert _mapped_rss(path) > 0
        deadline = time.monotonic() + 5
        while _mapped_rss(path) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _mapped_rss(path) == 0  # released by the thread while the unit runs
        _touch(data)
    del data
    assert not _mapped(path)  # and unmapped at its end
    assert "cerebro-release-w1" in [t.name for t in threading.enumerate()]
    residence.discard("train", 0)  # nothing spilled any more: the release thread ends
    deadline = time.monotonic() + 5
    while "cerebro-release-w1" in [t.name for t in threading.enumerate()]:
        assert time.monotonic() < deadline, "the release thread did not end"
        time.sleep(0.01)
    residence.close()


def test_reading_a_partition_held_in_ram_changes_nothing(dataset: str, tmp_path: Path) -> None:
    residence = Residence("w2", 1 << 30, directory=str(tmp_path))
    held = read_partition(dataset, "validation", 0)
    assert residence.admit(held) and not residence.is_spilled("validation", 0)
    with residence.partition("validation", 0) as data:
        assert data is held
        checksum = _touch(held)
    assert _touch(held) == checksum and residence.directory is None
    residence.close()


# -- an address-space limit (PySpark's spark.executor.pyspark.memory) ------------------------

_MAP_UNDER_A_LIMIT = """
import gc, json, resource, sys
import numpy as np
from cerebro_spark.data import PartitionData
from cerebro_spark.data._residence import Residence, address_space_in_use, address_space_limit
from cerebro_spark.errors import ConfigError

residence = Residence("w5", 1, directory=sys.argv[1])
rows = 1 << 20
features = np.arange(rows * 16, dtype=np.float32).reshape(rows, 16)
residence.admit(PartitionData.from_arrays("train", 2, features, np.arange(rows), 99))
del features
gc.collect()
limit = address_space_in_use() + (32 << 20)  # the 72 MiB file does not fit
resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
report = {"limit": limit, "seen": address_space_limit(), "file": residence.spilled_bytes}
try:
    with residence.partition("train", 2):
        report["mapped"] = True
except ConfigError as error:
    report["error"] = str(error)
resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
with residence.partition("train", 2) as data:  # the limit lifted: it maps
    report["sum"] = float(data.columns[0].values[-1].sum())
residence.close()
print(json.dumps(report))
"""


def test_a_partition_that_does_not_fit_the_address_space_limit_is_refused_by_name(
    tmp_path: Path,
) -> None:
    """PySpark sets RLIMIT_AS from spark.executor.pyspark.memory; a mapping beyond it fails."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYSPARK_EXECUTOR_MEMORY_MB": "512"}
    child = subprocess.run(
        [sys.executable, "-c", _MAP_UNDER_A_LIMIT, str(tmp_path)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert report["seen"] == report["limit"]  # address_space_limit reads RLIMIT_AS
    assert "mapped" not in report
    pattern = re.escape(
        f"worker w5 cannot map its spilled train partition 2 ({format_bytes(report['file'])}): "
        f"this Python worker's address space is limited to {format_bytes(report['limit'])} "
        "(RLIMIT_AS, set by PySpark from spark.executor.pyspark.memory: 512 MiB per Python "
        "worker) and IN_USE of it is in use (0 B of partitions kept in RAM, worker_memory "
        "1 B); lower worker_memory so that fewer partitions stay in RAM, or raise "
        "spark.executor.pyspark.memory or unset it (OSError: [Errno 12] Cannot allocate "
        "memory)"
    ).replace("IN_USE", r"[0-9.]+ [MG]iB")
    assert re.fullmatch(pattern, report["error"]), report["error"]
    last_row = np.arange((1 << 20) * 16 - 16, (1 << 20) * 16, dtype=np.float32)
    assert report["sum"] == float(last_row.sum())
    assert list(tmp_path.iterdir()) == []


# -- stale local directories of dead workers ---------------------------------------------------


def _dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _stale(parent: Path, name: str) -> Path:
    """A directory as a worker leaves it, with a partition file in it."""
    path = parent / name
    path.mkdir()
    (path / "train-00000.arrow").write_bytes(b"x" * 100)
    return path


_SPILLING_WORKER = """
import sys, time
import numpy as np
from cerebro_spark.data import PartitionData
from cerebro_spark.data._residence import Residence

residence = Residence("w7", 1, directory=sys.argv[1])
residence.admit(PartitionData.from_arrays("train", 0, np.ones((64, 4), np.float32), np.arange(64)))
print(residence.directory, flush=True)
time.sleep(600)
"""


def test_a_worker_killed_by_sigkill_leaves_its_directory_and_the_next_sweep_removes_it(
    tmp_path: Path,
) -> None:
    root = Path(__file__).resolve().parents[2]
    worker = subprocess.Popen(
        [sys.executable, "-c", _SPILLING_WORKER, str(tmp_path)],
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None
        directory = Path(worker.stdout.readline().strip())
        assert directory.parent == tmp_path
        assert directory.name.startswith(f"cerebro-w7-{worker.pid}-")
        assert [p.name for p in directory.iterdir()] == ["train-00000.arrow"]
        assert Residence("w0", 1, directory=str(tmp_path)).sweep() == []  # it is alive
        assert directory.is_dir()
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
        if worker.stdout is not None:
            worker.stdout.close()
    assert [p.name for p in directory.iterdir()] == ["train-00000.arrow"]  # left behind
    assert Residence("w0", 1, directory=str(tmp_path)).sweep() == [str(directory)]
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_removes_only_unlocked_directories_of_dead_pids(tmp_path: Path) -> None:
    import fcntl

    dead = _dead_pid()
    gone = _stale(tmp_path, f"cerebro-w0-{dead}-abcd1234")
    gone_too = _stale(tmp_path, f"cerebro-w-1-{dead}-1234_xyz")  # a worker id with '-'
    mine = _stale(tmp_path, f"cerebro-w1-{os.getpid()}-abcd1234")  # this process's
    live = _stale(tmp_path, f"cerebro-w2-{os.getppid()}-abcd1234")  # a live pid, unlocked
    locked = _stale(tmp_path, f"cerebro-w3-{dead}-zzzz0000")  # pid not seen here, but locked
    lock = os.open(locked, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # its owner, in another pid namespace
    young = _stale(tmp_path, f".cerebro-w4-{dead}-abcd1234")  # being made (staging)
    old = _stale(tmp_path, f".cerebro-w5-{dead}-abcd1234")
    os.utime(old, (time.time() - 120, time.time() - 120))
    others = [_stale(tmp_path, name) for name in ("cerebro-notes", "blockmgr-1", "0c")]
    (tmp_path / f"cerebro-w6-{dead}-file0000").write_text("a file, not a directory")
    (tmp_path / f"cerebro-w8-{dead}-link0000").symlink_to(others[0])
    try:
        removed = sweep_stale(str(tmp_path))
    finally:
        os.close(lock)
    assert removed == sorted(str(p) for p in (old, gone, gone_too))
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {p.name for p in (mine, live, locked, young, *others)} | {
        f"cerebro-w6-{dead}-file0000",
        f"cerebro-w8-{dead}-link0000",
    }
    assert sweep_stale(str(tmp_path)) == [str(locked)]  # its lock was let go
    assert sweep_stale(str(tmp_path / "missing")) == []


def test_a_zombie_counts_as_dead(tmp_path: Path) -> None:
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "the child did not end"
            time.sleep(0.01)
        stale = _stale(tmp_path, f"cerebro-w0-{zombie.pid}-abcd1234")
        assert sweep_stale(str(tmp_path)) == [str(stale)]
    finally:
        zombie.wait()


def test_a_new_directory_is_locked_by_its_residence_and_unlocked_when_it_goes(
    dataset: str, tmp_path: Path
) -> None:
    import fcntl

    residence = Residence("w9", 1, directory=str(tmp_path))
    residence.admit(read_partition(dataset, "train", 0))
    directory = str(residence.directory)
    assert [p.name for p in tmp_path.iterdir()] == [Path(directory).name]  # no staging left
    probe = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(probe)
    residence.close()
    assert list(tmp_path.iterdir()) == []
