from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from procedure_contract import FakeClock, FakeLoop, ProcedureContract

from cerebro_spark.errors import ConfigError
from cerebro_spark.search import (
    Clock,
    Decision,
    EpochReport,
    SearchProcedure,
    SearchSpace,
    make_procedure,
    procedure_options,
)
from cerebro_spark.search._asha import ASHA, asha_rungs

SPACE = SearchSpace.from_config(
    {"lr": {"loguniform": [1e-4, 1e-1]}, "act": {"choice": ["relu", "gelu", "tanh"]}}
)


def asha(**kwargs: Any) -> ASHA:
    kwargs.setdefault("epochs", 9)
    kwargs.setdefault("metric", "score")
    kwargs.setdefault("mode", "max")
    kwargs.setdefault("rng", np.random.default_rng(0))
    return ASHA(SPACE, **kwargs)


def report(trial_id: str, epoch: int, score: float) -> EpochReport:
    return EpochReport(trial_id, epoch, {"score": score})


def ids(specs: list[Any]) -> list[str]:
    return [s.trial_id for s in specs]


class TestASHAContract(ProcedureContract):
    def make(self, rng: np.random.Generator, clock: Clock) -> SearchProcedure:
        return ASHA(
            SPACE,
            epochs=9,
            num_trials=20,
            num_workers=3,
            metric=self.metric,
            mode=self.mode,
            rng=rng,
            clock=clock,
        )


class TestASHADeadlineContract(ProcedureContract):
    metric = "loss"
    mode = "min"

    def make(self, rng: np.random.Generator, clock: Clock) -> SearchProcedure:
        return ASHA(
            SPACE,
            epochs=4,
            eta=2,
            num_workers=2,
            deadline=40.0,
            metric=self.metric,
            mode=self.mode,
            rng=rng,
            clock=clock,
        )


def test_asha_rungs_are_below_r() -> None:
    assert asha_rungs(1, 3, 9) == [1, 3]
    assert asha_rungs(1, 3, 10) == [1, 3, 9]
    assert asha_rungs(2, 4, 100) == [2, 8, 32]
    assert asha_rungs(5, 3, 5) == []


def test_hand_worked_promotion_sequence() -> None:
    """η=3, r=1, R=9 (rungs at 1 and 3), two workers, six configs."""
    proc = asha(num_trials=6, num_workers=2)
    assert ids(proc.suggest()) == ["t0000", "t0001"]
    assert proc.resumed() == []
    # Rung 0 has 1 then 2 results: top ⌊n/3⌋ = 0, so both pause.
    assert proc.on_epoch_end(report("t0000", 1, 0.5)) is Decision.PAUSE
    assert proc.on_epoch_end(report("t0001", 1, 0.9)) is Decision.PAUSE
    # get_job: nothing promotable (top 0 of 2) -> two new configs.
    assert ids(proc.suggest()) == ["t0002", "t0003"]
    assert proc.resumed() == []
    # 3 results: top 1 is t0001 (0.9), so t0002 (0.7) pauses.
    assert proc.on_epoch_end(report("t0002", 1, 0.7)) is Decision.PAUSE
    # 4 results: top 1 is now t0003 (0.95): promoted at once.
    assert proc.on_epoch_end(report("t0003", 1, 0.95)) is Decision.CONTINUE
    # One free slot: the top 1 of rung 0 (t0003) is not paused -> a new config.
    assert ids(proc.suggest()) == ["t0004"]
    assert proc.on_epoch_end(report("t0003", 2, 0.96)) is Decision.CONTINUE
    assert proc.on_epoch_end(report("t0004", 1, 0.8)) is Decision.PAUSE  # 5 results, top 1
    assert ids(proc.suggest()) == ["t0005"]
    # t0003 reaches rung 1 alone: top 0 of 1 -> pause. t0005 is 6th of 6 at rung 0.
    assert proc.on_epoch_end(report("t0003", 3, 0.97)) is Decision.PAUSE
    assert proc.on_epoch_end(report("t0005", 1, 0.1)) is Decision.PAUSE
    # No config left: get_job checks rung 1 (top 0 of 1), then rung 0, whose top
    # ⌊6/3⌋ = 2 are t0003 (already promoted) and t0001 (paused): t0001 is promoted.
    assert proc.suggest() == []
    assert proc.resumed() == ["t0001"]
    assert not proc.is_finished()
    assert proc.on_epoch_end(report("t0001", 2, 0.91)) is Decision.CONTINUE
    assert proc.on_epoch_end(report("t0001", 3, 0.6)) is Decision.PAUSE  # top 0 of 2
    # Nothing live, nothing promotable, no config left: finished.
    assert proc.suggest() == [] and proc.resumed() == []
    assert proc.is_finished()


def test_get_job_checks_rungs_in_descending_order() -> None:
    """η=3, rungs at 1 and 3, R=9, two workers, twelve configs; rung-0 scores fall."""
    proc = asha(num_trials=12, num_workers=2)
    p, c = Decision.PAUSE, Decision.CONTINUE

    def round_(
        new: list[str], resumed: list[str], reports: list[tuple[str, int, float, Decision]]
    ) -> None:
        assert ids(proc.suggest()) == new
        assert proc.resumed() == resumed
        for trial_id, epoch, score, decision in reports:
            assert proc.on_epoch_end(report(trial_id, epoch, score)) is decision, trial_id

    round_(["t0000", "t0001"], [], [("t0000", 1, 0.9, p), ("t0001", 1, 0.8, p)])
    round_(["t0002", "t0003"], [], [("t0002", 1, 0.7, p), ("t0003", 1, 0.6, p)])
    # Rung 0's top ⌊4/3⌋ = 1 is t0000, paused: promoted; the other slot gets a new config.
    round_(["t0004"], ["t0000"], [("t0000", 2, 0.9, c), ("t0004", 1, 0.5, p)])
    round_(["t0005"], [], [("t0000", 3, 0.9, p), ("t0005", 1, 0.4, p)])
    # Rung 1 has 1 result (top 0); rung 0's top 2 are t0000 (promoted) and t0001.
    round_(["t0006"], ["t0001"], [("t0001", 2, 0.8, c), ("t0006", 1, 0.3, p)])
    round_(["t0007"], [], [("t0001", 3, 0.8, p), ("t0007", 1, 0.2, p)])
    round_(["t0008", "t0009"], [], [("t0008", 1, 0.1, p), ("t0009", 1, 0.05, p)])
    # Rung 0's top ⌊10/3⌋ = 3 adds t0002.
    round_(["t0010"], ["t0002"], [("t0002", 2, 0.7, c), ("t0010", 1, 0.01, p)])
    # t0002 is last of 3 at rung 1 (top 1 is t0000); t0011 is 12th at rung 0 (top 4).
    round_(["t0011"], [], [("t0002", 3, 0.5, p), ("t0011", 1, 0.0, p)])
    # Two free slots, no config left: rung 1's promotable t0000 comes first, then rung 0's
    # t0003 (its top 4 are t0000-t0003, only t0003 still paused there).
    round_([], ["t0000", "t0003"], [("t0000", 4, 0.9, c), ("t0003", 2, 0.6, c)])
    assert not proc.is_finished()


def test_deadline_stops_starting_and_finishes() -> None:
    clock = FakeClock(100.0)
    proc = asha(num_workers=2, deadline=10, clock=clock)
    first = ids(proc.suggest())
    assert first == ["t0000", "t0001"]
    clock.now = 105.0
    assert proc.on_epoch_end(report("t0000", 1, 0.5)) is Decision.PAUSE
    assert proc.on_epoch_end(report("t0001", 1, 0.6)) is Decision.PAUSE
    assert ids(proc.suggest()) == ["t0002", "t0003"]
    assert proc.on_epoch_end(report("t0002", 1, 0.9)) is Decision.CONTINUE
    assert not proc.is_finished()
    clock.now = 110.0  # the deadline: no new trials, live ones stop at their next report
    assert proc.is_finished()
    assert proc.suggest() == [] and proc.resumed() == []
    assert proc.on_epoch_end(report("t0002", 2, 0.9)) is Decision.STOP
    assert proc.on_epoch_end(report("t0003", 1, 0.99)) is Decision.STOP


def test_keeps_num_workers_trials_in_flight() -> None:
    clock = FakeClock()
    loop = FakeLoop(asha(num_trials=30, num_workers=4, clock=clock), clock, seed=4, metric="score")
    while not loop.done:
        loop.open_round()
        if len(loop.params) < 30:
            assert len(loop.live) == 4
        loop.close_round()
    assert len(loop.params) == 30
    # Top 1/η of 30 reach 3 epochs, top 1/η of those reach 9.
    assert sorted(loop.stopped.values()).count(9) == 3


def test_nan_ranks_last_at_a_rung() -> None:
    proc = asha(num_trials=3, num_workers=3, eta=2, epochs=2)
    a, b, c = ids(proc.suggest())
    assert proc.on_epoch_end(report(a, 1, float("nan"))) is Decision.PAUSE
    assert proc.on_epoch_end(report(b, 1, -1.0)) is Decision.CONTINUE  # top 1 of 2
    assert proc.on_epoch_end(report(c, 1, float("nan"))) is Decision.PAUSE


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({}, r"ASHA needs num_trials or deadline"),
        ({"num_trials": 0}, r"num_trials must be an integer >= 1, got 0"),
        ({"num_trials": 5, "eta": 0}, r"eta must be an integer >= 2, got 0"),
        ({"num_trials": 5, "num_workers": 0}, r"num_workers must be an integer >= 1, got 0"),
        ({"deadline": 0}, r"deadline must be a number of seconds > 0, got 0"),
        ({"deadline": float("inf")}, r"deadline must be a number of seconds > 0, got inf"),
        ({"deadline": True}, r"deadline must be a number of seconds > 0, got True"),
        ({"num_trials": 5, "min_epochs": 10}, r"min_epochs must be <= epochs \(9\), got 10"),
    ],
)
def test_asha_validates_arguments(kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        asha(**kwargs)


def test_out_of_protocol_reports_are_rejected() -> None:
    proc = asha(num_trials=2, num_workers=1)
    (a,) = ids(proc.suggest())
    with pytest.raises(ValueError, match=r"report.epoch must be 1"):
        proc.on_epoch_end(report(a, 3, 0.0))
    assert proc.on_epoch_end(report(a, 1, 0.0)) is Decision.PAUSE
    with pytest.raises(ValueError, match="which is not live"):
        proc.on_epoch_end(report(a, 2, 0.0))


def test_state_keeps_the_deadline_origin() -> None:
    clock = FakeClock(50.0)
    proc = asha(deadline=10, clock=clock)
    proc.suggest()
    state = json.loads(json.dumps(proc.state_dict()))
    later = FakeClock(59.0)
    restored = asha(deadline=10, clock=later)
    restored.load_state_dict(state)
    assert not restored.is_finished()
    later.now = 60.0
    assert restored.is_finished()
    with pytest.raises(ConfigError, match=r"the state has deadline=10\.0"):
        asha(deadline=20, clock=clock).load_state_dict(state)


def test_registered_as_asha() -> None:
    assert procedure_options("asha") == {
        "num_trials": False,
        "eta": False,
        "min_epochs": False,
        "num_workers": False,
        "deadline": False,
    }
    proc = make_procedure(
        "asha",
        space=SPACE,
        epochs=4,
        metric="score",
        mode="max",
        rng=np.random.default_rng(0),
        num_trials=4,
        num_workers=2,
    )
    assert type(proc) is ASHA
    assert proc.suggest()
