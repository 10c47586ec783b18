"""How the engine handles group units that fail (Cerebro §5.6 Q/Q' extended to §5.7).

The failures a real backend produces only by chance (a rendezvous that breaks while every
worker lives, an I/O error on one rank, a worker that dies between a sync and a submit, a
peer that reports long after its partner died) are scripted here on the real WorkerPool
over the in-memory fake transport (``tests/backends/fake_transport.py``): each worker is a
thread that computes each unit's "checkpoint" as a digest of its input checkpoint and the
partitions it covers, so the final digests show whether every trial trained on exactly the
right groups in the right order; a :data:`Script` says what a unit does. Real training
with group units on ``LocalBackend`` is in ``test_groups.py``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.backends import WorkerPool
from cerebro_spark.driver._rounds import MAX_GROUP_BREAKS
from cerebro_spark.engine import ExperimentConfig, parse_config, read_events, run_experiment
from cerebro_spark.errors import CerebroError, StoreError, TrialError
from cerebro_spark.search import GridSearch, SearchSpace
from cerebro_spark.search._registry import PROCEDURES
from cerebro_spark.store import open_store
from cerebro_spark.units import GroupBrokenError, UnitResult, UnitTask
from tests.backends import fake_transport
from tests.backends.fake_transport import Died, ThreadTransport


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a scripted unit does: fail with ``error`` after ``delay`` seconds, or its
    worker dies (leaves ``workers()``) when it starts."""

    error: BaseException | None = None
    delay: float = 0.0
    kill: bool = False


Script = Callable[[str, UnitTask], Outcome]


def hook(script: Script) -> fake_transport.Hook:
    """The fake workers' hook that plays ``script`` as each unit's pass starts."""

    def play(worker: str, task: UnitTask, stage: str) -> None:
        if stage != "pass":
            return
        outcome = script(worker, task)
        time.sleep(outcome.delay)
        if outcome.kill:
            raise Died(worker)
        if outcome.error is not None:
            raise outcome.error

    return play


@pytest.fixture(autouse=True)
def script() -> Iterator[fake_transport.Script]:
    yield fake_transport.reset()
    fake_transport.reset()


def pool() -> WorkerPool:
    """Two fake workers (partition ``i`` on ``w{i mod 2}``) on the real pool."""
    return WorkerPool(ThreadTransport(), 2, heartbeat_s=0.2, heartbeat_timeout_s=5.0)


class GroupedGrid(GridSearch):
    def __init__(self, space: SearchSpace, *, group_size: int = 2, **options: Any) -> None:
        super().__init__(space, **options)
        self.group_size = group_size

    def resources(self, trial_id: str) -> int:
        return self.group_size


@pytest.fixture(scope="module", autouse=True)
def grouped_procedure() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(PROCEDURES, "grouped-grid", GroupedGrid)
        yield


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("group-failures")


def config(
    store: Path, *, trials: int = 1, group_size: int = 2, workers: int = 2
) -> ExperimentConfig:
    return parse_config(
        {
            "name": "scripted",
            "seed": 3,
            "store": str(store),
            "data": {"source": "sklearn:digits", "partitions": 4},
            "procedure": {"name": "grouped-grid", "group_size": group_size},
            "epochs": 2,
            "workers": workers,
            "model": "tests.engine.free_spec:FreeSpec",  # built once by the pre-flight
            "space": {"hidden": {"grid": list(range(trials))}},
        }
    )


def run(
    store: Path,
    name: str,
    script: Script | None = None,
    backend: WorkerPool | None = None,
    **kwargs: Any,
) -> Any:
    """Run the experiment on ``backend`` (a fresh :func:`pool`), its units playing ``script``."""
    fake_transport.SCRIPT.hook = None if script is None else hook(script)
    backend = backend or pool()
    result = run_experiment(
        config(store, **kwargs), experiment_id=name, backend_factory=lambda c: backend
    )
    return result, read_events(open_store(str(store)).child(f"experiments/{name}"))


def digests(result: Any) -> dict[str, str | None]:
    return {t.trial_id: t.checkpoint_sha256 for t in result.trials}


def trained_once(events: list[dict[str, Any]], trials: int) -> bool:
    groups: Counter[str] = Counter()
    ends = []
    for e in events:
        if e["event"] == "unit_end" and e["kind"] == "train":
            if "group" in e:
                groups[e["group"]] += 1
                if groups[e["group"]] < len(e["group_partitions"]):
                    continue
                ends += [
                    x for x in events if x.get("group") == e["group"] and x["event"] == "unit_end"
                ]
            else:
                ends.append(e)
    keys = Counter((e["trial"], e["epoch"], e["partition"]) for e in ends)
    return len(keys) == trials * 2 * 4 and set(keys.values()) == {1}


@pytest.fixture(scope="module")
def clean(store: Path) -> Any:
    """Two trials, every train unit a group of 2, nothing fails."""
    return run(store, "clean", trials=2)


def test_a_clean_run_trains_in_groups(clean: Any) -> None:
    result, events = clean
    assert all(t.status == "completed" and t.epochs == 2 for t in result.trials)
    assert trained_once(events, trials=2)
    train = [e for e in events if e["event"] == "unit_end" and e["kind"] == "train"]
    assert all(len(e["group_partitions"]) == 2 for e in train)


def attempts(
    match: Callable[[UnitTask], bool], outcome: Callable[[int, UnitTask], Outcome]
) -> Script:
    """A script that applies ``outcome(n, task)`` to the n-th (0-based) rank-0 group task
    matching ``match`` and to its peers; every other task succeeds."""
    seen: dict[str, int] = {}
    lock = threading.Lock()  # the ranks start on their workers' threads

    def script(worker: str, task: UnitTask) -> Outcome:
        if task.group is None or not match(task):
            return Outcome()
        with lock:
            n = seen.setdefault(task.group.group_id, len(seen))
        return outcome(n, task)

    return script


def first_group(task: UnitTask) -> bool:
    return task.trial_id == "t0000" and task.epoch == 1 and task.step == 0


def test_a_group_that_breaks_with_every_worker_alive_is_retried_whole(
    clean: Any, store: Path
) -> None:
    def outcome(n: int, task: UnitTask) -> Outcome:
        if n < 2:  # the first two attempts break; every worker lives on
            return Outcome(GroupBrokenError(f"attempt {n}: rendezvous failed"))
        return Outcome()

    result, events = run(store, "broken", attempts(first_group, outcome), trials=2)
    failed = [e for e in events if e["event"] == "unit_failed"]
    assert [e["reason"] for e in failed] == ["group_broken"] * 4  # 2 attempts x 2 ranks
    assert len({e["group"] for e in failed}) == 2
    assert not any(e["event"] == "worker_lost" for e in events)
    assert trained_once(events, trials=2)
    assert digests(result) == digests(clean[0])  # the retried groups trained the same


def test_a_group_that_keeps_breaking_trains_alone_for_the_rest_of_the_round(
    clean: Any, store: Path
) -> None:
    def outcome(n: int, task: UnitTask) -> Outcome:
        return Outcome(GroupBrokenError(f"attempt {n}: rendezvous failed"))

    script = attempts(lambda t: t.trial_id == "t0000" and t.epoch == 1, outcome)
    result, events = run(store, "unbreakable", script, trials=2)
    failed = [e for e in events if e["event"] == "unit_failed"]
    assert len(failed) == 2 * MAX_GROUP_BREAKS
    ends = [e for e in events if e["event"] == "unit_end" and e["kind"] == "train"]
    alone = [e for e in ends if e["trial"] == "t0000" and e["epoch"] == 1]
    assert len(alone) == 4 and not any("group" in e for e in alone)
    assert trained_once(events, trials=2)
    assert result.trials[0].status == "completed"
    assert digests(result)["t0001"] == digests(clean[0])["t0001"]
    assert digests(result)["t0000"] != digests(clean[0])["t0000"]  # other groups, other weights


def test_a_trial_error_on_one_rank_fails_the_trial_only(store: Path) -> None:
    def outcome(n: int, task: UnitTask) -> Outcome:
        assert task.group is not None
        if task.group.rank == 1:
            return Outcome(TrialError("user code raised on rank 1"))
        return Outcome(TrialError("rank 1 of the group failed; see that worker's error"), 0.05)

    result, events = run(store, "trial-error", attempts(first_group, outcome), trials=2)
    status = {t.trial_id: t.status for t in result.trials}
    assert status == {"t0000": "failed", "t0001": "completed"}
    (failure,) = [e for e in events if e["event"] == "trial_failed"]
    assert failure["error"] in ("user code raised on rank 1", "rank 1 of the group failed; "
                                "see that worker's error")  # fmt: skip
    assert {e["reason"] for e in events if e["event"] == "unit_failed"} == {"trial_error"}


def test_io_errors_on_a_group_are_retried_then_give_up(store: Path) -> None:
    def flaky(n: int, task: UnitTask) -> Outcome:
        return Outcome(StoreError("s3 is down") if n == 0 else None)

    _, events = run(store, "io-once", attempts(first_group, flaky))
    assert [e["reason"] for e in events if e["event"] == "unit_failed"] == ["io_error"] * 2
    assert trained_once(events, trials=1)

    def down(n: int, task: UnitTask) -> Outcome:
        return Outcome(StoreError("s3 is down"))

    with pytest.raises(CerebroError, match="failed 4 times with I/O errors"):
        run(store, "io-always", attempts(first_group, down))


def test_a_peer_that_reports_after_its_partner_died_keeps_its_worker_busy(store: Path) -> None:
    """w1 dies as the group starts and reports at once; w0 reports the broken group 1.5 s
    later, after the engine has seen w1 missing from ``workers()`` (it syncs every 0.5 s).
    Until w0 reports, the group stays in Q' and w0 gets no other unit (the backend would
    refuse it); then only the worker missing from ``workers()`` is dropped, not w0."""

    def outcome(n: int, task: UnitTask) -> Outcome:
        assert task.group is not None
        if n > 0:
            return Outcome()
        if task.group.rank == 1:
            return Outcome(kill=True)
        return Outcome(GroupBrokenError("on worker w0: lost its peers"), delay=1.5)

    script = attempts(lambda t: t.epoch == 0 and t.step == 0, outcome)
    result, events = run(store, "late-peer", script, trials=2)
    assert [e["worker"] for e in events if e["event"] == "worker_lost"] == ["w1"]
    failed = {(e["worker"], e["reason"]) for e in events if e["event"] == "unit_failed"}
    assert failed == {("w0", "worker_lost"), ("w1", "worker_lost")}
    assert trained_once(events, trials=2)
    assert all(t.status == "completed" for t in result.trials)


def test_a_worker_that_dies_between_a_sync_and_a_submit_loses_nothing(store: Path) -> None:
    backend = pool()
    submit_group = backend.submit_group

    def dying(assignments: Mapping[str, UnitTask]) -> dict[str, Future[UnitResult]]:
        if "w1" in backend.workers() and any(t.epoch == 1 for t in assignments.values()):
            backend.kill_worker("w1")  # idle: it is gone when this returns
        return submit_group(assignments)

    backend.submit_group = dying  # type: ignore[method-assign]
    _, events = run(store, "vanished", backend=backend, trials=2)
    assert [e["worker"] for e in events if e["event"] == "worker_lost"] == ["w1"]
    assert not any(e["event"] == "unit_failed" for e in events)
    assert trained_once(events, trials=2)
    epoch_two = [e for e in events if e["event"] == "unit_end" and e["epoch"] == 1]
    assert {e["worker"] for e in epoch_two} == {"w0"}
    assert not any("group" in e for e in epoch_two)  # one worker left: no groups


def test_a_bad_resources_answer_is_refused(store: Path) -> None:
    with pytest.raises(CerebroError, match=r"asked for resources=0 for trial t0000"):
        run(store, "zero", group_size=0)
