"""A resumed elastic run goes on elastic: its cluster again, resized as its plan says.

No torch, no Spark: the WorkerPool over the in-memory fake transport and the fake cluster
of ``test_elastic_controller``, put in place of ``elastic_run`` as ``run`` and ``resume`` see it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.backends import WorkerPool
from cerebro_spark.engine import (
    ExperimentConfig,
    _api,
    load_state,
    parse_config,
    read_events,
    resume_experiment,
    run_experiment,
)
from cerebro_spark.store import open_store
from tests.backends import fake_transport
from tests.backends.fake_transport import ThreadTransport
from tests.engine.test_elastic_controller import PoolCluster, controller, sha_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def script() -> Iterator[fake_transport.Script]:
    yield fake_transport.reset()
    fake_transport.reset()


def elastic_sha_config(store: Path) -> ExperimentConfig:
    raw = sha_config(store).to_dict()
    raw["backend"] = "spark"  # what an elastic run resizes (these tests bring their own pools)
    raw["elastic"] = {
        "manager": "spark",
        "deadline": 600,
        "prices": str(ROOT / "conf/prices/local.yaml"),
        "instance_type": "local-core",
        "profile": str(ROOT / "conf/profiles/digits-local.yaml"),
    }
    return parse_config(raw)


class Interrupted(Exception):
    """The driver's death, at a stage boundary."""


def test_resume_of_an_elastic_run_resizes_as_its_plan_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = elastic_sha_config(tmp_path)
    entered: list[int] = []

    @contextlib.contextmanager
    def fake_elastic_run(config: ExperimentConfig, die_at: int | None = None) -> Iterator[Any]:
        entered.append(1)
        cluster = PoolCluster()
        hook = controller(cluster, config, [4, 2, 1])

        def factory(c: ExperimentConfig) -> WorkerPool:
            cluster.pool = WorkerPool(ThreadTransport(), 4, heartbeat_s=0.5, heartbeat_timeout_s=10)
            return cluster.pool

        def on_stage(stage: Any, backend: Any) -> Any:
            if die_at is not None and stage.round == die_at:
                raise Interrupted
            return hook(stage, backend)

        yield factory, on_stage

    # The first driver dies at the boundary of stage 1 (round 1), before it resizes.
    monkeypatch.setattr(_api, "elastic_run", lambda c, started: fake_elastic_run(c, die_at=1))
    with pytest.raises(Interrupted):
        run_experiment(cfg, experiment_id="e")
    monkeypatch.setattr(_api, "elastic_run", lambda c, started: fake_elastic_run(c))
    resume_experiment(str(tmp_path), "e")
    assert len(entered) == 2  # the resume went through the elastic layer
    events = read_events(open_store(str(tmp_path)).child("experiments/e"))
    resized = [e for e in events if e["event"] == "resized"]
    assert [(e["stage"], e["from"], e["target"]) for e in resized] == [(1, 4, 2), (2, 2, 1)]
    _, state = load_state(str(tmp_path), "e")
    assert state.finished and state.elastic_summary is not None
    assert [state.stage_actuals[i]["workers"] for i in (1, 2)] == [2, 1]
    # One clock: the resumed session's stage ends go on in experiment time (since run).
    assert state.stage_actuals[1]["end"] < state.stage_actuals[2]["end"]
    assert state.stage_actuals[2]["end"] <= state.experiment_seconds + 0.01
