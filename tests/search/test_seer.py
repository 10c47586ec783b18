"""SEER (SEER §3, Alg. 1-3): the plan against hand computations, the contract, decisions."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from procedure_contract import FakeClock, FakeLoop, ProcedureContract

from cerebro_spark.errors import ConfigError
from cerebro_spark.search import Clock, Decision, EpochReport, SearchProcedure, SearchSpace
from cerebro_spark.search._registry import make_procedure
from cerebro_spark.search._seer import SEER, seer_plan

SPACE = SearchSpace.from_config({"lr": {"loguniform": [1e-4, 1e-1]}, "depth": {"int": [1, 8]}})


def report(trial_id: str, epoch: int, score: float) -> EpochReport:
    return EpochReport(trial_id, epoch, {"score": score, "loss": 1 - score})


# --- the plan (Alg. 2 and 3)


def test_plan_reproduces_the_worked_example_of_section_3_4() -> None:
    plan = seer_plan(10, 80, eta=2, v=2)
    # Alg. 2: on (4, 8] ceil(log2 R) = 3 and R * 2 * (1 - 1/8) <= 10 gives R* = 40/7
    assert plan.R_star == pytest.approx(40 / 7)
    assert plan.K == 3
    assert plan.t1 == pytest.approx(10 / 7)  # 1.43
    assert pytest.approx(120 / 7) == plan.B0  # 17.14
    # Alg. 3: q v^(q-1) <= 80 / (120/7) = 4.67 gives q* = 2; P = [1, 2, 4],
    # B = [240/7, 240/7, 80 - 480/7]; Alg. 2 line 8: N = [8, 4, 0]; the empty bracket goes
    assert plan.q_star == 2
    assert plan.N == (8, 4)
    assert plan.P == (1, 2)
    assert pytest.approx((240 / 7, 240 / 7)) == plan.B
    assert len(plan.dropped) == 1
    assert plan.dropped[0][0] == 4
    assert plan.dropped[0][1] == pytest.approx(80 / 7)
    assert [s.trials for s in plan.stages] == [(8, 4), (4, 2), (2, 1)]
    assert [s.resources for s in plan.stages] == [(1, 2)] * 3
    assert [s.start for s in plan.stages] == pytest.approx([0, 10 / 7, 30 / 7])
    assert [s.end for s in plan.stages] == pytest.approx([10 / 7, 30 / 7, 10])
    assert plan.total_trials == 12
    assert plan.time == pytest.approx(10)
    assert plan.cost == pytest.approx(3 * 160 / 7)  # 16, 8 and 4 workers: 68.57 <= 80


def test_plan_when_the_budget_binds() -> None:
    # T=10, B=12: on (4, 8] 3R <= 12 gives R = 4, not above 4; on (2, 4] R = min(4,
    # 10/1.5, 12/2) = 4. K = 2, t1 = 4/2 = 2, B0 = 4*2 = 8, B/B0 = 1.5: q* = 1,
    # P = [1, 2], B = [8, 4], N = [8/(2*2*1), 4/(2*2*2)] = [2, 0]
    plan = seer_plan(10, 12)
    assert (plan.R_star, plan.K, plan.t1, plan.B0, plan.q_star) == (4, 2, 2, 8, 1)
    assert (plan.N, plan.P, plan.B) == ((2,), (1,), (8.0,))
    assert [s.trials for s in plan.stages] == [(2,), (1,)]
    assert plan.time == 6  # a small budget finishes before the deadline (§3.3)
    assert plan.cost == 8


def test_plan_of_table_2_with_the_papers_default_eta() -> None:
    # T=60, B=16*60, eta=4: on (16, 64] R * 4/3 * 63/64 <= 60 gives R* = 320/7 = 45.7,
    # K = 3, t1 = R*/16 = 20/7, B0 = 3 R* = 960/7, B/B0 = 7: q* = 2 (2*2 <= 7 < 3*4),
    # P = [1, 2, 4], B = [1920/7, 1920/7, 2880/7]: N = [32, 16, 12] (exact quotients)
    plan = seer_plan(60, 960, eta=4, v=2)
    assert plan.R_star == pytest.approx(320 / 7)
    assert (plan.K, plan.q_star) == (3, 2)
    assert plan.t1 == pytest.approx(20 / 7)
    assert pytest.approx(960 / 7) == plan.B0
    assert plan.N == (32, 16, 12)
    assert plan.P == (1, 2, 4)
    assert pytest.approx((1920 / 7, 1920 / 7, 2880 / 7)) == plan.B
    assert [s.trials for s in plan.stages] == [(32, 16, 12), (8, 4, 3), (2, 1, 0)]
    assert [s.duration for s in plan.stages] == pytest.approx([20 / 7, 80 / 7, 320 / 7])


def test_plan_with_p_max_takes_the_else_branch_of_alg_3() -> None:
    # p_min v^(q*-1) = 2 is not < p_max = 2: q'* = 0 (1 * 2^0 < 2), P = [1, 2],
    # B = [40, 40]: N = [floor(40 / (30/7)), floor(40 / (60/7))] = [9, 4]
    plan = seer_plan(10, 80, p_max=2)
    assert plan.q_star == 2
    assert plan.P == (1, 2)
    assert plan.B == (40.0, 40.0)
    assert plan.N == (9, 4)
    assert [s.trials for s in plan.stages] == [(9, 4), (4, 2), (2, 1)]


def test_plan_with_p_max_equal_to_p_min_is_one_bracket() -> None:
    plan = seer_plan(10, 80, p_min=2, p_max=2)
    # R*: 2R*3 <= 80 and 1.75 R <= 10: R* = 40/7; B0 = 2 * 40/7 * 3 = 240/7; N = 80/(30/7*2)
    assert plan.P == (2,)
    assert plan.N == (9,)


def test_plan_with_v_one_keeps_every_bracket_at_p_min() -> None:
    plan = seer_plan(10, 80, v=1)
    # q* = floor(80 / (120/7)) = 4 brackets of B0 = 120/7 each, N = B0 / (K t1) = 4,
    # plus the rest 80 - 480/7 = 80/7: N = floor((80/7) / (30/7)) = 2; all at p_min = 1
    assert plan.q_star == 4
    assert plan.P == (1,) * 5
    assert (4, 4, 4, 4, math.floor((80 - 4 * 120 / 7) / (30 / 7))) == plan.N


def test_plan_epochs_per_stage() -> None:
    plan = seer_plan(10, 80, epoch_seconds=0.5)
    # stage times 10/7, 20/7, 40/7 on 1 and 2 workers, in epochs of 0.5
    assert [s.epochs for s in plan.stages] == [(2, 5), (5, 11), (11, 22)]
    assert seer_plan(10, 80).stages[0].epochs == ()


@pytest.mark.parametrize(
    ("deadline", "budget", "kwargs", "pattern"),
    [
        (1.0, 80.0, {}, r"infeasible: deadline T=1 and worker_seconds B=80 .* T > t_min = 1"),
        (
            10.0,
            1.0,
            {},
            r"infeasible: deadline T=10 and worker_seconds B=1 .* B > p_min \* t_min = 1",
        ),
        (10.0, 3.0, {"p_min": 4}, r"B > p_min \* t_min = 4"),
        (0.0, 80.0, {}, r"deadline must be a finite number > 0, got 0"),
        (10.0, 80.0, {"eta": 1}, r"eta must be a finite number > 1, got 1"),
        (10.0, 80.0, {"v": 0.5}, r"v must be a finite number >= 1, got 0.5"),
        (10.0, 80.0, {"p_max": 1, "p_min": 2}, r"p_max must be >= p_min, got p_max=1 < p_min=2"),
        (10.0, 80.0, {"t_min": -1}, r"t_min must be a finite number > 0"),
    ],
)
def test_plan_rejects_bad_input(
    deadline: float, budget: float, kwargs: dict[str, Any], pattern: str
) -> None:
    with pytest.raises(ConfigError, match=pattern):
        seer_plan(deadline, budget, **kwargs)


@settings(max_examples=150, deadline=None)
@given(
    deadline=st.floats(1.5, 500),
    ratio=st.floats(1.5, 200),
    eta=st.sampled_from([1.5, 2, 3, 4]),
    v=st.sampled_from([1, 1.5, 2, 3]),
    p_max=st.one_of(st.none(), st.integers(1, 16)),
)
def test_plan_meets_deadline_and_budget(
    deadline: float, ratio: float, eta: float, v: float, p_max: int | None
) -> None:
    """SEER Fact 1: the plan takes at most T and spends at most B."""
    budget = deadline * ratio
    plan = seer_plan(deadline, budget, eta=eta, v=v, p_max=p_max)
    assert plan.time <= deadline * (1 + 1e-9)
    assert plan.cost <= budget * (1 + 1e-9)
    assert plan.N and all(n >= 1 for n in plan.N)
    assert plan.N[0] >= math.floor(eta ** (plan.K - 1) + 1e-9)  # B[1] / (K t1 p_min)
    if float(eta).is_integer():  # then bracket 1 keeps a trial in every stage
        assert all(stage.trials[0] >= 1 for stage in plan.stages)
    assert p_max is None or max(plan.P) <= p_max
    assert list(plan.P) == sorted(plan.P)
    for earlier, later in zip(plan.stages, plan.stages[1:], strict=False):
        assert all(a >= b for a, b in zip(earlier.trials, later.trials, strict=True))
    assert json.loads(json.dumps(plan.to_dict()))["K"] == plan.K


# --- the contract


class TestSeerContract(ProcedureContract):
    def make(self, rng: np.random.Generator, clock: Clock) -> SearchProcedure:
        return SEER(
            SPACE,
            epochs=30,
            metric=self.metric,
            mode=self.mode,
            rng=rng,
            clock=clock,
            deadline=40.0,
            num_workers=4,
        )


class TestSeerParallelContract(ProcedureContract):
    metric = "loss"
    mode = "min"

    def make(self, rng: np.random.Generator, clock: Clock) -> SearchProcedure:
        return SEER(
            SPACE,
            epochs=8,
            metric=self.metric,
            mode=self.mode,
            rng=rng,
            clock=clock,
            deadline=300.0,
            num_workers=8,
            worker_seconds=1200.0,
            eta=3,
            t_min=2.0,
            epoch_seconds=0.5,
        )


# --- execution (Alg. 1)


def seer(clock: FakeClock, **kwargs: Any) -> SEER:
    kwargs.setdefault("epochs", 100)
    kwargs.setdefault("metric", "score")
    kwargs.setdefault("mode", "max")
    kwargs.setdefault("rng", np.random.default_rng(0))
    kwargs.setdefault("deadline", 10.0)
    kwargs.setdefault("worker_seconds", 80.0)
    kwargs.setdefault("num_workers", 16)
    return SEER(SPACE, clock=clock, **kwargs)


def stage_one(clock: FakeClock) -> tuple[SEER, list[str], dict[str, Decision]]:
    """The §3.4 plan in seconds; its first round ends at 1.0, past half the 1.43 s stage."""
    proc = seer(clock)
    ids = [s.trial_id for s in proc.suggest()]
    assert proc.resumed() == []
    scores = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.05, 0.5, 0.95, 0.3]  # brackets 1, 2
    clock.now = 1.0
    decisions = {t: proc.on_epoch_end(report(t, 1, s)) for t, s in zip(ids, scores, strict=True)}
    return proc, ids, decisions


def test_first_suggest_samples_every_bracket() -> None:
    proc = seer(FakeClock())
    specs = proc.suggest()
    assert len(specs) == 12
    ids = [s.trial_id for s in specs]
    assert [proc.bracket(t) for t in ids] == [0] * 8 + [1] * 4
    assert [proc.resources(t) for t in ids] == [1] * 8 + [2] * 4
    assert proc.suggest() == []
    assert proc.stage == 1


def test_stage_close_eliminates_per_bracket_and_promotes_the_best() -> None:
    clock = FakeClock()
    proc, ids, decisions = stage_one(clock)
    # 1.0 + 1.0 > 1.43: the stage's time is up after one epoch; the last report closes it.
    # Bracket 1 drops its 4 worst (0.1-0.4), bracket 2 its 2 worst (0.05, 0.3).
    assert decisions[ids[11]] is Decision.STOP  # the closer was eliminated
    assert all(decisions[t] is Decision.PAUSE for t in ids[:11])
    assert proc.stage == 2
    # survivors best first: t0010 .95, t0007 .8, t0006 .7, t0005 .6, t0004 .5, t0009 .5
    # the top 2 go to the 2-worker bracket: t0007 is promoted, t0009 demoted
    assert {t: proc.bracket(t) for t in ids if proc.bracket(t) is not None} == {
        "t0010": 1,
        "t0007": 1,
        "t0006": 0,
        "t0005": 0,
        "t0004": 0,
        "t0009": 0,
    }
    assert proc.suggest() == []
    resumed = proc.resumed()
    assert sorted(resumed) == ["t0004", "t0005", "t0006", "t0007", "t0009", "t0010"]
    assert proc.resources("t0007") == 2
    assert proc.resources("t0009") == 1
    assert proc.resources("t0000") == 1  # eliminated


def test_members_on_more_workers_train_more_epochs_per_stage() -> None:
    clock = FakeClock()
    proc, _, _ = stage_one(clock)
    proc.suggest()
    live = proc.resumed()
    # stage 2: 20/7 s; 1 worker -> 2 epochs, 2 workers -> 5 epochs (epoch_seconds = 1)
    fast = [t for t in live if proc.bracket(t) == 1]
    slow = [t for t in live if proc.bracket(t) == 0]
    epochs = dict.fromkeys(live, 1)
    trained: dict[str, int] = dict.fromkeys(live, 0)
    now = 1.0
    while live:
        now += 0.25  # short rounds: time is never up before the targets
        clock.now = now
        still = []
        for t in live:
            epochs[t] += 1
            trained[t] += 1
            if proc.on_epoch_end(report(t, epochs[t], 0.5)) is Decision.CONTINUE:
                still.append(t)
        proc.suggest()
        live = still + proc.resumed()
        if proc.stage != 2:
            break
    assert {trained[t] for t in slow} == {2}
    assert {trained[t] for t in fast} == {5}


def test_pacing_makes_slow_members_wait() -> None:
    clock = FakeClock()
    proc, _, _ = stage_one(clock)
    proc.suggest()
    live = proc.resumed()
    clock.now = 1.1
    decisions = {t: proc.on_epoch_end(report(t, 2, 0.5)) for t in live}
    # round 1 of stage 2 done: the 2-worker members (E = 5 of M = 5) are due again in
    # round 2, the 1-worker members (E = 2) only in round 3 (ceil(2 * 2 / 5) = 1 epoch)
    for t, decision in decisions.items():
        expected = Decision.CONTINUE if proc.bracket(t) == 1 else Decision.PAUSE
        assert decision is expected, t
    proc.suggest()
    assert proc.resumed() == []
    clock.now = 1.2
    for t in ("t0010", "t0007"):
        assert proc.on_epoch_end(report(t, 3, 0.5)) is Decision.CONTINUE
    proc.suggest()
    assert sorted(proc.resumed()) == ["t0004", "t0005", "t0006", "t0009"]


def test_last_stage_stops_everything() -> None:
    clock = FakeClock()
    proc = seer(clock, deadline=4.0, worker_seconds=4.0, num_workers=2)
    # R*: on (1, 2] R <= 4 and R <= 4 -> 2; on (2, 4] 1.5 R <= 4 but 2R <= 4 -> 2 is not
    # above 2: R* = 2, K = 1, t1 = 2, B0 = 2, q* = 1: P = [1, 2], B = [2, 2],
    # N = [floor(2 / 2), floor(2 / 4)] = [1, 0]
    assert (proc.plan.K, proc.plan.N) == (1, (1,))
    (t,) = (s.trial_id for s in proc.suggest())
    clock.now = 1.0
    assert proc.on_epoch_end(report(t, 1, 0.5)) is Decision.CONTINUE  # 1 + 1 <= 2
    clock.now = 2.0
    assert proc.on_epoch_end(report(t, 2, 0.6)) is Decision.STOP  # target of 2 epochs
    assert proc.is_finished()
    assert proc.suggest() == []
    assert proc.resumed() == []


def test_deadline_stops_live_trials() -> None:
    clock = FakeClock()
    proc, _, _ = stage_one(clock)
    proc.suggest()
    live = proc.resumed()
    clock.now = 10.0
    assert proc.on_epoch_end(report(live[0], 2, 0.5)) is Decision.STOP
    assert proc.is_finished()
    assert proc.on_epoch_end(report(live[1], 2, 0.5)) is Decision.STOP
    assert proc.resumed() == []


def test_epochs_cap_limits_every_trial() -> None:
    clock = FakeClock()
    proc = seer(clock, epochs=2)
    loop = FakeLoop(proc, clock, seed=0, metric="score")
    loop.epoch_seconds = 0.05
    loop.run(max_rounds=100)
    assert max(loop.stopped.values() or [0]) <= 2
    assert all(epochs <= 2 for epochs in loop.paused.values())


def test_plan_follows_the_options() -> None:
    proc = seer(FakeClock(), deadline=10.0, worker_seconds=None, num_workers=8)
    assert proc.plan.worker_seconds == 80.0  # num_workers * deadline
    assert proc.plan.p_max == 8
    assert proc.plan.t_min == 1.0  # epoch_seconds
    assert (proc.plan.N, proc.plan.P) == ((8, 4), (1, 2))


def test_state_from_another_plan_is_refused() -> None:
    state = seer(FakeClock()).state_dict()
    with pytest.raises(ConfigError, match="cannot resume SEER: the state has plan"):
        seer(FakeClock(), worker_seconds=200.0).load_state_dict(state)


@pytest.mark.parametrize(
    ("options", "startup", "epoch", "workers"),
    [
        # The elastic benchmark's SEER: stage ends 1, 3, 7, 15, 31 s, all but the last
        # passed in a 16 s start-up; a round of 16 trials on 2 workers takes 5 s.
        ({"epochs": 8, "deadline": 45, "worker_seconds": 80, "epoch_seconds": 0.65,
          "num_workers": 2}, 16.0, 0.648, 2),
        # SEER §3.4's two brackets (P = [1, 2]), paced; short rounds, then late ones.
        ({"epochs": 100, "deadline": 10, "worker_seconds": 80, "num_workers": 4}, 0.0, 0.3, 4),
        ({"epochs": 100, "deadline": 10, "worker_seconds": 80, "num_workers": 4}, 1.0, 0.5, 2),
    ],
    ids=["late", "paced", "cut"],
)  # fmt: skip
def test_the_stage_clock_replays_the_rounds_seer_trains(
    options: dict[str, Any], startup: float, epoch: float, workers: int
) -> None:
    """What the planner simulates (the spec's clock) is what SEER does on the same clock:
    per round, the members of each bracket that train."""
    clock = FakeClock()
    proc = SEER(SPACE, metric="score", mode="max", rng=np.random.default_rng(0), clock=clock,
                **options)  # fmt: skip
    stage_clock = proc.stage_spec().clock
    assert stage_clock is not None

    def seconds(round_index: int, training: tuple[int, ...]) -> tuple[float, float]:
        busy = sum(n * p for n, p in zip(training, stage_clock.resources, strict=True))
        return (startup if round_index == 0 else 0.0), epoch * max(1.0, busy / workers)

    expected = stage_clock.rounds(seconds, options["deadline"])
    clock.now = startup
    rng = np.random.default_rng(1)
    epochs: dict[str, int] = {}
    live: list[str] = []
    trained: list[tuple[int, ...]] = []
    while not (proc.is_finished() and not live):
        for spec in proc.suggest():
            epochs[spec.trial_id] = 0
        live += proc.resumed()
        live = sorted(set(live) | {t for t in epochs if epochs[t] == 0})
        if not live:
            break
        training = [0] * len(stage_clock.resources)
        for trial_id in live:
            training[proc.bracket(trial_id) or 0] += 1
        trained.append(tuple(training))
        clock.now += seconds(len(trained), tuple(training))[1]
        going = []
        for trial_id in live:
            epochs[trial_id] += 1
            decision = proc.on_epoch_end(report(trial_id, epochs[trial_id], float(rng.random())))
            if decision is Decision.CONTINUE:
                going.append(trial_id)
        live = going
    assert trained == expected
    assert len(trained) > len(proc.plan.stages)  # not one round per stage: something to check


def test_registered_as_seer() -> None:
    proc = make_procedure(
        "seer",
        space=SPACE,
        epochs=5,
        metric="score",
        mode="max",
        rng=np.random.default_rng(0),
        deadline=10.0,
        num_workers=8,
    )
    assert isinstance(proc, SEER)


def test_reports_out_of_protocol_are_rejected() -> None:
    clock = FakeClock()
    proc, _, _ = stage_one(clock)
    with pytest.raises(ValueError, match="trial 't0000', which is paused or stopped"):
        proc.on_epoch_end(report("t0000", 2, 0.5))
    with pytest.raises(ValueError, match="trial 't9999', which is unknown"):
        proc.on_epoch_end(report("t9999", 1, 0.5))


def test_a_deadline_passed_before_the_first_round_suggests_nothing() -> None:
    """Start-up alone may take the deadline: SEER is finished then and suggests no trial
    (the epoch template refuses a finished procedure's suggestions)."""
    clock = FakeClock()
    procedure = seer(clock)
    clock.now = 10.0  # the default deadline of these tests
    assert procedure.is_finished()
    assert procedure.suggest() == []
    assert procedure.resumed() == []
