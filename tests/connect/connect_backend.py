"""SparkBackend on a Spark Connect session (issue 28, part 1): the backend contract, then
what Connect changes. The server is real (its own process on 127.0.0.1,
:mod:`tests.connect_server`); the session has no SparkContext, so every worker is started,
placed and cancelled through what Connect offers (:mod:`cerebro_spark.backends._connect`).
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

from cerebro_spark.backends import Backend, SparkBackend, WorkerJob
from cerebro_spark.backends._connect import ConnectTransport
from cerebro_spark.errors import ConfigError
from cerebro_spark.spark_session import is_connect_session
from cerebro_spark.store import open_store
from tests.backends.contract import (
    RESULT_TIMEOUT_S,
    BackendContract,
    Dataset,
    make_dataset,
    result,
    train_task,
    wait_until,
)

pytestmark = [pytest.mark.spark, pytest.mark.torch]


@pytest.fixture(scope="module", autouse=True)
def _session_for_the_contract(spark_connect: Any) -> None:
    TestConnectBackend.session = spark_connect


class TestConnectBackend(BackendContract):
    session: Any = None

    def make_backend(self, num_workers: int) -> Backend:
        return SparkBackend(num_workers, spark=self.session)

    def kill_worker(self, backend: Backend, worker_id: str) -> None:
        assert isinstance(backend, SparkBackend)
        os.kill(backend.pids()[worker_id], signal.SIGKILL)  # no goodbye
        wait_until(lambda: worker_id not in backend.workers(), f"the loss of {worker_id}")


# -- what Connect changes -----------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return make_dataset(tmp_path_factory.mktemp("connect-backend") / "dataset")


@pytest.fixture
def job(dataset: Dataset, tmp_path: Any) -> WorkerJob:
    return WorkerJob(dataset_uri=dataset.uri, store=open_store(str(tmp_path)), torch_threads=1)


def test_the_session_has_no_spark_context_and_gets_the_connect_transport(
    spark_connect: Any,
) -> None:
    assert is_connect_session(spark_connect)
    with pytest.raises(Exception, match="JVM_ATTRIBUTE_NOT_SUPPORTED"):
        spark_connect.sparkContext  # noqa: B018 - the attribute raises
    backend = SparkBackend(2, spark=spark_connect)
    assert isinstance(backend._transport, ConnectTransport)


def test_an_interrupted_worker_is_lost_and_the_other_serves_its_partitions(
    spark_connect: Any, job: WorkerJob
) -> None:
    with SparkBackend(2, spark=spark_connect) as backend:
        backend.start(job)
        backend.wait_started(RESULT_TIMEOUT_S)
        workers = backend.workers()
        assert {info.executor_id for info in workers.values()} == {"driver"}
        assert {info.host for info in workers.values()} == {"localhost"}
        backend._transport.kill("w1")  # spark.interruptTag: its task is cancelled
        wait_until(lambda: "w1" not in backend.workers(), "the loss of w1")
        assert sorted(backend.workers()["w0"].partitions) == [0, 1, 2, 3]
        for partition in range(4):
            assert result(backend.submit("w0", train_task("after", partition))).rows > 0
        lost = [c for c in backend.changes() if c.kind.value == "lost"]
        assert [c.worker.worker_id for c in lost] == ["w1"]


def test_starting_without_a_worker_count_is_refused(spark_connect: Any, job: WorkerJob) -> None:
    backend = SparkBackend(None, spark=spark_connect)
    try:
        with pytest.raises(ConfigError, match="a Spark Connect session does not say how many"):
            backend.start(job)
    finally:
        backend.close()


class FakeConf:
    def __init__(self, **settings: str) -> None:
        self.settings = {key.replace("_", "."): value for key, value in settings.items()}

    def get(self, key: str, default: Any = None) -> Any:
        return self.settings.get(key, default)


class FakeSession:
    def __init__(self, **settings: str) -> None:
        self.conf = FakeConf(**settings)


@pytest.mark.parametrize(
    ("master", "workers", "allowed"),
    [("local[2]", 3, False), ("local[2]", 2, True), ("local", 2, False), ("yarn", 64, True)],
)
def test_a_local_master_has_as_many_slots_as_it_says(
    master: str, workers: int, allowed: bool
) -> None:
    transport = ConnectTransport(FakeSession(spark_master=master))
    if allowed:
        assert transport.open(workers, 1.0) == workers
    else:
        with pytest.raises(ConfigError, match=f"num_workers={workers} exceeds the"):
            transport.open(workers, 1.0)


def test_spark_speculation_is_refused_on_connect_too() -> None:
    transport = ConnectTransport(FakeSession(spark_speculation="true", spark_master="local[2]"))
    with pytest.raises(ConfigError, match=r"spark\.speculation=true is not supported"):
        transport.open(2, 1.0)
