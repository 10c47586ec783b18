"""A worker over its ``worker_memory`` spills partitions to local disk and trains the same bits."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from cerebro_spark.backends import Worker, WorkerJob, WorkerPool
from cerebro_spark.data import read_partition
from cerebro_spark.errors import DataError
from cerebro_spark.store import open_store
from tests.backends import contract
from tests.backends.contract import Dataset, make_dataset
from tests.backends.fake_transport import ThreadTransport

pytestmark = pytest.mark.torch

ALL = (0, 1, 2, 3)


def _budget(dataset: Dataset, partitions: tuple[int, ...]) -> int:
    """Held bytes of both splits of ``partitions``: a budget that holds exactly those."""
    return sum(
        read_partition(dataset.uri, split, index).nbytes
        for index in partitions
        for split in ("train", "validation")
    )


def _epoch(worker: Worker, store_root: str, prefix: str) -> list[tuple[str, str | None, str]]:
    """A trial's chain over every partition (run and train+write alike), then validations.

    Returns each unit's checkpoint SHA-256 (train) or metric states (validation).
    """
    out: list[tuple[str, str | None, str]] = []
    previous: str | None = None
    for step, partition in enumerate(ALL):
        task = contract.train_task(
            "t",
            partition,
            out=f"{prefix}/s{step}.pt",
            checkpoint_in=previous,
            step=step,
            epoch_units=len(ALL),
        )
        result = worker.run(task) if step % 2 else worker.train(task).write()
        out.append(("train", result.checkpoint_sha256, ""))
        previous = task.checkpoint_out
    assert previous is not None
    for partition in ALL:
        result = worker.run(contract.validate_task("t", partition, previous))
        assert "loss" in result.metric_states
        out.append(("validate", None, repr(result.to_json()["metric_states"])))
    digest = hashlib.sha256(open_store(store_root).get(previous)).hexdigest()
    assert out[len(ALL) - 1][1] == digest  # the reported digest is the stored bytes'
    return out


def test_a_worker_over_its_budget_spills_and_trains_bit_identical_units(tmp_path: Path) -> None:
    dataset = make_dataset(tmp_path / "dataset")
    store = str(tmp_path / "store")
    local = tmp_path / "local"
    budget = _budget(dataset, (0,))  # partition 0 fits; 1, 2 and 3 are spilled
    spilling = Worker(
        "w0",
        WorkerJob(dataset.uri, open_store(store), 1, worker_memory=budget),
        spill_dir=str(local),
    )
    assert spilling.load(ALL) == dataset.bytes_of(set(ALL))
    assert spilling.bytes_read == dataset.bytes_of(set(ALL))  # store bytes, each file once
    assert spilling.memory_budget == budget
    assert spilling.held_bytes == budget
    assert spilling.spilled() == [(s, i) for s in ("train", "validation") for i in (1, 2, 3)]
    directory = Path(str(spilling.spill_directory))
    assert directory.parent == local
    files = sorted(p.name for p in directory.iterdir())
    assert files == [f"{s}-0000{i}.arrow" for s in ("train", "validation") for i in (1, 2, 3)]
    assert spilling.spilled_bytes == sum(p.stat().st_size for p in directory.iterdir())

    spilled = _epoch(spilling, store, "spilled")
    assert spilling.bytes_read == dataset.bytes_of(set(ALL))  # units read no store bytes

    in_memory = Worker("w1", WorkerJob(dataset.uri, open_store(store), 1, worker_memory=1 << 30))
    in_memory.load(ALL)
    assert in_memory.spilled() == [] and in_memory.spill_directory is None
    assert _epoch(in_memory, store, "in-memory") == spilled

    spilling.drop([1, 2])
    assert sorted(p.name for p in directory.iterdir()) == [
        "train-00003.arrow",
        "validation-00003.arrow",
    ]
    assert spilling.partitions == frozenset({0, 3})
    spilling.close()
    assert not directory.exists() and list(local.iterdir()) == []
    assert spilling.partitions == frozenset() and spilling.held_bytes == 0


def test_a_load_that_fails_leaves_no_local_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cerebro_spark.backends._worker as worker_module
    import cerebro_spark.data as data

    dataset = make_dataset(tmp_path / "dataset")
    local = tmp_path / "local"
    worker = Worker(
        "w0",
        WorkerJob(dataset.uri, open_store(str(tmp_path / "store")), 1, worker_memory=1),
        spill_dir=str(local),
    )
    real = data.read_partition

    def flaky(uri: str, split: str, index: int, **kwargs: object) -> data.PartitionData:
        if (split, index) == ("validation", 2):
            raise DataError("broken file of partition 2")
        return real(uri, split, index, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(worker_module, "read_partition", flaky)  # where the worker reads
    with pytest.raises(DataError, match="broken file of partition 2"):
        worker.load([1, 2])
    assert worker.partitions == frozenset() and worker.spilled() == []
    assert list(local.iterdir()) == []  # what was spilled of this load is gone
    assert worker.bytes_read == dataset.bytes_of({1}) + dataset.manifest.partition("train", 2).bytes
    monkeypatch.undo()
    worker.load([1, 2])
    assert worker.spilled_bytes > 0
    worker.close()


def test_a_worker_that_ends_removes_its_local_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers served by the pool spill under SPARK_LOCAL_DIRS; stopping them cleans up."""
    dataset = make_dataset(tmp_path / "dataset")
    local = tmp_path / "executor-local"
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{local},{tmp_path / 'unused'}")
    job = WorkerJob(dataset.uri, open_store(str(tmp_path / "store")), 1, worker_memory=1)
    with WorkerPool(ThreadTransport(make_worker=Worker), 2, heartbeat_s=0.5) as pool:
        pool.start(job)
        pool.wait_started(60)
        spilled = sorted(p.name for d in local.iterdir() for p in d.iterdir())
        assert spilled == sorted(f"{s}-0000{i}.arrow" for s in ("train", "validation") for i in ALL)
        assert {d.name.split("-")[1] for d in local.iterdir()} == {"w0", "w1"}
        assert sum(info.bytes_read for info in pool.workers().values()) == dataset.bytes_of(
            set(ALL)
        )
        result = contract.result(pool.submit("w0", contract.train_task("a", 0, out="a.pt")))
        assert result.checkpoint_sha256
    assert list(local.iterdir()) == []
    assert not (tmp_path / "unused").exists()
