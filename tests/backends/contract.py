"""The contract every Backend passes (the rules in ``cerebro_spark/backends/_base.py``).

A backend's test module subclasses :class:`BackendContract` in a class named ``Test...``
and implements :meth:`BackendContract.make_backend` (an unstarted backend with
``num_workers`` workers) and :meth:`BackendContract.kill_worker` (make that worker's
process/executor die abruptly). Everything else is real: a prepared dataset of 4
partitions written with ``write_dataset``, a ``FileSystemStore`` and ``MLPSpec`` trials
(plus the specs in ``tests/backends/failing_spec.py``).
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import math
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from cerebro_spark.backends import Backend, Membership, WorkerJob
from cerebro_spark.data import Manifest, write_dataset
from cerebro_spark.errors import ConfigError, TrialError, WorkerLostError
from cerebro_spark.store import Store, open_store
from cerebro_spark.units import UnitKind, UnitResult, UnitTask

NUM_PARTITIONS = 4
MLP = "cerebro_spark.training:MLPSpec"
GATED = "tests.backends.failing_spec:GatedSpec"
FAILING = "tests.backends.failing_spec:FailingSpec"
POISON = "tests.backends.failing_spec:PoisonSpec"
PACK_RTOL, PACK_ATOL = 1e-5, 1e-6  # a packed trial's weights against its unpacked twin's
FAILURE_MESSAGE = "FailingSpec.build_model always raises"  # failing_spec.FAILURE_MESSAGE
PARAMS: Mapping[str, Any] = {"hidden_units": [16], "lr": 0.01, "batch_size": 16}
RESULT_TIMEOUT_S = 120.0


@dataclasses.dataclass(frozen=True)
class Dataset:
    uri: str
    manifest: Manifest

    def bytes_of(self, partitions: frozenset[int] | set[int]) -> int:
        """File bytes of the train and validation splits of ``partitions``."""
        return sum(
            self.manifest.partition(split, index).bytes
            for index in partitions
            for split in ("train", "validation")
        )


def make_dataset(path: Path) -> Dataset:
    """Write 320 rows of a seeded 3-class problem as a 4-partition dataset."""
    rng = np.random.default_rng(7)
    rows = 320
    labels = rng.integers(0, 3, size=rows)
    centers = rng.normal(size=(3, 4)) * 2.0
    features = centers[labels] + rng.normal(size=(rows, 4))
    table = pa.table(
        {
            **{f"f{i}": features[:, i].astype(np.float32) for i in range(4)},
            "label": labels.astype(np.int64),
        }
    )
    uri = str(path)
    manifest = write_dataset(
        table,
        uri,
        features=[f"f{i}" for i in range(4)],
        label="label",
        num_partitions=NUM_PARTITIONS,
        seed=11,
        validation_fraction=0.2,
    )
    return Dataset(uri, manifest)


def train_task(
    trial: str,
    partition: int,
    *,
    out: str | None = None,
    checkpoint_in: str | None = None,
    spec: str = MLP,
    params: Mapping[str, Any] = PARAMS,
    epoch: int = 0,
    step: int = 0,
    epoch_units: int = 1,
) -> UnitTask:
    return UnitTask(
        kind=UnitKind.TRAIN,
        trial_id=trial,
        spec=spec,
        params=dict(params),
        trial_seed=1234,
        epoch=epoch,
        partition=partition,
        step=step,
        epoch_units=epoch_units,
        checkpoint_in=checkpoint_in,
        checkpoint_out=out or f"ckpt/{trial}/e{epoch}-s{step}-p{partition}.pt",
    )


def validate_task(trial: str, partition: int, checkpoint_in: str) -> UnitTask:
    return UnitTask(
        kind=UnitKind.VALIDATE,
        trial_id=trial,
        spec=MLP,
        params=dict(PARAMS),
        trial_seed=1234,
        epoch=0,
        partition=partition,
        checkpoint_in=checkpoint_in,
    )


def gated(marker: Path, wait_for: list[Path], *, timeout_s: float = 60.0) -> dict[str, Any]:
    """Params of a GatedSpec unit: write ``marker`` on start, wait for ``wait_for``."""
    return {
        **PARAMS,
        "marker": str(marker),
        "wait_for": [str(path) for path in wait_for],
        "wait_timeout_s": timeout_s,
    }


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.02)


def result(future: Future[UnitResult]) -> UnitResult:
    return future.result(timeout=RESULT_TIMEOUT_S)


def holder(backend: Backend, partition: int) -> str:
    """Return the id of a live worker holding ``partition``."""
    for worker_id, info in backend.workers().items():
        if partition in info.partitions:
            return worker_id
    raise AssertionError(f"no live worker holds partition {partition}: {backend.workers()}")


def held(backend: Backend) -> set[int]:
    return {p for info in backend.workers().values() for p in info.partitions}


def run_epoch(backend: Backend, prefix: str, order: list[int]) -> str:
    """Train trial ``t`` one epoch in ``order``, each unit on the partition's holder;
    return the last checkpoint's SHA-256."""
    checkpoint: str | None = None
    digest: str | None = None
    for step, partition in enumerate(order):
        task = train_task(
            "t",
            partition,
            out=f"{prefix}/s{step}.pt",
            checkpoint_in=checkpoint,
            step=step,
            epoch_units=len(order),
        )
        digest = result(backend.submit(holder(backend, partition), task)).checkpoint_sha256
        checkpoint = task.checkpoint_out
    assert digest is not None
    return digest


@pytest.mark.torch
class BackendContract(abc.ABC):
    """Shared tests; subclass as ``class TestMyBackend(BackendContract)``."""

    @abc.abstractmethod
    def make_backend(self, num_workers: int) -> Backend:
        """Return an unstarted backend that will start ``num_workers`` workers."""

    @abc.abstractmethod
    def kill_worker(self, backend: Backend, worker_id: str) -> None:
        """Make ``worker_id`` die abruptly (SIGKILL its process, kill its executor)."""

    # -- fixtures --------------------------------------------------------------------------
    # One started backend is shared by the tests that leave it as they found it (idle, no
    # worker lost); tests that kill or close workers start their own.

    @pytest.fixture(scope="class")
    @classmethod
    def dataset(cls, tmp_path_factory: pytest.TempPathFactory) -> Dataset:
        return make_dataset(tmp_path_factory.mktemp("backend-contract") / "dataset")

    @pytest.fixture(scope="class")
    @classmethod
    def store(cls, tmp_path_factory: pytest.TempPathFactory) -> Store:
        return open_store(str(tmp_path_factory.mktemp("backend-contract-store")))

    @pytest.fixture(scope="class")
    @classmethod
    def job(cls, dataset: Dataset, store: Store) -> WorkerJob:
        return WorkerJob(dataset_uri=dataset.uri, store=store, torch_threads=1)

    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls, job: WorkerJob) -> Iterator[Backend]:
        """The shared backend: 2 workers, 4 partitions."""
        backend = cls().make_backend(2)
        try:
            backend.start(job)
            backend.wait_started(RESULT_TIMEOUT_S)
            yield backend
        finally:
            backend.close()

    @pytest.fixture
    def started(self, job: WorkerJob) -> Iterator[Callable[..., Backend]]:
        """Start private backends of any size; every one is closed after the test."""
        backends: list[Backend] = []

        def start(num_workers: int, *, wait: bool = True) -> Backend:
            """A started backend; with ``wait``, once every worker is ready."""
            backend = self.make_backend(num_workers)
            backends.append(backend)
            backend.start(job)
            if wait:
                backend.wait_started(RESULT_TIMEOUT_S)
            return backend

        yield start
        for backend in backends:
            backend.close()

    @pytest.fixture
    def release(self, tmp_path: Path) -> Iterator[Path]:
        """A gate file GatedSpec units wait for; created at teardown if a test did not."""
        path = tmp_path / "release"
        yield path
        path.touch()

    # -- start, placement, reading once ----------------------------------------------------

    def test_start_places_every_partition_on_exactly_one_worker(self, backend: Backend) -> None:
        workers = backend.workers()
        assert len(workers) == 2
        for worker_id, info in workers.items():
            assert info.worker_id == worker_id
            assert info.partitions, f"{worker_id} holds nothing"
        counts = [p for info in workers.values() for p in info.partitions]
        assert sorted(counts) == list(range(NUM_PARTITIONS))

    def test_each_partition_is_read_once(
        self, backend: Backend, dataset: Dataset, store: Store
    ) -> None:
        before = backend.workers()
        for info in before.values():
            assert info.bytes_read == dataset.bytes_of(info.partitions) > 0
        for partition in range(NUM_PARTITIONS):
            worker_id = holder(backend, partition)
            trained = result(backend.submit(worker_id, train_task("t", partition)))
            key = trained.task.checkpoint_out
            assert key is not None
            result(backend.submit(worker_id, validate_task("t", partition, key)))
            result(backend.submit(worker_id, train_task("u", partition, checkpoint_in=key)))
        assert backend.workers() == before

    # -- units -------------------------------------------------------------------------------

    def test_train_unit_reports_rows_and_writes_its_checkpoint(
        self, backend: Backend, dataset: Dataset, store: Store
    ) -> None:
        partition = 1
        worker_id = holder(backend, partition)
        task = train_task("t", partition)
        out = result(backend.submit(worker_id, task))
        assert out.task == task
        assert out.worker_id == worker_id
        assert out.rows == dataset.manifest.partition("train", partition).rows
        assert out.seconds > 0
        assert math.isfinite(out.metrics()["loss"])
        assert 0.0 <= out.metrics()["accuracy"] <= 1.0
        assert task.checkpoint_out is not None
        blob = store.get(task.checkpoint_out)
        assert out.checkpoint_bytes == len(blob)
        assert out.checkpoint_sha256 == hashlib.sha256(blob).hexdigest()

    def test_validate_unit_reads_the_validation_partition(
        self, backend: Backend, dataset: Dataset, store: Store
    ) -> None:
        partition = 2
        worker_id = holder(backend, partition)
        trained = result(backend.submit(worker_id, train_task("t", partition)))
        key = trained.task.checkpoint_out
        assert key is not None
        keys_before = store.list()
        checked = result(backend.submit(worker_id, validate_task("t", partition, key)))
        assert checked.rows == dataset.manifest.partition("validation", partition).rows
        assert checked.rows != trained.rows  # really the other split
        assert checked.checkpoint_sha256 is None
        assert math.isfinite(checked.metrics()["loss"])
        assert store.list() == keys_before  # validation writes nothing

    def test_two_workers_run_units_at_the_same_time(
        self, backend: Backend, tmp_path: Path, release: Path
    ) -> None:
        (first, second) = sorted(backend.workers())
        marks = [tmp_path / "a-started", tmp_path / "b-started"]
        futures = [
            backend.submit(
                worker_id,
                train_task(
                    f"t{i}",
                    min(backend.workers()[worker_id].partitions),
                    spec=GATED,
                    params=gated(marks[i], [marks[1 - i], release]),
                ),
            )
            for i, worker_id in enumerate((first, second))
        ]
        # Both units are inside build_model at once, each having seen the other start.
        wait_until(lambda: all(mark.exists() for mark in marks), "both units to start")
        assert not any(future.done() for future in futures)
        release.write_text("go")
        done = [result(future) for future in futures]
        assert [r.worker_id for r in done] == [first, second]

    def test_submit_to_a_busy_worker_raises(
        self, backend: Backend, tmp_path: Path, release: Path
    ) -> None:
        worker_id = min(backend.workers())
        partition = min(backend.workers()[worker_id].partitions)
        started = tmp_path / "started"
        busy = backend.submit(
            worker_id,
            train_task("slow", partition, spec=GATED, params=gated(started, [release])),
        )
        wait_until(started.exists, "the unit to start")
        with pytest.raises(ValueError, match=rf"{worker_id}.*busy|busy.*{worker_id}") as info:
            backend.submit(worker_id, train_task("other", partition))
        assert str(partition) in str(info.value)
        release.write_text("go")
        assert result(busy).rows > 0
        assert result(backend.submit(worker_id, train_task("other", partition))).rows > 0

    def test_submit_for_a_partition_the_worker_lacks_raises(self, backend: Backend) -> None:
        worker_id = min(backend.workers())
        missing = min(set(range(NUM_PARTITIONS)) - backend.workers()[worker_id].partitions)
        with pytest.raises(ValueError, match=rf"partition {missing}") as info:
            backend.submit(worker_id, train_task("t", missing))
        assert worker_id in str(info.value)
        with pytest.raises(ValueError, match="no-such-worker") as info:
            backend.submit("no-such-worker", train_task("t", 0))
        assert "0" in str(info.value)

    def test_user_code_failure_is_a_trial_error_and_the_worker_lives_on(
        self, backend: Backend
    ) -> None:
        worker_id = min(backend.workers())
        partition = min(backend.workers()[worker_id].partitions)
        failed = backend.submit(worker_id, train_task("bad", partition, spec=FAILING))
        with pytest.raises(TrialError, match=FAILURE_MESSAGE):
            result(failed)
        assert worker_id in backend.workers()
        assert result(backend.submit(worker_id, train_task("good", partition))).rows > 0

    # -- packed units (issue 27) ---------------------------------------------------------------

    def test_a_pack_trains_each_trial_as_alone_and_a_nan_trial_fails_alone(
        self, backend: Backend, dataset: Dataset, store: Store
    ) -> None:
        from cerebro_spark.training import decode_checkpoint  # torch: the workers train

        partition = 3
        worker_id = holder(backend, partition)
        params = [{**PARAMS, "lr": 0.01}, {**PARAMS, "poison": True}, {**PARAMS, "lr": 0.2}]
        tasks = [
            train_task(f"p{i}", partition, spec=POISON, params=p, out=f"pack/p{i}.pt")
            for i, p in enumerate(params)
        ]
        with pytest.raises(ConfigError, match="distinct"):  # refused before anything is sent
            backend.submit_pack(worker_id, [tasks[0], tasks[0]])
        futures = backend.submit_pack(worker_id, tasks)
        assert len(futures) == 3
        with pytest.raises(ValueError, match=worker_id):  # one pack at a time, as one unit
            backend.submit(worker_id, train_task("busy", partition))
        with pytest.raises(TrialError, match="not finite"):
            result(futures[1])
        rows = dataset.manifest.partition("train", partition).rows
        for index in (0, 2):
            packed = result(futures[index])
            assert packed.task == tasks[index]
            assert packed.worker_id == worker_id
            assert packed.rows == rows
            key = tasks[index].checkpoint_out
            assert key is not None
            blob = store.get(key)
            assert packed.checkpoint_sha256 == hashlib.sha256(blob).hexdigest()
            twin_task = dataclasses.replace(tasks[index], checkpoint_out=f"{key}.alone")
            alone = result(backend.submit(worker_id, twin_task))
            assert packed.metric_sums == pytest.approx(alone.metric_sums, rel=1e-5, abs=1e-6)
            weights = decode_checkpoint(blob)["model"]
            twin = decode_checkpoint(store.get(f"{key}.alone"))["model"]
            assert weights.keys() == twin.keys()
            for name, tensor in twin.items():
                assert np.allclose(weights[name], tensor, rtol=PACK_RTOL, atol=PACK_ATOL), name
        assert not store.exists(str(tasks[1].checkpoint_out))
        assert worker_id in backend.workers()
        (single,) = backend.submit_pack(worker_id, [train_task("one", partition)])
        assert result(single).rows == rows  # a pack of one is an ordinary unit

    def test_a_worker_killed_mid_pack_fails_every_member(
        self, started: Callable[[int], Backend], tmp_path: Path
    ) -> None:
        backend = started(1)
        (victim,) = backend.workers()
        begun = tmp_path / "started"
        params = gated(begun, [tmp_path / "never"])
        tasks = [
            train_task(f"k{i}", 0, spec=GATED, params={**params, "lr": 0.01 * (i + 1)})
            for i in range(2)
        ]
        futures = backend.submit_pack(victim, tasks)
        wait_until(begun.exists, "the pack to start")
        self.kill_worker(backend, victim)
        for future in futures:
            with pytest.raises(WorkerLostError):
                future.result(timeout=RESULT_TIMEOUT_S)

    # -- failures ----------------------------------------------------------------------------

    def test_a_worker_killed_mid_unit(
        self, started: Callable[[int], Backend], dataset: Dataset, tmp_path: Path
    ) -> None:
        backend = started(2)
        victim, survivor = sorted(backend.workers())
        lost = backend.workers()[victim].partitions
        partition = min(lost)
        # The unit that will be replayed elsewhere, run once on the victim first.
        reference = result(backend.submit(victim, train_task("r", partition, out="ref/a.pt")))
        begun = tmp_path / "started"
        running = backend.submit(
            victim,
            train_task("k", partition, spec=GATED, params=gated(begun, [tmp_path / "never"])),
        )
        wait_until(begun.exists, "the unit to start")
        self.kill_worker(backend, victim)
        with pytest.raises(WorkerLostError):
            running.result(timeout=RESULT_TIMEOUT_S)
        assert victim not in backend.workers()
        wait_until(lambda: held(backend) == set(range(NUM_PARTITIONS)), "re-homing")
        assert set(backend.workers()) == {survivor}
        for moved in sorted(lost):
            assert holder(backend, moved) == survivor
            out = result(backend.submit(survivor, train_task("m", moved)))
            assert out.rows == dataset.manifest.partition("train", moved).rows
        # Re-homed partitions were read from storage once more, by the survivor only.
        info = backend.workers()[survivor]
        assert info.bytes_read == dataset.bytes_of(info.partitions)
        # The same unit on another worker (another process) gives the same checkpoint.
        replay = result(backend.submit(survivor, train_task("r", partition, out="ref/b.pt")))
        assert replay.worker_id != reference.worker_id
        assert replay.checkpoint_sha256 == reference.checkpoint_sha256

    def test_an_epoch_is_bit_identical_with_another_worker_count(
        self, backend: Backend, started: Callable[[int], Backend]
    ) -> None:
        two = run_epoch(backend, "two-workers", order=[2, 0, 3, 1])
        one = run_epoch(started(1), "one-worker", order=[2, 0, 3, 1])
        assert two == one

    # -- membership and retire ----------------------------------------------------------------

    def test_membership_changes_are_reported_once(
        self, started: Callable[..., Backend], dataset: Dataset
    ) -> None:
        """``start`` returns once a worker is ready; the others arrive as changes."""
        backend = started(2, wait=False)
        assert backend.workers(), "start returned before any worker was ready"
        backend.wait_started(RESULT_TIMEOUT_S)
        assert backend.starting() == 0
        changes = backend.changes()
        assert sorted((c.kind.value, c.worker.worker_id) for c in changes) == [
            ("joined", "w0"),
            ("joined", "w1"),
            ("ready", "w0"),
            ("ready", "w1"),
        ]
        for change in changes:
            if change.kind is Membership.READY:
                info = change.worker
                assert info.partitions == backend.workers()[info.worker_id].partitions
                assert info.bytes_read == dataset.bytes_of(info.partitions) > 0
        assert backend.changes() == []

    def test_a_retired_worker_finishes_its_unit_and_leaves_its_partitions_behind(
        self, started: Callable[[int], Backend], dataset: Dataset, tmp_path: Path, release: Path
    ) -> None:
        backend = started(2)
        backend.changes()
        begun = tmp_path / "started"
        running = backend.submit(
            "w1", train_task("k", 1, spec=GATED, params=gated(begun, [release]))
        )
        wait_until(begun.exists, "the unit to start")
        retired = backend.retire("w1")
        assert "w1" not in backend.workers()
        with pytest.raises(ValueError, match=r"w1.*retiring"):
            backend.submit("w1", train_task("t", 3))
        release.write_text("go")
        assert result(running).rows > 0  # a retire is not a loss: the unit in flight ends well
        retired.result(timeout=RESULT_TIMEOUT_S)
        workers = backend.workers()
        assert {w: set(i.partitions) for w, i in workers.items()} == {"w0": {0, 1, 2, 3}}
        assert workers["w0"].bytes_read == dataset.bytes_of({0, 1, 2, 3})  # loaded from storage
        assert [(c.kind, c.worker.worker_id) for c in backend.changes()] == [
            (Membership.RETIRING, "w1"),
            (Membership.PARTITIONS, "w0"),
            (Membership.RETIRED, "w1"),
        ]
        assert result(backend.submit("w0", train_task("t", 3))).rows > 0
        with pytest.raises(ValueError, match="last live worker"):
            backend.retire("w0")
        with pytest.raises(ValueError, match="no such live worker"):
            backend.retire("w1")

    def test_an_added_worker_loads_replicas_and_units_replay_bit_identically(
        self, started: Callable[..., Backend], dataset: Dataset
    ) -> None:
        """``add_worker`` (one slot more than ``started(1)``: Spark's shared session)."""
        unstarted = self.make_backend(1)
        with pytest.raises(RuntimeError, match="start"):
            unstarted.add_worker()
        unstarted.close()
        backend = started(1)
        backend.changes()
        assert backend.add_worker() == "w1"
        replicas = backend.workers()["w1"].partitions
        assert len(replicas) == NUM_PARTITIONS // 2 and replicas < set(range(NUM_PARTITIONS))
        assert backend.workers()["w1"].bytes_read == dataset.bytes_of(replicas)
        assert [(c.kind, c.worker.worker_id) for c in backend.changes()] == [
            (Membership.JOINED, "w1"),
            (Membership.READY, "w1"),
        ]
        partition = min(replicas)
        on_w0 = result(backend.submit("w0", train_task("t", partition, out="added/a.pt")))
        on_w1 = result(backend.submit("w1", train_task("t", partition, out="added/b.pt")))
        assert on_w0.checkpoint_sha256 == on_w1.checkpoint_sha256
        with pytest.raises(ValueError, match=r"\[7\]"):
            backend.add_worker([7])
        assert set(backend.workers()) == {"w0", "w1"}
        # With every worker lost, an added worker loads every partition.
        for worker_id in ("w0", "w1"):
            self.kill_worker(backend, worker_id)
        wait_until(lambda: backend.workers() == {}, "every worker's loss")
        assert backend.add_worker() == "w2"
        info = backend.workers()["w2"]
        assert info.partitions == set(range(NUM_PARTITIONS))
        assert info.bytes_read == dataset.bytes_of(set(range(NUM_PARTITIONS)))
        backend.close()
        with pytest.raises(RuntimeError, match="closed"):
            backend.add_worker()

    def test_close_is_idempotent_and_stops_every_worker(
        self, started: Callable[[int], Backend]
    ) -> None:
        backend = started(2)
        worker_id = min(backend.workers())
        backend.close()
        backend.close()
        assert backend.workers() == {}
        with pytest.raises(ValueError, match=worker_id):
            backend.submit(worker_id, train_task("t", 0))
