from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cerebro_spark.errors import ConfigError
from cerebro_spark.search import (
    PROCEDURES,
    GridSearch,
    RandomSearch,
    SearchSpace,
    make_procedure,
    procedure_options,
)

SPACE = SearchSpace({"lr": {"grid": [0.1, 0.01]}, "units": {"int": [1, 2]}})


def make(name: str, **options: Any) -> object:
    return make_procedure(
        name,
        space=SPACE,
        epochs=2,
        metric="accuracy",
        mode="max",
        rng=np.random.default_rng(0),
        **options,
    )


def test_registry_knows_grid_and_random() -> None:
    assert PROCEDURES["grid"] is GridSearch
    assert PROCEDURES["random"] is RandomSearch


def test_make_grid_with_options() -> None:
    proc = make("grid", repeats=2, max_concurrent=3)
    assert isinstance(proc, GridSearch)
    assert (proc.epochs, proc.metric, proc.mode, proc.repeats) == (2, "accuracy", "max", 2)
    assert proc.max_concurrent == 3
    assert len(proc.suggest()) == 3


def test_make_random_passes_space_rng_and_clock() -> None:
    ticks: list[float] = []

    def clock() -> float:
        ticks.append(0.0)
        return 0.0

    proc = make_procedure(
        "random",
        space=SPACE,
        epochs=1,
        metric="loss",
        mode="min",
        rng=np.random.default_rng(5),
        clock=clock,
        num_trials=3,
    )
    assert isinstance(proc, RandomSearch)
    assert proc.clock is clock and proc.space is SPACE
    expected = np.random.default_rng(5)
    assert [dict(s.params) for s in proc.suggest()] == [SPACE.sample(expected) for _ in range(3)]


def test_procedure_options_lists_required_and_optional() -> None:
    assert procedure_options("grid") == {"repeats": False, "max_concurrent": False}
    assert procedure_options("random") == {"num_trials": True, "max_concurrent": False}


def test_unknown_procedure_lists_known_names() -> None:
    with pytest.raises(ConfigError) as err:
        make("hyperbnd")
    assert str(err.value) == (
        "unknown search procedure 'hyperbnd'; known procedures: "
        "asha, grid, hyperband, hypersched, pbt, random, seer, sha, tpe"
    )


def test_unknown_option_names_it_and_the_accepted_ones() -> None:
    with pytest.raises(ConfigError) as err:
        make("random", num_trials=2, num_samples=4)
    assert str(err.value) == (
        "search procedure 'random' has no option 'num_samples'; accepted options: "
        "max_concurrent, num_trials"
    )
    with pytest.raises(
        ConfigError,
        match="'grid' has no option 'clock_speed'; accepted options: max_concurrent, repeats",
    ):
        make("grid", clock_speed=1)


def test_missing_required_option() -> None:
    with pytest.raises(ConfigError) as err:
        make("random")
    assert str(err.value) == (
        "search procedure 'random' needs option 'num_trials'; accepted options: "
        "max_concurrent, num_trials"
    )


def test_bad_option_values_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="num_trials must be an integer >= 1, got 0"):
        make("random", num_trials=0)
    with pytest.raises(ConfigError, match="mode must be 'min' or 'max', got 'up'"):
        make_procedure(
            "grid", space=SPACE, epochs=1, metric="m", mode="up", rng=np.random.default_rng(0)
        )


def test_seers_old_budget_is_read_as_worker_seconds_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``budget`` means dollars only: SEER's resource budget is ``worker_seconds``."""
    new = make("seer", deadline=10.0, num_workers=16, worker_seconds=80.0)
    with caplog.at_level("WARNING", logger="cerebro_spark.search._registry"):
        old = make("seer", deadline=10.0, num_workers=16, budget=80.0)
    assert old.plan == new.plan and old.plan.worker_seconds == 80.0  # type: ignore[attr-defined]
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1
    assert "procedure.budget is the old name of seer's option 'worker_seconds'" in warned[0]
    assert "read as procedure.worker_seconds: 80.0" in warned[0]
    assert "worker_seconds" in procedure_options("seer")
    assert "budget" not in procedure_options("seer")


def test_seers_budget_and_worker_seconds_together_are_refused_naming_both() -> None:
    with pytest.raises(ConfigError) as error:
        make("seer", deadline=10.0, num_workers=16, budget=80.0, worker_seconds=40.0)
    message = str(error.value)
    assert "procedure.budget and procedure.worker_seconds are both given" in message
    assert "got 80.0 and 40.0" in message


def test_an_unrenamed_option_of_another_procedure_is_still_refused() -> None:
    with pytest.raises(ConfigError, match="has no option 'budget'"):
        make("random", num_trials=2, budget=3)


def test_a_procedures_config_options_may_be_left_to_the_config() -> None:
    """``deadline`` and ``num_workers`` come from the config (its deadline, its workers):
    checking a procedure's own options does not ask for them; building it does."""
    from cerebro_spark.search import check_procedure_options

    check_procedure_options("seer", {"worker_seconds": 80})
    with pytest.raises(ConfigError, match="needs option 'deadline'"):
        check_procedure_options("seer", {"worker_seconds": 80}, from_config=False)
    with pytest.raises(ConfigError, match="needs option 'deadline'"):
        make("seer", num_workers=4, worker_seconds=80)
