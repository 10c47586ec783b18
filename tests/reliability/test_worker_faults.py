"""Workers that die at awkward moments (issue 12, part 6).

A Spark worker's process killed while it loads its partitions (it registered, it is not
ready yet). Today the backend's start fails as a whole: the run ends with a
:class:`~cerebro_spark.errors.WorkerLostError` naming the worker and the partitions it
was loading (the CLI: one line, exit status 2), its log whole, and ``resume`` finishes
it. A backend that starts with the workers left instead is accepted too. Either way the
experiment ends with the results of an uninterrupted run.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from cerebro_spark.backends import SparkBackend
from cerebro_spark.engine import parse_config, resume_experiment, run_experiment
from cerebro_spark.errors import WorkerLostError
from tests.reliability.conftest import outcome, strict_events, tiny_config, unit_ends

pytestmark = [pytest.mark.spark, pytest.mark.torch, pytest.mark.slow]


def test_a_spark_worker_killed_while_it_loads_partitions(spark, tmp_path, tiny_reference):
    store = tmp_path / "store"
    reference = tiny_reference.outcome  # the uninterrupted run (local backend)

    backends: list[SparkBackend] = []
    killed: dict[str, int] = {}

    def factory(config):
        backend = SparkBackend(config.workers, spark=spark)
        backends.append(backend)
        return backend

    def kill_first_registered() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if backends:
                backend = backends[0]
                pids = backend.pids()
                loading = [w for w in pids if w not in backend.workers()]
                if loading:
                    worker = sorted(loading)[0]
                    os.kill(pids[worker], signal.SIGKILL)
                    killed[worker] = pids[worker]
                    return
            time.sleep(0.005)

    thread = threading.Thread(target=kill_first_registered, daemon=True)
    thread.start()
    try:
        run_experiment(
            parse_config(tiny_config(store, backend="spark")),
            experiment_id="killed-loading",
            backend_factory=factory,
        )
    except WorkerLostError as error:
        (worker,) = killed
        assert f"worker {worker} was lost" in str(error)
        assert "before it had loaded partitions" in str(error)
        _, state = strict_events(str(store), "killed-loading")
        assert not state.finished
        backends.clear()
        resume_experiment(str(store), "killed-loading", backend_factory=factory)
    thread.join()
    assert killed, "no worker was caught loading"
    events, state = strict_events(str(store), "killed-loading")
    assert state.finished and outcome(state) == reference
    ends = unit_ends(events)
    assert len(ends) == len(set(ends)) == 4 * 2 * 2 * 2
