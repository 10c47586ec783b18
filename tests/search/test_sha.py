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
from cerebro_spark.search._rungs import Bracket, rank, sha_ladder, to_score
from cerebro_spark.search._sha import SuccessiveHalving

SPACE = SearchSpace.from_config(
    {
        "lr": {"loguniform": [1e-4, 1e-1]},
        "width": {"int": [8, 256], "log": True},
        "act": {"choice": ["relu", "gelu"]},
    }
)


def sha(**kwargs: Any) -> SuccessiveHalving:
    kwargs.setdefault("num_trials", 9)
    kwargs.setdefault("epochs", 9)
    kwargs.setdefault("metric", "score")
    kwargs.setdefault("mode", "max")
    kwargs.setdefault("rng", np.random.default_rng(0))
    return SuccessiveHalving(SPACE, **kwargs)


def report(trial_id: str, epoch: int, score: float) -> EpochReport:
    return EpochReport(trial_id, epoch, {"score": score, "loss": -score})


class TestSHAContract(ProcedureContract):
    def make(self, rng: np.random.Generator, clock: Clock) -> SearchProcedure:
        return SuccessiveHalving(
            SPACE, num_trials=9, epochs=9, metric=self.metric, mode=self.mode, rng=rng, clock=clock
        )


class TestSHACappedLadderContract(ProcedureContract):
    metric = "loss"
    mode = "min"

    def make(self, rng: np.random.Generator, clock: Clock) -> SearchProcedure:
        return SuccessiveHalving(
            SPACE,
            num_trials=10,
            eta=2,
            min_epochs=2,
            epochs=7,
            metric=self.metric,
            mode=self.mode,
            rng=rng,
            clock=clock,
        )


# --- the rung ladder and ranking


@pytest.mark.parametrize(
    ("args", "ladder"),
    [
        ((1, 3, 9), [1, 3, 9]),
        ((1, 3, 10), [1, 3, 9, 10]),
        ((2, 2, 7), [2, 4, 7]),
        ((1, 3, 1), [1]),
        ((3, 3, 3), [3]),
        ((1, 2, 16), [1, 2, 4, 8, 16]),
    ],
)
def test_sha_ladder(args: tuple[int, int, int], ladder: list[int]) -> None:
    assert sha_ladder(*args) == ladder


def test_rank_puts_non_finite_last_and_breaks_ties_by_id() -> None:
    scores = {"t3": 0.5, "t1": to_score(float("nan"), "max"), "t2": 0.5, "t0": 0.9}
    assert rank(scores) == ["t0", "t2", "t3", "t1"]
    assert to_score(2.0, "min") == -2.0
    assert to_score(float("inf"), "max") is None


# --- decisions of the paper's algorithm


def test_rung_zero_keeps_three_of_nine_and_stops_six() -> None:
    proc = sha()
    ids = [s.trial_id for s in proc.suggest()]
    assert len(ids) == 9 and proc.suggest() == []
    scores = dict(zip(ids, [0.1, 0.9, 0.3, 0.8, 0.2, 0.5, 0.7, 0.4, 0.6], strict=True))
    decisions = {t: proc.on_epoch_end(report(t, 1, scores[t])) for t in ids}
    # All but the last reporter wait at the rung; the last one's report decides it.
    assert all(decisions[t] is Decision.PAUSE for t in ids[:-1])
    assert decisions[ids[-1]] is Decision.STOP  # 0.6 is 4th best
    best = [ids[1], ids[3], ids[6]]  # 0.9, 0.8, 0.7
    assert proc.resumed() == sorted(best)
    assert proc.resumed() == []
    assert not proc.is_finished()
    # Rung 1 at 3 epochs: the three survivors train epochs 2 and 3; one survives.
    for t in best:
        assert proc.on_epoch_end(report(t, 2, scores[t])) is Decision.CONTINUE
    rung1 = {ids[1]: 0.5, ids[3]: 0.95, ids[6]: 0.6}
    assert proc.on_epoch_end(report(ids[1], 3, rung1[ids[1]])) is Decision.PAUSE
    assert proc.on_epoch_end(report(ids[3], 3, rung1[ids[3]])) is Decision.PAUSE
    assert proc.on_epoch_end(report(ids[6], 3, rung1[ids[6]])) is Decision.STOP
    assert proc.resumed() == [ids[3]]
    # Last rung: the survivor trains to 9 epochs and stops.
    for epoch in range(4, 9):
        assert proc.on_epoch_end(report(ids[3], epoch, 0.99)) is Decision.CONTINUE
    assert not proc.is_finished()
    assert proc.on_epoch_end(report(ids[3], 9, 0.99)) is Decision.STOP
    assert proc.is_finished()
    assert proc.suggest() == [] and proc.resumed() == []


def test_last_reporter_that_survives_continues_without_pause() -> None:
    proc = sha(num_trials=3, epochs=3)
    ids = [s.trial_id for s in proc.suggest()]
    assert proc.on_epoch_end(report(ids[0], 1, 0.1)) is Decision.PAUSE
    assert proc.on_epoch_end(report(ids[1], 1, 0.2)) is Decision.PAUSE
    assert proc.on_epoch_end(report(ids[2], 1, 0.3)) is Decision.CONTINUE
    assert proc.resumed() == []  # the survivor never paused


def test_mode_min_keeps_the_smallest_losses() -> None:
    proc = sha(num_trials=4, eta=2, epochs=2, metric="loss", mode="min")
    ids = [s.trial_id for s in proc.suggest()]
    losses = [0.4, 0.1, 0.3, 0.2]
    decisions = [
        proc.on_epoch_end(EpochReport(t, 1, {"loss": v})) for t, v in zip(ids, losses, strict=True)
    ]
    assert decisions == [Decision.PAUSE, Decision.PAUSE, Decision.PAUSE, Decision.CONTINUE]
    assert proc.resumed() == [ids[1]]


def test_nan_metric_ranks_last() -> None:
    proc = sha(num_trials=2, eta=2, epochs=2)
    a, b = (s.trial_id for s in proc.suggest())
    assert proc.on_epoch_end(report(a, 1, float("nan"))) is Decision.PAUSE
    assert proc.on_epoch_end(report(b, 1, -5.0)) is Decision.CONTINUE
    assert proc.resumed() == []
    assert proc.on_epoch_end(report(b, 2, 0.0)) is Decision.STOP
    assert proc.is_finished()


def test_rung_sizes_follow_floor_n_over_eta() -> None:
    """n=10, η=2 keeps 5, 2, 1 at rungs 1, 2, 4 and trains the last one to 8 epochs."""
    loop = FakeLoop(sha(num_trials=10, eta=2, epochs=8), FakeClock(), seed=3, metric="score")
    loop.run(100)
    stopped_at = sorted(loop.stopped.values()) + sorted(loop.paused.values())
    # Losers of rung k stop or stay paused at its epochs; the winner stops at 8.
    assert sorted(stopped_at) == [1] * 5 + [2] * 3 + [4] * 1 + [8]
    assert max(loop.stopped.values()) == 8


def test_no_trial_trains_past_its_rung_before_the_rung_is_decided() -> None:
    proc = sha(num_trials=27, epochs=27)
    loop = FakeLoop(proc, FakeClock(), seed=1, metric="score")
    ladder = [1, 3, 9, 27]
    while not loop.done:
        loop.step()
        for trial_id, epochs in {**loop.paused, **loop.stopped}.items():
            assert epochs in ladder, (trial_id, epochs)
        # A live trial is never beyond the rung it is training towards.
        for epochs in loop.live.values():
            assert epochs < 27
    rounds = [e for e in loop.trace if e[0] == "round"]
    assert len(rounds) == 27  # one round per epoch of the longest trial: no idle rounds


# --- arguments and state


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"num_trials": 0}, r"num_trials must be an integer >= 1, got 0"),
        ({"eta": 1}, r"eta must be an integer >= 2, got 1"),
        ({"eta": 2.5}, r"eta must be an integer >= 2, got 2.5"),
        ({"min_epochs": 0}, r"min_epochs must be an integer >= 1, got 0"),
        ({"min_epochs": 10}, r"min_epochs must be <= epochs \(9\), got 10"),
        ({"epochs": 0}, r"epochs must be an integer >= 1, got 0"),
        ({"mode": "up"}, r"mode must be 'min' or 'max'"),
    ],
)
def test_sha_validates_arguments(kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        sha(**kwargs)


def test_sha_needs_a_search_space() -> None:
    with pytest.raises(ConfigError, match="space must be a SearchSpace"):
        SuccessiveHalving(
            {"lr": 1},  # type: ignore[arg-type]
            num_trials=2,
            epochs=2,
            metric="score",
            mode="max",
            rng=np.random.default_rng(0),
        )


def test_out_of_protocol_reports_are_rejected() -> None:
    proc = sha(num_trials=3, epochs=3)
    ids = [s.trial_id for s in proc.suggest()]
    with pytest.raises(ValueError, match=r"report.epoch must be 1 .* got 2"):
        proc.on_epoch_end(report(ids[0], 2, 0.5))
    assert proc.on_epoch_end(report(ids[0], 1, 0.5)) is Decision.PAUSE
    with pytest.raises(ValueError, match="not training in its bracket"):
        proc.on_epoch_end(report(ids[0], 2, 0.5))
    with pytest.raises(ValueError, match="not training"):
        proc.on_epoch_end(report("t9999", 1, 0.5))


def test_state_mid_rung_restores_the_waiting_trials() -> None:
    proc = sha(num_trials=3, epochs=3)
    ids = [s.trial_id for s in proc.suggest()]
    proc.on_epoch_end(report(ids[0], 1, 0.9))
    proc.on_epoch_end(report(ids[1], 1, 0.1))
    state = json.loads(json.dumps(proc.state_dict()))
    assert state["bracket"]["waiting"] == {ids[0]: 0.9, ids[1]: 0.1}
    restored = sha(num_trials=3, epochs=3, rng=np.random.default_rng(5))
    restored.load_state_dict(state)
    assert restored.on_epoch_end(report(ids[2], 1, 0.5)) is Decision.STOP
    assert restored.resumed() == [ids[0]]


def test_state_from_other_arguments_is_refused() -> None:
    state = sha(eta=3).state_dict()
    with pytest.raises(ConfigError, match="the state has eta=3 but this procedure has eta=2"):
        sha(eta=2).load_state_dict(state)


def test_bracket_rejects_a_ladder_that_does_not_increase() -> None:
    with pytest.raises(ValueError, match="increasing"):
        Bracket([1, 3, 3], 3)


def test_registered_as_sha() -> None:
    assert procedure_options("sha") == {"num_trials": True, "eta": False, "min_epochs": False}
    proc = make_procedure(
        "sha",
        space=SPACE,
        epochs=4,
        metric="score",
        mode="max",
        rng=np.random.default_rng(0),
        num_trials=4,
        eta=2,
    )
    assert type(proc) is SuccessiveHalving
    assert proc.suggest()
