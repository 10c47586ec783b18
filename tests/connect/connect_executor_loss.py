"""An executor killed mid-unit on a Spark Connect session (issue 28, part 5).

The server runs ``local-cluster[2,1,1024]`` (``connect_cluster_server``): two executor
JVMs of one task slot each, so the two workers run on different executors, and each says
which when it registers (its Python runs in its session's directory inside the executor's
work directory, :func:`cerebro_spark.backends._serve.executor_hint`).

* A search: once a unit has ended, the executor of a worker that is training a unit is
  killed from the OS (``SIGKILL`` of its ``CoarseGrainedExecutorBackend``, as a crashed
  node ends). Its Python worker dies with it (PySpark's daemon sees its executor's pipe
  close and ends its workers); the pool sees the worker's control connection close, loses
  it, re-homes its partition on the other worker and interrupts its Connect operation,
  whose task Spark had resubmitted and which no slot had taken yet (the standalone master
  starts a replacement executor meanwhile). The run ends with every trial's final
  checkpoint and the leaderboard of an uninterrupted run of the same search on the same
  server, and nothing of the lost worker runs on.
* The same loss with no interrupt (one that came too late): Spark runs the retry on the
  replacement executor, it registers as the lost worker, the pool refuses it and the
  retried task ends at once.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.backends import Backend, SparkBackend, WorkerJob
from cerebro_spark.backends._connect import ConnectTransport
from cerebro_spark.backends._serve import REFUSED
from cerebro_spark.cluster._daemons import alive
from cerebro_spark.engine import ExperimentResult, parse_config, read_events, run_experiment
from cerebro_spark.engine._backend import default_backend
from cerebro_spark.store import open_store
from cerebro_spark.training import MLPSpec
from tests.backends.contract import RESULT_TIMEOUT_S, make_dataset, result, train_task, wait_until

pytestmark = [pytest.mark.spark, pytest.mark.torch]

logger = logging.getLogger(__name__)

KILL_TIMEOUT_S = 120.0


class SlowMLP(MLPSpec):
    """An MLP whose every batch takes 0.1 s more: a unit lasts long enough to be cut."""

    def transform(self, features: Any, labels: Any) -> tuple[Any, Any]:
        """Sleep, then pass the batch on unchanged."""
        time.sleep(0.1)
        return features, labels


def _stop_connect_sessions() -> None:
    """Stop the active and the default Spark Connect session, if any."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    for session in (ConnectSession.getActiveSession(), ConnectSession._get_default_session()):
        if session is not None:
            session.stop()


@pytest.fixture(autouse=True)
def _no_connect_session_left() -> Iterator[None]:
    """No other module's Connect session is picked up (``getOrCreate`` returns the active
    or default one, whatever its server), and the test's are stopped after it."""
    _stop_connect_sessions()
    yield
    _stop_connect_sessions()


def config(store: Path, master: str) -> Any:
    """Two trials, two epochs, two partitions, two workers; 8 batches of 0.1 s a unit."""
    return parse_config(
        {
            "name": "executor-loss",
            "seed": 4,
            "store": str(store),
            "data": {"source": "sklearn:iris", "partitions": 2},
            "epochs": 2,
            "workers": 2,
            "backend": "spark",
            "spark": {"master": master},
            "model": "tests.connect.connect_executor_loss:SlowMLP",  # as the workers import it
            "space": {"hidden_units": [8], "lr": {"grid": [0.01, 0.05]}, "batch_size": 8},
        }
    )


def final_digests(result: ExperimentResult) -> dict[str, str | None]:
    return {t.trial_id: t.checkpoint_sha256 for t in result.trials}


def leaderboard(result: ExperimentResult) -> bytes:
    return result.store.get(f"experiments/{result.experiment_id}/leaderboard.csv")


def logged_events(store: Path, experiment_id: str) -> list[dict[str, Any]]:
    """The complete lines of an experiment's events.jsonl so far (it is being written)."""
    path = store / "experiments" / experiment_id / "events.jsonl"
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.strip()[-1:] == "}"]


class ExecutorKiller:
    """Kills, from the OS, the executor of a worker in the middle of a train unit.

    Args:
        server: The ``local-cluster`` Connect server.
        store: The experiment's store.
        experiment_id: The experiment watched (its events.jsonl).
        backends: Where the run's backend is put once built.
    """

    def __init__(
        self, server: Any, store: Path, experiment_id: str, backends: list[SparkBackend]
    ) -> None:
        self.server = server
        self.store = store
        self.experiment_id = experiment_id
        self.backends = backends
        self.killed: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._watch, name="executor-killer", daemon=True)

    def _victim(self) -> tuple[str, str] | None:
        """A worker that runs a train unit now and its executor, once a unit has ended."""
        events = logged_events(self.store, self.experiment_id)
        executors = {e["worker"]: e["executor_id"] for e in events if e["event"] == "worker_joined"}
        ended = {
            (e["trial"], e["epoch"], e["kind"], e["partition"])
            for e in events
            if e["event"] == "unit_end"
        }
        if not ended:
            return None
        for event in events:
            if event["event"] != "unit_start" or event["kind"] != "train":
                continue
            unit = (event["trial"], event["epoch"], event["kind"], event["partition"])
            executor = executors.get(event["worker"])
            if unit not in ended and executor is not None:
                return event["worker"], executor
        return None

    def _watch(self) -> None:
        deadline = time.monotonic() + KILL_TIMEOUT_S
        while time.monotonic() < deadline and not self.killed:
            victim = self._victim() if self.backends else None
            if victim is not None:
                worker, executor = victim
                jvm = self.server.executor_pids()[executor]
                python = self.backends[0].pids()[worker]
                os.kill(jvm, signal.SIGKILL)
                self.killed.update(worker=worker, executor=executor, jvm=jvm, python=python)
                logger.info("killed executor %s (pid %d) of worker %s", executor, jvm, worker)
                return
            time.sleep(0.05)


def test_an_executor_killed_mid_unit_loses_no_unit(
    connect_cluster_server: Any, tmp_path: Path
) -> None:
    """A worker's executor JVM killed while it trains a unit: the run loses no unit and
    leaves nothing of the lost worker running (the module docstring)."""
    server = connect_cluster_server
    reference = run_experiment(config(tmp_path, server.url), experiment_id="reference")
    assert [t.status for t in reference.trials] == ["completed", "completed"]
    executors = {
        e["worker"]: e["executor_id"]
        for e in read_events(open_store(str(tmp_path)).child("experiments/reference"))
        if e["event"] == "worker_joined"
    }
    assert sorted(executors) == ["w0", "w1"] and sorted(executors.values()) == ["0", "1"]

    backends: list[SparkBackend] = []

    def factory(cfg: Any) -> Backend:
        backend = default_backend(cfg)
        assert isinstance(backend, SparkBackend)
        backends.append(backend)
        return backend

    killer = ExecutorKiller(server, tmp_path, "killed", backends)
    killer.thread.start()
    result = run_experiment(
        config(tmp_path, server.url), experiment_id="killed", backend_factory=factory
    )
    killer.thread.join(timeout=5)
    assert killer.killed, "no worker was caught in the middle of a unit"
    lost_worker, lost_executor = killer.killed["worker"], killer.killed["executor"]

    events = read_events(open_store(str(tmp_path)).child("experiments/killed"))
    lost = [e for e in events if e["event"] == "worker_lost"]
    assert [e["worker"] for e in lost] == [lost_worker], lost
    assert lost[0]["unit"] is not None, lost  # it was killed mid-unit
    # the unit it trained failed with it; so did the one before, when the worker was still
    # writing that one's checkpoint (freed early, it had taken the next unit)
    failed = [e for e in events if e["event"] == "unit_failed"]
    assert 1 <= len(failed) <= 2, failed
    assert all(e["reason"] == "worker_lost" and e["worker"] == lost_worker for e in failed)
    # no unit lost: the same final models and leaderboard as the uninterrupted run
    assert [t.status for t in result.trials] == ["completed", "completed"]
    assert final_digests(result) == final_digests(reference)
    assert leaderboard(result) == leaderboard(reference)

    # nothing of the lost worker runs on: no second registration (a retried task attempt
    # would be refused), its Connect operation ended, its Python process is gone
    joined = [e["worker"] for e in events if e["event"] == "worker_joined"]
    assert sorted(joined) == ["w0", "w1"]
    backend = backends[0]
    stats = backend.stats()
    assert stats.registered == 2 and sum(stats.lost.values()) == 1, stats
    assert isinstance(backend._transport, ConnectTransport)
    operations = backend._transport._done
    assert sorted(operations) == ["w0", "w1"] and all(f.done() for f in operations.values())
    assert not alive(killer.killed["python"])
    assert lost_executor not in server.executor_pids()
    logger.info(
        "worker %s lost with executor %s (%s); refused registrations %d; operation: %r",
        lost_worker,
        lost_executor,
        lost[0]["reason"],
        stats.refused,
        operations[lost_worker].exception(),
    )


def test_a_retried_task_of_a_lost_worker_is_refused_and_ends(
    connect_cluster_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark retries a dead executor's task elsewhere: when the pool's interrupt of the
    lost worker's operation comes too late to cancel it (here: never), the retry, on the
    replacement executor, registers as the lost worker; the pool refuses it, the task
    ends at once and its operation succeeds, and the pool goes on without it."""
    server = connect_cluster_server
    dataset = make_dataset(tmp_path / "dataset")
    job = WorkerJob(dataset.uri, open_store(str(tmp_path / "store")), torch_threads=1)
    with SparkBackend(2, spark=server.session()) as backend:
        transport = backend._transport
        assert isinstance(transport, ConnectTransport)
        monkeypatch.setattr(transport, "kill", lambda worker_id: None)  # no interrupt
        backend.start(job)
        backend.wait_started(RESULT_TIMEOUT_S)
        executor = backend.workers()["w1"].executor_id
        assert executor is not None and executor != backend.workers()["w0"].executor_id
        os.kill(server.executor_pids()[executor], signal.SIGKILL)
        wait_until(lambda: "w1" not in backend.workers(), "the loss of w1")
        assert transport._done["w1"].result(timeout=RESULT_TIMEOUT_S) == REFUSED
        stats = backend.stats()
        assert (stats.registered, stats.refused, sum(stats.lost.values())) == (2, 1, 1), stats
        assert sorted(backend.workers()) == ["w0"]
        assert sorted(backend.workers()["w0"].partitions) == [0, 1, 2, 3]
        assert result(backend.submit("w0", train_task("after", 1))).rows > 0
        monkeypatch.undo()  # the close may interrupt again
