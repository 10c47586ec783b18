"""The contract suite catches broken procedures (each check here can fail)."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pytest
from procedure_contract import ProcedureContract

from cerebro_spark.search import (
    Clock,
    Decision,
    EpochReport,
    RandomSearch,
    SearchProcedure,
    SearchSpace,
    TrialSpec,
)

SPACE = SearchSpace({"lr": {"loguniform": [1e-3, 1.0]}, "units": {"int": [1, 64]}})


class UsesGlobalRng(RandomSearch):
    def _params(self, index: int) -> dict[str, Any]:
        return {"lr": float(np.random.random())}


class ForgetsRng(RandomSearch):
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        del state["rng"]
        return state


class ForgetsProgress(RandomSearch):
    def load_state_dict(self, state: Any) -> None:
        state = dict(state)
        state["next_trial_number"] = 0
        super().load_state_dict(state)


class ReusesIds(RandomSearch):
    def suggest(self) -> list[TrialSpec]:
        return [TrialSpec("t0000", s.params) for s in super().suggest()]


class NeverFinishes(RandomSearch):
    def is_finished(self) -> bool:
        return False


class IgnoresMissingMetric(RandomSearch):
    def metric_value(self, report: EpochReport) -> float:
        return 0.0


class ReadsAbsoluteTime(RandomSearch):
    def on_epoch_end(self, report: EpochReport) -> Decision:
        decision = super().on_epoch_end(report)
        if decision is Decision.CONTINUE and self.clock() > 1000:
            self._live.pop(report.trial_id)
            self._stopped.add(report.trial_id)
            return Decision.STOP
        return decision


class NonJsonState(RandomSearch):
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "stopped": set(self._stopped)}


class ReturnsStrings(RandomSearch):
    def on_epoch_end(self, report: EpochReport) -> Decision:
        return super().on_epoch_end(report).value  # type: ignore[return-value]


class FinishedButSuggests(RandomSearch):
    def suggest(self) -> list[TrialSpec]:
        if self.is_finished():
            return [self._new_trial({"lr": 0.5})]
        return super().suggest()


class ForgetsNewTrials(RandomSearch):
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["live"] = {t: e for t, e in state["live"].items() if e > 0}
        return state


class IgnoresFailures(RandomSearch):
    def on_trial_failed(self, trial_id: str) -> None:
        pass  # the failed trial keeps its place for ever


class ResumesStopped(RandomSearch):
    def resumed(self) -> list[str]:
        return sorted(self._stopped)[:1]  # the engine once trained a stopped trial again


class ResumesFailed(RandomSearch):
    def on_trial_failed(self, trial_id: str) -> None:
        super().on_trial_failed(trial_id)
        self.failed = trial_id

    def resumed(self) -> list[str]:
        failed = getattr(self, "failed", None)
        return [failed] if failed is not None else []  # the engine once ignored it


class AsksNoWorkers(RandomSearch):
    def resources(self, trial_id: str) -> int:
        return 0  # the simulator once clamped it to 1


class AsksHalfWorkers(RandomSearch):
    def resources(self, trial_id: str) -> int:
        return 1.5  # type: ignore[return-value]


def contract_for(cls: type[RandomSearch]) -> ProcedureContract:
    class Contract(ProcedureContract):
        max_rounds = 30

        def make(self, rng: np.random.Generator, clock: Clock) -> SearchProcedure:
            return cls(
                SPACE,
                num_trials=4,
                epochs=3,
                metric=self.metric,
                mode=self.mode,
                rng=rng,
                clock=clock,
                max_concurrent=2,
            )

    return Contract()


FAILURES = [
    (UsesGlobalRng, "test_no_global_random_state", "numpy's global random state"),
    (ForgetsRng, "test_resumed_mid_run_behaves_identically", "diverged after resuming"),
    (ForgetsProgress, "test_resumed_mid_run_behaves_identically", "returned known trial id"),
    (ForgetsProgress, "test_load_state_dict_round_trips", "does not give the state back"),
    (ReusesIds, "test_runs_to_completion", "returned known trial id 't0000'"),
    (NeverFinishes, "test_runs_to_completion", "stalled in round"),
    (IgnoresMissingMetric, "test_report_without_the_metric_is_a_config_error", "DID NOT RAISE"),
    (ReadsAbsoluteTime, "test_clock_origin_does_not_matter", "clock's origin"),
    (NonJsonState, "test_state_dict_is_json_at_every_round", "not JSON serializable"),
    (ReturnsStrings, "test_runs_to_completion", "returned 'continue', not a Decision"),
    (FinishedButSuggests, "test_runs_to_completion", "a finished procedure suggested trials"),
    (IgnoresFailures, "test_a_failed_trial_leaves_the_search_without_stalling_it", "stalled"),
    (ResumesStopped, "test_runs_to_completion", "resumed trial 't0000', which is stopped"),
    (
        ResumesFailed,
        "test_a_failed_trial_leaves_the_search_without_stalling_it",
        "resumed trial 't0001', which is failed; resumed\\(\\) names only paused trials",
    ),
    (AsksNoWorkers, "test_runs_to_completion", "asked for resources=0 for trial t0000"),
    (AsksHalfWorkers, "test_runs_to_completion", "asked for resources=1.5 for trial t0000"),
]


@pytest.mark.parametrize(
    ("cls", "test", "reason"), FAILURES, ids=[f"{c.__name__}-{t}" for c, t, _ in FAILURES]
)
def test_contract_catches(cls: type[RandomSearch], test: str, reason: str) -> None:
    with pytest.raises((AssertionError, TypeError, pytest.fail.Exception), match=reason):
        run_check(contract_for(cls), test)


def run_check(contract: ProcedureContract, test: str) -> None:
    method = getattr(contract, test)
    if "when" in inspect.signature(method).parameters:
        for when in ("between_rounds", "after_suggest"):
            method(when)
    elif "epoch" in inspect.signature(method).parameters:
        for epoch in (1, 2):
            method(epoch)
    else:
        method()


def test_contract_resumes_after_suggest_too() -> None:
    contract = contract_for(ForgetsNewTrials)
    contract.test_resumed_mid_run_behaves_identically("between_rounds")
    with pytest.raises(ValueError, match="which is unknown"):
        contract.test_resumed_mid_run_behaves_identically("after_suggest")


def test_unbroken_procedure_passes_every_check() -> None:
    contract = contract_for(RandomSearch)
    tests = [name for name in dir(contract) if name.startswith("test_")]
    assert {t for _, t, _ in FAILURES} <= set(tests)
    for name in tests:
        run_check(contract, name)
