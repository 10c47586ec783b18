from __future__ import annotations

import json
import multiprocessing
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cerebro_spark.backends import Backend, LocalBackend, LocalTransport, Worker, WorkerJob
from cerebro_spark.errors import ConfigError, DataError, StoreError, TrialError, WorkerLostError
from cerebro_spark.store import Store, open_store
from cerebro_spark.units import UnitKind
from tests.backends.contract import (
    GATED,
    RESULT_TIMEOUT_S,
    BackendContract,
    Dataset,
    gated,
    make_dataset,
    result,
    train_task,
    validate_task,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[2]


def worker_children() -> list[multiprocessing.process.BaseProcess]:
    return [p for p in multiprocessing.active_children() if p.name.startswith("cerebro-worker-")]


@pytest.fixture(autouse=True, scope="module")
def no_worker_outlives_the_module() -> Iterator[None]:
    yield
    assert worker_children() == []


@pytest.fixture(autouse=True)
def no_worker_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if request.cls is None:  # the contract class shares one backend between its tests
        assert worker_children() == []


class TestLocalBackend(BackendContract):
    def make_backend(self, num_workers: int) -> Backend:
        return LocalBackend(num_workers)

    def kill_worker(self, backend: Backend, worker_id: str) -> None:
        assert isinstance(backend, LocalBackend)
        backend.kill_worker(worker_id)


# -- fixtures for the LocalBackend-only tests ----------------------------------------------


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return make_dataset(tmp_path_factory.mktemp("local-backend") / "dataset")


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return open_store(str(tmp_path / "store"))


@pytest.fixture
def job(dataset: Dataset, store: Store) -> WorkerJob:
    return WorkerJob(dataset_uri=dataset.uri, store=store, torch_threads=1)


@pytest.fixture
def local(job: WorkerJob) -> Iterator[Callable[[int], LocalBackend]]:
    backends: list[LocalBackend] = []

    def start(num_workers: int) -> LocalBackend:
        backend = LocalBackend(num_workers)
        backends.append(backend)
        backend.start(job)
        backend.wait_started(RESULT_TIMEOUT_S)
        return backend

    yield start
    for backend in backends:
        backend.close()


def partitions_of(backend: LocalBackend) -> dict[str, set[int]]:
    return {worker_id: set(info.partitions) for worker_id, info in backend.workers().items()}


# -- the in-process Worker -------------------------------------------------------------------


@pytest.fixture
def torch_threads() -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.torch
@pytest.mark.usefixtures("torch_threads")
def test_worker_reads_each_partition_once_and_runs_units_on_the_right_split(
    job: WorkerJob, dataset: Dataset, store: Store
) -> None:
    import torch

    worker = Worker("w7", WorkerJob(job.dataset_uri, job.store, torch_threads=2))
    assert worker.load([2, 0, 2]) == dataset.bytes_of({0, 2})
    assert worker.partitions == frozenset({0, 2})
    assert torch.get_num_threads() == 2
    assert worker.load([0]) == 0
    assert worker.bytes_read == dataset.bytes_of({0, 2})
    trained = worker.run(train_task("t", 0))
    assert trained.worker_id == "w7"
    assert trained.rows == dataset.manifest.partition("train", 0).rows
    key = trained.task.checkpoint_out
    assert key is not None and store.exists(key)
    checked = worker.run(validate_task("t", 0, key))
    assert checked.task.kind is UnitKind.VALIDATE
    assert checked.rows == dataset.manifest.partition("validation", 0).rows
    with pytest.raises(ValueError, match=r"w7 does not hold partition 1"):
        worker.run(train_task("t", 1))
    with pytest.raises(ValueError, match=r"partition 9 is outside range\(num_partitions=4\)"):
        worker.load([9])
    worker.drop([0, 3])
    assert worker.partitions == frozenset({2})
    assert worker.bytes_read == dataset.bytes_of({0, 2})  # dropping does not reduce it


# -- placement, validation, start failures -----------------------------------------------------


def test_bad_arguments_are_refused(job: WorkerJob) -> None:
    with pytest.raises(ConfigError, match="num_workers must be an integer >= 1, got 0"):
        LocalBackend(0)
    with pytest.raises(ConfigError, match="start_method must be 'spawn' or 'forkserver'"):
        LocalBackend(1, start_method="fork")
    with (
        LocalBackend(5) as backend,
        pytest.raises(ConfigError, match="num_workers=5 exceeds num_partitions=4"),
    ):
        backend.start(job)
    with LocalBackend(1) as backend, pytest.raises(ConfigError, match="torch_threads"):
        backend.start(WorkerJob(job.dataset_uri, job.store, torch_threads=0))


@pytest.mark.torch
def test_when_no_worker_can_load_start_fails_with_the_error(tmp_path: Path, store: Store) -> None:
    broken = make_dataset(tmp_path / "broken")
    for partition in (0, 1):  # w0's and w1's
        path = Path(broken.uri) / broken.manifest.partition("train", partition).path
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    backend = LocalBackend(2)
    with pytest.raises(DataError, match=r"train partition [01]") as info:
        backend.start(WorkerJob(broken.uri, store))
    assert re.search(r"worker w[01] traceback", str(info.value.__cause__))
    assert backend.workers() == {}
    backend.close()


@pytest.mark.torch
def test_a_worker_that_dies_while_starting_fails_start(dataset: Dataset, tmp_path: Path) -> None:
    from tests.backends.failing_spec import ExplodingStore  # imports torch

    backend = LocalBackend(2)
    with pytest.raises(WorkerLostError, match=r"lost before it registered: .*exit code 3"):
        backend.start(WorkerJob(dataset.uri, ExplodingStore(str(tmp_path / "store"))))
    assert backend.workers() == {}
    backend.close()


# -- errors in units ---------------------------------------------------------------------------


@pytest.mark.torch
def test_an_io_error_in_the_worker_is_a_retryable_store_error(
    local: Callable[[int], LocalBackend], job: WorkerJob
) -> None:
    backend = local(1)
    with pytest.raises(RuntimeError, match="already"):
        backend.start(job)
    future = backend.submit("w0", validate_task("t", 0, "no/such/checkpoint.pt"))
    with pytest.raises(StoreError, match="FileNotFoundError") as info:
        result(future)
    assert "w0" in str(info.value)
    assert not isinstance(info.value, TrialError)
    assert result(backend.submit("w0", train_task("t", 0))).rows > 0
    # any other error (here: a malformed task) fails the trial, with the worker's traceback
    future = backend.submit("w0", train_task("t", 0, step=5, epoch_units=1))
    with pytest.raises(TrialError, match="ConfigError") as failure:
        result(future)
    assert "Traceback" in str(failure.value)
    assert result(backend.submit("w0", train_task("t", 0))).rows > 0


# -- placement, losses, re-homing, joins -------------------------------------------------------


@pytest.mark.torch
def test_placement_is_i_mod_n_and_lost_partitions_go_to_the_workers_holding_fewest(
    local: Callable[[int], LocalBackend], dataset: Dataset
) -> None:
    backend = local(3)
    assert partitions_of(backend) == {"w0": {0, 3}, "w1": {1}, "w2": {2}}
    assert all(info.device == "cpu" for info in backend.workers().values())
    assert set(backend.pids()) == {"w0", "w1", "w2"}
    backend.kill_worker("w0")  # idle: noticed through the process sentinel
    assert partitions_of(backend) == {"w1": {0, 1}, "w2": {2, 3}}
    assert set(backend.pids()) == {"w1", "w2"}
    wait_until(
        lambda: all(
            info.bytes_read == dataset.bytes_of(info.partitions)
            for info in backend.workers().values()
        ),
        "the re-homed partitions to be loaded",
    )
    for worker_id, partition in (("w1", 0), ("w2", 3)):
        assert result(backend.submit(worker_id, train_task("t", partition))).rows > 0
    with pytest.raises(ValueError, match="no such live worker"):
        backend.submit("w0", train_task("t", 0))
    with pytest.raises(ValueError, match="no live worker 'w0'"):
        backend.kill_worker("w0")


@pytest.mark.torch
def test_added_workers_hold_the_least_held_partitions_or_those_asked_for(
    local: Callable[[int], LocalBackend], tmp_path: Path
) -> None:
    """The rest of ``add_worker`` is in the contract (``tests/backends/contract.py``)."""
    backend = local(2)
    assert backend.add_worker() == "w2"
    assert partitions_of(backend) == {"w0": {0, 2}, "w1": {1, 3}, "w2": {0, 1}}
    assert backend.add_worker([3]) == "w3"
    assert partitions_of(backend)["w3"] == {3}
    # A lost replica needs no re-homing; its running unit fails with a precise message.
    started = tmp_path / "started"
    running = backend.submit(
        "w2", train_task("k", 1, spec=GATED, params=gated(started, [tmp_path / "never"]))
    )
    wait_until(started.exists, "the unit to start")
    backend.kill_worker("w2")
    with pytest.raises(WorkerLostError, match=r"w2 was lost .*SIGKILL.* while it ran the train"):
        result(running)
    assert partitions_of(backend) == {"w0": {0, 2}, "w1": {1, 3}, "w3": {3}}


@pytest.mark.torch
def test_close_fails_the_running_unit_and_stops_every_process(
    local: Callable[[int], LocalBackend], tmp_path: Path
) -> None:
    backend = local(2)
    pids = backend.pids()
    started = tmp_path / "started"
    running = backend.submit(
        "w1", train_task("k", 1, spec=GATED, params=gated(started, [tmp_path / "never"]))
    )
    wait_until(started.exists, "the unit to start")
    begun = time.monotonic()
    backend.close()
    with pytest.raises(WorkerLostError, match="closed"):
        result(running)
    assert time.monotonic() - begun < 30
    assert backend.pids() == {}
    for pid in pids.values():
        assert not _alive(pid)
    with pytest.raises(RuntimeError, match="closed"):
        backend.add_worker()


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie awaiting its reaper counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


@pytest.mark.torch
def test_workers_exit_when_the_driver_is_killed(dataset: Dataset, tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import json, os, signal, sys
        sys.path.insert(0, sys.argv[3])
        from cerebro_spark.backends import LocalBackend, WorkerJob
        from cerebro_spark.store import open_store

        if __name__ == "__main__":
            backend = LocalBackend(2)
            backend.start(WorkerJob(sys.argv[1], open_store(sys.argv[2])))
            backend.wait_started()
            print(json.dumps(sorted(backend.pids().values())), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    path = tmp_path / "driver.py"
    path.write_text(script)
    done = subprocess.run(
        [sys.executable, str(path), dataset.uri, str(tmp_path / "store"), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == -9, done.stderr
    pids = json.loads(done.stdout)
    assert len(pids) == 2
    wait_until(lambda: not any(_alive(pid) for pid in pids), "orphaned workers to exit")


class _Process:
    """What LocalTransport asks of a process when it hands out GPUs."""

    def __init__(self, alive: bool = True) -> None:
        self.alive = alive

    def is_alive(self) -> bool:
        return self.alive

    def kill(self) -> None:  # the transport's finalizer kills what is alive
        self.alive = False

    def join(self, timeout: float | None = None) -> None:
        pass


def test_each_worker_process_gets_the_gpu_with_the_fewest_live_workers():
    transport = LocalTransport(gpus=(0, 1))
    given = []
    for worker in ("w0", "w1", "w2"):
        given.append(transport._task_info(worker).resources["gpu"])
        transport._processes[worker] = _Process()
    assert given == [("0",), ("1",), ("0",)]
    transport._processes["w1"].alive = False  # GPU 1 is free again: its replacement goes there
    assert transport._task_info("w3").resources == {"gpu": ("1",)}
    assert LocalTransport()._task_info("w0").resources == {}
    with pytest.raises(ConfigError, match=r"gpus must be CUDA device indices"):
        LocalTransport(gpus=(-1,))
