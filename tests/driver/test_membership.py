"""Worker membership is a fact in the event log: joins, readiness, re-homing, retires and
losses are ``worker_*`` events, folded into ``ExperimentState.workers``; the stage boundary
is where a cluster manager may resize; a resumed run starts from the logged membership.

The engine runs on a real WorkerPool over the in-memory fake transport
(``tests/backends/fake_transport.py``): real control channel, real partition reads, units
that "train" by hashing. No torch, no Spark.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.backends import Backend, WorkerPool
from cerebro_spark.engine import (
    EventLog,
    ExperimentConfig,
    Stage,
    load_state,
    parse_config,
    read_events,
    resume_experiment,
    run_experiment,
)
from cerebro_spark.store import open_store
from tests.backends import fake_transport
from tests.backends.fake_transport import ThreadTransport


@pytest.fixture(autouse=True)
def script() -> Iterator[fake_transport.Script]:
    yield fake_transport.reset()
    fake_transport.reset()


def config(store: Path, *, workers: int = 2, epochs: int = 3) -> ExperimentConfig:
    return parse_config(
        {
            "name": "membership",
            "seed": 5,
            "store": str(store),
            "data": {"source": "sklearn:digits", "partitions": 4},
            "procedure": "grid",
            "epochs": epochs,
            "workers": workers,
            "model": "tests.engine.free_spec:FreeSpec",  # built once by the pre-flight
            "space": {"hidden": {"grid": [1, 2, 3]}},
        }
    )


def pool(cfg: ExperimentConfig) -> WorkerPool:
    return WorkerPool(ThreadTransport(), cfg.workers, heartbeat_s=0.5, heartbeat_timeout_s=10.0)


def events_of(store: Path, experiment: str) -> list[dict[str, Any]]:
    return read_events(open_store(str(store)).child(f"experiments/{experiment}"))


def membership(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["event"], e["worker"]) for e in events if e["event"].startswith("worker_")]


def trained_once(events: list[dict[str, Any]], trials: int, epochs: int) -> bool:
    keys = Counter(
        (e["trial"], e["epoch"], e["kind"], e["partition"])
        for e in events
        if e["event"] == "unit_end"
    )
    return len(keys) == trials * epochs * 2 * 4 and set(keys.values()) == {1}


def test_membership_is_logged_and_folded(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    result = run_experiment(cfg, experiment_id="plain", backend_factory=pool)
    events = events_of(tmp_path, "plain")
    joins = membership(events)[:4]  # the two workers start side by side
    assert sorted(joins) == [
        ("worker_joined", "w0"),
        ("worker_joined", "w1"),
        ("worker_ready", "w0"),
        ("worker_ready", "w1"),
    ]
    assert joins.index(("worker_joined", "w0")) < joins.index(("worker_ready", "w0"))
    ready = {e["worker"]: e for e in events if e["event"] == "worker_ready"}
    assert ready["w0"]["partitions"] == [0, 2] and ready["w1"]["partitions"] == [1, 3]
    assert all(e["bytes_read"] > 0 and e["host"] == "127.0.0.1" for e in ready.values())
    # The close at the end stops both workers normally.
    assert membership(events)[-2:] == [("worker_retired", "w0"), ("worker_retired", "w1")]
    _, state = load_state(str(tmp_path), "plain")
    assert {w: s.status for w, s in state.workers.items()} == {"w0": "retired", "w1": "retired"}
    assert state.ready_workers() == {}
    assert trained_once(events, trials=3, epochs=3)
    assert all(t.status == "completed" for t in result.trials)


def test_the_stage_boundary_retires_and_adds_workers_and_the_round_uses_them(
    tmp_path: Path,
) -> None:
    """Round 1 starts after w1 was retired (its partitions re-homed on w0), round 2 after
    a new worker joined: each round's units run on exactly the workers that existed."""
    stages: list[tuple[Stage, list[str]]] = []

    def on_stage(stage: Stage, backend: Backend) -> None:
        assert isinstance(backend, WorkerPool)
        if stage.final:
            return
        if stage.round == 0:
            backend.wait_started(30)  # the hook sees the ready workers; w1 may still load
        if stage.round == 1:
            backend.retire("w1").result(timeout=30)
        if stage.round == 2:
            backend.add_worker()
        stages.append((stage, sorted(backend.workers())))

    cfg = config(tmp_path)
    run_experiment(cfg, experiment_id="resized", backend_factory=pool, on_stage=on_stage)
    assert [(s.round, s.trials, workers) for s, workers in stages] == [
        (0, ("t0000", "t0001", "t0002"), ["w0", "w1"]),
        (1, ("t0000", "t0001", "t0002"), ["w0"]),
        (2, ("t0000", "t0001", "t0002"), ["w0", "w2"]),
    ]
    events = events_of(tmp_path, "resized")
    starts = {e["round"]: i for i, e in enumerate(events) if e["event"] == "round_start"}
    between = membership(events[starts[0] : starts[1]])
    assert between[-3:] == [
        ("worker_retiring", "w1"),
        ("worker_partitions", "w0"),
        ("worker_retired", "w1"),
    ]
    assert membership(events[starts[1] : starts[2]]) == [
        ("worker_joined", "w2"),
        ("worker_ready", "w2"),
    ]
    workers = {r: {e["worker"] for e in events if e["event"] == "unit_end" and e["round"] == r}
               for r in starts}  # fmt: skip
    assert workers == {0: {"w0", "w1"}, 1: {"w0"}, 2: {"w0", "w2"}}
    assert not any(e["event"] in ("unit_failed", "worker_lost") for e in events)
    assert trained_once(events, trials=3, epochs=3)


class _DriverKilled(BaseException):
    """Stands for SIGKILL: nothing in the engine catches it."""


def test_a_resumed_run_starts_from_the_logged_membership(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first session retires w1 at round 1 (w0 then holds every partition) and dies in
    round 2; the resumed session starts one worker -- not the config's two -- holding
    what w0 held, with a fresh id, after logging the dead session's workers as lost."""

    def on_stage(stage: Stage, backend: Backend) -> None:
        if stage.round == 1:
            backend.retire("w1").result(timeout=30)

    original = EventLog.append

    def append(self: EventLog, event: str, **fields: Any) -> dict[str, Any]:
        record = original(self, event, **fields)
        if event == "unit_end" and fields.get("round") == 2:
            raise _DriverKilled("killed in round 2")
        return record

    cfg = config(tmp_path)
    monkeypatch.setattr(EventLog, "append", append)
    with pytest.raises(_DriverKilled):
        run_experiment(cfg, experiment_id="crashed", backend_factory=pool, on_stage=on_stage)
    monkeypatch.setattr(EventLog, "append", original)
    _, state = load_state(str(tmp_path), "crashed")
    assert state.ready_workers() == {"w0": frozenset({0, 1, 2, 3})}

    started: list[WorkerPool] = []

    def factory(c: ExperimentConfig) -> WorkerPool:
        started.append(pool(c))
        return started[-1]

    result = resume_experiment(str(tmp_path), "crashed", backend_factory=factory)
    events = events_of(tmp_path, "crashed")
    resumed = max(i for i, e in enumerate(events) if e["event"] == "experiment_start")
    after = events[resumed:]
    assert membership(after)[:3] == [
        ("worker_lost", "w0"),
        ("worker_joined", "w2"),
        ("worker_ready", "w2"),
    ]
    lost = next(e for e in after if e["event"] == "worker_lost")
    assert lost["reason"] == "the driver session that ran it ended"
    ready = next(e for e in after if e["event"] == "worker_ready")
    assert ready["partitions"] == [0, 1, 2, 3]
    assert {e["worker"] for e in after if e["event"] == "unit_end"} == {"w2"}
    assert trained_once(events, trials=3, epochs=3)
    assert all(t.status == "completed" for t in result.trials)
    _, state = load_state(str(tmp_path), "crashed")
    assert {w: s.status for w, s in state.workers.items()} == {
        "w0": "lost",
        "w1": "retired",
        "w2": "retired",
    }
