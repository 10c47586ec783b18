"""HyperSched (HyperSched §4, Alg. 3): the contract and its decisions on hand-made reports."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from procedure_contract import FakeClock, FakeLoop, ProcedureContract

from cerebro_spark.errors import ConfigError
from cerebro_spark.search import Clock, Decision, EpochReport, SearchProcedure, SearchSpace
from cerebro_spark.search._hypersched import HyperSched, speedup, uniform_allocation
from cerebro_spark.search._registry import make_procedure

SPACE = SearchSpace.from_config(
    {"lr": {"loguniform": [1e-4, 1e-1]}, "width": {"int": [8, 256], "log": True}}
)


def hs(clock: FakeClock | None = None, **kwargs: Any) -> HyperSched:
    kwargs.setdefault("epochs", 9)
    kwargs.setdefault("metric", "score")
    kwargs.setdefault("mode", "max")
    kwargs.setdefault("rng", np.random.default_rng(0))
    kwargs.setdefault("deadline", 100.0)
    kwargs.setdefault("num_workers", 4)
    return HyperSched(SPACE, clock=clock or FakeClock(), **kwargs)


def report(trial_id: str, epoch: int, score: float, seconds: float = 0.0) -> EpochReport:
    return EpochReport(trial_id, epoch, {"score": score, "loss": 1 - score}, seconds)


# --- the contract


class TestHyperSchedContract(ProcedureContract):
    def make(self, rng: np.random.Generator, clock: Clock) -> SearchProcedure:
        return HyperSched(
            SPACE,
            epochs=9,
            metric=self.metric,
            mode=self.mode,
            rng=rng,
            clock=clock,
            deadline=60.0,
            num_workers=4,
        )


class TestHyperSchedOverheadContract(ProcedureContract):
    metric = "loss"
    mode = "min"

    def make(self, rng: np.random.Generator, clock: Clock) -> SearchProcedure:
        return HyperSched(
            SPACE,
            epochs=12,
            metric=self.metric,
            mode=self.mode,
            rng=rng,
            clock=clock,
            deadline=45.0,
            num_workers=3,
            eta=2,
            min_epochs=2,
            max_trials=7,
            scaling="sqrt",
            startup_overhead=1.5,
            cooldown=4.0,
            epoch_seconds=0.5,
        )


def test_contract_run_uses_more_workers_and_ends_by_the_deadline() -> None:
    clock = FakeClock()
    proc = hs(clock, deadline=60.0, epochs=30)
    loop = FakeLoop(proc, clock, seed=3, metric="score")
    widths = []
    while not loop.done:
        loop.open_round()
        widths += [proc.resources(t) for t in loop.live]
        loop.close_round()
    assert max(widths) > 1, "no trial was ever given more than one worker"
    assert proc.is_finished()
    assert clock.now <= 60.0 + 4  # the last round started before the deadline


# --- building blocks


def test_speedup_functions() -> None:
    assert [speedup("linear", k) for k in (1, 2, 8)] == [1.0, 2.0, 8.0]
    assert speedup("sqrt", 4) == 2.0
    assert speedup("sqrt", 2) == pytest.approx(math.sqrt(2))
    assert [speedup("none", k) for k in (1, 5)] == [1.0, 1.0]
    with pytest.raises(ConfigError, match="scaling must be one of linear, sqrt, none"):
        speedup("cubic", 2)
    with pytest.raises(ConfigError, match="workers must be an integer >= 1, got 0"):
        speedup("linear", 0)


def test_uniform_allocation_deals_round_robin_best_first() -> None:
    assert uniform_allocation(["a", "b", "c"], 8) == {"a": 3, "b": 3, "c": 2}
    assert uniform_allocation(["a", "b"], 4) == {"a": 2, "b": 2}
    assert uniform_allocation(["a", "b", "c"], 2) == {"a": 1, "b": 1, "c": 1}
    assert uniform_allocation([], 4) == {}


# --- entrance policy


def test_fills_the_cluster_then_waits_for_free_workers() -> None:
    clock = FakeClock()
    proc = hs(clock, num_workers=3)
    first = proc.suggest()
    assert [s.trial_id for s in first] == ["t0000", "t0001", "t0002"]
    assert proc.suggest() == []
    clock.now = 1.0
    assert proc.on_epoch_end(report("t0000", 1, 0.5)) is Decision.CONTINUE
    assert proc.on_epoch_end(report("t0001", 1, 0.2)) is Decision.PAUSE  # below the cutoff
    assert [s.trial_id for s in proc.suggest()] == ["t0003"]  # its worker is free again


def test_entrance_refuses_a_trial_that_cannot_reach_the_first_rung() -> None:
    clock = FakeClock()
    proc = hs(clock, deadline=10.0, min_epochs=3, epoch_seconds=1.0, startup_overhead=0.5)
    clock.now = 6.4  # 3.6 s left: 0.5 start-up + 3 epochs = 3.5 s fits
    assert len(proc.suggest()) == 4
    clock2 = FakeClock()
    late = hs(clock2, deadline=10.0, min_epochs=3, epoch_seconds=1.0, startup_overhead=0.5)
    clock2.now = 6.6  # 3.4 s left: the first rung cannot be reached
    assert late.entrance_open()  # workers are free and min(R*T_a, eta*t_f) = 0 < T_n ...
    assert late.suggest() == []  # ... but no trial that cannot reach its first rung starts
    assert late.is_finished()


def test_entrance_closes_when_eta_times_the_furthest_trial_exceeds_the_time_left() -> None:
    clock = FakeClock()
    proc = hs(clock, deadline=20.0, epochs=30, eta=3, num_workers=2)
    a, other = (s.trial_id for s in proc.suggest())
    for n in range(1, 6):
        clock.now = float(n)  # rounds of 1 s: a has trained n s, the furthest trial
        assert proc.on_epoch_end(report(a, n, 0.9)) is Decision.CONTINUE
        assert proc.on_epoch_end(report(other, 1, 0.1 / n)) is Decision.PAUSE
        new = proc.suggest()
        assert proc.resumed() == []
        if n < 5:  # eta * t_f = 3n < 20 - n: the freed worker takes a new trial
            assert len(new) == 1
            other = new[0].trial_id
        else:  # 3 * 5 = 15 >= 15 s left, and R * T_a = 30 >= 15: no more trials
            assert new == []
            assert not proc.entrance_open()
    assert not proc.is_finished()  # a is still live


def test_epoch_time_is_refined_from_reports() -> None:
    proc = hs(epoch_seconds=1.0)
    t = proc.suggest()[0].trial_id
    assert proc.epoch_time == 1.0
    proc.on_epoch_end(report(t, 1, 0.5, seconds=3.0))
    proc.on_epoch_end(report(t, 2, 0.5, seconds=5.0))
    assert proc.epoch_time == 4.0


# --- speculative evaluation and promotion


def test_speculative_evaluation_lets_the_first_arrival_continue_then_monitors_it() -> None:
    clock = FakeClock()
    proc = hs(clock, num_workers=4, eta=2, epochs=8)
    ids = [s.trial_id for s in proc.suggest()]
    clock.now = 1.0
    assert proc.on_epoch_end(report(ids[0], 1, 0.3)) is Decision.CONTINUE  # first at rung 1
    assert proc.on_epoch_end(report(ids[1], 1, 0.2)) is Decision.PAUSE  # 2 seen, keeps 1
    assert proc.on_epoch_end(report(ids[2], 1, 0.6)) is Decision.CONTINUE  # 3 seen, keeps 2
    assert proc.on_epoch_end(report(ids[3], 1, 0.7)) is Decision.CONTINUE  # 4 seen, keeps 2
    clock.now = 2.0
    # ids[0] (0.3) is no longer in the top half of rung 1 (0.7, 0.6 are): paused later on
    assert proc.on_epoch_end(report(ids[0], 2, 0.9)) is Decision.PAUSE
    assert proc.on_epoch_end(report(ids[2], 2, 0.6)) is Decision.CONTINUE


def test_paused_trial_in_a_rungs_top_is_resumed() -> None:
    clock = FakeClock()
    proc = hs(clock, num_workers=2, eta=2, epochs=8)
    a, b = (s.trial_id for s in proc.suggest())
    clock.now = 1.0
    assert proc.on_epoch_end(report(a, 1, 0.8)) is Decision.CONTINUE
    assert proc.on_epoch_end(report(b, 1, 0.4)) is Decision.PAUSE
    # rung 1 holds a 0.8, b 0.4: its top floor(2/2) = 1 is a, which is live: a new trial
    (c,) = (s.trial_id for s in proc.suggest())
    assert proc.resumed() == []
    clock.now = 2.0
    assert proc.on_epoch_end(report(a, 2, 0.85)) is Decision.CONTINUE
    assert proc.on_epoch_end(report(c, 1, 0.1)) is Decision.PAUSE
    (d,) = (s.trial_id for s in proc.suggest())  # top floor(3/2) = 1: still only a
    clock.now = 3.0
    assert proc.on_epoch_end(report(a, 3, 0.9)) is Decision.CONTINUE
    assert proc.on_epoch_end(report(d, 1, 0.05)) is Decision.PAUSE
    # top floor(4/2) = 2 of rung 1: a and b; b is paused and promotable
    assert proc.suggest() == []
    assert proc.resumed() == [b]
    assert proc.resources(b) == 1
    clock.now = 4.0
    assert proc.on_epoch_end(report(b, 2, 0.95)) is Decision.CONTINUE  # best at rung 2


def test_trial_paused_at_a_lower_rung_is_not_recorded_at_the_higher_one() -> None:
    clock = FakeClock()
    proc = hs(clock, num_workers=2, eta=3, epochs=27)  # rungs 1, 3, 9
    a, b = (s.trial_id for s in proc.suggest())
    assert proc.on_epoch_end(report(a, 1, 0.5)) is Decision.CONTINUE
    assert proc.on_epoch_end(report(a, 2, 0.5)) is Decision.CONTINUE
    assert proc.on_epoch_end(report(b, 1, 0.9)) is Decision.CONTINUE
    # at epoch 3 (rung 3) a fails rung 1 first (0.5 < 0.9): paused, not recorded at rung 3
    assert proc.on_epoch_end(report(a, 3, 0.6)) is Decision.PAUSE
    for score in (0.1, 0.05, 0.04, 0.03):  # worse newcomers lower rung 1's cutoff
        (new,) = proc.suggest()
        assert proc.on_epoch_end(report(new.trial_id, 1, score)) is Decision.PAUSE
    # rung 1 has 6 scores: its top floor(6/3) = 2 are b and a; a is promoted
    assert proc.suggest() == []
    assert proc.resumed() == [a]
    assert proc.on_epoch_end(report(a, 4, 0.7)) is Decision.CONTINUE  # alone at rung 3


# --- dynamic allocation


def rounds(
    proc: HyperSched,
    clock: FakeClock,
    epochs: dict[str, int],
    plan: list[tuple[float, dict[str, float]]],
) -> None:
    """Run rounds by hand: at each time, suggest, then every listed trial reports."""
    for now, scores in plan:
        assert proc.suggest() == []
        proc.resumed()
        clock.now = now
        for trial_id, score in scores.items():
            epochs[trial_id] = epochs.get(trial_id, 0) + 1
            proc.on_epoch_end(report(trial_id, epochs[trial_id], score))


def test_best_trial_gets_the_left_over_worker() -> None:
    clock = FakeClock()
    proc = hs(clock, num_workers=4, max_trials=3, min_epochs=5, epochs=50)
    a, b, c = (s.trial_id for s in proc.suggest())
    clock.now = 1.0
    for trial_id, score in ((a, 0.9), (b, 0.5), (c, 0.7)):
        assert proc.on_epoch_end(report(trial_id, 1, score)) is Decision.CONTINUE
    # 4 workers dealt over a, c, b best first: a gets the fourth
    assert [proc.resources(t) for t in (a, b, c)] == [2, 1, 1]
    # b becomes the best, but no worker is idle: nobody shrinks, b does not grow
    rounds(proc, clock, {a: 1, b: 1, c: 1}, [(2.0, {a: 0.9, b: 0.95, c: 0.7})])
    assert [proc.resources(t) for t in (a, b, c)] == [2, 1, 1]


def grown(**kwargs: Any) -> tuple[HyperSched, FakeClock, list[str]]:
    """Two live trials on 4 workers; the better one reports at ``clock.now`` next."""
    clock = FakeClock()
    kwargs.setdefault("num_workers", 4)
    kwargs.setdefault("epochs", 50)
    kwargs.setdefault("max_trials", 2)
    proc = hs(clock, **kwargs)
    ids = [s.trial_id for s in proc.suggest()]
    assert len(ids) == 2
    return proc, clock, ids


def test_resize_pays_for_its_overhead_only_when_enough_time_is_left() -> None:
    proc, clock, (a, _) = grown(deadline=10.0, startup_overhead=3.0)
    clock.now = 6.0  # T_n = 4: (4 - 3) * 2 = 2 < 4 * 1: stay on one worker
    assert proc.on_epoch_end(report(a, 1, 0.9)) is Decision.CONTINUE
    assert proc.resources(a) == 1
    proc, clock, (a, _) = grown(deadline=10.0, startup_overhead=1.0)
    clock.now = 6.0  # T_n = 4: (4 - 1) * 2 = 6 > 4: grow to the share of 2
    assert proc.on_epoch_end(report(a, 1, 0.9)) is Decision.CONTINUE
    assert proc.resources(a) == 2


def test_no_scaling_never_resizes() -> None:
    proc, clock, (a, _) = grown(scaling="none")
    clock.now = 1.0
    proc.on_epoch_end(report(a, 1, 0.9))
    assert proc.resources(a) == 1


def test_sqrt_scaling_resizes_when_it_pays() -> None:
    proc, clock, (a, _) = grown(scaling="sqrt", deadline=10.0, startup_overhead=2.0)
    clock.now = 2.0  # (8 - 2) * sqrt(2) = 8.49 > 8
    proc.on_epoch_end(report(a, 1, 0.9))
    assert proc.resources(a) == 2
    proc, clock, (a, _) = grown(scaling="sqrt", deadline=10.0, startup_overhead=3.0)
    clock.now = 2.0  # (8 - 3) * sqrt(2) = 7.07 < 8
    proc.on_epoch_end(report(a, 1, 0.9))
    assert proc.resources(a) == 1


def test_cooldown_spaces_the_resizes_of_a_trial() -> None:
    clock = FakeClock()
    proc = hs(clock, num_workers=4, max_trials=3, min_epochs=5, epochs=50, cooldown=5.0)
    a, b, c = (s.trial_id for s in proc.suggest())
    scores = {a: 0.9, b: 0.5, c: 0.7}
    epochs = dict.fromkeys(scores, 0)
    rounds(proc, clock, epochs, [(1.0, scores)])
    assert proc.resources(a) == 1  # its share is 2, but it started 1 s ago
    rounds(proc, clock, epochs, [(5.0, scores)])
    assert proc.resources(a) == 2  # 5 s after its start
    # epochs 3, 4, 5; 5 is the first rung: b and c pause there
    rounds(proc, clock, epochs, [(6.0, scores), (7.0, scores), (8.0, scores)])
    assert [proc.resources(t) for t in (a, b, c)] == [2, 1, 1]
    rounds(proc, clock, epochs, [(9.0, {a: 0.9})])
    assert proc.resources(a) == 2  # its share is 4, but it was resized 4 s ago
    rounds(proc, clock, epochs, [(10.0, {a: 0.9})])
    assert proc.resources(a) == 4


def test_allocation_never_exceeds_the_cluster() -> None:
    clock = FakeClock()
    proc = hs(clock, num_workers=5, eta=2, epochs=40, deadline=60.0)
    loop = FakeLoop(proc, clock, seed=1, metric="score")
    while not loop.done:
        loop.open_round()
        assert sum(proc.resources(t) for t in loop.live) <= 5
        loop.close_round()


# --- the deadline


def test_everything_stops_at_the_deadline() -> None:
    clock = FakeClock()
    proc = hs(clock, deadline=10.0)
    ids = [s.trial_id for s in proc.suggest()]
    clock.now = 10.0
    assert proc.on_epoch_end(report(ids[0], 1, 0.9)) is Decision.STOP
    assert proc.is_finished()
    assert proc.suggest() == []
    assert proc.resumed() == []


def test_a_trial_whose_next_epoch_cannot_finish_is_stopped() -> None:
    clock = FakeClock()
    proc = hs(clock, deadline=10.0, epoch_seconds=2.0, max_trials=1, num_workers=1)
    (t,) = (s.trial_id for s in proc.suggest())
    clock.now = 7.5  # 7.5 + 2 <= 10: goes on ...
    assert proc.on_epoch_end(report(t, 1, 0.5)) is Decision.CONTINUE
    clock.now = 8.5  # ... but 8.5 + 2 > 10: that epoch could not count
    assert proc.on_epoch_end(report(t, 2, 0.5)) is Decision.STOP
    assert proc.is_finished()


def test_trial_stops_after_R_epochs() -> None:
    proc = hs(epochs=2, max_trials=1)
    (t,) = (s.trial_id for s in proc.suggest())
    assert proc.on_epoch_end(report(t, 1, 0.5)) is Decision.CONTINUE
    assert proc.on_epoch_end(report(t, 2, 0.5)) is Decision.STOP
    assert proc.is_finished()


# --- state and arguments


def test_state_round_trip_keeps_allocations_and_rungs() -> None:
    proc, clock, (a, b) = grown(eta=2)
    clock.now = 1.0
    proc.on_epoch_end(report(b, 1, 0.2))  # first at rung 1: continues
    proc.on_epoch_end(report(a, 1, 0.9))  # the better one grows to its share of 2
    state = json.loads(json.dumps(proc.state_dict()))
    fresh = hs(FakeClock(1.0), num_workers=4, epochs=50, max_trials=2, eta=2)
    fresh.load_state_dict(state)
    assert fresh.resources(a) == proc.resources(a) == 2
    assert fresh.state_dict() == state
    with pytest.raises(ConfigError, match=r"the state has deadline=100\.0 but this procedure"):
        hs(deadline=50.0, num_workers=4, epochs=50, eta=2).load_state_dict(state)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"deadline": 0}, r"deadline must be a finite number > 0, got 0"),
        ({"deadline": math.inf}, r"deadline must be a finite number > 0"),
        ({"num_workers": 0}, r"num_workers must be an integer >= 1, got 0"),
        ({"eta": 1}, r"eta must be an integer >= 2, got 1"),
        ({"min_epochs": 10}, r"min_epochs must be <= epochs, got min_epochs=10 > epochs=9"),
        ({"max_trials": 0}, r"max_trials must be an integer >= 1, got 0"),
        ({"scaling": "log"}, r"scaling must be one of linear, sqrt, none, got 'log'"),
        ({"startup_overhead": -1}, r"startup_overhead must be a finite number >= 0"),
        ({"cooldown": "5"}, r"cooldown must be a finite number >= 0, got '5'"),
        ({"epoch_seconds": 0.0}, r"epoch_seconds must be a finite number > 0"),
    ],
)
def test_arguments_are_validated(kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        hs(**kwargs)


def test_registered_as_hypersched() -> None:
    proc = make_procedure(
        "hypersched",
        space=SPACE,
        epochs=5,
        metric="score",
        mode="max",
        rng=np.random.default_rng(0),
        deadline=30.0,
        num_workers=2,
    )
    assert isinstance(proc, HyperSched)
    with pytest.raises(ConfigError, match="needs option 'deadline'"):
        make_procedure(
            "hypersched",
            space=SPACE,
            epochs=5,
            metric="score",
            mode="max",
            rng=np.random.default_rng(0),
            num_workers=2,
        )


def test_reports_out_of_protocol_are_rejected() -> None:
    proc = hs(max_trials=1)
    (t,) = (s.trial_id for s in proc.suggest())
    with pytest.raises(ValueError, match="trial 't9999', which is unknown"):
        proc.on_epoch_end(report("t9999", 1, 0.5))
    with pytest.raises(ValueError, match=r"report.epoch must be 1 .* got 3"):
        proc.on_epoch_end(report(t, 3, 0.5))
