"""The worker: it imports torch in a thread while it reads its partitions."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cerebro_spark.backends import Worker, WorkerJob
from cerebro_spark.errors import DataError
from cerebro_spark.store import open_store
from tests.backends.contract import make_dataset

pytestmark = pytest.mark.torch


def test_a_worker_warms_up_while_it_reads_and_records_both(tmp_path: Path) -> None:
    dataset = make_dataset(tmp_path / "dataset")
    job = WorkerJob(dataset.uri, open_store(str(tmp_path / "store")), torch_threads=1)
    worker = Worker("w0", job)
    worker.warm_up()
    worker.warm_up()  # once
    read = worker.load([0, 2])
    assert read == dataset.bytes_of({0, 2}) > 0 and worker.partitions == {0, 2}
    assert set(worker.startup) == {"partitions", "torch"}  # both done when load returns
    assert "torch._dynamo" in sys.modules  # what the first optimizer would import


def test_a_failed_warm_up_fails_the_load_that_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset = make_dataset(tmp_path / "dataset")
    job = WorkerJob(dataset.uri, open_store(str(tmp_path / "store")), torch_threads=1)
    worker = Worker("w0", job)

    def broken() -> None:
        raise ImportError("no torch here")

    monkeypatch.setattr(worker, "_import_torch", broken)
    worker.warm_up()
    with pytest.raises(ImportError, match="no torch here"):
        worker.load([1])
    assert worker.partitions == frozenset()  # none of the load's partitions are held
    monkeypatch.undo()
    assert worker.load([1]) > 0  # a later load imports torch itself


def test_a_failed_read_among_several_loads_none_and_raises_the_first_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cerebro_spark.data as data

    dataset = make_dataset(tmp_path / "dataset")
    job = WorkerJob(dataset.uri, open_store(str(tmp_path / "store")), torch_threads=1)
    worker = Worker("w0", job)
    real = data.read_partition
    started: list[tuple[str, int]] = []

    def flaky(uri: str, split: str, index: int, **kwargs: object) -> data.PartitionData:
        started.append((split, index))
        if index in (1, 3) and split == "validation":
            raise DataError(f"broken file of partition {index}")
        return real(uri, split, index, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(data, "read_partition", flaky)
    with pytest.raises(DataError, match="broken file of partition 1"):
        worker.load([3, 0, 1])
    assert sorted(started) == sorted((s, i) for i in (0, 1, 3) for s in ("train", "validation"))
    assert worker.partitions == frozenset()  # none of this load's partitions are held
    read = dataset.bytes_of({0}) + sum(dataset.manifest.partition("train", i).bytes for i in (1, 3))
    assert worker.bytes_read == read  # what was read still counts
    monkeypatch.undo()
    assert worker.load([3, 0, 1]) == dataset.bytes_of({0, 1, 3})
