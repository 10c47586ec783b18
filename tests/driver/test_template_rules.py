"""The driver asks its procedure through the epoch template (``search/_template.py``).

The rules are the simulator's and the contract tests' (``tests/search/test_template.py``):
a procedure that resumes a trial that is not paused -- one that failed (the driver used to
ignore it with a warning) or one that completed (it used to train it again) -- or asks
for resources that are not an integer >= 1 ends the run with ``ProcedureContractError``,
the events before it written. Runs on fake workers (threads that hash instead of training).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.backends import WorkerPool
from cerebro_spark.engine import parse_config, read_events, resume_experiment, run_experiment
from cerebro_spark.errors import ProcedureContractError
from cerebro_spark.search import GridSearch
from cerebro_spark.search._registry import PROCEDURES
from cerebro_spark.store import open_store
from tests.backends import fake_transport
from tests.backends.fake_transport import ThreadTransport


class ResumesFailed(GridSearch):
    """Resumes the trial that failed (its unit's user code raised) in the next round."""

    failed: str | None = None

    def on_trial_failed(self, trial_id: str) -> None:
        super().on_trial_failed(trial_id)
        self.failed = trial_id

    def resumed(self) -> list[str]:
        return [self.failed] if self.failed is not None else []


class ResumesCompleted(GridSearch):
    """Resumes the first trial again once it trained its epochs (and the second started)."""

    def resumed(self) -> list[str]:
        return sorted(self._stopped)[:1]


class AsksForWorkers(GridSearch):
    def __init__(self, *args: Any, workers: Any = 1, **options: Any) -> None:
        super().__init__(*args, **options)
        self.workers = workers

    def resources(self, trial_id: str) -> Any:
        return self.workers


@pytest.fixture(scope="module", autouse=True)
def procedures() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(PROCEDURES, "resumes-failed", ResumesFailed)
        patch.setitem(PROCEDURES, "resumes-completed", ResumesCompleted)
        patch.setitem(PROCEDURES, "asks-for-workers", AsksForWorkers)
        yield


@pytest.fixture(autouse=True)
def script() -> Iterator[fake_transport.Script]:
    yield fake_transport.reset()
    fake_transport.reset()


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("template-rules")


def pool() -> WorkerPool:
    return WorkerPool(ThreadTransport(), 2, heartbeat_s=0.2, heartbeat_timeout_s=5.0)


def run(
    store: Path, name: str, procedure: dict[str, Any], space: dict[str, Any], **kwargs: Any
) -> None:
    config = parse_config(
        {
            "name": "rules",
            "seed": 3,
            "store": str(store),
            "data": {"source": "sklearn:digits", "partitions": 2},
            "procedure": procedure,
            "epochs": kwargs.pop("epochs", 2),
            "workers": 2,
            "model": "tests.engine.free_spec:FreeSpec",  # built once by the pre-flight
            "space": space,
        }
    )
    backend = pool()
    run_experiment(config, experiment_id=name, backend_factory=lambda c: backend, **kwargs)


def events(store: Path, name: str) -> list[dict[str, Any]]:
    return read_events(open_store(str(store)).child(f"experiments/{name}"))


def test_resuming_a_failed_trial_is_refused(store: Path) -> None:
    space = {"fail": {"grid": [{"w0": "trial", "w1": "trial"}, {}]}}  # t0000's code raises
    with pytest.raises(ProcedureContractError) as error:
        run(store, "failed", {"name": "resumes-failed"}, space)
    assert str(error.value) == (
        "search procedure 'resumes-failed' resumed trial 't0000', which is failed; "
        "resumed() names only paused trials"
    )
    log = events(store, "failed")  # written up to the refusal
    assert [e["trial"] for e in log if e["event"] == "trial_failed"] == ["t0000"]
    assert not [e for e in log if e["event"] == "trial_resumed"]
    assert [e["round"] for e in log if e["event"] == "round_end"] == [0]


def test_resuming_a_completed_trial_is_refused(store: Path) -> None:
    space = {"hidden": {"grid": [1, 2]}}
    with pytest.raises(ProcedureContractError) as error:
        run(store, "completed", {"name": "resumes-completed", "max_concurrent": 1}, space)
    assert str(error.value) == (
        "search procedure 'resumes-completed' resumed trial 't0000', which is completed; "
        "resumed() names only paused trials"
    )
    log = events(store, "completed")
    decisions = [(e["trial"], e["status"]) for e in log if e["event"] == "decision"]
    assert decisions == [("t0000", "running"), ("t0000", "completed")]
    assert not [e for e in log if e["event"] == "trial_resumed"]


@pytest.mark.parametrize("workers", [0, True, 2.0])
def test_resources_that_are_no_integer_of_at_least_one_are_refused(
    store: Path, workers: Any
) -> None:
    procedure = {"name": "asks-for-workers", "workers": workers}
    with pytest.raises(ProcedureContractError) as error:
        run(store, f"workers-{workers}", procedure, {"hidden": {"grid": [1]}})
    assert str(error.value) == (
        f"search procedure 'asks-for-workers' asked for resources={workers!r} for trial "
        "t0000; resources must be an integer >= 1 (workers)"
    )
    assert not [e for e in events(store, f"workers-{workers}") if e["event"] == "round_start"]


class Interrupted(Exception):
    """The driver dies at a stage boundary."""


def test_a_driver_that_died_between_a_rounds_opening_and_its_start_resumes(store: Path) -> None:
    """The log holds round 1's trial_resumed events but no round_start: the procedure,
    restored from round 0's end, resumes the same paused trials again -- paused as far as
    it knows, so the template lets it (the events are those of the run before the rule)."""
    procedure = {"name": "sha", "num_trials": 4, "eta": 2, "min_epochs": 1}
    space = {"hidden": {"grid": [1, 2, 3, 4]}}

    def die(stage: Any, backend: Any) -> None:
        if stage.round == 1:
            raise Interrupted

    with pytest.raises(Interrupted):
        run(store, "window", procedure, space, epochs=4, on_stage=die)
    first = events(store, "window")
    opened = [e["trial"] for e in first if e["event"] == "trial_resumed"]
    assert opened and first[-1]["event"] != "round_start"
    assert [e for e in first if e["event"] == "round_start"][-1]["round"] == 0
    backend = pool()
    resume_experiment(str(store), "window", backend_factory=lambda c: backend)
    log = events(store, "window")[len(first) :]
    assert [e["trial"] for e in log if e["event"] == "trial_resumed"][: len(opened)] == opened
    run(store, "straight", procedure, space, epochs=4)
    decisions = [
        (e["round"], e["trial"], e["decision"], e["status"])
        for e in events(store, "straight")
        if e["event"] == "decision"
    ]
    assert [
        (e["round"], e["trial"], e["decision"], e["status"])
        for e in events(store, "window")
        if e["event"] == "decision"
    ] == decisions
