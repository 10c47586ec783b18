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
    GridSearch,
    RandomSearch,
    SearchProcedure,
    SearchSpace,
)

FINITE = SearchSpace.from_config(
    {
        "lr": {"grid": [0.1, 0.01, 0.001]},
        "optimizer": {"name": "adam", "beta1": {"choice": [0.9, 0.95]}},
        "layers": [64, 32],
    }
)
BRANCHES = SearchSpace.from_config(
    {
        "choice": [
            {"model": "pkg:MLPSpec", "hidden": {"int": [1, 3]}},
            {"model": "pkg:CNNSpec", "channels": {"quantized": {"uniform": [8, 32]}, "q": 8}},
        ]
    }
)
CONTINUOUS = SearchSpace.from_config(
    {
        "lr": {"loguniform": [1e-4, 1e-1]},
        "dropout": {"uniform": [0.0, 0.5]},
        "width": {"int": [8, 256], "log": True},
        "act": {"choice": ["relu", "gelu"]},
    }
)


def grid(space: SearchSpace = FINITE, **kwargs: Any) -> GridSearch:
    kwargs.setdefault("epochs", 3)
    kwargs.setdefault("metric", "score")
    kwargs.setdefault("mode", "max")
    kwargs.setdefault("rng", np.random.default_rng(0))
    return GridSearch(space, **kwargs)


def rand(space: SearchSpace = CONTINUOUS, **kwargs: Any) -> RandomSearch:
    kwargs.setdefault("num_trials", 5)
    kwargs.setdefault("epochs", 3)
    kwargs.setdefault("metric", "score")
    kwargs.setdefault("mode", "max")
    kwargs.setdefault("rng", np.random.default_rng(0))
    return RandomSearch(space, **kwargs)


def report(trial_id: str, epoch: int, score: float = 0.5) -> EpochReport:
    return EpochReport(trial_id, epoch, {"score": score, "loss": 1 - score})


# --- the contract, for several configurations


class TestGridContract(ProcedureContract):
    def make(self, rng: np.random.Generator, clock: Clock) -> SearchProcedure:
        return GridSearch(
            FINITE, epochs=3, metric=self.metric, mode=self.mode, rng=rng, clock=clock
        )


class TestGridBranchesConcurrencyContract(ProcedureContract):
    metric = "loss"
    mode = "min"

    def make(self, rng: np.random.Generator, clock: Clock) -> SearchProcedure:
        return GridSearch(
            BRANCHES,
            epochs=2,
            metric=self.metric,
            mode=self.mode,
            rng=rng,
            clock=clock,
            repeats=2,
            max_concurrent=3,
        )


class TestRandomContract(ProcedureContract):
    def make(self, rng: np.random.Generator, clock: Clock) -> SearchProcedure:
        return RandomSearch(
            CONTINUOUS,
            num_trials=8,
            epochs=2,
            metric=self.metric,
            mode=self.mode,
            rng=rng,
            clock=clock,
        )


class TestRandomConcurrencyContract(ProcedureContract):
    def make(self, rng: np.random.Generator, clock: Clock) -> SearchProcedure:
        return RandomSearch(
            CONTINUOUS,
            num_trials=7,
            epochs=3,
            metric=self.metric,
            mode=self.mode,
            rng=rng,
            clock=clock,
            max_concurrent=2,
        )


# --- grid search


def test_grid_suggests_every_point_once_in_grid_order() -> None:
    proc = grid()
    specs = proc.suggest()
    assert [dict(s.params) for s in specs] == FINITE.grid()
    assert len(specs) == 6
    assert [s.trial_id for s in specs] == [f"t{i:04d}" for i in range(6)]
    assert all(s.clone_from is None for s in specs)
    assert proc.suggest() == []


def test_grid_branches_expand_separately() -> None:
    specs = grid(BRANCHES).suggest()
    assert [dict(s.params) for s in specs] == [
        {"model": "pkg:MLPSpec", "hidden": 1},
        {"model": "pkg:MLPSpec", "hidden": 2},
        {"model": "pkg:MLPSpec", "hidden": 3},
        {"model": "pkg:CNNSpec", "channels": 8},
        {"model": "pkg:CNNSpec", "channels": 16},
        {"model": "pkg:CNNSpec", "channels": 24},
        {"model": "pkg:CNNSpec", "channels": 32},
    ]


def test_grid_continues_until_epochs_then_stops() -> None:
    proc = grid(epochs=3)
    ids = [s.trial_id for s in proc.suggest()]
    for epoch in (1, 2):
        for trial_id in ids:
            assert proc.on_epoch_end(report(trial_id, epoch)) is Decision.CONTINUE
        assert not proc.is_finished()
    for trial_id in ids[:-1]:
        assert proc.on_epoch_end(report(trial_id, 3)) is Decision.STOP
        assert not proc.is_finished()
    assert proc.on_epoch_end(report(ids[-1], 3)) is Decision.STOP
    assert proc.is_finished()
    assert proc.suggest() == []
    assert proc.resumed() == []


def test_grid_metric_values_do_not_change_decisions() -> None:
    proc = grid(epochs=2)
    first, second = (s.trial_id for s in proc.suggest()[:2])
    assert proc.on_epoch_end(report(first, 1, score=0.99)) is Decision.CONTINUE
    assert proc.on_epoch_end(report(second, 1, score=float("nan"))) is Decision.CONTINUE


def test_grid_one_epoch_stops_at_first_report() -> None:
    proc = grid(epochs=1)
    specs = proc.suggest()
    assert {proc.on_epoch_end(report(s.trial_id, 1)) for s in specs} == {Decision.STOP}
    assert proc.is_finished()


def test_grid_repeats_whole_grid() -> None:
    specs = grid(repeats=2).suggest()
    params = [dict(s.params) for s in specs]
    assert params == FINITE.grid() * 2
    assert len({s.trial_id for s in specs}) == 12


def test_grid_max_concurrent_refills_as_trials_stop() -> None:
    proc = grid(epochs=1, max_concurrent=4)
    first = proc.suggest()
    assert [dict(s.params) for s in first] == FINITE.grid()[:4]
    assert proc.suggest() == []
    assert proc.on_epoch_end(report(first[0].trial_id, 1)) is Decision.STOP
    refill = proc.suggest()
    assert [dict(s.params) for s in refill] == [FINITE.grid()[4]]
    assert refill[0].trial_id == "t0004"


def test_a_failed_trial_frees_its_place_and_ends_like_a_stopped_one() -> None:
    proc = grid(epochs=2, max_concurrent=4)
    first = proc.suggest()
    proc.on_trial_failed(first[1].trial_id)
    refill = proc.suggest()
    assert [s.trial_id for s in refill] == ["t0004"]
    assert proc.state_dict()["stopped"] == [first[1].trial_id]
    with pytest.raises(ValueError, match="already stopped"):
        proc.on_epoch_end(report(first[1].trial_id, 1))
    proc.on_trial_failed("t9999")  # unknown: nothing to do
    for spec in proc.suggest() + [s for s in first if s is not first[1]] + refill:
        proc.on_trial_failed(spec.trial_id)
    while not proc.is_finished():
        specs = proc.suggest()
        assert specs, "the grid stalled with failed trials counted as live"
        for spec in specs:
            proc.on_trial_failed(spec.trial_id)


def test_grid_params_are_independent_copies() -> None:
    proc = grid()
    specs = proc.suggest()
    specs[0].params["layers"].append(999)
    assert specs[1].params["layers"] == [64, 32]
    assert FINITE.grid()[0]["layers"] == [64, 32]


def test_grid_rejects_continuous_space_naming_the_param() -> None:
    with pytest.raises(ConfigError, match=r"space\.lr: loguniform is continuous"):
        grid(CONTINUOUS)


def test_grid_rejects_huge_grid() -> None:
    space = SearchSpace({"a": {"int": [1, 1000]}, "b": {"int": [1, 1000]}})
    with pytest.raises(ConfigError, match="1000000 trials, more than 100000"):
        grid(space)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"epochs": 0}, r"epochs must be an integer >= 1, got 0"),
        ({"epochs": True}, r"epochs must be an integer >= 1, got True"),
        ({"epochs": 2.0}, r"epochs must be an integer >= 1, got 2.0"),
        ({"repeats": 0}, r"repeats must be an integer >= 1, got 0"),
        ({"max_concurrent": 0}, r"max_concurrent must be an integer >= 1, got 0"),
        ({"mode": "best"}, r"mode must be 'min' or 'max', got 'best'"),
        ({"metric": ""}, r"metric must be a non-empty"),
    ],
)
def test_grid_validates_arguments(kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        grid(**kwargs)


def test_procedures_need_a_search_space() -> None:
    with pytest.raises(ConfigError, match=r"space must be a SearchSpace.*got dict"):
        grid({"lr": {"grid": [1, 2]}})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="space must be a SearchSpace"):
        rand({"lr": {"uniform": [1, 2]}})  # type: ignore[arg-type]


def test_reports_out_of_protocol_are_rejected() -> None:
    proc = grid(epochs=1)
    trial_id = proc.suggest()[0].trial_id
    with pytest.raises(ValueError, match=r"trial 't9999', which is unknown"):
        proc.on_epoch_end(report("t9999", 1))
    with pytest.raises(ValueError, match=r"report.epoch must be 1 .* got 2"):
        proc.on_epoch_end(report(trial_id, 2))
    assert proc.on_epoch_end(report(trial_id, 1)) is Decision.STOP
    with pytest.raises(ValueError, match="which is already stopped"):
        proc.on_epoch_end(report(trial_id, 2))


def test_missing_metric_names_trial_and_metrics() -> None:
    proc = grid(metric="accuracy")
    trial_id = proc.suggest()[0].trial_id
    with pytest.raises(ConfigError) as err:
        proc.on_epoch_end(report(trial_id, 1))
    assert str(err.value) == (
        "metric 'accuracy' is missing from the report of trial t0000 (epoch 1); "
        "it reported: loss, score"
    )


def test_state_from_other_arguments_is_refused() -> None:
    state = grid(epochs=3).state_dict()
    with pytest.raises(ConfigError, match="the state has epochs=3 but this procedure has epochs=4"):
        grid(epochs=4).load_state_dict(state)
    with pytest.raises(ConfigError, match="the state has total=6 but this procedure has total=12"):
        grid(repeats=2).load_state_dict(state)


def test_grid_state_records_progress() -> None:
    proc = grid(epochs=2)
    ids = [s.trial_id for s in proc.suggest()]
    proc.on_epoch_end(report(ids[0], 1))
    proc.on_epoch_end(report(ids[0], 2))
    proc.on_epoch_end(report(ids[1], 1))
    state = json.loads(json.dumps(proc.state_dict()))
    assert state["suggested"] == 6
    assert state["stopped"] == [ids[0]]
    assert state["live"] == {ids[1]: 1, **{t: 0 for t in ids[2:]}}
    restored = grid(epochs=2)
    restored.load_state_dict(state)
    assert restored.suggest() == []
    assert restored.on_epoch_end(report(ids[1], 2)) is Decision.STOP
    with pytest.raises(ValueError, match="already stopped"):
        restored.on_epoch_end(report(ids[0], 3))


# --- random search


def test_random_samples_num_trials_from_the_rng() -> None:
    specs = rand(num_trials=5, rng=np.random.default_rng(7)).suggest()
    expected_rng = np.random.default_rng(7)
    assert [dict(s.params) for s in specs] == [CONTINUOUS.sample(expected_rng) for _ in range(5)]
    assert len({json.dumps(dict(s.params), sort_keys=True) for s in specs}) == 5


def test_random_seeds_change_the_samples() -> None:
    a = [dict(s.params) for s in rand(rng=np.random.default_rng(1)).suggest()]
    b = [dict(s.params) for s in rand(rng=np.random.default_rng(2)).suggest()]
    assert a != b


def test_random_trial_params_do_not_depend_on_max_concurrent() -> None:
    all_at_once = [dict(s.params) for s in rand(num_trials=6).suggest()]
    proc = rand(num_trials=6, epochs=1, max_concurrent=2)
    seen: list[dict[str, Any]] = []
    while not proc.is_finished():
        specs = proc.suggest()
        assert len(specs) <= 2
        seen += [dict(s.params) for s in specs]
        for spec in specs:
            assert proc.on_epoch_end(report(spec.trial_id, 1)) is Decision.STOP
    assert seen == all_at_once


def test_random_max_concurrent_limits_live_trials() -> None:
    proc = rand(num_trials=5, epochs=2, max_concurrent=3)
    first = proc.suggest()
    assert len(first) == 3
    assert proc.on_epoch_end(report(first[0].trial_id, 1)) is Decision.CONTINUE
    assert proc.suggest() == []
    assert proc.on_epoch_end(report(first[0].trial_id, 2)) is Decision.STOP
    assert [s.trial_id for s in proc.suggest()] == ["t0003"]


def test_random_decisions_follow_the_epoch_budget() -> None:
    proc = rand(num_trials=2, epochs=2)
    a, b = (s.trial_id for s in proc.suggest())
    assert proc.on_epoch_end(report(a, 1)) is Decision.CONTINUE
    assert proc.on_epoch_end(report(b, 1)) is Decision.CONTINUE
    assert proc.on_epoch_end(report(a, 2)) is Decision.STOP
    assert not proc.is_finished()
    assert proc.on_epoch_end(report(b, 2)) is Decision.STOP
    assert proc.is_finished()


def test_random_resume_restores_the_rng() -> None:
    proc = rand(num_trials=6, epochs=1, max_concurrent=2, rng=np.random.default_rng(3))
    for spec in proc.suggest():
        proc.on_epoch_end(report(spec.trial_id, 1))
    state = json.loads(json.dumps(proc.state_dict()))
    restored = rand(num_trials=6, epochs=1, max_concurrent=2, rng=np.random.default_rng(99))
    restored.load_state_dict(state)
    assert restored.suggest() == proc.suggest()


def test_random_branch_samples_are_flat_params() -> None:
    specs = rand(BRANCHES, num_trials=40).suggest()
    models = {s.params["model"] for s in specs}
    assert models == {"pkg:MLPSpec", "pkg:CNNSpec"}
    for spec in specs:
        if spec.params["model"] == "pkg:MLPSpec":
            assert set(spec.params) == {"model", "hidden"}
        else:
            assert set(spec.params) == {"model", "channels"}
            assert spec.params["channels"] in (8, 16, 24, 32)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"num_trials": 0}, r"num_trials must be an integer >= 1, got 0"),
        ({"num_trials": "5"}, r"num_trials must be an integer >= 1, got '5'"),
        ({"epochs": -1}, r"epochs must be an integer >= 1, got -1"),
        ({"max_concurrent": 1.5}, r"max_concurrent must be an integer >= 1, got 1.5"),
    ],
)
def test_random_validates_arguments(kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        rand(**kwargs)


def test_fake_loop_drives_random_search_to_the_end() -> None:
    clock = FakeClock()
    proc = rand(num_trials=4, epochs=3, max_concurrent=3, clock=clock)
    loop = FakeLoop(proc, clock, seed=0, metric="score")
    loop.run(max_rounds=50)
    assert loop.stopped == {f"t{i:04d}": 3 for i in range(4)}
    assert loop.rounds == 6  # 3 trials for 3 rounds, then the fourth for 3 more
    assert clock.now == 12.0
