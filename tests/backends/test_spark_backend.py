"""SparkBackend on a real local Spark session: the backend contract, then Spark specifics.

The contract runs up to four workers at once (its shared two-worker backend stays up
while tests start private ones) and every worker holds a task slot for its life, so this
module needs a session with at least four slots: it overrides the shared ``spark``
fixture with a ``local[4]`` session of its own (threads are cheap), unless a session is
already running, which it then reuses when it has enough slots.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.backends import Backend, SparkBackend, WorkerJob
from cerebro_spark.backends._control import connect
from cerebro_spark.backends._serve import REFUSED
from cerebro_spark.backends._spark import run_worker_task
from cerebro_spark.errors import ConfigError, DataError, WorkerLostError
from cerebro_spark.store import Store, open_store
from tests.backends.contract import (
    GATED,
    RESULT_TIMEOUT_S,
    BackendContract,
    Dataset,
    gated,
    make_dataset,
    result,
    train_task,
    wait_until,
)

pytestmark = [pytest.mark.spark, pytest.mark.torch]

SLOTS = 4


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """A ``local[4]`` session for this module (see the module docstring)."""
    from pyspark import SparkContext

    from cerebro_spark.spark_session import spark_session

    active = SparkContext._active_spark_context
    if active is not None:
        from pyspark.sql import SparkSession

        slots = active.defaultParallelism
        if slots < SLOTS:
            pytest.fail(
                f"the SparkBackend tests need a session with {SLOTS} task slots; the running "
                f"session has {slots} ({active.master}): make the shared 'spark' fixture "
                f"local[{SLOTS}] or run this module first"
            )
        yield SparkSession(active)
        return
    session = spark_session(
        f"local[{SLOTS}]",
        "cerebro-spark-backend-tests",
        {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"},
        preload_torch=True,
    )
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module", autouse=True)
def _session_for_the_contract(spark: Any) -> None:
    TestSparkBackend.session = spark


def kill_process(backend: SparkBackend, worker_id: str, sig: int = signal.SIGKILL) -> int:
    """Send ``sig`` to a worker's Python process (it runs on this machine)."""
    pid = backend.pids()[worker_id]
    os.kill(pid, sig)
    return pid


class TestSparkBackend(BackendContract):
    session: Any = None

    def make_backend(self, num_workers: int) -> Backend:
        return SparkBackend(num_workers, spark=self.session)

    def kill_worker(self, backend: Backend, worker_id: str) -> None:
        assert isinstance(backend, SparkBackend)
        kill_process(backend, worker_id)  # the executor-side process dies: no goodbye
        wait_until(lambda: worker_id not in backend.workers(), f"the loss of {worker_id}")


# -- Spark-specific ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return make_dataset(tmp_path_factory.mktemp("spark-backend") / "dataset")


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return open_store(str(tmp_path / "store"))


@pytest.fixture
def job(dataset: Dataset, store: Store) -> WorkerJob:
    return WorkerJob(dataset_uri=dataset.uri, store=store, torch_threads=1)


@pytest.fixture
def backends(spark: Any, job: WorkerJob) -> Iterator[Callable[..., SparkBackend]]:
    """Start SparkBackends with any arguments; every one is closed after the test."""
    started: list[SparkBackend] = []

    def start(num_workers: int | None, **kwargs: Any) -> SparkBackend:
        backend = SparkBackend(num_workers, spark=spark, **kwargs)
        started.append(backend)
        backend.start(job)
        backend.wait_started(RESULT_TIMEOUT_S)
        return backend

    yield start
    for backend in started:
        backend.close()


def partitions_of(backend: SparkBackend) -> dict[str, set[int]]:
    return {worker_id: set(info.partitions) for worker_id, info in backend.workers().items()}


def test_bad_arguments_are_refused(spark: Any, job: WorkerJob) -> None:
    with pytest.raises(ConfigError, match="num_workers must be an integer >= 1 or None, got 0"):
        SparkBackend(0)
    with pytest.raises(ConfigError, match="heartbeat_s must be a number > 0"):
        SparkBackend(1, heartbeat_s=0)
    with pytest.raises(ConfigError, match=r"heartbeat_timeout_s must be at least 2 \* heartbeat_s"):
        SparkBackend(1, heartbeat_s=5, heartbeat_timeout_s=6)
    with (
        SparkBackend(5, spark=spark) as backend,
        pytest.raises(ConfigError, match="num_workers=5 exceeds num_partitions=4"),
    ):
        backend.start(job)
    with SparkBackend(1, spark=spark) as backend, pytest.raises(ConfigError, match="torch_threads"):
        backend.start(WorkerJob(job.dataset_uri, job.store, torch_threads=0))


def test_placement_executors_and_one_worker_per_slot_by_default(
    backends: Callable[..., SparkBackend], dataset: Dataset
) -> None:
    backend = backends(None)  # local[4]: four slots, four workers
    assert partitions_of(backend) == {"w0": {0}, "w1": {1}, "w2": {2}, "w3": {3}}
    assert backend.executors() == {f"w{i}": "driver" for i in range(SLOTS)}
    for info in backend.workers().values():
        assert info.device == "cpu"
        assert info.host == "localhost"  # Spark's name for the driver's executor
        assert info.bytes_read == dataset.bytes_of(info.partitions)
    pids = backend.pids()
    assert len(set(pids.values())) == SLOTS and os.getpid() not in pids.values()
    stats = backend.stats()
    assert (stats.started, stats.registered, stats.refused) == (SLOTS, SLOTS, 0)
    assert set(stats.ready_seconds) == set(pids)
    assert all(
        0 < stats.register_seconds[w] <= stats.ready_seconds[w] for w in stats.register_seconds
    )


def test_more_workers_than_local_slots_is_refused(spark: Any, tmp_path: Path, store: Store) -> None:
    import numpy as np
    import pyarrow as pa

    from cerebro_spark.data import write_dataset

    table = pa.table({"f0": np.arange(64, dtype=np.float32), "label": np.arange(64) % 2})
    uri = str(tmp_path / "eight")
    write_dataset(table, uri, features=["f0"], label="label", num_partitions=8, seed=1)
    with SparkBackend(SLOTS + 1, spark=spark) as backend:
        with pytest.raises(ConfigError, match=r"num_workers=5 exceeds the 4 task slots of master"):
            backend.start(WorkerJob(uri, store))
        assert backend.stats().started == 0


def test_kill_worker_cancels_its_job_and_rehomes(
    backends: Callable[..., SparkBackend], tmp_path: Path
) -> None:
    backend = backends(2)
    started = tmp_path / "started"
    running = backend.submit(
        "w0", train_task("k", 0, spec=GATED, params=gated(started, [tmp_path / "never"]))
    )
    wait_until(started.exists, "the unit to start")
    pid = backend.pids()["w0"]
    backend.kill_worker("w0")
    with pytest.raises(WorkerLostError, match=r"w0 was lost .*while it ran the train unit"):
        result(running)
    assert partitions_of(backend) == {"w1": {0, 1, 2, 3}}
    assert backend.stats().lost == {"ended": 1}
    with pytest.raises(ValueError, match="executor 'driver', which cannot be killed alone"):
        backend.kill_worker("w1", executor=True)
    wait_until(lambda: not _alive(pid), "Spark to kill the cancelled task's Python process")
    assert result(backend.submit("w1", train_task("t", 0))).rows > 0
    with pytest.raises(ValueError, match="no live worker 'w0'"):
        backend.kill_worker("w0")


def test_a_silent_worker_is_lost_by_heartbeat(
    backends: Callable[..., SparkBackend], dataset: Dataset
) -> None:
    backend = backends(2, heartbeat_s=0.5, heartbeat_timeout_s=3.0)
    pid = kill_process(backend, "w1", signal.SIGSTOP)  # hung: connection open, no heartbeats
    try:
        begun = time.monotonic()
        wait_until(lambda: "w1" not in backend.workers(), "the silent worker to be lost")
        assert 2.0 < time.monotonic() - begun < 30  # timeout 3 s, heartbeats every 0.5 s
        assert backend.stats().lost == {"heartbeat": 1}
        assert partitions_of(backend) == {"w0": {0, 1, 2, 3}}
        wait_until(
            lambda: backend.workers()["w0"].bytes_read == dataset.bytes_of({0, 1, 2, 3}),
            "the re-homed partitions to be loaded",
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_retried_task_of_a_lost_worker_is_refused_and_exits(
    spark: Any, backends: Callable[..., SparkBackend]
) -> None:
    backend = backends(1)
    spec = backend._worker_spec("w0")
    backend.kill_worker("w0")
    # What Spark does when it retries the task after an executor loss: run it again.
    rows = spark.sparkContext.parallelize(["w0"], 1)
    assert rows.mapPartitions(functools.partial(run_worker_task, spec)).collect() == [REFUSED]
    assert backend.stats().refused == 1
    assert backend.workers() == {}
    # A worker id nobody started is refused too, and a peer without the secret gets nothing.
    host, port = backend.control_address or ("", 0)
    channel = connect(host, port, spec.secret)
    channel.send({"op": "register", "worker_id": "w99", "attempt": 0})
    assert channel.recv()["op"] == "refuse"
    channel.close()
    assert backend.stats().refused == 2


def test_when_no_worker_can_load_start_fails_with_the_error(
    spark: Any, tmp_path: Path, store: Store
) -> None:
    broken = make_dataset(tmp_path / "broken")
    for partition in (0, 1):  # w0's and w1's: start fails only when no worker can load
        path = Path(broken.uri) / broken.manifest.partition("train", partition).path
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    backend = SparkBackend(2, spark=spark)
    with pytest.raises(DataError, match=r"train partition [01]") as info:
        backend.start(WorkerJob(broken.uri, store))
    assert re.search(r"worker w[01] traceback", str(info.value.__cause__))
    assert backend.workers() == {}
    backend.close()


def test_close_fails_the_running_unit_and_frees_every_slot(
    spark: Any, backends: Callable[..., SparkBackend], tmp_path: Path
) -> None:
    backend = backends(2)
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
    assert backend.pids() == {} and backend.workers() == {}
    wait_until(lambda: not _alive(pids["w1"]), "the busy worker's process to be killed")
    with pytest.raises(RuntimeError, match="closed"):
        backend.add_worker()
    wait_until(lambda: active_tasks(spark) == 0, "every task slot to be free again")


def active_tasks(spark: Any) -> int:
    """Tasks running on the session's executors (here: the driver's)."""
    summaries = spark.sparkContext._jsc.sc().statusStore().executorList(True)
    return sum(int(summaries.apply(i).activeTasks()) for i in range(summaries.size()))


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie awaiting its reaper counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")
