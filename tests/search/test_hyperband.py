from __future__ import annotations

import json
from collections import Counter
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
from cerebro_spark.search._hyperband import Hyperband, hyperband_brackets

SPACE = SearchSpace.from_config(
    {"lr": {"loguniform": [1e-4, 1e-1]}, "units": {"quantized": {"uniform": [8, 64]}, "q": 8}}
)


def hyperband(**kwargs: Any) -> Hyperband:
    kwargs.setdefault("epochs", 27)
    kwargs.setdefault("metric", "score")
    kwargs.setdefault("mode", "max")
    kwargs.setdefault("rng", np.random.default_rng(0))
    return Hyperband(SPACE, **kwargs)


class TestHyperbandContract(ProcedureContract):
    def make(self, rng: np.random.Generator, clock: Clock) -> SearchProcedure:
        return Hyperband(SPACE, epochs=9, metric=self.metric, mode=self.mode, rng=rng, clock=clock)


class TestHyperbandSequentialContract(ProcedureContract):
    metric = "loss"
    mode = "min"

    def make(self, rng: np.random.Generator, clock: Clock) -> SearchProcedure:
        return Hyperband(
            SPACE,
            epochs=4,
            eta=2,
            concurrent=False,
            metric=self.metric,
            mode=self.mode,
            rng=rng,
            clock=clock,
        )


# --- the bracket table


def test_brackets_for_r27_eta3() -> None:
    """n = ⌈(s_max+1)/(s+1)·η^s⌉, r_i = R·η^(i-s): s=2 gives ⌈4/3·9⌉ = 12 trials."""
    assert hyperband_brackets(27, 3) == [
        (27, [1, 3, 9, 27]),
        (12, [3, 9, 27]),
        (6, [9, 27]),
        (4, [27]),
    ]


def test_bracket_sizes_match_the_hyperband_paper_table_for_r81() -> None:
    """Li et al., Hyperband, Table 1 (R=81, η=3): n = 81, 34, 15, 8, 5 at r = 1, 3, 9, 27, 81."""
    brackets = hyperband_brackets(81, 3)
    assert [n for n, _ in brackets] == [81, 34, 15, 8, 5]
    assert [rungs[0] for _, rungs in brackets] == [1, 3, 9, 27, 81]
    assert all(rungs[-1] == 81 for _, rungs in brackets)


def test_brackets_round_rungs_when_r_is_not_a_power_of_eta() -> None:
    assert hyperband_brackets(10, 3) == [(9, [1, 3, 10]), (5, [3, 10]), (3, [10])]
    assert hyperband_brackets(9, 3, min_epochs=2) == [(3, [3, 9]), (2, [9])]
    assert hyperband_brackets(1, 3) == [(1, [1])]


def test_survivors_per_rung_follow_floor_n_eta_to_the_minus_i() -> None:
    """Run R=27, η=3 to the end: in each bracket rung i ends with ⌊n·η^-i⌋ trials."""
    proc = hyperband(epochs=27)
    loop = FakeLoop(proc, FakeClock(), seed=2, metric="score")
    loop.run(100)
    assert len(loop.params) == 27 + 12 + 6 + 4
    ended = Counter({**loop.paused, **loop.stopped}.values())
    # Epochs at which trials ended, summed over brackets:
    # s=3: 18 at 1, 6 at 3, 2 at 9, 1 at 27; s=2: 8 at 3, 3 at 9, 1 at 27;
    # s=1: 4 at 9, 2 at 27; s=0: 4 at 27.
    assert ended == Counter({1: 18, 3: 6 + 8, 9: 2 + 3 + 4, 27: 1 + 1 + 2 + 4})
    assert loop.rounds == 27  # concurrent brackets: one round per epoch of the longest


def test_concurrent_suggests_every_bracket_at_once() -> None:
    proc = hyperband(epochs=27)
    specs = proc.suggest()
    assert len(specs) == 49
    assert [s.trial_id for s in specs] == [f"t{i:04d}" for i in range(49)]
    assert proc.suggest() == []


def test_sequential_starts_a_bracket_when_the_previous_is_done() -> None:
    proc = hyperband(epochs=3, concurrent=False)  # brackets (3, [1, 3]), (2, [3])
    first = [s.trial_id for s in proc.suggest()]
    assert len(first) == 3
    assert proc.suggest() == []
    decisions = [
        proc.on_epoch_end(EpochReport(t, 1, {"score": float(i)})) for i, t in enumerate(first)
    ]
    assert decisions == [Decision.PAUSE, Decision.PAUSE, Decision.CONTINUE]
    assert proc.suggest() == []  # bracket 0 still runs its last trial
    assert proc.on_epoch_end(EpochReport(first[2], 2, {"score": 1.0})) is Decision.CONTINUE
    assert proc.on_epoch_end(EpochReport(first[2], 3, {"score": 1.0})) is Decision.STOP
    second = proc.suggest()
    assert [s.trial_id for s in second] == ["t0003", "t0004"]
    assert not proc.is_finished()
    for spec in second:
        for epoch in (1, 2):
            assert proc.on_epoch_end(EpochReport(spec.trial_id, epoch, {"score": 0.0})) is (
                Decision.CONTINUE
            )
        assert proc.on_epoch_end(EpochReport(spec.trial_id, 3, {"score": 0.0})) is Decision.STOP
    assert proc.is_finished()


def test_brackets_decide_their_rungs_independently() -> None:
    proc = hyperband(epochs=3)  # brackets (3, [1, 3]) and (2, [3])
    ids = [s.trial_id for s in proc.suggest()]
    assert len(ids) == 5
    decisions = [proc.on_epoch_end(EpochReport(t, 1, {"score": 0.5})) for t in ids]
    # Bracket 0 (t0000-t0002) waits at rung 1 until its last trial; bracket 1 trains on.
    # One of bracket 0's three survives; the tie goes to the oldest trial.
    assert decisions == [Decision.PAUSE, Decision.PAUSE, Decision.STOP] + [Decision.CONTINUE] * 2
    assert proc.resumed() == ["t0000"]


def test_unknown_trial_is_rejected() -> None:
    proc = hyperband(epochs=3)
    proc.suggest()
    with pytest.raises(ValueError, match="which is unknown"):
        proc.on_epoch_end(EpochReport("t0999", 1, {"score": 1.0}))


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"eta": 1}, r"eta must be an integer >= 2, got 1"),
        ({"min_epochs": 28}, r"min_epochs must be <= epochs \(27\), got 28"),
        ({"concurrent": "yes"}, r"concurrent must be true or false, got 'yes'"),
        ({"epochs": -3}, r"epochs must be an integer >= 1, got -3"),
    ],
)
def test_hyperband_validates_arguments(kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        hyperband(**kwargs)


def test_state_from_other_arguments_is_refused() -> None:
    state = json.loads(json.dumps(hyperband(concurrent=True).state_dict()))
    with pytest.raises(ConfigError, match="the state has concurrent=True"):
        hyperband(concurrent=False).load_state_dict(state)


def test_registered_as_hyperband() -> None:
    assert procedure_options("hyperband") == {
        "eta": False,
        "min_epochs": False,
        "concurrent": False,
    }
    proc = make_procedure(
        "hyperband",
        space=SPACE,
        epochs=4,
        metric="score",
        mode="max",
        rng=np.random.default_rng(0),
        eta=2,
        concurrent=False,
    )
    assert type(proc) is Hyperband
    assert proc.suggest()
