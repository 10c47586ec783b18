"""A search on a Spark Connect server (issue 28): ``run_experiment`` with ``backend: spark``
and the server's ``sc://`` URL as the master runs its workers through Spark Connect (no
SparkContext), and ends with the weights the same search trains on local worker
processes, bit for bit."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.engine import parse_config, read_events, run_experiment
from cerebro_spark.store import open_store

pytestmark = [pytest.mark.spark, pytest.mark.torch]


@pytest.fixture(autouse=True)
def _connect_session_stopped() -> Iterator[None]:
    """The run's Connect session is stopped after the test: no later module finds it."""
    yield
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    session = ConnectSession.getActiveSession()
    if session is not None:
        session.stop()


def digests(store: Path, experiment_id: str) -> dict[str, str]:
    events = read_events(open_store(str(store)).child(f"experiments/{experiment_id}"))
    ends = [e for e in events if e["event"] == "unit_end" and e["kind"] == "train"]
    return {e["trial"]: e["checkpoint_sha256"] for e in ends}  # each trial's last


def config(store: Path, backend: str, master: str | None = None) -> Any:
    return parse_config(
        {
            "name": "connect",
            "seed": 4,
            "store": str(store),
            "data": {"source": "sklearn:iris", "partitions": 2},
            "epochs": 2,
            "workers": 2,
            "backend": backend,
            "spark": {"master": master} if master else {},
            "model": "cerebro_spark.training:MLPSpec",
            "space": {"hidden_units": [8], "lr": {"grid": [0.01, 0.05]}, "batch_size": 16},
        }
    )


def test_a_search_on_spark_connect_trains_what_local_workers_train(
    connect_server: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="cerebro_spark.backends._connect"):
        on_connect = run_experiment(
            config(tmp_path, "spark", connect_server.url), experiment_id="connect"
        )
    assert "starting 2 workers on a Spark Connect session (master local[4])" in caplog.text
    assert [t.status for t in on_connect.trials] == ["completed", "completed"]
    events = read_events(open_store(str(tmp_path)).child("experiments/connect"))
    ready = [e for e in events if e["event"] == "worker_ready"]
    assert sorted(e["worker"] for e in ready) == ["w0", "w1"]
    assert {e["executor_id"] for e in ready} == {"driver"}  # local[4]: the driver runs tasks
    run_experiment(config(tmp_path, "local"), experiment_id="local")
    assert digests(tmp_path, "connect") == digests(tmp_path, "local") != {}


def test_hypersched_trains_in_group_units_on_spark_connect(
    connect_server: Any, tmp_path: Path
) -> None:
    """HyperSched gives a live trial the idle workers (Alg. 3): on Connect, too, its group
    units rendezvous between two worker tasks and train one trial data-parallel."""
    raw = {
        "name": "hypersched",
        "seed": 4,
        "store": str(tmp_path),
        "data": {"source": "sklearn:digits", "partitions": 2},
        "procedure": {"name": "hypersched", "max_trials": 2, "eta": 2, "epoch_seconds": 1.0},
        "deadline": 600,
        "epochs": 4,
        "workers": 2,
        "backend": "spark",
        "spark": {"master": connect_server.url},
        "model": "cerebro_spark.training:MLPSpec",
        "space": {"hidden_units": [32], "lr": {"grid": [0.003, 0.01]}, "batch_size": 64},
    }
    result = run_experiment(parse_config(raw), experiment_id="groups")
    assert result.best is not None and result.best.metrics["accuracy"] > 0.7
    events = read_events(open_store(str(tmp_path)).child("experiments/groups"))
    grown = {t for e in events if e["event"] == "round_start"
             for t, k in e["resources"].items() if k == 2}  # fmt: skip
    assert grown, "HyperSched never gave a trial two workers"
    groups: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        if event["event"] == "unit_end" and "group" in event:
            groups.setdefault(event["group"], []).append(event)
    assert groups, "no group unit ran"
    for ranks in groups.values():
        assert len(ranks) == 2 and ranks[0]["worker"] != ranks[1]["worker"]
        assert ranks[0]["checkpoint_sha256"] == ranks[1]["checkpoint_sha256"] is not None
    assert not any(e["event"] == "unit_failed" for e in events)
