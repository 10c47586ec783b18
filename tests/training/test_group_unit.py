"""Group units (one trial trained data-parallel by k workers): GroupSpec, the exact
equivalence with one worker on the concatenated batches, determinism, the LR schedule,
failures on one rank, and a peer that never joins.

Groups of 2 run in two real worker processes (``spawn``), each serving rank tasks over
a pipe; a group of 1 runs in this process.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import socket
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import pytest
import torch
from training_fixtures import BLOBS_INFO, blobs, one_worker_on_concatenated_batches, train_task

from cerebro_spark.data import DatasetInfo, PartitionData
from cerebro_spark.errors import ConfigError, DataError, TrialError, WorkerLostError
from cerebro_spark.store import Store, open_store
from cerebro_spark.training import (
    decode_checkpoint,
    run_group_unit,
    run_unit,
    weights_digest,
)
from cerebro_spark.training._group import group_steps, local_batch_sizes
from cerebro_spark.units import (
    GroupBrokenError,
    GroupSpec,
    UnitKind,
    UnitResult,
    UnitTask,
    check_group,
    group_tasks,
)

pytestmark = pytest.mark.torch

RESULT_TIMEOUT_S = 120.0
MLP = "cerebro_spark.training:MLPSpec"
SPARSE_TABLE = "training_fixtures:SparseTableSpec"
SGD = {"hidden_units": [16], "optimizer": "sgd", "lr": 0.05, "momentum": 0.9, "batch_size": 32}
ADAM = {"hidden_units": [16], "lr": 0.01, "batch_size": 32}
DROPOUT = {"hidden_units": [16, 8], "dropout": 0.3, "lr": 0.01, "batch_size": 32}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def ranks_of(task: UnitTask, partitions: tuple[int, ...], **group: Any) -> tuple[UnitTask, ...]:
    return group_tasks(
        task,
        partitions,
        group.pop("group_id", f"g-{task.trial_id}-{task.epoch}-{task.step}"),
        address="127.0.0.1",
        port=free_port(),
        **group,
    )


# -- two real rank processes -------------------------------------------------------------


def _serve_ranks(conn: Connection) -> None:
    """A rank process: run the group tasks it is sent, one at a time, until EOF."""
    torch.set_num_threads(1)
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        task, data, store, info = message
        try:
            reply: Any = run_group_unit(task, data, store, info, worker_id=f"r{task.group.rank}")
        except Exception as error:
            reply = error
        conn.send(reply)


class RankProcesses:
    """Two spawned processes that run the ranks of 2-groups in parallel."""

    def __init__(self, count: int = 2) -> None:
        context = multiprocessing.get_context("spawn")
        self.conns: list[Connection] = []
        self.processes: list[multiprocessing.process.BaseProcess] = []
        for index in range(count):
            parent, child = context.Pipe()
            process = context.Process(target=_serve_ranks, args=(child,), name=f"rank-{index}")
            process.daemon = True
            process.start()
            child.close()
            self.conns.append(parent)
            self.processes.append(process)

    def run(
        self,
        tasks: tuple[UnitTask, ...],
        parts: dict[int, PartitionData],
        store: Store,
        info: DatasetInfo = BLOBS_INFO,
    ) -> list[UnitResult | Exception]:
        """Run rank r on process r; return each rank's result or exception, by rank."""
        for conn, task in zip(self.conns, tasks, strict=True):
            conn.send((task, parts[task.partition], store, info))
        replies = []
        for conn in self.conns[: len(tasks)]:
            assert conn.poll(RESULT_TIMEOUT_S), "a rank did not answer"
            replies.append(conn.recv())
        return replies

    def close(self) -> None:
        for conn in self.conns:
            conn.close()
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join(5)


@pytest.fixture(scope="module")
def ranks() -> Iterator[RankProcesses]:
    processes = RankProcesses()
    yield processes
    processes.close()


@pytest.fixture
def disk_store(tmp_path) -> Store:
    return open_store(str(tmp_path / "store"))


def ok(replies: list[UnitResult | Exception]) -> list[UnitResult]:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return [reply for reply in replies if isinstance(reply, UnitResult)]


# -- GroupSpec, group_tasks, check_group ---------------------------------------------------


def test_group_spec_round_trips_through_json_and_old_tasks_are_unchanged():
    plain = train_task()
    assert "group" not in plain.to_json()  # event logs of ordinary units are unchanged
    assert UnitTask.from_json(plain.to_json()) == plain
    tasks = group_tasks(train_task(epoch_units=4, step=1), [3, 0], "g1", timeout_s=5.0)
    assert [t.partition for t in tasks] == [3, 0]
    assert [t.group.rank for t in tasks if t.group] == [0, 1]
    for task in tasks:
        assert UnitTask.from_json(task.to_json()) == task
        assert UnitTask.from_json(json.loads(json.dumps(task.to_json()))) == task


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"rank": 2}, r"rank must be in range\(size=2\), got 2"),
        ({"size": 0, "partitions": ()}, "size must be >= 1, got 0"),
        ({"partitions": (1, 1)}, "distinct non-negative ints, got \\[1, 1\\]"),
        ({"partitions": (1,)}, "one partition per rank \\(size=2\\)"),
        ({"port": 70000}, "port must be in \\[0, 65535\\], got 70000"),
        ({"group_id": ""}, "group_id must be a non-empty str"),
        ({"timeout_s": 0}, "timeout_s must be a number > 0, got 0"),
    ],
)
def test_group_spec_refuses_bad_fields(fields, match):
    base = {
        "rank": 0,
        "size": 2,
        "address": "127.0.0.1",
        "port": 0,
        "partitions": (0, 1),
        "group_id": "g",
    }
    with pytest.raises(ConfigError, match=match):
        GroupSpec(**{**base, **fields})


def test_check_group_refuses_tasks_that_are_not_one_group():
    a, b = group_tasks(train_task(epoch_units=2), [0, 1], "g")
    check_group([b, a])
    with pytest.raises(ConfigError, match=r"needs ranks 0\.\.1 once each, got ranks \[0\]"):
        check_group([a])
    with pytest.raises(ConfigError, match="differ only in partition and rank"):
        check_group([a, dataclasses.replace(b, params={"lr": 1.0})])
    with pytest.raises(ConfigError, match="must train partition 1, got 0"):
        check_group([a, dataclasses.replace(b, partition=0)])
    with pytest.raises(ConfigError, match="overruns the epoch of epoch_units=1"):
        group_tasks(train_task(epoch_units=1), [0, 1], "g")
    with pytest.raises(ConfigError, match="needs a GroupSpec"):
        check_group([a, train_task(partition=1)])


def test_local_batches_split_the_global_batch_and_steps_cover_every_row():
    assert local_batch_sizes(32, 2) == (16, 16)
    assert local_batch_sizes(10, 3) == (4, 3, 3)
    with pytest.raises(ConfigError, match="batch_size=2 is smaller than the group size 3"):
        local_batch_sizes(2, 3)
    steps = group_steps([200, 150], [16, 16])
    assert len(steps) == 13  # max(ceil(200/16), ceil(150/16))
    assert steps[0] == (16, 16) and steps[9] == (16, 6) and steps[10] == (16, 0)
    assert steps[12] == (8, 0)
    assert [sum(column) for column in zip(*steps, strict=True)] == [200, 150]


# -- the exact property: the all-reduce computes the concatenated batch's gradient ---------


def max_difference(a: dict[str, torch.Tensor], b: dict[str, Any]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize(
    ("spec", "params"),
    [(MLP, SGD), (MLP, ADAM), (SPARSE_TABLE, SGD), (SPARSE_TABLE, ADAM)],
    ids=["sgd-momentum", "adam", "sparse-table-sgd", "sparse-table-adam"],
)
def test_a_group_of_two_equals_one_worker_on_the_concatenated_batches(
    ranks, disk_store, spec, params
):
    parts = {0: blobs(0, rows=200), 1: blobs(1, rows=150)}  # unequal: 13 vs 10 local steps
    first = train_task(spec=spec, params=params, checkpoint_out="start.pt")
    start = run_unit(first, parts[0], disk_store, BLOBS_INFO)
    base = train_task(
        spec=spec,
        params=params,
        epoch=1,
        epoch_units=2,
        checkpoint_in="start.pt",
        checkpoint_out="g.pt",
    )
    tasks = ranks_of(base, (0, 1))
    results = ok(ranks.run(tasks, parts, disk_store))
    saved = decode_checkpoint(disk_store.get("g.pt"))
    reference = one_worker_on_concatenated_batches(tasks, parts, disk_store)
    difference = max_difference(reference, saved["model"])
    assert difference <= 1e-6, difference
    # Not trivially equal: training moved the weights far more than that, and rank 0's
    # batches alone (no all-reduce) lead elsewhere.
    before = decode_checkpoint(disk_store.get("start.pt"))["model"]
    assert max_difference(reference, before) > 1e-2
    alone = one_worker_on_concatenated_batches(tasks[:1], parts, disk_store)
    assert max_difference(alone, saved["model"]) > 1e-3
    # Each rank reports its own rows; rank 0 carries the checkpoint.
    assert [r.rows for r in results] == [200, 150]
    assert [r.worker_id for r in results] == ["r0", "r1"]
    assert results[0].checkpoint_sha256 is not None and results[1].checkpoint_sha256 is None
    assert results[1].checkpoint_bytes == 0
    assert saved["counters"] == {
        "epoch": 1,
        "step": 1,
        "samples_seen": start.rows + 350,
        "trial_seed": 1,
    }
    assert all(0 < r.metric_sums["loss"] / r.rows < 2 for r in results)
    if spec == SPARSE_TABLE:  # lazily stepped: the rows no batch looked up did not move
        never = slice(16, 32)
        assert torch.equal(saved["model"]["table.weight"][never], before["table.weight"][never])
        assert (
            max_difference(
                {"t": reference["table.weight"][:16]}, {"t": before["table.weight"][:16]}
            )
            > 1e-3
        )


def test_a_group_of_one_is_bit_identical_to_run_unit(disk_store):
    params = dict(DROPOUT, lr_schedule="step", lr_step_gamma=0.5)
    data = blobs(0, rows=150)
    single = run_unit(train_task(params=params, checkpoint_out="single.pt"), data, disk_store,
                      BLOBS_INFO)  # fmt: skip
    (task,) = ranks_of(train_task(params=params, checkpoint_out="group.pt"), (0,))
    grouped = run_group_unit(task, data, disk_store, BLOBS_INFO)
    assert weights_digest(disk_store.get("group.pt")) == weights_digest(disk_store.get("single.pt"))
    assert grouped.metric_sums == single.metric_sums
    assert grouped.rows == single.rows == 150
    assert not torch.distributed.is_initialized()  # the process group was destroyed


# -- determinism, LR schedule ------------------------------------------------------------


def test_the_same_group_unit_twice_gives_a_bit_identical_checkpoint(ranks, disk_store):
    parts = {2: blobs(2, rows=120), 5: blobs(5, rows=130)}
    shas, sums = [], []
    for attempt in ("a", "b"):
        base = train_task(params=DROPOUT, epoch_units=3, checkpoint_out=f"{attempt}.pt")
        results = ok(ranks.run(ranks_of(base, (5, 2), group_id=attempt), parts, disk_store))
        shas.append(results[0].checkpoint_sha256)
        sums.append([dict(r.metric_sums) for r in results])
    assert shas[0] == shas[1]
    assert sums[0] == sums[1]
    # Another rank order is another unit (rank 0 holds another partition's batches first).
    base = train_task(params=DROPOUT, epoch_units=3, checkpoint_out="c.pt")
    swapped = ok(ranks.run(ranks_of(base, (2, 5), group_id="c"), parts, disk_store))
    assert swapped[0].checkpoint_sha256 != shas[0]


def test_the_lr_scheduler_steps_when_the_group_unit_ends_the_epoch(ranks, disk_store):
    params = {"hidden_units": [8], "lr": 0.1, "lr_schedule": "step", "lr_step_gamma": 0.5}
    parts = {i: blobs(i, rows=64) for i in range(4)}
    key = None
    lrs = []
    for step, pair in ((0, (1, 3)), (2, (0, 2))):  # epoch of 4 partitions in 2 group units
        base = train_task(
            params=params, step=step, epoch_units=4, checkpoint_in=key,
            checkpoint_out=f"lr/s{step}.pt",
        )  # fmt: skip
        ok(ranks.run(ranks_of(base, pair), parts, disk_store))
        key = base.checkpoint_out
        saved = decode_checkpoint(disk_store.get(key))
        lrs.append(saved["optimizer"]["param_groups"][0]["lr"])
        assert saved["counters"]["step"] == step + 1
    assert lrs == [0.1, 0.05]


# -- failures ----------------------------------------------------------------------------


def test_a_failure_on_one_rank_fails_every_rank_promptly(ranks, disk_store):
    good = blobs(0, rows=100)
    bad = blobs(1, rows=100)
    bad.features[37] = np.nan  # rank 1's loss becomes NaN in its 3rd batch
    base = train_task(params=ADAM, epoch_units=2, checkpoint_out="nan.pt")
    started = time.monotonic()
    replies = ranks.run(ranks_of(base, (0, 1)), {0: good, 1: bad}, disk_store)
    assert time.monotonic() - started < 30  # not the 60 s collective timeout
    assert isinstance(replies[1], TrialError)
    assert "not finite" in str(replies[1])
    assert isinstance(replies[0], TrialError)
    assert "rank 1 (partition 1)" in str(replies[0])
    assert not disk_store.exists("nan.pt")
    # Both rank processes serve the next group.
    fine = train_task(params=ADAM, epoch_units=2, checkpoint_out="after.pt")
    assert [r.rows for r in ok(ranks.run(ranks_of(fine, (0, 2)), {0: good, 2: blobs(2)},
                                         disk_store))] == [100, 200]  # fmt: skip


def test_a_rank_failing_while_starting_is_named_by_its_peers(ranks, disk_store):
    narrow = blobs(1)
    narrow = PartitionData.from_arrays("train", 1, narrow.features[:, :3].copy(), narrow.labels)
    base = train_task(params=ADAM, epoch_units=2, checkpoint_out="x.pt")
    replies = ranks.run(ranks_of(base, (0, 1)), {0: blobs(0), 1: narrow}, disk_store)
    assert isinstance(replies[1], DataError) and "feature_shape" in str(replies[1])
    assert isinstance(replies[0], TrialError)
    assert "rank 1 (partition 1)" in str(replies[0]) and "while starting" in str(replies[0])
    # A checkpoint every rank fails to read is an I/O error (retry), not the trial's fault.
    base = train_task(
        params=ADAM, epoch=1, epoch_units=2, checkpoint_in="missing.pt", checkpoint_out="x.pt"
    )
    replies = ranks.run(ranks_of(base, (0, 1)), {0: blobs(0), 1: blobs(1)}, disk_store)
    assert all(isinstance(reply, OSError) for reply in replies), replies
    assert not disk_store.exists("x.pt")


def test_ranks_given_different_tasks_refuse_to_train(ranks, disk_store):
    a, b = ranks_of(train_task(params=ADAM, epoch_units=2), (0, 1))
    b = dataclasses.replace(b, params={**ADAM, "lr": 0.5})  # bypasses check_group
    replies = ranks.run((a, b), {0: blobs(0), 1: blobs(1)}, disk_store)
    for reply in replies:
        assert isinstance(reply, ConfigError)
        assert "were given different tasks" in str(reply)


def test_a_rank_whose_peer_never_joins_fails_after_the_timeout(disk_store):
    (rank0, _) = ranks_of(train_task(epoch_units=2), (0, 1), timeout_s=2.0)
    started = time.monotonic()
    with pytest.raises(GroupBrokenError, match="could not join the rendezvous") as info:
        run_group_unit(rank0, blobs(0), disk_store, BLOBS_INFO)
    assert 1.5 < time.monotonic() - started < 30
    assert isinstance(info.value, WorkerLostError)  # the unit goes back to the queue
    assert not torch.distributed.is_initialized()
    # The process serves the next unit.
    assert run_unit(train_task(checkpoint_out="next.pt"), blobs(0), disk_store, BLOBS_INFO).rows


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"kind": UnitKind.VALIDATE}, "group units train"),
        ({"partition": 1}, "must train partition 0, got task.partition=1"),
        ({"step": 1}, "does not fit an epoch of epoch_units=2"),
        ({"group": None}, "has no group: use run_unit"),
    ],
)
def test_malformed_group_tasks_are_refused_before_the_rendezvous(disk_store, change, match):
    (task, _) = ranks_of(train_task(epoch_units=2), (0, 1))
    with pytest.raises(ConfigError, match=match):
        run_group_unit(dataclasses.replace(task, **change), blobs(0), disk_store, BLOBS_INFO)
    unchosen = group_tasks(train_task(epoch_units=2), (0, 1), "g")[0]
    with pytest.raises(ConfigError, match="no rendezvous address/port yet"):
        run_group_unit(unchosen, blobs(0), disk_store, BLOBS_INFO)
