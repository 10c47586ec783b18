from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
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
from cerebro_spark.search._tpe import TPESearch, build_params, optuna_distributions

SPACE = SearchSpace.from_config(
    {
        "lr": {"loguniform": [1e-4, 1e-1]},
        "dropout": {"uniform": [0.0, 0.5]},
        "optimizer": {"name": "adam", "beta1": {"quantized": {"uniform": [0.8, 0.99]}, "q": 0.01}},
        "width": {"int": [8, 256], "log": True},
        "layers": {"grid": [[64], [64, 32]]},
    }
)
BRANCHES = SearchSpace.from_config(
    {
        "choice": [
            {"model": "pkg:MLPSpec", "hidden": {"int": [1, 3]}},
            {
                "model": "pkg:CNNSpec",
                "channels": {"quantized": {"loguniform": [8, 64]}, "q": 8},
                "act": {"choice": ["relu", {"uniform": [0.0, 0.3]}]},
            },
        ]
    }
)


def tpe(space: SearchSpace = SPACE, **kwargs: Any) -> TPESearch:
    kwargs.setdefault("num_trials", 6)
    kwargs.setdefault("epochs", 1)
    kwargs.setdefault("metric", "score")
    kwargs.setdefault("mode", "max")
    kwargs.setdefault("rng", np.random.default_rng(0))
    return TPESearch(space, **kwargs)


class TestTPEContract(ProcedureContract):
    resume_points = 6

    def make(self, rng: np.random.Generator, clock: Clock) -> SearchProcedure:
        return TPESearch(
            SPACE,
            num_trials=12,
            epochs=2,
            max_concurrent=3,
            n_startup_trials=4,
            metric=self.metric,
            mode=self.mode,
            rng=rng,
            clock=clock,
        )


class TestTPEBranchesContract(ProcedureContract):
    metric = "loss"
    mode = "min"
    resume_points = 6

    def make(self, rng: np.random.Generator, clock: Clock) -> SearchProcedure:
        return TPESearch(
            BRANCHES,
            num_trials=10,
            epochs=1,
            num_workers=2,
            n_startup_trials=3,
            metric=self.metric,
            mode=self.mode,
            rng=rng,
            clock=clock,
        )


# --- conversion of the space


def test_space_becomes_optuna_distributions() -> None:
    assert optuna_distributions(SPACE) == {
        "lr": FloatDistribution(1e-4, 1e-1, log=True),
        "dropout": FloatDistribution(0.0, 0.5),
        "optimizer.beta1": IntDistribution(80, 99),
        "width": IntDistribution(8, 256, log=True),
        "layers": CategoricalDistribution((0, 1)),
    }


def test_branches_are_flattened_with_a_branch_categorical() -> None:
    assert optuna_distributions(BRANCHES) == {
        "choice": CategoricalDistribution((0, 1)),
        "choice[0].hidden": IntDistribution(1, 3),
        "choice[1].channels": IntDistribution(1, 8, log=True),
        "choice[1].act": CategoricalDistribution((0, 1)),
        "choice[1].act[1]": FloatDistribution(0.0, 0.3),
    }


def test_build_params_maps_optuna_values_back() -> None:
    values = {"choice": 1, "choice[1].channels": 3, "choice[1].act": 1, "choice[1].act[1]": 0.2}
    root = BRANCHES._root
    assert build_params(root, values.__getitem__) == {
        "model": "pkg:CNNSpec",
        "channels": 24,
        "act": 0.2,
    }
    values = {"lr": 0.01, "dropout": 0.1, "optimizer.beta1": 93, "width": 16, "layers": 1}
    assert build_params(SPACE._root, values.__getitem__) == {
        "lr": 0.01,
        "dropout": 0.1,
        "optimizer": {"name": "adam", "beta1": 0.93},
        "width": 16,
        "layers": [64, 32],
    }


def test_colliding_names_are_a_config_error() -> None:
    space = SearchSpace({"a.b": {"uniform": [0, 1]}, "a": {"b": {"uniform": [0, 1]}}})
    with pytest.raises(ConfigError, match=r"two params are named 'a.b'"):
        tpe(space)


# --- ask and tell


def test_proposes_num_trials_and_tells_the_final_metric() -> None:
    proc = tpe(num_trials=5, epochs=2, max_concurrent=2)
    specs = proc.suggest()
    assert [s.trial_id for s in specs] == ["t0000", "t0001"]
    assert proc.suggest() == []
    seen = list(specs)
    while not proc.is_finished():
        for spec in list(seen):
            trial_id = spec.trial_id
            assert proc.on_epoch_end(EpochReport(trial_id, 1, {"score": 0.1})) is (
                Decision.CONTINUE
            )
            score = float(spec.params["dropout"])
            assert proc.on_epoch_end(EpochReport(trial_id, 2, {"score": score})) is Decision.STOP
            seen.remove(spec)
        seen += proc.suggest()
    study = proc._get_study()
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 5
    assert study.direction.name == "MAXIMIZE"
    state = proc.state_dict()
    assert [r["trial_id"] for r in state["trials"]] == [f"t{i:04d}" for i in range(5)]
    assert all(r["value"] == r["params"]["dropout"] for r in state["trials"])


def test_deterministic_for_a_seed_and_seeds_differ() -> None:
    def params(seed: int) -> list[dict[str, Any]]:
        loop = FakeLoop(tpe(num_trials=8, n_startup_trials=3, rng=np.random.default_rng(seed)),
                        FakeClock(), seed=seed, metric="score")  # fmt: skip
        loop.run(50)
        return list(loop.params.values())

    assert params(1) == params(1)
    assert params(1) != params(2)


def test_tpe_uses_the_told_values() -> None:
    """Maximise -(x-0.8)²: after 10 random configs TPE proposes x near 0.8 more often."""
    space = SearchSpace({"x": {"uniform": [0.0, 1.0]}})
    proc = tpe(space, num_trials=40, max_concurrent=1, n_startup_trials=10)
    xs = []
    while not proc.is_finished():
        (spec,) = proc.suggest()
        x = float(spec.params["x"])
        xs.append(x)
        proc.on_epoch_end(EpochReport(spec.trial_id, 1, {"score": -((x - 0.8) ** 2)}))
    random_part = np.mean([abs(x - 0.8) for x in xs[:10]])
    tpe_part = np.mean([abs(x - 0.8) for x in xs[20:]])
    assert tpe_part < random_part / 2


def test_non_finite_metric_fails_the_optuna_trial() -> None:
    proc = tpe(num_trials=1)
    (spec,) = proc.suggest()
    assert proc.on_epoch_end(EpochReport(spec.trial_id, 1, {"score": float("nan")})) is (
        Decision.STOP
    )
    assert proc._get_study().trials[0].state.name == "FAIL"
    state = json.loads(json.dumps(proc.state_dict()))
    assert state["trials"][0]["state"] == "fail"
    restored = tpe(num_trials=1)
    restored.load_state_dict(state)
    assert restored._get_study().trials[0].state.name == "FAIL"
    assert restored.is_finished()


def test_restored_study_matches_the_live_one() -> None:
    proc = tpe(num_trials=8, max_concurrent=3, n_startup_trials=2)
    specs = proc.suggest()
    proc.on_epoch_end(EpochReport(specs[0].trial_id, 1, {"score": 0.3}))
    state = json.loads(json.dumps(proc.state_dict()))
    restored = tpe(num_trials=8, max_concurrent=3, n_startup_trials=2)
    restored.load_state_dict(state)
    live = [(t.number, t.state, t.params, t.value) for t in proc._get_study().trials]
    rebuilt = [(t.number, t.state, t.params, t.value) for t in restored._get_study().trials]
    assert rebuilt == live
    assert restored.suggest() == proc.suggest()
    assert restored.on_epoch_end(EpochReport(specs[1].trial_id, 1, {"score": 0.5})) is (
        Decision.STOP
    )


def test_max_concurrent_defaults_to_num_workers_then_four() -> None:
    assert tpe().max_concurrent == 4
    assert tpe(num_workers=3).max_concurrent == 3
    assert tpe(num_workers=3, max_concurrent=5).max_concurrent == 5


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"num_trials": 0}, r"num_trials must be an integer >= 1, got 0"),
        ({"max_concurrent": 0}, r"max_concurrent must be an integer >= 1, got 0"),
        ({"num_workers": -1}, r"num_workers must be an integer >= 1, got -1"),
        ({"n_startup_trials": -1}, r"n_startup_trials must be an integer >= 0, got -1"),
        ({"epochs": 0}, r"epochs must be an integer >= 1, got 0"),
    ],
)
def test_tpe_validates_arguments(kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        tpe(**kwargs)


def test_out_of_protocol_reports_are_rejected() -> None:
    proc = tpe(num_trials=1, epochs=2)
    (spec,) = proc.suggest()
    with pytest.raises(ValueError, match=r"report.epoch must be 1"):
        proc.on_epoch_end(EpochReport(spec.trial_id, 2, {"score": 0.0}))
    with pytest.raises(ValueError, match="which is not live"):
        proc.on_epoch_end(EpochReport("t0404", 1, {"score": 0.0}))


def test_state_from_another_space_is_refused() -> None:
    proc = tpe(num_trials=2)
    proc.suggest()
    state = json.loads(json.dumps(proc.state_dict()))
    other = tpe(SearchSpace({"y": {"uniform": [0, 1]}}), num_trials=2)
    with pytest.raises(ConfigError, match=r"cannot resume TPESearch: trial t0000 has params"):
        other.load_state_dict(state)
    with pytest.raises(ConfigError, match="the state has num_trials=2"):
        tpe(num_trials=3).load_state_dict(state)


def test_registered_as_tpe() -> None:
    assert procedure_options("tpe") == {
        "num_trials": True,
        "max_concurrent": False,
        "num_workers": False,
        "n_startup_trials": False,
    }
    proc = make_procedure(
        "tpe",
        space=SPACE,
        epochs=4,
        metric="score",
        mode="max",
        rng=np.random.default_rng(0),
        num_trials=3,
        num_workers=2,
    )
    assert type(proc) is TPESearch
    assert proc.suggest()
