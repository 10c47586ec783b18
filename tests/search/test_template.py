"""The epoch template's rules (``cerebro_spark/search/_template.py``), one question at a time.

A scripted procedure answers what each test tells it to; the template checks the answers.
The driver, the simulator and ``FakeLoop`` refuse the same answers through it (their own
tests: ``tests/driver/test_template_rules.py``, ``tests/simulate/test_run.py``,
``tests/search/test_procedure_contract_selftest.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cerebro_spark.errors import CerebroError, ProcedureContractError
from cerebro_spark.search import (
    Decision,
    EpochReport,
    EpochTemplate,
    RoundOpening,
    SearchProcedure,
    TrialSpec,
)


class Scripted(SearchProcedure):
    """Answers with whatever the test put in its fields; records the calls it gets."""

    def __init__(self) -> None:
        super().__init__("score", "max", np.random.default_rng(0))
        self.specs: Any = []
        self.resume: Any = []
        self.finished = False
        self.finished_after: bool | None = None  # is_finished() once suggest was called
        self.decision: Any = Decision.CONTINUE
        self.size: Any = 1
        self.calls: list[str] = []

    def suggest(self) -> Any:
        self.calls.append("suggest")
        return self.specs

    def resumed(self) -> Any:
        self.calls.append("resumed")
        return self.resume

    def resources(self, trial_id: str) -> Any:
        return self.size

    def on_epoch_end(self, report: EpochReport) -> Any:
        self.calls.append(f"on_epoch_end {report.trial_id}")
        return self.decision

    def is_finished(self) -> bool:
        self.calls.append("is_finished")
        if "suggest" in self.calls and self.finished_after is not None:
            return self.finished_after
        return self.finished


def template(proc: Scripted, epochs: int | None = 3) -> EpochTemplate:
    return EpochTemplate(proc, name="scripted", epochs=epochs)


def spec(trial_id: str, clone_from: str | None = None, **params: Any) -> TrialSpec:
    return TrialSpec(trial_id, params or {"x": 1.0}, clone_from)


STATUSES = {
    "t0": "running",
    "t1": "paused",
    "t2": "stopped",
    "t3": "completed",
    "t4": "failed",
    "t5": "paused",
}


def test_the_error_is_a_cerebro_error() -> None:
    assert issubclass(ProcedureContractError, CerebroError)


# -- resumed(): only paused trials -------------------------------------------------------


def test_paused_trials_are_resumed_in_the_procedures_order() -> None:
    proc = Scripted()
    proc.specs = [spec("t6")]
    proc.resume = ["t5", "t1"]
    opening = template(proc).open_round(STATUSES)
    assert opening == RoundOpening((spec("t6"),), ("t5", "t1"), live=4, stalled=False)
    assert proc.calls == ["is_finished", "suggest", "resumed"]


@pytest.mark.parametrize(
    ("trial", "why"),
    [
        ("t0", "which is running"),
        ("t2", "which is stopped"),
        ("t3", "which is completed"),
        ("t4", "which is failed"),
        ("t9", "which is unknown \\(never suggested\\)"),
        ("t6", "which is suggested in this round \\(it trains already\\)"),
    ],
)
def test_resuming_a_trial_that_is_not_paused_is_refused(trial: str, why: str) -> None:
    proc = Scripted()
    proc.specs = [spec("t6")]
    proc.resume = ["t1", trial]
    with pytest.raises(ProcedureContractError) as error:
        template(proc).open_round(STATUSES)
    assert str(error.value) == (
        f"search procedure 'scripted' resumed trial {trial!r}, "
        f"{why.replace(chr(92), '')}; resumed() names only paused trials"
    )


def test_resuming_a_paused_trial_twice_in_one_round_is_refused() -> None:
    proc = Scripted()
    proc.resume = ["t1", "t1"]
    with pytest.raises(ProcedureContractError, match="'t1', which is already resumed in this"):
        template(proc).open_round(STATUSES)


def test_resumed_must_be_a_list() -> None:
    proc = Scripted()
    proc.resume = ("t1",)
    with pytest.raises(ProcedureContractError, match="returned tuple from resumed"):
        template(proc).open_round(STATUSES)


# -- suggest(): fresh trials --------------------------------------------------------------


def test_new_trials_may_clone_known_trials_and_earlier_ones() -> None:
    proc = Scripted()
    proc.specs = [spec("t6", "t2"), spec("t7", "t6", lr=0.1, layers=[1, 2], name=None)]
    opening = template(proc).open_round(STATUSES)
    assert [s.trial_id for s in opening.added] == ["t6", "t7"]
    assert opening.live == 3


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        ((spec("t6"),), "returned tuple from suggest\\(\\); it must return a list"),
        ([{"trial_id": "t6"}], "returned \\{'trial_id': 't6'\\} from suggest\\(\\), not a"),
        ([spec("")], "suggested a trial with id ''; ids are non-empty strings"),
        ([spec("t1")], "suggest\\(\\) returned known trial id 't1'"),
        ([spec("t6"), spec("t6")], "suggest\\(\\) returned known trial id 't6'"),
        ([spec("t6", "t8")], "suggested trial t6 as a clone of unknown trial 't8'"),
        ([spec("t6", x=(1, 2))], "suggested trial t6 with params \\{'x': \\(1, 2\\)\\}, which"),
        ([spec("t6", x=float("nan"))], "suggested trial t6 with params \\{'x': nan\\}, which"),
        ([spec("t6", x={1, 2})], "suggested trial t6 with params \\{'x': \\{1, 2\\}\\}, which"),
        ([TrialSpec("t6", {1: 2.0})], "suggested trial t6 with params \\{1: 2.0\\}, which"),
    ],
)
def test_a_bad_suggestion_is_refused(specs: Any, message: str) -> None:
    proc = Scripted()
    proc.specs = specs
    with pytest.raises(ProcedureContractError, match=f"^search procedure 'scripted' {message}"):
        template(proc).open_round(STATUSES)
    assert "resumed" not in proc.calls  # refused before the procedure is asked on


# -- a finished procedure, a stall --------------------------------------------------------


def test_a_finished_procedure_that_suggests_is_refused() -> None:
    proc = Scripted()
    proc.finished, proc.specs = True, [spec("t6")]
    with pytest.raises(ProcedureContractError, match=r"suggested \['t6'\] after is_finished"):
        template(proc).open_round(STATUSES)


def test_a_finished_procedure_that_resumes_is_refused() -> None:
    proc = Scripted()
    proc.finished, proc.resume = True, ["t1"]
    with pytest.raises(ProcedureContractError, match=r"resumed \['t1'\] after is_finished"):
        template(proc).open_round(STATUSES)


def test_a_procedure_that_finishes_while_it_suggests_may_still_start_what_it_suggested() -> None:
    proc = Scripted()
    proc.finished_after, proc.specs = True, [spec("t6")]
    assert template(proc).open_round({}).live == 1  # finished *when the round opened* counts


def test_nothing_to_train_while_not_finished_is_a_stall() -> None:
    proc = Scripted()
    opening = template(proc).open_round({"t1": "paused", "t4": "failed"})
    assert opening == RoundOpening((), (), live=0, stalled=True)
    assert proc.calls == ["is_finished", "suggest", "resumed", "is_finished"]
    proc.finished_after = True
    assert not template(proc).open_round({"t1": "paused"}).stalled


def test_a_running_trial_is_no_stall() -> None:
    proc = Scripted()
    opening = template(proc).open_round({"t0": "running"})
    assert (opening.live, opening.stalled) == (1, False)
    assert proc.calls == ["is_finished", "suggest", "resumed"]  # no second question


# -- resources(): an integer >= 1 ---------------------------------------------------------


@pytest.mark.parametrize("size", [1, 4, np.int64(2), np.uint8(3)])
def test_resources_are_integers_of_at_least_one(size: Any) -> None:
    proc = Scripted()
    proc.size = size
    got = template(proc).resources("t0")
    assert got == size and type(got) is int


@pytest.mark.parametrize(
    ("size", "shown"),
    [
        (0, "0"),
        (-2, "-2"),
        (True, "True"),
        (2.0, "2.0"),
        ("2", "'2'"),
        (None, "None"),
        (np.int64(0), "np.int64(0)"),
        (np.bool_(True), "np.True_"),
    ],
)
def test_resources_anything_else_is_refused_never_clamped(size: Any, shown: str) -> None:
    proc = Scripted()
    proc.size = size
    with pytest.raises(ProcedureContractError) as error:
        template(proc).resources("t0007")
    assert str(error.value) == (
        f"search procedure 'scripted' asked for resources={shown} for trial t0007; "
        "resources must be an integer >= 1 (workers)"
    )


# -- on_epoch_end(): a Decision, and the next status --------------------------------------


@pytest.mark.parametrize(
    ("decision", "epoch", "status"),
    [
        (Decision.CONTINUE, 1, "running"),
        (Decision.CONTINUE, 3, "running"),
        (Decision.PAUSE, 1, "paused"),
        (Decision.STOP, 2, "stopped"),
        (Decision.STOP, 3, "completed"),
        (Decision.STOP, 4, "completed"),
    ],
)
def test_a_decision_gives_the_next_status(decision: Decision, epoch: int, status: str) -> None:
    proc = Scripted()
    proc.decision = decision
    report = EpochReport("t0", epoch, {"score": 0.5})
    assert template(proc, epochs=3).close_epoch(report) == (decision, status)
    assert proc.calls == ["on_epoch_end t0"]


def test_without_an_epoch_budget_every_stop_is_stopped() -> None:
    proc = Scripted()
    proc.decision = Decision.STOP
    assert template(proc, epochs=None).close_epoch(EpochReport("t0", 99, {})) == (
        Decision.STOP,
        "stopped",
    )


@pytest.mark.parametrize("decision", ["continue", None, 1])
def test_a_decision_that_is_not_a_decision_is_refused(decision: Any) -> None:
    proc = Scripted()
    proc.decision = decision
    with pytest.raises(ProcedureContractError) as error:
        template(proc).close_epoch(EpochReport("t0002", 2, {"score": 0.5}))
    assert str(error.value) == (
        "search procedure 'scripted' on_epoch_end (trial t0002, epoch 2) returned "
        f"{decision!r}, not a Decision"
    )


def test_the_procedure_is_named_by_its_class_without_a_name() -> None:
    proc = Scripted()
    proc.size = 0
    with pytest.raises(ProcedureContractError, match=r"^search procedure 'Scripted' asked for"):
        EpochTemplate(proc).resources("t0")
