"""The engine does not wait for every initial worker: ``Backend.start`` returns once one is
ready, the first units run on it, and the others join the round as they become ready (or
are lost, their partitions re-homed). A round that no ready worker can go on with waits
while workers are still starting, and fails with a clear error once none is.

The engine runs on a real WorkerPool over the in-memory fake transport
(``tests/backends/fake_transport.py``): real control channel, real partition reads, units
that "train" by hashing, a first load held by a gate. No torch, no Spark.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.backends import Backend, WorkerPool
from cerebro_spark.driver._experiment import Experiment
from cerebro_spark.driver._rounds import RoundRunner
from cerebro_spark.engine import (
    EventLog,
    ExperimentConfig,
    load_state,
    parse_config,
    read_events,
    resume_experiment,
    run_experiment,
)
from cerebro_spark.errors import CerebroError, DataError
from cerebro_spark.search import GridSearch
from cerebro_spark.search._registry import PROCEDURES
from cerebro_spark.store import open_store
from tests.backends import fake_transport
from tests.backends.fake_transport import ThreadTransport

TRIALS, EPOCHS, PARTITIONS = 3, 2, 4


@pytest.fixture(autouse=True)
def script() -> Iterator[fake_transport.Script]:
    yield fake_transport.reset()
    fake_transport.reset()


def config(store: Path) -> ExperimentConfig:
    return parse_config(
        {
            "name": "early",
            "seed": 5,
            "store": str(store),
            "data": {"source": "sklearn:digits", "partitions": PARTITIONS},
            "procedure": "grid",
            "epochs": EPOCHS,
            "workers": 2,
            "model": "tests.engine.free_spec:FreeSpec",
            "space": {"hidden": {"grid": [1, 2, 3]}},
        }
    )


def pool(cfg: ExperimentConfig) -> WorkerPool:
    return WorkerPool(ThreadTransport(), cfg.workers, heartbeat_s=0.5, heartbeat_timeout_s=10.0)


def events_of(store: Path, experiment: str) -> list[dict[str, Any]]:
    return read_events(open_store(str(store)).child(f"experiments/{experiment}"))


def index_of(events: list[dict[str, Any]], event: str, **fields: Any) -> int:
    return next(
        i
        for i, e in enumerate(events)
        if e["event"] == event and all(e.get(k) == v for k, v in fields.items())
    )


def assert_trained_once(events: list[dict[str, Any]]) -> None:
    keys = Counter(
        (e["trial"], e["epoch"], e["kind"], e["partition"])
        for e in events
        if e["event"] == "unit_end"
    )
    assert len(keys) == TRIALS * EPOCHS * 2 * PARTITIONS
    assert set(keys.values()) == {1}


def test_a_worker_ready_while_units_run_takes_a_unit_before_any_ends(
    tmp_path: Path, script: fake_transport.Script, monkeypatch: pytest.MonkeyPatch
) -> None:
    import cerebro_spark.driver._rounds as rounds

    # Nothing but a unit's end, or the look for workers still starting, wakes the driver.
    monkeypatch.setattr(rounds, "WAIT_SECONDS", 60.0)
    loading = script.load_gates["w1"] = script.gate("w1-load")
    units = script.gate("units")  # no unit ends before w1 took one
    cfg = config(tmp_path)
    cfg = parse_config({**cfg.to_dict(), "space": {"hidden": {"grid": [1, 2, 3]}, "gate": "units"}})
    outcome: list[Any] = []
    run = threading.Thread(
        target=lambda: outcome.append(
            run_experiment(cfg, experiment_id="joins", backend_factory=pool)
        )
    )
    run.start()
    try:
        deadline = time.monotonic() + 60
        while not script.ran("w0") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert script.ran("w0") and not script.ran("w1")
        loading.set()
        while not script.ran("w1") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert script.ran("w1"), "w1 took no unit while w0's ran"
        assert not units.is_set()
    finally:
        units.set()
        run.join(timeout=120)
    assert outcome and all(t.epochs == EPOCHS for t in outcome[0].trials)
    assert_trained_once(events_of(tmp_path, "joins"))


@pytest.fixture
def stalls(monkeypatch: pytest.MonkeyPatch, script: fake_transport.Script) -> list[int]:
    """Hold w1's first load until the round stalls on w0 alone (each stall is counted)."""
    gate = script.load_gates["w1"] = script.gate("w1-load")
    seen: list[int] = []
    original = RoundRunner._check_stalled

    def check(self: RoundRunner) -> None:
        seen.append(self.backend.starting())
        original(self)  # w1 is still loading: this must wait, not raise
        gate.set()

    monkeypatch.setattr(RoundRunner, "_check_stalled", check)
    return seen


def test_units_run_on_the_first_ready_worker_and_the_slow_one_joins_mid_round(
    tmp_path: Path, stalls: list[int]
) -> None:
    result = run_experiment(config(tmp_path), experiment_id="slow", backend_factory=pool)
    events = events_of(tmp_path, "slow")
    first_unit = index_of(events, "unit_start")
    assert events[first_unit]["worker"] == "w0"
    assert index_of(events, "worker_ready", worker="w0") < first_unit
    assert first_unit < index_of(events, "worker_ready", worker="w1")
    assert stalls and stalls[0] == 1  # the round ran out of work on w0 while w1 loaded
    ready = next(e for e in events if e["event"] == "worker_ready" and e["worker"] == "w1")
    assert ready["partitions"] == [1, 3] and ready["bytes_read"] > 0
    # w1 took units in the very round it joined, and every unit ran exactly once.
    assert any(e["event"] == "unit_end" and e["worker"] == "w1" and e["round"] == 0 for e in events)
    assert_trained_once(events)
    assert not any(e["event"] in ("unit_failed", "worker_lost") for e in events)
    assert all(t.status == "completed" for t in result.trials)


def test_an_initial_worker_failing_after_start_is_lost_and_the_run_finishes(
    tmp_path: Path, stalls: list[int], script: fake_transport.Script
) -> None:
    script.failing_loads.add("w1")
    result = run_experiment(config(tmp_path), experiment_id="lost", backend_factory=pool)
    events = events_of(tmp_path, "lost")
    lost = events[index_of(events, "worker_lost", worker="w1")]
    assert "w1 cannot read partitions [1, 3]" in lost["reason"] and lost["unit"] is None
    assert index_of(events, "unit_start") < index_of(events, "worker_lost", worker="w1")
    rehomed = index_of(events, "worker_partitions", worker="w0", partitions=[0, 1, 2, 3])
    assert rehomed > index_of(events, "worker_lost", worker="w1")
    assert {e["worker"] for e in events if e["event"] == "unit_end"} == {"w0"}
    assert_trained_once(events)
    assert all(t.status == "completed" for t in result.trials)


def test_when_no_initial_worker_can_load_the_run_fails_with_the_load_error(
    tmp_path: Path, script: fake_transport.Script
) -> None:
    script.failing_loads.update({"w0", "w1"})
    with pytest.raises(DataError, match=r"cannot read partitions"):
        run_experiment(config(tmp_path), experiment_id="none", backend_factory=pool)


def test_a_round_no_worker_can_finish_fails_once_none_is_starting(
    tmp_path: Path, script: fake_transport.Script
) -> None:
    """w1 fails to load and so does the re-home of its partitions on w0: with no worker
    starting, the stalled round names the partitions no worker holds."""
    script.failing_loads.add("w1")
    gate = script.load_gates["w1"] = script.gate("w1-load")

    def factory(cfg: ExperimentConfig) -> WorkerPool:
        backend = pool(cfg)
        original = backend._on_initial_load

        def on_initial_load(handle: Any, future: Any) -> None:
            original(handle, future)
            if handle.worker_id == "w0":  # w0 is ready: from now on its loads fail too
                script.failing_loads.add("w0")
                gate.set()

        backend._on_initial_load = on_initial_load  # type: ignore[method-assign]
        return backend

    with pytest.raises(CerebroError, match=r"partitions \[1, 3\] are held by no worker"):
        run_experiment(config(tmp_path), experiment_id="stuck", backend_factory=factory)
    events = events_of(tmp_path, "stuck")
    assert index_of(events, "worker_partitions", worker="w0", partitions=[0, 2]) > index_of(
        events, "worker_lost", worker="w1"
    )


class _GroupedGrid(GridSearch):
    """Grid search whose every trial trains on two workers at once (Cerebro §5.7)."""

    def resources(self, trial_id: str) -> int:
        return 2


def test_a_round_with_groups_starts_once_no_worker_is_starting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: fake_transport.Script
) -> None:
    """Groups are formed on the workers there are: a group round waits for w1 (which
    loads slowly), so its groups have two ranks, as when start waited for every worker."""
    monkeypatch.setitem(PROCEDURES, "grouped-grid", _GroupedGrid)
    gate = script.load_gates["w1"] = script.gate("w1-load")
    waits: list[int] = []
    original = Experiment._await_starting

    def await_starting(self: Experiment, backend: Backend) -> None:
        waits.append(backend.starting())
        threading.Timer(0.3, gate.set).start()
        original(self, backend)

    monkeypatch.setattr(Experiment, "_await_starting", await_starting)
    cfg = config(tmp_path).replace(procedure="grouped-grid", procedure_options={})
    run_experiment(cfg, experiment_id="groups", backend_factory=pool)
    events = events_of(tmp_path, "groups")
    assert waits[0] == 1
    assert index_of(events, "worker_ready", worker="w1") < index_of(events, "round_start")
    ranks = {
        len(e["group_partitions"])
        for e in events
        if e["event"] == "unit_end" and e["kind"] == "train" and e["round"] == 0
    }
    assert ranks == {2}


class _DriverKilled(BaseException):
    """Stands for SIGKILL: nothing in the engine catches it."""


def test_a_run_resumed_after_a_worker_that_never_became_ready_holds_every_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: fake_transport.Script
) -> None:
    """The first session dies while w1 (joined) still loads: the log has w1 joined, never
    ready. The resumed session logs both as lost and starts one worker from the logged
    placement (w0's partitions), completed so that it holds every partition."""
    script.load_gates["w1"] = script.gate("never")
    original = EventLog.append

    def append(self: EventLog, event: str, **fields: Any) -> dict[str, Any]:
        record = original(self, event, **fields)
        if event == "unit_end":
            raise _DriverKilled("killed at the first unit end")
        return record

    monkeypatch.setattr(EventLog, "append", append)
    with pytest.raises(_DriverKilled):
        run_experiment(config(tmp_path), experiment_id="crashed", backend_factory=pool)
    monkeypatch.setattr(EventLog, "append", original)
    _, state = load_state(str(tmp_path), "crashed")
    assert state.ready_workers() == {"w0": frozenset({0, 2})}
    assert state.workers["w1"].status in ("joined", "lost")  # lost if the close saw it

    result = resume_experiment(str(tmp_path), "crashed", backend_factory=pool)
    events = events_of(tmp_path, "crashed")
    resumed = max(i for i, e in enumerate(events) if e["event"] == "experiment_start")
    ready = [e for e in events[resumed:] if e["event"] == "worker_ready"]
    assert [(e["worker"], e["partitions"]) for e in ready] == [("w2", [0, 1, 2, 3])]
    assert_trained_once(events)
    assert all(t.status == "completed" for t in result.trials)
