"""The WorkerPool over an in-memory fake transport: no torch, no Spark, no processes.

Each worker is a thread running the real worker loop (``serve``) over the real
authenticated control channel, with a fake worker (``fake_transport.py``) that reads its
partitions but trains by hashing, and does what a unit's params script: wait for a gate,
fail, die, or (rank 0) announce a rendezvous port. So the pool's own machinery -- losses,
re-homing, group rendezvous, retire, membership changes, placement -- is tested in seconds;
the contract suite runs the same pool with real training on worker processes and on Spark.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.backends import (
    Backend,
    Membership,
    TaskInfo,
    UnitFuture,
    WorkerChange,
    WorkerJob,
    WorkerPool,
    serve,
)
from cerebro_spark.backends._control import connect
from cerebro_spark.backends._serve import REFUSED
from cerebro_spark.errors import ConfigError, DataError, StoreError, TrialError, WorkerLostError
from cerebro_spark.store import open_store
from cerebro_spark.units import GroupBrokenError, UnitKind, UnitTask, group_tasks
from tests.backends import fake_transport
from tests.backends.contract import Dataset, make_dataset, wait_until
from tests.backends.fake_transport import RENDEZVOUS_PORT, Script, ThreadTransport

TIMEOUT_S = 20.0


@pytest.fixture(autouse=True)
def script() -> Iterator[Script]:
    yield fake_transport.reset()
    fake_transport.reset()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return make_dataset(tmp_path_factory.mktemp("pool") / "dataset")


@pytest.fixture
def pools(dataset: Dataset, tmp_path: Path) -> Iterator[Callable[..., WorkerPool]]:
    started: list[WorkerPool] = []

    def start(num_workers: int | None, *, wait: bool = True, **kwargs: Any) -> WorkerPool:
        """A started pool; with ``wait``, once every worker is ready (or gone)."""
        placement = kwargs.pop("placement", None)
        first_worker = kwargs.pop("first_worker", 0)
        kwargs.setdefault("heartbeat_s", 0.2)
        kwargs.setdefault("heartbeat_timeout_s", 5.0)
        kwargs.setdefault("start_timeout_s", TIMEOUT_S)
        pool = WorkerPool(ThreadTransport(), num_workers, **kwargs)
        started.append(pool)
        job = WorkerJob(dataset.uri, open_store(str(tmp_path / "store")))
        pool.start(job, placement=placement, first_worker=first_worker)
        if wait:
            pool.wait_started(TIMEOUT_S)
        return pool

    yield start
    for pool in started:
        pool.close()


def task(trial: str, partition: int, **params: Any) -> UnitTask:
    return UnitTask(
        kind=UnitKind.TRAIN,
        trial_id=trial,
        spec="fake:Spec",
        params=params,
        trial_seed=1,
        epoch=0,
        partition=partition,
        epoch_units=4,
        checkpoint_out=f"{trial}.pt",
    )


def held(pool: WorkerPool) -> dict[str, set[int]]:
    return {w: set(info.partitions) for w, info in pool.workers().items()}


def kinds(changes: list[WorkerChange]) -> list[tuple[str, str]]:
    return [(c.kind.value, c.worker.worker_id) for c in changes]


def result(future: Future[Any]) -> Any:
    return future.result(timeout=TIMEOUT_S)


# -- start, placement, membership -------------------------------------------------------------


def test_start_places_partitions_and_reports_joins(
    pools: Callable[..., WorkerPool], dataset: Dataset
) -> None:
    pool = pools(2)
    assert held(pool) == {"w0": {0, 2}, "w1": {1, 3}}
    for info in pool.workers().values():
        assert info.bytes_read == dataset.bytes_of(info.partitions) > 0
    assert all(info.host == "127.0.0.1" for info in pool.workers().values())
    changes = pool.changes()
    assert sorted(kinds(changes)) == [
        ("joined", "w0"),
        ("joined", "w1"),
        ("ready", "w0"),
        ("ready", "w1"),
    ]
    ready = {c.worker.worker_id: c.worker for c in changes if c.kind is Membership.READY}
    assert ready["w0"].partitions == {0, 2}
    assert pool.changes() == []  # each change is reported once
    stats = pool.stats()
    assert (stats.started, stats.registered, stats.refused, stats.retired) == (2, 2, 0, 0)


def test_placement_and_first_worker(pools: Callable[..., WorkerPool]) -> None:
    pool = pools(None, placement=[[3], [0, 1]], first_worker=5)
    assert held(pool) == {"w5": {2, 3}, "w6": {0, 1}}  # partition 2 went to the one holding fewest
    with pytest.raises(ConfigError, match=r"placement .* must give every worker at least one"):
        pools(None, placement=[[0], [9]])
    with pytest.raises(ConfigError, match="num_workers=5 exceeds num_partitions=4"):
        pools(5)
    with pytest.raises(ConfigError, match="needs the number of workers"):
        pools(None)


def test_a_second_registration_of_a_worker_id_is_refused(pools: Callable[..., WorkerPool]) -> None:
    pool = pools(1)
    spec = pool._worker_spec("w0")
    host, port = pool.control_address or ("", 0)
    channel = connect(host, port, spec.secret)
    channel.send({"op": "register", "worker_id": "w0", "attempt": 1})
    assert channel.recv()["op"] == "refuse"
    channel.close()
    assert pool.stats().refused == 1
    assert set(pool.workers()) == {"w0"}


def test_a_retried_attempt_of_a_lost_worker_is_refused_and_ends(
    pools: Callable[..., WorkerPool],
) -> None:
    """Spark retries the task of a worker whose executor died; if the pool's kill of the
    lost worker did not cancel it first, the retry registers under the lost worker's id:
    it is refused, its ``serve`` ends at once, and the pool goes on without it."""
    pool = pools(2)
    pool.changes()
    with pytest.raises(WorkerLostError, match=r"worker w1 was lost .*while it ran the train unit"):
        result(pool.submit("w1", task("t", 1, die="w1")))
    wait_until(lambda: held(pool) == {"w0": {0, 1, 2, 3}}, "re-homing")
    retry = TaskInfo(attempt=1, task_attempt_id=7)
    assert serve(pool._worker_spec("w1"), retry, fake_transport.FakeWorker) == REFUSED
    stats = pool.stats()
    assert (stats.registered, stats.refused, stats.lost) == (2, 1, {"ended": 1})
    assert kinds(pool.changes()) == [("lost", "w1"), ("partitions", "w0")]  # no join
    assert set(pool.workers()) == {"w0"}
    assert result(pool.submit("w0", task("t", 1))).rows == 10


# -- units ---------------------------------------------------------------------------------------


def test_units_run_and_bad_submissions_are_refused(
    pools: Callable[..., WorkerPool], script: Script
) -> None:
    pool = pools(2)
    assert result(pool.submit("w0", task("t", 0))).worker_id == "w0"
    busy = pool.submit("w0", task("slow", 2, gate="g"))
    wait_until(lambda: bool(script.ran("w0")[1:]), "the unit to start")
    with pytest.raises(ValueError, match=r"partition 0 on worker w0: it is busy with the train"):
        pool.submit("w0", task("t", 0))
    with pytest.raises(ValueError, match=r"partition 0 on worker w1: it holds partitions \[1, 3\]"):
        pool.submit("w1", task("t", 0))
    with pytest.raises(ValueError, match="'w9': no such live worker"):
        pool.submit("w9", task("t", 0))
    script.gate("g").set()
    assert result(busy).rows == 10


def test_errors_are_classified_as_the_worker_raised_them(
    pools: Callable[..., WorkerPool],
) -> None:
    pool = pools(1)
    with pytest.raises(TrialError, match="user code failed on w0"):
        result(pool.submit("w0", task("t", 0, fail={"w0": "trial"})))
    with pytest.raises(StoreError, match="I/O error on worker w0: FileNotFoundError"):
        result(pool.submit("w0", task("t", 0, fail={"w0": "io"})))
    assert result(pool.submit("w0", task("t", 0))).rows == 10  # it lives on


def test_a_worker_that_dies_mid_unit_is_lost_and_its_partitions_rehomed(
    pools: Callable[..., WorkerPool], dataset: Dataset
) -> None:
    pool = pools(2)
    pool.changes()
    with pytest.raises(WorkerLostError, match=r"worker w1 was lost .*while it ran the train unit"):
        result(pool.submit("w1", task("t", 1, die="w1")))
    wait_until(lambda: held(pool) == {"w0": {0, 1, 2, 3}}, "re-homing")
    changes = pool.changes()
    assert kinds(changes) == [("lost", "w1"), ("partitions", "w0")]
    assert "Died" in (changes[0].reason or "")
    assert changes[1].worker.partitions == {0, 1, 2, 3}
    assert result(pool.submit("w0", task("t", 3))).rows == 10  # after the re-home load
    assert pool.workers()["w0"].bytes_read == dataset.bytes_of({0, 1, 2, 3})
    assert pool.stats().lost == {"ended": 1}
    with pytest.raises(ValueError, match="no such live worker"):
        pool.submit("w1", task("t", 1))


def test_when_no_worker_can_load_start_fails_with_the_first_error(
    dataset: Dataset, tmp_path: Path, script: Script
) -> None:
    script.failing_loads.update({"w0", "w1"})
    script.slow_loads["w0"] = 0.3  # w1 fails first: its error is the one raised
    pool = WorkerPool(ThreadTransport(), 2, start_timeout_s=TIMEOUT_S)
    with pytest.raises(DataError, match=r"w1 cannot read partitions \[1, 3\]") as info:
        pool.start(WorkerJob(dataset.uri, open_store(str(tmp_path / "store"))))
    assert "worker w1 traceback" in str(info.value.__cause__)
    assert pool.workers() == {}
    assert pool.starting() == 0
    pool.close()


def test_start_returns_once_one_worker_is_ready_and_the_others_arrive_as_changes(
    pools: Callable[..., WorkerPool], script: Script
) -> None:
    gate = script.load_gates["w1"] = script.gate("w1-load")
    pool = pools(2, wait=False)
    assert held(pool) == {"w0": {0, 2}}
    assert pool.starting() == 1
    assert result(pool.submit("w0", task("t", 0))).worker_id == "w0"  # w1 is still loading
    assert ("ready", "w1") not in kinds(pool.changes())
    gate.set()
    pool.wait_started(TIMEOUT_S)
    assert pool.starting() == 0
    assert held(pool) == {"w0": {0, 2}, "w1": {1, 3}}
    ready = [c for c in pool.changes() if c.kind is Membership.READY]
    assert [(c.worker.worker_id, c.worker.partitions) for c in ready] == [("w1", {1, 3})]


def test_an_initial_worker_failing_after_start_is_lost_and_its_partitions_rehomed(
    pools: Callable[..., WorkerPool], script: Script, dataset: Dataset
) -> None:
    """w1 joins, then cannot load its share after w0 is ready: a LOST change with its
    reason, not an exception; its sole copies go to w0, so every unit can still run."""
    gate = script.load_gates["w1"] = script.gate("w1-load")
    script.failing_loads.add("w1")
    pool = pools(2, wait=False)
    gate.set()
    pool.wait_started(TIMEOUT_S)
    wait_until(lambda: held(pool) == {"w0": {0, 1, 2, 3}}, "re-homing")
    changes = [(c.kind.value, c.worker.worker_id, c.reason) for c in pool.changes()]
    lost = [c for c in changes if c[0] == "lost"]
    assert [(kind, worker) for kind, worker, _ in lost] == [("lost", "w1")]
    assert "w1 cannot read partitions [1, 3]" in (lost[0][2] or "")
    assert ("partitions", "w0", None) in changes
    assert changes.index(("partitions", "w0", None)) > changes.index(lost[0])
    for partition in range(4):
        assert result(pool.submit("w0", task("t", partition))).worker_id == "w0"
    assert pool.workers()["w0"].bytes_read == dataset.bytes_of({0, 1, 2, 3})
    assert pool.stats().lost == {"load": 1}


def test_partitions_of_a_worker_lost_before_any_is_ready_go_to_the_first_ready(
    pools: Callable[..., WorkerPool], script: Script
) -> None:
    """w0 fails to load while w1 still loads: w0's share waits for w1, which takes it."""
    script.failing_loads.add("w0")
    script.slow_loads["w1"] = 0.5
    pool = pools(2)
    assert held(pool) == {"w1": {0, 1, 2, 3}}
    changes = kinds(pool.changes())
    assert changes.index(("lost", "w0")) < changes.index(("ready", "w1"))
    assert changes[-1] == ("partitions", "w1")
    assert result(pool.submit("w1", task("t", 0))).worker_id == "w1"


def test_a_worker_that_never_registers_is_lost_after_the_start_timeout(
    pools: Callable[..., WorkerPool], script: Script
) -> None:
    """A worker whose task never gets a slot: start goes on with w0; w1 is lost (it never
    joined, so no change names it) and its partitions are re-homed on w0."""
    script.no_register.add("w1")
    pool = pools(2, start_timeout_s=1.5)  # (w0 registers well within it)
    assert held(pool) == {"w0": {0, 1, 2, 3}}
    assert pool.stats().lost == {"start": 1}
    assert ("partitions", "w0") in kinds(pool.changes())


def test_when_no_worker_registers_start_times_out_naming_them(
    dataset: Dataset, tmp_path: Path, script: Script
) -> None:
    script.no_register.update({"w0", "w1"})
    pool = WorkerPool(ThreadTransport(), 2, start_timeout_s=0.3, heartbeat_s=0.1)
    with pytest.raises(TimeoutError, match=r"workers \['w0', 'w1'\] did not register within"):
        pool.start(WorkerJob(dataset.uri, open_store(str(tmp_path / "store"))))
    pool.close()


def test_a_worker_loading_longer_than_the_start_timeout_is_waited_for_while_it_beats(
    pools: Callable[..., WorkerPool], script: Script
) -> None:
    """``start_timeout_s`` bounds registering; a large share on slow storage may take longer
    to load, and the worker's heartbeats say it is still at it."""
    script.slow_loads["w1"] = 2.0
    pool = pools(2, start_timeout_s=0.5, heartbeat_s=0.1, heartbeat_timeout_s=1.5)
    assert held(pool) == {"w0": {0, 2}, "w1": {1, 3}}


# -- checkpoint writes overlapping the next unit ---------------------------------------------------


def freed(future: Future[Any]) -> bool:
    """Whether the unit's worker was freed before its result came."""
    assert isinstance(future, UnitFuture)
    return future.freed.done() and not future.done()


def test_a_worker_takes_its_next_unit_while_it_writes_a_checkpoint(
    pools: Callable[..., WorkerPool], script: Script
) -> None:
    pool = pools(2)
    writing = pool.submit("w0", task("a", 0, write_gate="disk"))
    wait_until(lambda: freed(writing), "the unit's pass to end")
    time.sleep(0.2)
    assert not writing.done()  # not done while its checkpoint is not durable
    nxt = pool.submit("w0", task("b", 2))  # the worker is not busy: it takes the next unit
    wait_until(lambda: [t.trial_id for t in script.ran("w0")] == ["a", "b"], "b to start")
    time.sleep(0.2)
    # One write at a time, replies in command order: b waits for a's write.
    assert not nxt.done() and not nxt.freed.done()  # type: ignore[attr-defined]
    assert not script.written
    script.gate("disk").set()
    assert result(writing).checkpoint_sha256 is not None
    assert result(nxt).rows == 10
    assert [key for _, key in script.written] == ["a.pt", "b.pt"]
    # A unit whose write is instant frees its worker with its result: nothing overtakes.
    assert result(pool.submit("w0", task("c", 0))).rows == 10


def test_a_read_ahead_hint_reaches_a_worker_while_it_trains(
    pools: Callable[..., WorkerPool], script: Script
) -> None:
    """Issue 27: the worker reads commands while it trains, so a hint is taken at once."""
    pool = pools(2)
    busy = pool.submit("w0", task("a", 0, gate="long"))
    wait_until(lambda: script.ran("w0"), "a to start")
    pool.prefetch("w0", [("b/e0.pt", "0" * 64), ("c/e0.pt", "1" * 64)])
    pool.prefetch("w0", [])  # nothing to say: nothing sent
    pool.prefetch("w9", [("b/e0.pt", "0" * 64)])  # no such worker: dropped
    wait_until(lambda: script.prefetched, "the hint")
    assert not busy.done()  # taken while the unit trains
    assert script.prefetched == [("w0", [("b/e0.pt", "0" * 64), ("c/e0.pt", "1" * 64)])]
    script.gate("long").set()
    assert result(busy).rows == 10
    assert result(pool.submit("w0", task("b", 2))).rows == 10  # commands still in order


def test_a_failed_checkpoint_write_fails_its_unit_and_the_worker_lives_on(
    pools: Callable[..., WorkerPool],
) -> None:
    pool = pools(1)
    failing = pool.submit("w0", task("a", 0, write_fail={"w0": "io"}))
    with pytest.raises(StoreError, match="I/O error on worker w0: OSError: no space left"):
        result(failing)
    assert failing.freed.done()  # type: ignore[attr-defined]
    assert result(pool.submit("w0", task("a", 0))).checkpoint_sha256 is not None
    assert list(pool.workers()) == ["w0"]


def test_a_worker_lost_while_writing_fails_the_written_unit_and_the_next(
    pools: Callable[..., WorkerPool], script: Script
) -> None:
    pool = pools(2)
    pool.changes()
    writing = pool.submit("w1", task("a", 1, write_gate="never"))
    wait_until(lambda: freed(writing), "the unit's pass to end")
    nxt = pool.submit("w1", task("b", 3, gate="never"))
    wait_until(lambda: len(script.ran("w1")) == 2, "b to start")
    pool.kill_worker("w1")
    for future in (writing, nxt):
        with pytest.raises(WorkerLostError, match="worker w1 was lost"):
            result(future)
    assert not script.written  # a's checkpoint never became durable: a is not done
    wait_until(lambda: held(pool) == {"w0": {0, 1, 2, 3}}, "re-homing")


def test_a_worker_retires_once_its_checkpoint_is_written(
    pools: Callable[..., WorkerPool], script: Script
) -> None:
    pool = pools(2)
    writing = pool.submit("w1", task("a", 1, write_gate="disk"))
    wait_until(lambda: freed(writing), "the unit's pass to end")
    retired = pool.retire("w1")
    time.sleep(0.3)
    assert not retired.done()  # the write in flight is drained like a unit
    script.gate("disk").set()
    assert result(writing).checkpoint_sha256 is not None  # a retire is no loss
    result(retired)
    assert script.written == [("w1", "a.pt")]


# -- groups --------------------------------------------------------------------------------------


def test_rank_0_chooses_the_port_and_the_pool_passes_it_on(
    pools: Callable[..., WorkerPool], script: Script
) -> None:
    pool = pools(2)
    ranks = group_tasks(task("g", 0), [0, 1], "grp")
    futures = pool.submit_group({"w1": ranks[1], "w0": ranks[0]})
    done = [result(futures["w0"]), result(futures["w1"])]
    peer = script.ran("w1")[-1]
    assert peer.group is not None
    assert (peer.group.address, peer.group.port) == ("127.0.0.1", RENDEZVOUS_PORT)
    for rank, out in enumerate(done):
        assert out.task.group is not None and out.task.group.rank == rank
        assert (out.task.group.address, out.task.group.port) == ("127.0.0.1", RENDEZVOUS_PORT)
    # A port given by the caller is sent as it is, to every rank at once.
    given = group_tasks(task("g", 2), [2, 3], "given", address="10.0.0.1", port=1234)
    for future in pool.submit_group({"w0": given[0], "w1": given[1]}).values():
        out = result(future)
        assert out.task.group is not None and out.task.group.port == 1234


def test_a_rank_0_that_fails_before_announcing_breaks_the_group_unsent(
    pools: Callable[..., WorkerPool], script: Script
) -> None:
    pool = pools(2)
    ranks = group_tasks(task("g", 0, silent_rank0=True, fail={"w0": "io"}), [0, 1], "quiet")
    futures = pool.submit_group({"w0": ranks[0], "w1": ranks[1]})
    with pytest.raises(StoreError):
        result(futures["w0"])
    with pytest.raises(
        GroupBrokenError, match=r"on worker w1: rank 0 of group quiet .* never sent"
    ):
        result(futures["w1"])
    assert script.ran("w1") == []  # the held rank never reached its worker
    assert result(pool.submit("w1", task("next", 1))).rows == 10


def test_a_rank_0_lost_before_announcing_breaks_the_group(
    pools: Callable[..., WorkerPool], script: Script
) -> None:
    pool = pools(3)
    ranks = group_tasks(task("g", 0, silent_rank0=True, gate="never"), [0, 1], "doomed")
    futures = pool.submit_group({"w0": ranks[0], "w1": ranks[1]})
    wait_until(lambda: bool(script.ran("w0")), "rank 0 to start")
    with pytest.raises(ValueError, match="busy"):  # the held rank keeps its worker busy
        pool.submit("w1", task("other", 1))
    pool.kill_worker("w0", timeout_s=TIMEOUT_S)
    with pytest.raises(WorkerLostError) as lost:
        result(futures["w0"])
    assert not isinstance(lost.value, GroupBrokenError)
    with pytest.raises(GroupBrokenError, match="was lost"):
        result(futures["w1"])
    assert "w1" in pool.workers()


# -- retire --------------------------------------------------------------------------------------


def test_retiring_an_idle_worker_rehomes_then_ends_it_normally(
    pools: Callable[..., WorkerPool], dataset: Dataset
) -> None:
    pool = pools(3)  # w0: 0, 3; w1: 1; w2: 2
    pool.changes()
    retired = pool.retire("w0")
    assert "w0" not in pool.workers()
    result(retired)
    assert held(pool) == {"w1": {0, 1}, "w2": {2, 3}}
    for info in pool.workers().values():  # the re-homed partitions were read (once more)
        assert info.bytes_read == dataset.bytes_of(info.partitions)
    changes = pool.changes()
    assert kinds(changes) == [
        ("retiring", "w0"),
        ("partitions", "w1"),
        ("partitions", "w2"),
        ("retired", "w0"),
    ]
    stats = pool.stats()
    assert stats.retired == 1 and stats.lost == {}


def test_a_busy_worker_finishes_its_unit_before_it_retires(
    pools: Callable[..., WorkerPool], script: Script
) -> None:
    pool = pools(2)
    running = pool.submit("w1", task("t", 1, gate="finish"))
    wait_until(lambda: bool(script.ran("w1")), "the unit to start")
    retired = pool.retire("w1")
    with pytest.raises(ValueError, match="on worker 'w1': it is retiring"):
        pool.submit("w1", task("u", 3))
    time.sleep(0.3)
    assert not retired.done()  # it waits for the unit in flight
    script.gate("finish").set()
    assert result(running).rows == 10  # the unit in flight succeeds: a retire is no loss
    result(retired)
    assert held(pool) == {"w0": {0, 1, 2, 3}}
    assert [c.kind for c in pool.changes()][-1] is Membership.RETIRED
    with pytest.raises(ValueError, match="cannot retire worker 'w1': no such live worker"):
        pool.retire("w1")


def test_the_last_worker_holding_partitions_cannot_retire(pools: Callable[..., WorkerPool]) -> None:
    pool = pools(1)
    with pytest.raises(ValueError, match=r"w0: it is the last live worker .* \[0, 1, 2, 3\]"):
        pool.retire("w0")
    assert set(pool.workers()) == {"w0"}


def test_a_retire_whose_rehoming_fails_is_called_off(
    pools: Callable[..., WorkerPool], script: Script
) -> None:
    pool = pools(2)
    pool.changes()
    script.failing_loads.add("w1")
    with pytest.raises(RuntimeError, match="retiring worker w0 was called off"):
        result(pool.retire("w0"))
    assert set(pool.workers()) == {"w0", "w1"}
    assert kinds(pool.changes())[-1] == ("ready", "w0")
    assert result(pool.submit("w0", task("t", 0))).rows == 10


# -- close ---------------------------------------------------------------------------------------


def test_close_stops_idle_workers_and_fails_busy_ones(
    pools: Callable[..., WorkerPool], script: Script
) -> None:
    pool = pools(2)
    pool.changes()
    running = pool.submit("w1", task("t", 1, gate="never"))
    wait_until(lambda: bool(script.ran("w1")), "the unit to start")
    pool.close()
    with pytest.raises(WorkerLostError, match="closed before the unit ended"):
        result(running)
    changes = {c.worker.worker_id: c for c in pool.changes()}
    assert changes["w0"].kind is Membership.RETIRED
    assert changes["w1"].kind is Membership.LOST and "killed" in (changes["w1"].reason or "")
    assert pool.workers() == {}
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.add_worker()


def test_a_backend_that_cannot_add_workers_says_so_by_name() -> None:
    """``Backend.add_worker``'s default, for a backend that cannot add workers, names it."""
    pool = WorkerPool(ThreadTransport(), 1)
    with pytest.raises(NotImplementedError, match="WorkerPool cannot add workers"):
        Backend.add_worker(pool)
    with pytest.raises(RuntimeError, match="call start first"):
        pool.add_worker()
    pool.close()


def test_a_failed_rehome_load_is_reported_as_a_membership_change(
    pools: Callable[..., WorkerPool], script: Script
) -> None:
    pool = pools(2)
    pool.changes()
    script.failing_loads.add("w0")
    with pytest.raises(WorkerLostError):
        result(pool.submit("w1", task("t", 1, die="w1")))
    wait_until(lambda: held(pool) == {"w0": {0, 2}}, "the failed load to be reported")
    changes = pool.changes()
    assert kinds(changes) == [("lost", "w1"), ("partitions", "w0"), ("partitions", "w0")]
    assert [c.worker.partitions for c in changes[1:]] == [{0, 1, 2, 3}, {0, 2}]


def test_the_pool_records_when_each_worker_reached_each_start_up_phase(
    pools: Callable[..., WorkerPool],
) -> None:
    before = time.time()
    pool = pools(2)
    startup = pool.stats().startup
    assert sorted(startup) == ["w0", "w1"]
    for phases in startup.values():
        # the worker's own phases (serve.py) between the driver's launch and its listing
        order = ["launched", "serve", "connected", "welcomed", "ready", "listed"]
        assert [phases[name] for name in order] == sorted(phases[name] for name in order)
        assert before - 1.0 <= phases["launched"] and phases["listed"] <= time.time()
