from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from procedure_contract import FakeClock, FakeLoop, ProcedureContract

from cerebro_spark.errors import ConfigError
from cerebro_spark.search import (
    Clock,
    Decision,
    EpochReport,
    LogUniform,
    SearchProcedure,
    SearchSpace,
    make_procedure,
    procedure_options,
)
from cerebro_spark.search._pbt import PBT, explore, parse_mutations, perturb

SPACE = SearchSpace.from_config(
    {
        "lr": {"loguniform": [1e-4, 1e-1]},
        "optimizer": {"name": "sgd", "momentum": {"uniform": [0.5, 0.99]}},
        "batch": {"choice": [16, 32, 64, 128]},
        "width": 64,
    }
)
MUTATIONS = {
    "lr": {"loguniform": [1e-4, 1e-1]},
    "optimizer": {"momentum": {"uniform": [0.5, 0.99]}},
    "batch": [16, 32, 64, 128],
}


def pbt(**kwargs: Any) -> PBT:
    kwargs.setdefault("population", 4)
    kwargs.setdefault("epochs", 4)
    kwargs.setdefault("hyperparam_mutations", MUTATIONS)
    kwargs.setdefault("metric", "score")
    kwargs.setdefault("mode", "max")
    kwargs.setdefault("rng", np.random.default_rng(0))
    return PBT(SPACE, **kwargs)


def report(trial_id: str, epoch: int, score: float) -> EpochReport:
    return EpochReport(trial_id, epoch, {"score": score})


class TestPBTContract(ProcedureContract):
    def make(self, rng: np.random.Generator, clock: Clock) -> SearchProcedure:
        return PBT(
            SPACE,
            epochs=6,
            population=4,
            perturbation_interval=2,
            hyperparam_mutations=MUTATIONS,
            metric=self.metric,
            mode=self.mode,
            rng=rng,
            clock=clock,
        )


class TestPBTHalfQuantileContract(ProcedureContract):
    metric = "loss"
    mode = "min"

    def make(self, rng: np.random.Generator, clock: Clock) -> SearchProcedure:
        return PBT(
            SPACE,
            epochs=5,
            population=5,
            quantile=0.5,
            resample_probability=0.5,
            hyperparam_mutations={"lr": {"loguniform": [1e-4, 1e-1]}},
            metric=self.metric,
            mode=self.mode,
            rng=rng,
            clock=clock,
        )


def test_bottom_quantile_is_replaced_by_a_perturbed_clone_of_a_top_member() -> None:
    proc = pbt(resample_probability=0.0, epochs=3)
    population = proc.suggest()
    members = [s.trial_id for s in population]
    assert members == ["t0000", "t0001", "t0002", "t0003"]
    params = {s.trial_id: dict(s.params) for s in population}
    # Epoch 1 is a perturbation point: all wait until the last member reports.
    assert proc.on_epoch_end(report("t0000", 1, 0.1)) is Decision.PAUSE
    assert proc.on_epoch_end(report("t0001", 1, 0.4)) is Decision.PAUSE
    assert proc.on_epoch_end(report("t0002", 1, 0.3)) is Decision.PAUSE
    # k = min(⌈0.25·4⌉, 2) = 1: t0000 (0.1) is replaced by a clone of t0001 (0.4);
    # t0003 (the last reporter, 3rd) continues, t0001 and t0002 are resumed.
    assert proc.on_epoch_end(report("t0003", 1, 0.2)) is Decision.CONTINUE
    assert proc.resumed() == ["t0001", "t0002"]
    (clone,) = proc.suggest()
    assert clone.trial_id == "t0004" and clone.clone_from == "t0001"
    donor = params["t0001"]
    new = dict(clone.params)
    assert new["width"] == 64 and new["optimizer"]["name"] == "sgd"
    ratio = new["lr"] / donor["lr"]
    assert math.isclose(ratio, 0.8) or math.isclose(ratio, 1.2) or new["lr"] == 1e-1
    momentum = donor["optimizer"]["momentum"]
    assert new["optimizer"]["momentum"] in {min(max(momentum * f, 0.5), 0.99) for f in (0.8, 1.2)}
    batches = [16, 32, 64, 128]
    assert abs(batches.index(new["batch"]) - batches.index(donor["batch"])) <= 1
    assert proc.suggest() == [] and proc.resumed() == []
    # The clone starts at lineage epoch 1, so its first report is lineage 2, a point.
    for trial_id in ("t0001", "t0002", "t0003"):
        assert proc.on_epoch_end(report(trial_id, 2, 0.5)) is Decision.PAUSE
    # Lineage 2 selection: all tie at 0.5, so the youngest (t0004) is the loser.
    assert proc.on_epoch_end(report("t0004", 1, 0.5)) is Decision.STOP
    assert proc.resumed() == ["t0001", "t0002", "t0003"]
    (second,) = proc.suggest()
    assert second.trial_id == "t0005" and second.clone_from == "t0001"
    for trial_id, epoch in (("t0001", 3), ("t0002", 3), ("t0003", 3), ("t0005", 1)):
        assert not proc.is_finished()
        assert proc.on_epoch_end(report(trial_id, epoch, 0.6)) is Decision.STOP
    assert proc.is_finished()
    assert proc.suggest() == [] and proc.resumed() == []


def test_last_reporter_in_the_bottom_quantile_is_stopped() -> None:
    proc = pbt(population=2, epochs=2)
    a, b = (s.trial_id for s in proc.suggest())
    assert proc.on_epoch_end(report(a, 1, 0.9)) is Decision.PAUSE
    assert proc.on_epoch_end(report(b, 1, 0.1)) is Decision.STOP
    assert proc.resumed() == [a]
    (clone,) = proc.suggest()
    assert clone.clone_from == a


def test_mode_min_replaces_the_largest_loss() -> None:
    proc = pbt(population=3, epochs=2, metric="loss", mode="min")
    a, b, c = (s.trial_id for s in proc.suggest())
    for trial_id, loss in ((a, 0.5), (b, 0.9), (c, 0.1)):
        proc.on_epoch_end(EpochReport(trial_id, 1, {"loss": loss}))
    assert proc.resumed() == [a]  # c reported last and continues; b is replaced
    (clone,) = proc.suggest()
    assert clone.clone_from == c


def test_perturbation_interval_and_lineage_budget() -> None:
    clock = FakeClock()
    proc = pbt(population=4, epochs=7, perturbation_interval=3, clock=clock)
    loop = FakeLoop(proc, clock, seed=5, metric="score")
    loop.run(50)
    assert loop.rounds == 7  # lockstep: one round per lineage epoch
    pauses = [e for e in loop.trace if e[0] == "decide" and e[4] == "pause"]
    clones = [t for e in loop.trace if e[0] == "round" for t, _, src in e[2] if src is not None]
    # Points at lineage 3 and 6; each replaces one member (k = 1 of 4).
    assert len(clones) == 2
    assert {e[1] for e in pauses} == {2, 5}  # rounds 2 and 5 end at lineage 3 and 6
    # A clone's reports count its own epochs; its lineage adds the donor's 3 or 6.
    base = {clones[0]: 3, clones[1]: 6}
    lineage = {t: base.get(t, 0) + e for t, e in {**loop.paused, **loop.stopped}.items()}
    finished = sorted(t for t in loop.stopped if lineage[t] == 7)
    assert len(finished) == 4  # the population at the end, each lineage 7 epochs long
    assert all(lineage[t] in (3, 6) for t in set(lineage) - set(finished))  # replaced


def test_explore_resamples_with_probability_one() -> None:
    mutations = parse_mutations({"lr": {"loguniform": [1e-4, 1e-1]}})
    rng = np.random.default_rng(0)
    values = {explore({"lr": 0.05}, mutations, rng, 1.0, (0.8, 1.2))["lr"] for _ in range(20)}
    assert len(values) == 20 and all(1e-4 <= v <= 1e-1 for v in values)
    assert values.isdisjoint({0.04, 0.06})


def test_explore_fills_a_missing_param_and_copies_the_rest() -> None:
    mutations = parse_mutations({"opt": {"lr": [0.1, 0.01]}})
    params = {"opt": {"name": "adam"}, "layers": [1, 2]}
    new = explore(params, mutations, np.random.default_rng(0), 0.0, (0.8, 1.2))
    assert new["opt"]["lr"] in (0.1, 0.01) and new["opt"]["name"] == "adam"
    assert new["layers"] == [1, 2] and new["layers"] is not params["layers"]
    assert "lr" not in params["opt"]


@pytest.mark.parametrize(
    ("config", "value", "allowed"),
    [
        ({"int": [1, 10]}, 5, {4, 6}),
        ({"int": [1, 10]}, 1, {1, 2}),  # 0.8 rounds back to 1: one step down, clipped
        ({"int": [1, 10]}, 10, {8, 10}),
        ({"quantized": {"uniform": [8, 64]}, "q": 8}, 32, {24, 40}),
        ({"quantized": {"uniform": [0.1, 1.0]}, "q": 0.1}, 0.5, {0.4, 0.6}),
        ({"uniform": [0.0, 1.0]}, 0.9, {0.72, 1.0}),
        ({"grid": ["a", "b", "c"]}, "a", {"a", "b"}),
        ({"choice": [1, 2, 3]}, 2, {1, 3}),
    ],
)
def test_perturb_stays_in_the_distribution(config: Any, value: Any, allowed: set[Any]) -> None:
    dist = parse_mutations({"x": config})[0][1]
    rng = np.random.default_rng(1)
    seen = {perturb(dist, value, rng, (0.8, 1.2)) for _ in range(30)}
    assert {round(v, 9) if isinstance(v, float) else v for v in seen} == allowed


def test_perturb_resamples_a_value_outside_the_choices() -> None:
    dist = parse_mutations({"x": ["a", "b"]})[0][1]
    assert perturb(dist, "zzz", np.random.default_rng(0), (0.8, 1.2)) in ("a", "b")
    dist = parse_mutations({"x": {"uniform": [0, 1]}})[0][1]
    assert 0 <= perturb(dist, "text", np.random.default_rng(0), (2.0,)) <= 1


def test_parse_mutations_paths_and_types() -> None:
    parsed = parse_mutations(MUTATIONS)
    assert [path for path, _ in parsed] == [("lr",), ("optimizer", "momentum"), ("batch",)]
    assert isinstance(parsed[0][1], LogUniform)


@pytest.mark.parametrize(
    ("mutations", "pattern"),
    [
        ({}, r"hyperparam_mutations must be a non-empty mapping"),
        ({"lr": 0.1}, r"hyperparam_mutations\.lr: a constant \(0\.1\) cannot be mutated"),
        ({"m": {"choice": [{"a": 1}, {"a": 2}]}}, r"hyperparam_mutations\.m: a mutated choice"),
        ({"lr": {"loguniform": [0, 1]}}, r"hyperparam_mutations\.lr: loguniform low must be > 0"),
    ],
)
def test_bad_mutations_are_config_errors(mutations: Any, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        pbt(hyperparam_mutations=mutations)


def test_mutation_under_a_constant_param_is_a_config_error() -> None:
    proc = pbt(hyperparam_mutations={"width": {"size": [1, 2]}})
    with pytest.raises(ConfigError, match=r"param width is 64, not a dict of params"):
        proc.suggest()


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"population": 1}, r"population must be >= 2 .* got 1"),
        ({"population": 0}, r"population must be an integer >= 1, got 0"),
        ({"quantile": 0.0}, r"quantile must be in \(0, 0.5\], got 0.0"),
        ({"quantile": 0.6}, r"quantile must be in \(0, 0.5\], got 0.6"),
        ({"quantile": "a"}, r"quantile must be a number, got 'a'"),
        ({"resample_probability": 1.5}, r"resample_probability must be in \[0, 1\], got 1.5"),
        ({"perturb_factors": []}, r"perturb_factors must be a non-empty list"),
        ({"perturb_factors": [0.8, -1]}, r"perturb_factors must be finite numbers > 0"),
        ({"perturb_factors": "0.8"}, r"perturb_factors must be a non-empty list"),
        ({"perturbation_interval": 0}, r"perturbation_interval must be an integer >= 1"),
    ],
)
def test_pbt_validates_arguments(kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        pbt(**kwargs)


def test_out_of_protocol_reports_are_rejected() -> None:
    proc = pbt(population=2, epochs=2)
    a, _ = (s.trial_id for s in proc.suggest())
    with pytest.raises(ValueError, match=r"report.epoch must be 1"):
        proc.on_epoch_end(report(a, 2, 0.0))
    assert proc.on_epoch_end(report(a, 1, 0.0)) is Decision.PAUSE
    with pytest.raises(ValueError, match="which is not training"):
        proc.on_epoch_end(report(a, 2, 0.0))


def test_state_round_trip_keeps_pending_clones() -> None:
    proc = pbt(population=2, epochs=3)
    a, b = (s.trial_id for s in proc.suggest())
    proc.on_epoch_end(report(a, 1, 0.1))
    proc.on_epoch_end(report(b, 1, 0.9))
    state = json.loads(json.dumps(proc.state_dict()))
    restored = pbt(population=2, epochs=3, rng=np.random.default_rng(9))
    restored.load_state_dict(state)
    assert restored.suggest() == proc.suggest()
    assert restored.resumed() == proc.resumed() == []
    with pytest.raises(ConfigError, match="the state has population=2"):
        pbt(population=3, epochs=3).load_state_dict(state)


def test_registered_as_pbt() -> None:
    assert procedure_options("pbt") == {
        "population": True,
        "hyperparam_mutations": True,
        "perturbation_interval": False,
        "quantile": False,
        "resample_probability": False,
        "perturb_factors": False,
    }
    proc = make_procedure(
        "pbt",
        space=SPACE,
        epochs=4,
        metric="score",
        mode="max",
        rng=np.random.default_rng(0),
        population=3,
        hyperparam_mutations={"lr": [0.1, 0.01]},
    )
    assert type(proc) is PBT
    assert proc.suggest()
