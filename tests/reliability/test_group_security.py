"""Reliability catalogue: who may join a group unit's rendezvous, and where secrets go.

Each case names the fault or bad input, the exact error expected, and checks that nothing
was lost:

* a process that presents a wrong group token cannot take a rank: it fails with
  ``GroupBrokenError`` and the real group trains the same checkpoint as without it;
* rank 0's store listens on its own address only, and a client without the token finds
  none of the group's keys;
* ``submit_group`` draws a fresh token per attempt, sends it to the ranks only, and
  keeps it out of ``repr`` and the logs;
* no byte of the control secret is in Spark job groups, job descriptions or events;
* a worker killed during a group unit: the group fails whole, the unit goes back to
  the queue, every unit runs exactly once.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import logging
import multiprocessing
import queue
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from multiprocessing.pool import Pool
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.backends import WorkerJob, WorkerPool
from cerebro_spark.engine import read_events, run_experiment
from cerebro_spark.errors import ConfigError
from cerebro_spark.search._registry import PROCEDURES
from cerebro_spark.store import open_store
from cerebro_spark.units import GroupBrokenError, UnitResult, UnitTask, group_tasks
from tests.backends import contract, fake_transport
from tests.backends.contract import make_dataset
from tests.backends.fake_transport import ThreadTransport
from tests.driver.test_group_failures import GroupedGrid, config, trained_once

TRAINING = str(Path(__file__).resolve().parents[1] / "training")
if TRAINING not in sys.path:
    sys.path.insert(0, TRAINING)  # training_fixtures, here and in spawned rank processes

from training_fixtures import BLOBS_INFO, blobs, train_task  # noqa: E402

TIMEOUT_S = 60.0
# How long a rank process waits for the others at the rendezvous. Generous: rank processes
# are spawned (each imports torch), and on a loaded machine rank 0 may listen only tens of
# seconds after a peer began to connect. No case here waits it out.
RENDEZVOUS_S = 120.0


def secret_forms(secret: bytes) -> list[str]:
    """The ways a secret could be written into text."""
    return [
        secret.hex(),
        secret.hex().upper(),
        base64.b64encode(secret).decode().rstrip("="),
        base64.urlsafe_b64encode(secret).decode().rstrip("="),
        secret.decode("latin-1"),
        repr(secret)[2:-1],
    ]


def assert_absent(secret: bytes | str, text: str, where: str) -> None:
    forms = secret_forms(secret) if isinstance(secret, bytes) else [secret]
    leaked = [form for form in forms if form and form in text]
    assert not leaked, f"the secret appears in {where}"


@pytest.fixture(autouse=True)
def script() -> Iterator[fake_transport.Script]:
    yield fake_transport.reset()
    fake_transport.reset()


# -- the rendezvous (real torch.distributed, rank processes) -----------------------------------


def run_rank(task: UnitTask, store_uri: str) -> UnitResult | Exception:
    """A rank process's body: train ``task`` on its blobs partition."""
    from cerebro_spark.training import run_group_unit

    try:
        data = blobs(task.partition)
        return run_group_unit(task, data, open_store(store_uri), BLOBS_INFO, worker_id="r")
    except Exception as error:
        return error


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def ranks(out: str, token: str, timeout_s: float = RENDEZVOUS_S) -> tuple[UnitTask, ...]:
    base = train_task(epoch_units=2, checkpoint_out=out)
    tasks = group_tasks(
        base, (0, 1), f"g-{out}", address="127.0.0.1", port=free_port(), timeout_s=timeout_s
    )
    return tuple(
        dataclasses.replace(t, group=dataclasses.replace(t.group, token=token))  # type: ignore[arg-type]
        for t in tasks
    )


def run_together(
    pool: Pool, tasks: list[UnitTask], store_uri: str, first: int | None = None
) -> list[UnitResult | Exception]:
    """Run ``tasks`` in rank processes of ``pool`` at once; their outcomes in order.

    ``pool`` has a process for every task (each runs one task at a time, so that all of
    them are in the rendezvous together). With ``first``, the tasks before it start, task
    ``first`` runs to its end, and only then do the rest start.
    """
    limit = RENDEZVOUS_S + TIMEOUT_S * 2
    cut = len(tasks) if first is None else first + 1
    pending = [pool.apply_async(run_rank, (task, store_uri)) for task in tasks[:cut]]
    if first is not None:
        pending[first].wait(limit)
    pending += [pool.apply_async(run_rank, (task, store_uri)) for task in tasks[cut:]]
    return [p.get(limit) for p in pending]


@pytest.mark.torch
def test_a_process_with_a_wrong_token_cannot_take_a_rank_and_the_group_trains(
    tmp_path: Path,
) -> None:
    store_uri = str(tmp_path / "store")
    # One pool of spawned rank processes for both groups: each imports torch once.
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        clean = run_together(pool, list(ranks("clean.pt", "a" * 32)), store_uri)
        assert all(isinstance(r, UnitResult) for r in clean), clean
        rank0, rank1 = ranks("attacked.pt", "b" * 32)
        assert rank1.group is not None
        intruder = dataclasses.replace(
            rank1, group=dataclasses.replace(rank1.group, token="c" * 32)
        )
        # The intruder meets rank 0 at the rendezvous, and is turned away, before the real
        # rank 1 starts (were it to come after the real group had trained, it would find no
        # one).
        real0, refused, real1 = run_together(pool, [rank0, intruder, rank1], store_uri, first=1)
    assert isinstance(refused, GroupBrokenError)
    assert "presented a token that is not the group's" in str(refused)
    assert "c" * 32 not in str(refused) and "b" * 32 not in str(refused)
    # Nothing lost: the real group trained, to the same checkpoint as without the intruder.
    assert isinstance(real0, UnitResult) and isinstance(real1, UnitResult)
    store = open_store(store_uri)
    digest = hashlib.sha256(store.get("attacked.pt")).hexdigest()
    assert digest == real0.checkpoint_sha256 == clean[0].checkpoint_sha256  # type: ignore[union-attr]


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the sockets listening on ``port`` (Linux /proc)."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port and len(address) == width:
                found.add(address)
    return found


@pytest.mark.torch
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads /proc/net/tcp")
def test_rank_0_listens_on_its_own_address_and_hides_the_keys_under_the_token(
    tmp_path: Path,
) -> None:
    import torch.distributed as dist

    from cerebro_spark.training import run_group_unit
    from cerebro_spark.training._group import _token_hash

    token = "d" * 32
    (rank0, _) = group_tasks(
        train_task(epoch_units=2, checkpoint_out="x.pt"), (0, 1), "g-listen", timeout_s=8.0
    )
    assert rank0.group is not None
    rank0 = dataclasses.replace(
        rank0, group=dataclasses.replace(rank0.group, address="127.0.0.1", token=token)
    )
    ports: queue.Queue[int] = queue.Queue()
    outcome: list[BaseException] = []

    def lead() -> None:
        try:
            run_group_unit(rank0, blobs(0), open_store(str(tmp_path)), BLOBS_INFO,
                           on_rendezvous=ports.put)  # fmt: skip
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=lead)
    thread.start()
    port = ports.get(timeout=TIMEOUT_S)
    assert listening_addresses(port) == {"0100007F"}  # 127.0.0.1, not 0.0.0.0 or ::
    client = dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=_seconds(5))
    assert client.check(["cerebro/g-listen/fingerprint"])  # only the fingerprint is visible
    assert not client.check(["rank/0"])
    assert dist.PrefixStore(_token_hash("prefix", token), client).check(["rank/0"])
    assert token not in client.get("cerebro/g-listen/fingerprint").decode()
    del client
    thread.join(TIMEOUT_S)
    # The peer never joined: rank 0 fails cleanly, and its message holds no key prefix.
    (error,) = outcome
    assert isinstance(error, GroupBrokenError) and "could not join the rendezvous" in str(error)
    assert _token_hash("prefix", token) not in str(error) and error.__cause__ is None
    assert not dist.is_initialized()


def _seconds(value: float) -> Any:
    import datetime

    return datetime.timedelta(seconds=value)


# -- the pool: tokens per attempt, addresses, logs ---------------------------------------------


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return make_dataset(tmp_path_factory.mktemp("security") / "dataset")


def test_submit_group_draws_a_fresh_token_per_attempt_and_keeps_it_out_of_logs(
    dataset: Any, tmp_path: Path, script: fake_transport.Script, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with WorkerPool(ThreadTransport(), 2, heartbeat_s=0.2, heartbeat_timeout_s=5.0) as pool:
        pool.start(WorkerJob(dataset.uri, open_store(str(tmp_path / "store"))))
        pool.wait_started(TIMEOUT_S)
        base = contract.train_task("t", 0, epoch_units=4)
        for attempt in range(2):
            tasks = group_tasks(base, [0, 1], f"g{attempt}")
            futures = pool.submit_group({"w0": tasks[0], "w1": tasks[1]})
            for future in futures.values():
                future.result(TIMEOUT_S)
        seen = [(worker, task.group) for worker, task in script.started]
    tokens = [group.token for _, group in seen if group is not None]
    assert len(tokens) == 4 and all(len(t) == 32 and int(t, 16) >= 0 for t in tokens)
    assert tokens[0] == tokens[1] != tokens[2] == tokens[3]  # one per attempt, shared by ranks
    assert {group.address for _, group in seen if group} == {"127.0.0.1"}  # rank 0's own host
    logged = "\n".join(record.getMessage() for record in caplog.records)
    logged += "\n".join(repr(group) for _, group in seen)
    for token in set(tokens):
        assert_absent(token, logged, "the logs or a GroupSpec's repr")


# -- Spark: the control secret is not in job groups or descriptions --------------------------


@pytest.mark.spark
@pytest.mark.torch
def test_no_byte_of_the_control_secret_is_in_spark_job_groups_or_descriptions(
    dataset: Any, tmp_path: Path
) -> None:
    from cerebro_spark.backends import SparkBackend
    from cerebro_spark.spark_session import spark_session

    session = spark_session("local[2]", conf={"spark.ui.enabled": "false"}, preload_torch=True)
    job = WorkerJob(dataset.uri, open_store(str(tmp_path / "store")))
    with SparkBackend(2, spark=session, heartbeat_s=0.5, heartbeat_timeout_s=30.0) as backend:
        backend.start(job)
        worker = next(iter(backend.workers()))
        partition = min(backend.workers()[worker].partitions)
        backend.submit(worker, contract.train_task("t", partition)).result(TIMEOUT_S * 2)
        secret = backend._secret
        jobs = session.sparkContext._jsc.sc().statusStore().jobsList(None)
        texts = []
        for i in range(jobs.size()):
            data = jobs.apply(i)
            group = data.jobGroup()
            description = data.description()
            texts += [
                str(data.name()),
                str(group.get()) if group.isDefined() else "",
                str(description.get()) if description.isDefined() else "",
            ]
    ours = [t for t in texts if "cerebro" in t]
    assert ours, texts  # the workers' jobs are listed, under their own groups
    assert_absent(secret, "\n".join(texts), "a Spark job group, name or description")
    local = session.sparkContext.getLocalProperty("spark.job.description") or ""
    assert_absent(secret, local, "the driver's job description")


# -- an experiment: secrets out of events, a worker killed during a group unit -----------------


@pytest.fixture(scope="module", autouse=True)
def grouped_procedure() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(PROCEDURES, "grouped-grid", GroupedGrid)
        yield


def run_with_pool(
    store: Path, name: str, wrap: Callable[[WorkerPool], None] | None = None
) -> tuple[Any, list[dict[str, Any]], WorkerPool]:
    pool = WorkerPool(ThreadTransport(), 2, heartbeat_s=0.2, heartbeat_timeout_s=5.0)
    if wrap is not None:
        wrap(pool)
    result = run_experiment(
        config(store, trials=2), experiment_id=name, backend_factory=lambda c: pool
    )
    return result, read_events(open_store(str(store)).child(f"experiments/{name}")), pool


def test_no_secret_or_token_reaches_the_event_log(
    tmp_path: Path, script: fake_transport.Script
) -> None:
    result, events, pool = run_with_pool(tmp_path, "secrets")
    assert all(t.status == "completed" for t in result.trials)
    assert trained_once(events, trials=2)
    experiment = tmp_path / "experiments" / "secrets"
    text = "\n".join(p.read_text() for p in experiment.glob("*.json*"))
    assert_absent(pool._secret, text, "events.jsonl or config.json")
    tokens = {task.group.token for _, task in script.started if task.group is not None}
    assert tokens and all(tokens)
    for token in tokens:
        assert_absent(token, text, "events.jsonl or config.json")


def test_a_worker_killed_during_a_group_unit_fails_the_group_whole_and_loses_nothing(
    tmp_path: Path, script: fake_transport.Script
) -> None:
    """w1 dies as it starts rank 1 of the first group of epoch 2 (a crash mid-unit):
    WorkerLostError for its rank, the group fails whole and goes back to the queue, and
    the run finishes on the worker left with every unit trained exactly once."""
    killed: list[str] = []

    def wrap(pool: WorkerPool) -> None:
        submit_group = pool.submit_group

        def dying(assignments: Mapping[str, UnitTask]) -> dict[str, Future[UnitResult]]:
            by_rank = {t.group.rank: w for w, t in assignments.items() if t.group}
            if not killed and any(t.epoch == 1 for t in assignments.values()):
                killed.append(by_rank[1])
                script.killed.add(by_rank[1])  # the fake worker dies when its rank starts
            return submit_group(assignments)

        pool.submit_group = dying  # type: ignore[method-assign]

    result, events, _ = run_with_pool(tmp_path, "killed", wrap)
    assert len(killed) == 1
    lost = [e for e in events if e["event"] == "worker_lost"]
    assert [e["worker"] for e in lost] == killed
    failed = [e for e in events if e["event"] == "unit_failed"]
    assert failed and {e["reason"] for e in failed} == {"worker_lost"}
    assert len({e["group"] for e in failed}) == 1  # one group attempt, failed whole
    assert trained_once(events, trials=2)
    assert all(t.status == "completed" and t.epochs == 2 for t in result.trials)


def test_a_group_task_logged_before_tokens_still_loads_and_a_token_never_shows_in_repr() -> None:
    (rank0, _) = group_tasks(train_task(epoch_units=2), (0, 1), "g-old")
    old = rank0.to_json()
    del old["group"]["token"]  # as written before GroupSpec had a token
    loaded = UnitTask.from_json(old)
    assert loaded.group is not None and loaded.group.token == "" and loaded == rank0
    assert rank0.group is not None
    secret = dataclasses.replace(rank0.group, token="e" * 32)
    assert "e" * 32 not in repr(secret) and "e" * 32 not in repr(
        dataclasses.replace(rank0, group=secret)
    )
    with pytest.raises(ConfigError, match=r"GroupSpec\.token must be a str, got int"):
        dataclasses.replace(rank0.group, token=5)  # type: ignore[arg-type]
