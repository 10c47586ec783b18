"""The contract every search procedure passes (rules in ``cerebro_spark/search/_base.py``).

Use it from a test module in this folder::

    from procedure_contract import ProcedureContract

    class TestMyProcedureContract(ProcedureContract):
        def make(self, rng, clock):
            return MyProcedure(space, epochs=3, metric=self.metric, mode=self.mode,
                               rng=rng, clock=clock)

``make`` must build the procedure from its two arguments alone (same arguments, same
procedure). The suite drives it with :class:`FakeLoop`, a synchronous stand-in for the
engine: each round it asks ``suggest()`` and ``resumed()``, then each live trial's
``resources()`` (:meth:`FakeLoop.open_round`), then trains every live trial one epoch and
asks for its decision (:meth:`FakeLoop.close_round`). The injected clock advances
``epoch_seconds`` per trial-epoch; metrics are a seeded function of the trial's params and
epoch. The loop asks through the epoch template the driver and the simulator use
(:class:`~cerebro_spark.search.EpochTemplate`), whose per-call rules (fresh unique ids, JSON
params, known ``clone_from``, ``resumed()`` names only paused trials, ``resources()`` an
integer >= 1, decisions are :class:`~cerebro_spark.search.Decision` members, a finished
procedure adds and resumes nothing) it reports as :class:`ContractViolation`; a stall is a
violation too. It records a trace; the tests compare traces.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from cerebro_spark.errors import ConfigError, ProcedureContractError
from cerebro_spark.search import Clock, EpochReport, EpochTemplate, SearchProcedure


class ContractViolation(AssertionError):
    """The procedure broke a rule of the search-procedure contract."""


@contextlib.contextmanager
def _violations() -> Iterator[None]:
    """Report the epoch template's refusal of a procedure's answer as a contract violation."""
    try:
        yield
    except ProcedureContractError as error:
        raise ContractViolation(str(error)) from error


@dataclasses.dataclass
class FakeClock:
    """A monotonic clock the loop advances by hand."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now


def fake_metrics(params: Any, epoch: int, seed: int, metric: str) -> dict[str, float]:
    """Validation metrics of a trial after ``epoch`` epochs: a seeded function of both.

    Each config has a quality in [0, 1) that its score approaches as epochs go by, plus a
    little noise, so procedures that compare trials see distinct, reproducible values.
    """
    digest = hashlib.sha256(json.dumps(params, sort_keys=True).encode()).digest()
    key = int.from_bytes(digest[:8], "little")
    quality = float(np.random.default_rng([seed, key]).random())
    noise = float(np.random.default_rng([seed, key, epoch]).normal(scale=0.01))
    score = quality * (1.0 - 0.5**epoch) + noise
    metrics = {"score": score, "loss": 1.0 - score, "accuracy": score}
    metrics.setdefault(metric, score)
    return metrics


class FakeLoop:
    """A synchronous engine: rounds of suggest, resume, one epoch per live trial, decide."""

    def __init__(
        self,
        procedure: SearchProcedure,
        clock: FakeClock,
        *,
        seed: int,
        metric: str,
        epoch_seconds: float = 1.0,
    ) -> None:
        self.procedure = procedure
        self.template = EpochTemplate(procedure)
        self.clock = clock
        self.seed = seed
        self.metric = metric
        self.epoch_seconds = epoch_seconds
        self.rounds = 0
        self.params: dict[str, Any] = {}
        self.live: dict[str, int] = {}  # trial id -> completed epochs, in suggestion order
        self.paused: dict[str, int] = {}
        self.stopped: dict[str, int] = {}
        self.trace: list[tuple[Any, ...]] = []
        self.fail: dict[str, int] = {}  # trial id -> the epoch whose training fails
        self.failed: set[str] = set()

    def bookkeeping(self) -> dict[str, Any]:
        """Everything but the procedure and clock, as the engine would checkpoint it."""
        keys = ("rounds", "params", "live", "paused", "stopped", "failed", "trace")
        return copy.deepcopy({k: getattr(self, k) for k in keys})

    def restore(self, bookkeeping: dict[str, Any]) -> None:
        for key, value in copy.deepcopy(bookkeeping).items():
            setattr(self, key, value)

    @property
    def done(self) -> bool:
        return not self.live and self.procedure.is_finished()

    def step(self) -> None:
        """Run one round."""
        self.open_round()
        self.close_round()

    def open_round(self) -> None:
        """First half of a round: ask for new and resumed trials (the engine then saves)."""
        with _violations():
            opening = self.template.open_round(self.statuses())
        new = []
        for spec in opening.added:
            params = dict(spec.params)
            self.params[spec.trial_id] = params
            self.live[spec.trial_id] = 0
            new.append((spec.trial_id, json.dumps(params, sort_keys=True), spec.clone_from))
        for trial_id in opening.resumed:
            self.live[trial_id] = self.paused.pop(trial_id)
        self.trace.append(("round", self.rounds, new, list(opening.resumed)))
        if opening.stalled:
            raise ContractViolation(
                f"stalled in round {self.rounds}: nothing live, nothing suggested or resumed, "
                f"and is_finished() is False (paused: {sorted(self.paused)})"
            )
        with _violations():  # asked where the driver asks: the round's start, before it saves
            resources = {t: self.template.resources(t) for t in self.live}
        self.trace.append(("resources", self.rounds, resources))

    def statuses(self) -> dict[str, str]:
        """Every known trial's status, as the template reads them."""
        statuses = dict.fromkeys(self.params, "stopped")
        statuses.update(dict.fromkeys(self.live, "running"))
        statuses.update(dict.fromkeys(self.paused, "paused"))
        statuses.update(dict.fromkeys(self.failed, "failed"))
        return statuses

    def close_round(self) -> None:
        """Second half: train every live trial one epoch and ask for each one's fate."""
        for trial_id in list(self.live):
            self.clock.now += self.epoch_seconds
            epoch = self.live[trial_id] + 1
            if self.fail.get(trial_id) == epoch:  # its user code raised: it never reports
                del self.live[trial_id]
                self.failed.add(trial_id)
                self.procedure.on_trial_failed(trial_id)
                self.trace.append(("failed", self.rounds, trial_id, epoch))
                continue
            metrics = fake_metrics(self.params[trial_id], epoch, self.seed, self.metric)
            report = EpochReport(trial_id, epoch, metrics)
            with _violations():
                decision, status = self.template.close_epoch(report)
            del self.live[trial_id]
            if status == "running":
                self.live[trial_id] = epoch
            elif status == "paused":
                self.paused[trial_id] = epoch
            else:
                self.stopped[trial_id] = epoch
            self.trace.append(("decide", self.rounds, trial_id, epoch, decision.value))
        self.rounds += 1

    def run(self, max_rounds: int) -> list[tuple[Any, ...]]:
        """Run rounds until done; fail after ``max_rounds``."""
        while not self.done:
            if self.rounds >= max_rounds:
                raise ContractViolation(f"not finished after {max_rounds} rounds")
            self.step()
        return self.trace


class ProcedureContract:
    """Base class of a procedure's contract tests; subclasses implement :meth:`make`."""

    metric = "score"
    mode = "max"
    seed = 1234
    max_rounds = 1000
    resume_points = 12
    """How many round boundaries the resume test restarts from (spread over the run)."""

    def make(self, rng: np.random.Generator, clock: Clock) -> SearchProcedure:
        raise NotImplementedError("subclasses build the procedure under test here")

    # --- helpers

    def loop(self, seed: int | None = None, start: float = 0.0) -> FakeLoop:
        seed = self.seed if seed is None else seed
        clock = FakeClock(start)
        proc = self.make(np.random.default_rng(seed), clock)
        return FakeLoop(proc, clock, seed=seed, metric=self.metric)

    def full_run(self, seed: int | None = None, start: float = 0.0) -> FakeLoop:
        loop = self.loop(seed, start)
        loop.run(self.max_rounds)
        return loop

    # --- the contract

    def test_runs_to_completion(self) -> None:
        loop = self.full_run()
        assert loop.params, "the procedure never suggested a trial"
        assert loop.procedure.suggest() == [], "a finished procedure suggested trials"
        assert loop.procedure.resumed() == [], "a finished procedure resumed trials"
        assert loop.procedure.is_finished(), "is_finished() went back to False"

    def test_trial_ids_are_unique_strings(self) -> None:
        loop = self.full_run()
        suggested = [t for entry in loop.trace if entry[0] == "round" for t, _, _ in entry[2]]
        assert len(suggested) == len(set(suggested)) == len(loop.params)
        assert all(isinstance(t, str) and t for t in suggested)

    def test_deterministic_with_equal_seeds(self) -> None:
        assert self.full_run().trace == self.full_run().trace, "equal seeds, different runs"

    def test_clock_origin_does_not_matter(self) -> None:
        assert self.full_run(start=0.0).trace == self.full_run(start=1e6).trace, (
            "behaviour depends on the clock's origin, not only on elapsed time"
        )

    def test_no_global_random_state(self) -> None:
        np.random.seed(1)
        random.seed(1)
        np_before, py_before = np.random.get_state(), random.getstate()
        first = self.full_run()
        np_after, py_after = np.random.get_state(), random.getstate()
        assert py_after == py_before, "the procedure used the global `random` state"
        assert all(np.array_equal(a, b) for a, b in zip(np_before, np_after, strict=True)), (
            "the procedure used numpy's global random state"
        )
        np.random.seed(2)
        random.seed(2)
        assert self.full_run().trace == first.trace, "behaviour depends on global seeds"

    def test_state_dict_is_json_at_every_round(self) -> None:
        loop = self.loop()
        while True:
            state = loop.procedure.state_dict()
            assert json.loads(json.dumps(state)) == state, "state_dict() changes through JSON"
            if loop.done:
                break
            loop.step()
            assert loop.rounds <= self.max_rounds

    def test_load_state_dict_round_trips(self) -> None:
        loop = self.loop()
        for _ in range(3):
            if not loop.done:
                loop.step()
        state = json.loads(json.dumps(loop.procedure.state_dict()))
        fresh = self.make(np.random.default_rng(self.seed), FakeClock(loop.clock.now))
        fresh.load_state_dict(state)
        assert json.loads(json.dumps(fresh.state_dict())) == state, (
            "load_state_dict(state) then state_dict() does not give the state back"
        )

    @pytest.mark.parametrize("when", ["between_rounds", "after_suggest"])
    def test_resumed_mid_run_behaves_identically(self, when: str) -> None:
        """Save where the engine saves (round end; round start, after suggest and resumed),
        restore into a fresh procedure, and the rest of the run is the same."""
        reference = self.full_run()
        total = reference.rounds
        step = max(1, total // self.resume_points)
        for stop_at in range(0, total, step):
            loop = self.loop()
            for _ in range(stop_at):
                loop.step()
            if when == "after_suggest":
                loop.open_round()
            state = json.loads(json.dumps(loop.procedure.state_dict()))
            clock = FakeClock(loop.clock.now)
            restored = self.make(np.random.default_rng(self.seed), clock)
            restored.load_state_dict(state)
            resumed = FakeLoop(restored, clock, seed=self.seed, metric=self.metric)
            resumed.restore(loop.bookkeeping())
            if when == "after_suggest":
                resumed.close_round()
            resumed.run(self.max_rounds)
            assert resumed.trace == reference.trace, f"diverged after resuming at round {stop_at}"
            assert clock.now == reference.clock.now

    @pytest.mark.parametrize("epoch", [1, 2])
    def test_a_failed_trial_leaves_the_search_without_stalling_it(self, epoch: int) -> None:
        """A trial whose training fails never reports again; the others go on to the end
        (rungs, generations and stages are decided without it) and it is never resumed."""
        loop = self.loop()
        loop.fail = {"t0001": epoch}
        loop.run(self.max_rounds)  # a stall or a resumed failed trial is a violation
        assert loop.procedure.is_finished()
        assert loop.stopped, "no trial ran to its end"
        again = self.loop()
        again.fail = {"t0001": epoch}
        assert again.run(self.max_rounds) == loop.trace, "equal seeds, different runs"

    def test_report_without_the_metric_is_a_config_error(self) -> None:
        proc = self.make(np.random.default_rng(self.seed), FakeClock())
        specs = proc.suggest()
        assert specs, "the procedure suggested nothing at its first call"
        trial_id = specs[0].trial_id
        with pytest.raises(ConfigError) as err:
            proc.on_epoch_end(EpochReport(trial_id, 1, {"bogus": 1.0, "other": 2.0}))
        message = str(err.value)
        assert trial_id in message
        assert self.metric in message
        assert "bogus" in message and "other" in message
