"""A search that cannot produce a trial is refused or fails (issue 30, part 4).

A deadline shorter than start-up plus one unit is refused by the pre-flight, naming the
numbers; a search that ends with no completed trial raises ``SearchFailedError`` whatever
the procedure -- one that suggested no trial included. The engine runs on the real
WorkerPool over the in-memory fake transport (no Spark, no training).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cerebro_spark.backends import WorkerPool
from cerebro_spark.driver import preflight as run_preflight
from cerebro_spark.driver._preflight import check_deadline
from cerebro_spark.elastic import PlanInfeasible
from cerebro_spark.engine import (
    Experiment,
    load_state,
    parse_config,
    resume_experiment,
    run_experiment,
)
from cerebro_spark.errors import ConfigError, SearchFailedError
from cerebro_spark.search import GridSearch, TrialSpec
from cerebro_spark.search._registry import PROCEDURES
from cerebro_spark.store import open_store
from tests.backends import fake_transport
from tests.backends.fake_transport import FakeWorker, ThreadTransport

PRICES = "conf/prices/local.yaml"
PROFILE = {
    "partitions": 4,
    "unit_seconds": {"local-core": 2.0, "slow-core": 9.0},
    "validation_seconds": {"local-core": 0.5, "slow-core": 2.0},
    "hop_seconds": 0.25,
    "worker_start_seconds": 6.0,
    "scale_seconds": 3.0,
    "scaling": {1: 1.0},
    "partition_load_seconds": 0.5,
}


class SilentGrid(GridSearch):
    """A procedure that suggests no trial at all."""

    def suggest(self) -> list[TrialSpec]:
        return []

    def is_finished(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def silent_procedure() -> Iterator[None]:
    fake_transport.reset()
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(PROCEDURES, "silent-grid", SilentGrid)
        yield
    fake_transport.reset()


def pool() -> WorkerPool:
    return WorkerPool(ThreadTransport(FakeWorker), 2, heartbeat_s=0.2, heartbeat_timeout_s=5.0)


def raw(store: Path, **changes: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": "none",
        "seed": 3,
        "store": str(store),
        "data": {"source": "sklearn:iris", "partitions": 2},
        "procedure": "grid",
        "epochs": 2,
        "workers": 2,
        "model": "tests.engine.free_spec:FreeSpec",
        "space": {"lr": {"choice": [0.01, 0.1]}},
    }
    config.update(changes)
    return config


def test_a_procedure_that_suggests_no_trial_fails_the_search(tmp_path: Path) -> None:
    config = parse_config(raw(tmp_path, procedure="silent-grid"))
    with pytest.raises(SearchFailedError) as caught:
        run_experiment(config, experiment_id="silent", backend_factory=lambda c: pool())
    error = caught.value
    assert "search procedure 'silent-grid' of experiment silent suggested no trial" in str(error)
    assert error.experiment_id == "silent" and error.trials == [] and error.failures == []
    _, state = load_state(str(tmp_path), "silent")
    assert state.finished and not state.trials  # the log ends: resume is told the same
    with pytest.raises(SearchFailedError, match="suggested no trial"):
        resume_experiment(str(tmp_path), "silent", backend_factory=lambda c: pool())


@pytest.mark.parametrize(
    "procedure",
    [
        {"name": "hypersched", "num_workers": 2},
        {"name": "asha", "num_trials": 4},
        {"name": "seer", "worker_seconds": 30},
    ],
    ids=lambda p: p["name"],
)
def test_a_deadline_that_passed_before_the_first_round_fails_every_procedure(
    tmp_path: Path, procedure: dict[str, Any]
) -> None:
    deadline = 5.0
    config = parse_config(raw(tmp_path, procedure=procedure, deadline=deadline))
    store = open_store(str(tmp_path))
    checked = run_preflight(config, store)  # as at run, the deadline left to the run
    # The run was called more than the deadline ago: start-up took all of it.
    experiment = Experiment(
        checked.config,
        store,
        "late",
        lambda c: pool(),
        preflight=checked,
        started=time.monotonic() - deadline - 1.0,
    )
    with pytest.raises(SearchFailedError) as caught:
        experiment.run()
    message = str(caught.value)
    assert f"search procedure {procedure['name']!r} of experiment late suggested no trial" in (
        message
    )
    assert "its deadline of 5 s (from run, start-up included) had passed" in message
    end = [e for e in experiment.log.read() if e["event"] == "experiment_end"]
    assert len(end) == 1 and end[0]["best_trial"] is None
    assert not store.exists("experiments/late/best.pt")


def test_a_deadline_passed_during_the_preflight_is_refused_with_the_numbers(
    tmp_path: Path,
) -> None:
    config = parse_config(
        raw(tmp_path, procedure={"name": "hypersched", "num_workers": 2}, deadline=0.001)
    )
    with pytest.raises(ConfigError) as caught:
        run_experiment(config, experiment_id="hurry", backend_factory=lambda c: pool())
    message = str(caught.value)
    assert message.startswith("deadline 0.001 s has passed before any worker started: the ")
    assert "pre-flight (dataset resolved, every model family built on the driver) took" in message
    assert open_store(str(tmp_path)).list("experiments") == []  # refused: nothing written


def elastic_config(tmp_path: Path, deadline: float, **elastic: Any) -> Any:
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    section = {"manager": "standalone", "prices": PRICES, "profile": str(profile), **elastic}
    return parse_config(raw(tmp_path, deadline=deadline, elastic=section))


def test_a_deadline_shorter_than_the_profiles_start_up_and_one_unit_is_refused(
    tmp_path: Path,
) -> None:
    # 3 + 6 + 0.5 s to start a worker, 2 + 0.25 s for a unit on the fastest type
    config = elastic_config(tmp_path, deadline=12.0)
    with pytest.raises(ConfigError) as caught:
        check_deadline(config, elapsed=1.0)
    message = str(caught.value)
    assert message.startswith(
        "deadline 12 s is shorter than start-up plus one training unit: 1.0 s of pre-flight "
        "+ 9.5 s to start a worker (profile "
    )
    assert "scale_seconds 3 + worker_start_seconds 6 + one partition_load_seconds 0.5" in message
    assert "+ 2.2 s for one unit (unit_seconds 2 on local-core + hop_seconds 0.25)" in message
    assert "= 12.8 s" in message
    check_deadline(config, elapsed=0.2)  # 11.95 s fits in 12 s
    # The config's instance type is the one measured, not the fastest.
    slow = elastic_config(tmp_path, deadline=12.0, instance_type="slow-core")
    with pytest.raises(ConfigError, match=r"unit_seconds 9 on slow-core"):
        check_deadline(slow, elapsed=0.2)


def test_without_a_profile_only_a_passed_deadline_is_refused(tmp_path: Path) -> None:
    config = parse_config(raw(tmp_path, procedure={"name": "asha", "num_trials": 4}, deadline=2))
    check_deadline(config, elapsed=1.9)  # no estimate of start-up: not certainly impossible
    with pytest.raises(ConfigError, match=r"^deadline 2 s has passed before any worker started"):
        check_deadline(config, elapsed=2.0)
    auto = elastic_config(tmp_path, deadline=2.0, profile="auto", instance_type="local-core")
    check_deadline(auto, elapsed=1.0)  # the pilot measures after the pre-flight
    check_deadline(parse_config(raw(tmp_path)), elapsed=1e9)  # no deadline: nothing to keep


def test_an_elastic_run_no_plan_meets_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    """Issue 30: a refused elastic run left its experiment (``config.json``) behind."""
    config = elastic_config(tmp_path, deadline=600.0, budget=1e-9, instance_type="local-core")
    with pytest.raises(PlanInfeasible):
        run_experiment(config, experiment_id="poor")
    assert open_store(str(tmp_path)).list("experiments") == []
