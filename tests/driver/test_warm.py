"""Warm workers between searches of one process (issue 30, part 6): LocalBackend workers.

A search with ``warm_workers`` parks its started backend; the next search with the same
workers takes it (no backend built, no partition read) and ends with the weights a cold
run gives; a search on other data closes it and starts afresh; an idle one is closed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.backends import Backend
from cerebro_spark.engine import (
    ExperimentConfig,
    default_backend,
    parse_config,
    read_events,
    release_workers,
    run_experiment,
)
from cerebro_spark.errors import ConfigError
from cerebro_spark.store import open_store

pytestmark = pytest.mark.torch


class Counting:
    """The default backend factory, keeping every backend it built."""

    def __init__(self) -> None:
        self.built: list[Backend] = []

    def __call__(self, config: ExperimentConfig) -> Backend:
        backend = default_backend(config)
        self.built.append(backend)
        return backend


def config(store: Path, **changes: Any) -> ExperimentConfig:
    raw: dict[str, Any] = {
        "name": "warm",
        "seed": 2,
        "store": str(store),
        "data": {"source": "sklearn:iris", "partitions": 2},
        "epochs": 2,
        "workers": 2,
        "backend": "local",
        "model": "cerebro_spark.training:MLPSpec",
        "space": {"hidden_units": [8], "lr": {"grid": [0.01, 0.03]}, "batch_size": 16},
        "warm_workers": 60,
    }
    raw.update(changes)
    return parse_config(raw)


def events(store: Path, experiment_id: str) -> list[dict[str, Any]]:
    return read_events(open_store(str(store)).child(f"experiments/{experiment_id}"))


def digests(store: Path, experiment_id: str) -> dict[str, str]:
    return {
        e["trial"]: e["checkpoint_sha256"]
        for e in events(store, experiment_id)
        if e["event"] == "unit_end" and e["kind"] == "train"
    }


@pytest.fixture(autouse=True)
def nothing_parked() -> Iterator[None]:
    release_workers()
    yield
    release_workers()


def test_the_next_search_on_the_same_data_takes_the_warm_workers(tmp_path: Path) -> None:
    factory = Counting()
    run_experiment(config(tmp_path), experiment_id="first", backend_factory=factory)
    run_experiment(config(tmp_path), experiment_id="second", backend_factory=factory)
    assert len(factory.built) == 1
    second = events(tmp_path, "second")
    ready = [e for e in second if e["event"] == "worker_ready"]
    assert sorted(e["worker"] for e in ready) == ["w0", "w1"]
    assert sorted(p for e in ready for p in e["partitions"]) == [0, 1]
    assert all(e["bytes_read"] == 0 for e in ready)
    assert [e["bytes_read"] for e in second if e["event"] == "worker_bytes"] == [0, 0]
    first_read = [
        e["bytes_read"] for e in events(tmp_path, "first") if e["event"] == "worker_bytes"
    ]
    assert len(first_read) == 2 and all(n > 0 for n in first_read)
    # the weights are a cold run's
    run_experiment(config(tmp_path, warm_workers=0), experiment_id="cold")
    assert digests(tmp_path, "second") == digests(tmp_path, "cold") != {}
    # the cold run took nothing and parked nothing: the second search's workers wait
    backend = factory.built[0]
    assert len(backend.workers()) == 2
    assert release_workers() is True and backend.workers() == {}
    assert release_workers() is False


def test_a_search_on_other_data_closes_the_warm_workers(tmp_path: Path) -> None:
    factory = Counting()
    run_experiment(config(tmp_path), experiment_id="iris", backend_factory=factory)
    other = config(tmp_path, data={"source": "sklearn:iris", "partitions": 3}, workers=3)
    run_experiment(other, experiment_id="three", backend_factory=factory)
    assert len(factory.built) == 2
    assert factory.built[0].workers() == {}  # closed before the new ones started
    assert len(factory.built[1].workers()) == 3  # parked in turn


def test_idle_warm_workers_are_closed(tmp_path: Path) -> None:
    factory = Counting()
    run_experiment(config(tmp_path, warm_workers=0.5), experiment_id="a", backend_factory=factory)
    deadline = time.monotonic() + 30
    while factory.built[0].workers() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert factory.built[0].workers() == {}
    assert release_workers() is False


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        (-1, "must be a number of seconds >= 0"),
        (float("nan"), "must be a number of seconds >= 0"),
        (True, "must not be a boolean"),
    ],
)
def test_warm_workers_must_be_seconds(tmp_path: Path, value: Any, rule: str) -> None:
    with pytest.raises(ConfigError, match=rf"warm_workers {rule}.*, got {value!r}"):
        config(tmp_path, warm_workers=value)
