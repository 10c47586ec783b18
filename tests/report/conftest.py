"""One real elastic run shared by the report's tests.

Successive halving of 4 trials (eta 2, 2 epochs) on the digits, trained by real torch
workers (LocalBackend processes), under an :class:`ElasticController` that follows a plan
of 2 workers then 1: the log holds unit starts and ends on two workers, worker joins, a
retirement, a resize, the plan's stages beside what they took and cost, an elastic
summary, decisions that continue, pause and stop trials, and one trial that fails in
training (``FailsInTrainingSpec``), so the report has every part to show.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.backends import Backend, LocalBackend
from cerebro_spark.cluster import Capabilities, ClusterManager, CostMeter, Executor
from cerebro_spark.elastic import parse_catalog
from cerebro_spark.engine import (
    ExperimentConfig,
    Stage,
    StageDirective,
    experiment_spec,
    parse_config,
    run_experiment,
)
from cerebro_spark.engine._elastic import ElasticController, StagePlan

PRICE = 36.0  # dollars per instance-hour: a cent a second


class PoolCluster(ClusterManager):
    """Executors are the backend's workers; growing starts workers, shrinking releases."""

    capabilities = Capabilities(resizable=True, choose_victims=True, min_executors=1)

    def __init__(self) -> None:
        self.pool: LocalBackend | None = None
        self.since: dict[str, float] = {}

    def executors(self) -> list[Executor]:
        """One per live worker, ready or still starting (its executor is already there)."""
        assert self.pool is not None
        now = time.time()
        with self.pool._lock:
            live = list(self.pool._handles)
        return [
            Executor(w, "127.0.0.1", 1, since=self.since.setdefault(w, now), instance=w)
            for w in live
        ]

    def resize(self, target: int, victims: Sequence[str] = ()) -> None:
        assert self.pool is not None
        self.check_resize(target, victims)
        for _ in range(target - len(self.executors())):
            threading.Thread(target=self.pool.add_worker, daemon=True).start()


def report_config(store: Path) -> ExperimentConfig:
    return parse_config(
        {
            "name": "report",
            "seed": 6,  # one of the 4 trials draws FailsInTrainingSpec
            "store": str(store),
            "data": {"source": "sklearn:digits", "partitions": 4},
            "procedure": {"name": "sha", "eta": 2, "num_trials": 4, "min_epochs": 1},
            "epochs": 2,
            "workers": 2,
            "backend": "local",
            "metric": "accuracy",
            "space": {
                "model": {
                    "choice": [
                        "cerebro_spark.training:MLPSpec",
                        "tests.engine.outcome_specs:FailsInTrainingSpec",
                    ]
                },
                "hidden_units": {"choice": [[16], [32]]},
                "lr": {"loguniform": [0.002, 0.02]},
                "batch_size": 64,
            },
        }
    )


@dataclasses.dataclass(frozen=True)
class RealRun:
    store: Path
    experiment_id: str
    config: ExperimentConfig
    live_pages: dict[int, str]
    """``report.html`` as it was when stage ``n`` was about to start (``n`` > 0; stage 2
    is the final one, after the last round)."""

    @property
    def directory(self) -> Path:
        return self.store / "experiments" / self.experiment_id


@pytest.fixture(scope="session")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> RealRun:
    store = tmp_path_factory.mktemp("report-store")
    config = report_config(store)
    cluster = PoolCluster()
    stages, end = [], 0.0
    for index, (stage, workers) in enumerate(
        zip(experiment_spec(config).stages, [2, 1], strict=True)
    ):
        stages.append(StagePlan(index, stage.trials, stage.epochs, workers, end, end + 8.0, 0.02))
        end += 8.0
    catalog = parse_catalog(
        {
            "billing": {
                "model": "per_instance",
                "granularity_seconds": 0.001,
                "minimum_seconds": 0,
            },
            "instances": {"box": {"usd_per_hour": PRICE}},
        }
    )
    hook = ElasticController(
        cluster,
        CostMeter(cluster, catalog, "box", interval_s=0.2),
        stages,
        deadline=600.0,
        budget=None,
        started_at=time.time(),
        lead_seconds=0.0,
        resize_timeout=120.0,
        replan_drift=1e9,
        replan=None,
    )

    def factory(c: ExperimentConfig) -> LocalBackend:
        cluster.pool = LocalBackend(c.workers)
        return cluster.pool

    live_pages: dict[int, str] = {}
    page = store / "experiments" / "e1" / "report.html"

    def watching(stage: Stage, backend: Backend) -> StageDirective:
        """The plan's hook; first, keep the report as it is. At the final stage, that is
        the page round 0's end asked for (rendered beside round 1, it may still be on its
        way; the last round's end asks for none, the final report follows)."""
        waited = time.monotonic() + (60.0 if stage.final else 0.0)
        while not page.exists() and time.monotonic() < waited:
            time.sleep(0.05)
        if stage.round > 0 and page.exists():
            live_pages.setdefault(stage.round, page.read_text())
        return hook(stage, backend)

    run_experiment(config, experiment_id="e1", backend_factory=factory, on_stage=watching)
    return RealRun(store, "e1", config, live_pages)


def events_of(run: RealRun) -> list[dict[str, Any]]:
    from cerebro_spark.engine import read_events
    from cerebro_spark.store import open_store

    return read_events(open_store(str(run.store)).child(f"experiments/{run.experiment_id}"))
