"""LocalBackend.submit_group: a trial trained data-parallel by a group of worker processes.

The acceptance test: a group of 2 trains one trial and matches the validation-loss curve of
one worker trained with the same global batch size, on the digits data in 2 partitions.
Then the rules of ``Backend.submit_group`` (checked before anything is sent) and a peer
killed mid-unit (the survivor fails with GroupBrokenError and serves the next unit).
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cerebro_spark.backends import Backend, LocalBackend, WorkerJob
from cerebro_spark.data import load_source, write_dataset
from cerebro_spark.errors import ConfigError, WorkerLostError
from cerebro_spark.store import Store, open_store
from cerebro_spark.units import GroupBrokenError, UnitKind, UnitResult, UnitTask, group_tasks
from tests.backends.contract import (
    GATED,
    Dataset,
    gated,
    holder,
    make_dataset,
    result,
    train_task,
    wait_until,
)

pytestmark = pytest.mark.torch
logger = logging.getLogger(__name__)

MLP = "cerebro_spark.training:MLPSpec"
# Global batch B = 32: one worker takes 32 rows per step, a group of 2 takes 16 + 16.
DIGITS_PARAMS: Mapping[str, Any] = {"hidden_units": [64], "lr": 0.003, "batch_size": 32}
EPOCHS = 5
# Per-epoch validation losses of the two runs may differ by at most this share of the
# one-worker loss (justified in the test's docstring; measured here: at most 6.7 %).
RELATIVE_TOLERANCE = 0.10


def worker_children() -> list[multiprocessing.process.BaseProcess]:
    return [p for p in multiprocessing.active_children() if p.name.startswith("cerebro-worker-")]


@pytest.fixture(autouse=True, scope="module")
def no_worker_outlives_the_module() -> Iterator[None]:
    yield
    assert worker_children() == []


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    table, meta = load_source("sklearn:digits")
    uri = str(tmp_path_factory.mktemp("group-digits") / "dataset")
    manifest = write_dataset(table, uri, num_partitions=2, seed=3, **meta)
    return Dataset(uri, manifest)


@pytest.fixture(scope="module")
def blobs4(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return make_dataset(tmp_path_factory.mktemp("group-blobs") / "dataset")


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    return open_store(str(tmp_path_factory.mktemp("group-store")))


@pytest.fixture(scope="module")
def shared(digits: Dataset, store: Store) -> Iterator[LocalBackend]:
    """Two workers on the digits (w0 holds partition 0, w1 partition 1), shared by the
    tests that leave them idle and alive."""
    backend = LocalBackend(2)
    try:
        backend.start(WorkerJob(dataset_uri=digits.uri, store=store, torch_threads=1))
        backend.wait_started()
        yield backend
    finally:
        backend.close()


@pytest.fixture
def local(store: Store) -> Iterator[Callable[[Dataset, int], LocalBackend]]:
    backends: list[LocalBackend] = []

    def start(dataset: Dataset, num_workers: int) -> LocalBackend:
        backend = LocalBackend(num_workers)
        backends.append(backend)
        backend.start(WorkerJob(dataset_uri=dataset.uri, store=store, torch_threads=1))
        backend.wait_started()
        return backend

    yield start
    for backend in backends:
        backend.close()


def task(
    trial: str,
    *,
    epoch: int = 0,
    step: int = 0,
    epoch_units: int = 2,
    checkpoint_in: str | None = None,
    out: str,
    params: Mapping[str, Any] = DIGITS_PARAMS,
    spec: str = MLP,
) -> UnitTask:
    return UnitTask(
        kind=UnitKind.TRAIN,
        trial_id=trial,
        spec=spec,
        params=dict(params),
        trial_seed=42,
        epoch=epoch,
        partition=0,
        step=step,
        epoch_units=epoch_units,
        checkpoint_in=checkpoint_in,
        checkpoint_out=out,
    )


def by_holder(backend: Backend, tasks: tuple[UnitTask, ...]) -> dict[str, UnitTask]:
    return {holder(backend, t.partition): t for t in tasks}


def results(futures: Mapping[str, Future[UnitResult]]) -> list[UnitResult]:
    """The ranks' results, by rank."""
    done = [result(future) for future in futures.values()]
    return sorted(done, key=lambda r: r.task.group.rank if r.task.group else 0)


def validation_loss(backend: Backend, trial: str, checkpoint: str, partitions: int) -> float:
    futures = [
        backend.submit(
            holder(backend, p),
            UnitTask(
                kind=UnitKind.VALIDATE,
                trial_id=trial,
                spec=MLP,
                params=dict(DIGITS_PARAMS),
                trial_seed=42,
                epoch=0,
                partition=p,
                checkpoint_in=checkpoint,
            ),
        )
        for p in range(partitions)
    ]
    done = [result(f) for f in futures]
    return sum(r.metric_sums["loss"] for r in done) / sum(r.rows for r in done)


# -- the acceptance test -------------------------------------------------------------------


def test_a_group_of_two_matches_the_loss_curve_of_one_worker_with_the_same_global_batch(
    shared: LocalBackend, digits: Dataset
) -> None:
    """One worker (two ordinary units per epoch, batch 32) vs a group of 2 (one group
    unit per epoch, 16 + 16 rows per step), 5 epochs of digits from the same initial
    weights, the same partitions visited in the same per-epoch order.

    Both runs train on the same rows with the same global batch size; they differ in
    which rows share a batch (the group mixes the two partitions, the single worker does
    one after the other), hence in the SGD noise, and in one step: with ~719 rows per
    partition the single worker takes 2 x 23 steps per epoch (each partition ends in a
    partial batch) and the group 45. Measured over 6 trial seeds the per-epoch difference
    is within -8.1 % .. +8.0 % (the single worker on average ~3 % ahead, from its extra
    step); for this seed it is at most 6.7 %, and the run is bit-reproducible. 10 % per
    epoch leaves room for that noise, while a broken all-reduce (ranks stepping on their
    own half batch: 2 x the steps; a missing division by the world size: 2 x the
    gradient; replicas drifting apart) moves the curve far more. The exact form of the
    equivalence (weights equal to 1e-6 with concatenated batches) is in
    tests/training/test_group_unit.py.
    """
    backend = shared
    single_curve: list[float] = []
    group_curve: list[float] = []
    single_key: str | None = None
    group_key: str | None = None
    rows = {"single": 0, "group": 0}
    for epoch in range(EPOCHS):
        order = [int(p) for p in np.random.default_rng([42, epoch]).permutation(2)]
        # (a) one worker at a time: the trial hops between the partitions' holders.
        for step, partition in enumerate(order):
            unit = task(
                "single", epoch=epoch, step=step, checkpoint_in=single_key,
                out=f"single/e{epoch}s{step}.pt",
            )  # fmt: skip
            unit = UnitTask.from_json({**unit.to_json(), "partition": partition})
            rows["single"] += result(backend.submit(holder(backend, partition), unit)).rows
            single_key = unit.checkpoint_out
        assert single_key is not None
        single_curve.append(validation_loss(backend, "single", single_key, 2))
        # (b) a group of 2 trains both partitions at once.
        ranks = group_tasks(
            task("group", epoch=epoch, checkpoint_in=group_key, out=f"group/e{epoch}.pt"),
            order,
            f"group-e{epoch}",
        )
        done = results(backend.submit_group(by_holder(backend, ranks)))
        assert [r.task.partition for r in done] == order
        assert done[0].checkpoint_sha256 is not None
        rows["group"] += sum(r.rows for r in done)
        group_key = ranks[0].checkpoint_out
        assert group_key is not None
        group_curve.append(validation_loss(backend, "group", group_key, 2))
    table = "\n".join(
        f"epoch {e + 1}: one worker {s:.4f}  group of 2 {g:.4f}  relative difference "
        f"{abs(g - s) / s:.2%}"
        for e, (s, g) in enumerate(zip(single_curve, group_curve, strict=True))
    )
    logger.info("validation loss per epoch\n%s", table)
    print(f"\nvalidation loss per epoch (digits, B=32, Adam lr=0.003)\n{table}")
    assert rows["single"] == rows["group"] == EPOCHS * digits.manifest.rows("train")
    for single, grouped in zip(single_curve, group_curve, strict=True):
        assert abs(grouped - single) <= RELATIVE_TOLERANCE * single, table
    for curve in (single_curve, group_curve):
        assert all(b < a for a, b in itertools.pairwise(curve)), table
        assert curve[-1] < 0.5 * curve[0], table


# -- submit_group's rules ------------------------------------------------------------------


def test_submit_group_checks_everything_before_sending_anything(
    shared: LocalBackend, digits: Dataset
) -> None:
    backend = shared  # w0 holds partition 0, w1 partition 1
    ranks = group_tasks(task("t", out="rules.pt"), [0, 1], "g")
    wrong = r"rank 0 \(partition 0\) of group 'g' on worker w1: it holds partitions \[1\]"
    with pytest.raises(ValueError, match=wrong):
        backend.submit_group({"w1": ranks[0], "w0": ranks[1]})
    with pytest.raises(ValueError, match="no-such-worker"):
        backend.submit_group({"w0": ranks[0], "no-such-worker": ranks[1]})
    with pytest.raises(ConfigError, match=r"needs ranks 0\.\.1 once each"):
        backend.submit_group({"w0": ranks[0]})
    with pytest.raises(ValueError, match="rank 0 of group 'g'; use submit_group"):
        backend.submit("w0", ranks[0])
    # Nothing was sent: both workers are idle and run the group now.
    done = results(backend.submit_group({"w0": ranks[0], "w1": ranks[1]}))
    assert [r.worker_id for r in done] == ["w0", "w1"]
    assert all(r.task.group and r.task.group.port > 0 for r in done)
    assert [r.rows for r in done] == [digits.manifest.partition("train", p).rows for p in (0, 1)]


def test_submit_group_refuses_a_busy_worker(shared: LocalBackend, tmp_path: Path) -> None:
    backend = shared
    release = tmp_path / "release"
    begun = tmp_path / "begun"
    busy = backend.submit("w1", train_task("slow", 1, spec=GATED, params=gated(begun, [release])))
    wait_until(begun.exists, "the unit to start")
    ranks = group_tasks(task("t", out="busy.pt"), [0, 1], "g")
    with pytest.raises(ValueError, match="on worker w1: it is busy with the train unit"):
        backend.submit_group({"w0": ranks[0], "w1": ranks[1]})
    release.touch()
    assert result(busy).rows > 0
    # w0 got nothing (rank 0 would still wait for its peer, and w0 would be busy).
    assert result(backend.submit("w0", train_task("after", 0))).rows > 0


# -- a peer dies -------------------------------------------------------------------------


def test_a_peer_killed_mid_unit_breaks_the_group_and_the_survivor_serves_on(
    local: Callable[[Dataset, int], LocalBackend], blobs4: Dataset, tmp_path: Path
) -> None:
    backend = local(blobs4, 3)  # w0: 0, 3; w1: 1; w2: 2
    release = tmp_path / "release"
    begun = tmp_path / "begun"
    params = {**gated(begun, [release]), "batch_size": 16}
    ranks = group_tasks(
        task("t", epoch_units=4, out="broken.pt", spec=GATED, params=params),
        [0, 1],
        "doomed",
        timeout_s=20.0,
    )
    futures = backend.submit_group({"w0": ranks[0], "w1": ranks[1]})
    wait_until(begun.exists, "a rank to start")  # both ranks have joined the group
    backend.kill_worker("w1")
    release.touch()  # rank 0 goes on to its first collective and finds its peer gone
    with pytest.raises(WorkerLostError) as lost:
        futures["w1"].result(timeout=60)
    assert not isinstance(lost.value, GroupBrokenError)
    with pytest.raises(GroupBrokenError, match=r"on worker w0: .*lost its peers") as broken:
        futures["w0"].result(timeout=60)
    assert "doomed" in str(broken.value)
    assert "w0" in backend.workers() and "w1" not in backend.workers()
    # The survivor serves the next unit: a group with another worker, then a plain unit.
    wait_until(lambda: holder(backend, 1) != "w1", "re-homing")
    again = group_tasks(task("t", epoch_units=4, out="again.pt", params={"batch_size": 16}),
                        [0, 2], "again")  # fmt: skip
    done = results(backend.submit_group({"w0": again[0], "w2": again[1]}))
    assert done[0].checkpoint_sha256 is not None
    assert result(backend.submit("w0", train_task("plain", 3))).rows > 0
