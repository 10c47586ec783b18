"""Every procedure's stage structure (RubberBand Fig. 6), as ``stage_spec`` gives it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cerebro_spark.errors import ConfigError
from cerebro_spark.search import Cohort, ExperimentSpec, SearchSpace, StageSpec, make_procedure

SPACE = SearchSpace.from_config({"lr": {"grid": [0.1, 0.2, 0.3]}, "x": {"grid": [1, 2]}})


def spec(name: str, epochs: int = 27, **options: Any) -> ExperimentSpec:
    procedure = make_procedure(name, space=SPACE, epochs=epochs, metric="loss", mode="min",
                               rng=np.random.default_rng(0), **options)  # fmt: skip
    result = procedure.stage_spec()
    assert result is not None
    return result


def shape(s: ExperimentSpec) -> list[list[tuple[int, int, int]]]:
    return [[(c.trials, c.epochs, c.resources) for c in st.cohorts] for st in s.stages]


def test_sha_has_a_stage_per_rung() -> None:
    s = spec("sha", num_trials=27, eta=3)
    assert shape(s) == [[(27, 1, 1)], [(9, 2, 1)], [(3, 6, 1)], [(1, 18, 1)]]
    assert s.elastic and s.num_stages() == 4 and s.get_stage(2) == (3, 6)
    assert [st.trial_epochs for st in s.stages] == [27, 18, 18, 18]


def test_hyperband_is_a_multi_job_side_by_side_or_in_sequence() -> None:
    side = spec("hyperband", eta=3)
    assert shape(side)[0] == [(27, 1, 1), (12, 3, 1), (6, 9, 1), (4, 27, 1)]
    assert shape(side)[-1] == [(1, 18, 1)]
    sequence = spec("hyperband", eta=3, concurrent=False)
    assert sequence.num_stages() == 4 + 3 + 2 + 1
    assert sum(st.trial_epochs for st in side.stages) == sum(
        st.trial_epochs for st in sequence.stages
    )


def test_seer_gives_its_brackets_resources_and_epochs() -> None:
    s = spec("seer", epochs=100, deadline=10, worker_seconds=80, num_workers=4, epoch_seconds=1.0)
    # SEER §3.4: N = [8, 4], P = [1, 2]; stage k lasts 10/7 * 2**(k-1).
    assert shape(s) == [[(8, 1, 1), (4, 2, 2)], [(4, 2, 1), (2, 5, 2)], [(2, 5, 1), (1, 11, 2)]]
    capped = spec(
        "seer", epochs=4, deadline=10, worker_seconds=80, num_workers=4, epoch_seconds=1.0
    )
    assert max(sum(c.epochs for st in capped.stages for c in st.cohorts[i : i + 1])
               for i in range(2)) <= 4  # fmt: skip


def test_asynchronous_procedures_get_one_stage_and_their_trials_in_flight() -> None:
    grid = spec("grid", epochs=5, max_concurrent=2)
    assert shape(grid) == [[(6, 5, 1)]] and not grid.elastic and grid.max_workers == 2
    assert spec("grid", epochs=5).max_workers == 6
    random = spec("random", epochs=5, num_trials=7)
    assert shape(random) == [[(7, 5, 1)]] and random.max_workers == 7
    asha = spec("asha", epochs=27, num_trials=27, eta=3)
    assert shape(asha) == [[(18, 1, 1), (6, 3, 1), (2, 9, 1), (1, 27, 1)]]
    assert asha.max_workers == 27 and asha.fixed_seconds is None
    timed = spec("asha", epochs=27, deadline=60, num_workers=3)
    assert timed.fixed_seconds == 60 and timed.max_workers == 3
    sched = spec("hypersched", epochs=9, deadline=120, num_workers=4)
    assert (sched.fixed_seconds, sched.max_workers, sched.elastic) == (120, 4, False)
    pbt = spec("pbt", epochs=9, population=4, hyperparam_mutations={"lr": [0.1, 0.2]})
    assert shape(pbt) == [[(4, 9, 1)]] and pbt.max_workers == 4
    tpe = spec("tpe", epochs=3, num_trials=10, num_workers=2)
    assert shape(tpe) == [[(10, 3, 1)]] and tpe.max_workers == 2


def test_specs_check_their_parts_and_serialise() -> None:
    with pytest.raises(ConfigError, match=r"Cohort.trials must be an integer >= 1, got 0"):
        Cohort(0, 1)
    with pytest.raises(ConfigError, match="at least one cohort"):
        StageSpec(())
    with pytest.raises(ConfigError, match="has no stage"):
        ExperimentSpec("x", ())
    as_dict = spec("sha", num_trials=4, eta=2, epochs=4).to_dict()
    assert as_dict["stages"][0] == {
        "trials": 4,
        "epochs": 1,
        "cohorts": [{"trials": 4, "epochs": 1, "resources": 1}],
    }
