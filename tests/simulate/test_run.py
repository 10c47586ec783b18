"""Simulated runs of registered procedures: determinism, time accounting, the deadline."""

from __future__ import annotations

import math

import pytest

from cerebro_spark.errors import ConfigError, ProcedureContractError
from cerebro_spark.search import PROCEDURES, RandomSearch
from cerebro_spark.simulate import (
    SimulationSettings,
    compare_procedures,
    format_table,
    run_simulation,
    summaries_to_json,
)
from cerebro_spark.simulate._workload import SIMULATED_SPACE, ParametricWorkload


def test_runs_are_deterministic_per_seed() -> None:
    settings = SimulationSettings(deadline=15.0, num_workers=4)
    for name in ("hypersched", "seer", "asha"):
        first = run_simulation(name, settings, seed=5)
        assert run_simulation(name, settings, seed=5) == first
        assert run_simulation(name, settings, seed=6) != first


def test_one_trial_pays_the_start_up_overhead_once() -> None:
    # random search with one trial on one worker: 0.5 s start-up, then 1 s per epoch
    settings = SimulationSettings(deadline=10.5, num_workers=1, overhead=0.5, epochs=50)
    result = run_simulation("random", settings, seed=0, options={"num_trials": 1})
    assert result.trial_epochs == 10
    assert result.end == 10.5
    assert result.reason == "deadline"
    assert result.best_trial == "t0000"
    assert result.rounds == 10  # the tenth epoch ends at the deadline: no eleventh round


def test_best_score_counts_only_epochs_finished_by_the_deadline() -> None:
    settings = SimulationSettings(deadline=3.5, num_workers=1, epochs=50)
    result = run_simulation("random", settings, seed=2, options={"num_trials": 1})
    assert result.trial_epochs == 3  # the fourth epoch would end at 4.0
    assert result.end == 3.5
    workload = ParametricWorkload(seed=2)
    best = max(workload.score(p, 3) for p in SIMULATED_SPACE.grid())
    assert result.best_score <= best


def test_a_finished_procedure_ends_the_run_early() -> None:
    settings = SimulationSettings(deadline=100.0, num_workers=2, epochs=3)
    result = run_simulation("random", settings, seed=0, options={"num_trials": 2})
    assert result.reason == "finished"
    assert result.end == 3.0  # two trials side by side, three 1 s epochs
    assert result.trial_epochs == 6


def test_procedures_stop_at_their_deadline() -> None:
    settings = SimulationSettings(deadline=12.0, num_workers=4, overhead=0.2, scaling="sqrt")
    for name in ("hypersched", "seer", "asha"):
        result = run_simulation(name, settings, seed=1)
        assert result.end <= 12.0
        assert result.reason in ("deadline", "finished")
        assert not math.isnan(result.best_score)


def test_more_workers_per_trial_make_epochs_faster() -> None:
    # HyperSched alone on 4 workers with linear scaling grows its only trial: more epochs
    # by the deadline than on one worker, none more with scaling "none"
    base = {"deadline": 20.0, "num_workers": 4, "epochs": 500}
    options = {"max_trials": 1}
    linear = run_simulation("hypersched", SimulationSettings(**base), seed=0, options=options)
    flat = run_simulation(
        "hypersched", SimulationSettings(**base, scaling="none"), seed=0, options=options
    )
    assert flat.trial_epochs == 20
    assert linear.trial_epochs > 60


def test_resize_overhead_is_charged() -> None:
    options = {"max_trials": 1}
    free = run_simulation(
        "hypersched", SimulationSettings(20.0, 4, epochs=500), seed=0, options=options
    )
    costly = run_simulation(
        "hypersched", SimulationSettings(20.0, 4, overhead=1.0, epochs=500), seed=0, options=options
    )
    # the trial starts (1 s) and grows to 4 workers (1 s): 2 s fewer at 4 epochs per second
    assert free.trial_epochs - costly.trial_epochs == pytest.approx(8, abs=1)


def test_compare_and_format() -> None:
    settings = SimulationSettings(deadline=8.0, num_workers=4)
    summaries = compare_procedures(["asha", "seer"], settings, seeds=3)
    assert [s.procedure for s in summaries] == ["asha", "seer"]
    assert all(len(s.results) == 3 for s in summaries)
    table = format_table(summaries, settings)
    assert "| asha |" in table and "| seer |" in table and "±" in table
    assert '"procedure": "seer"' in summaries_to_json(summaries, settings)


def test_bad_settings_and_procedures() -> None:
    with pytest.raises(ConfigError, match="deadline must be a finite number > 0"):
        SimulationSettings(deadline=0.0, num_workers=2)
    with pytest.raises(ConfigError, match="num_workers must be an integer >= 1, got 0"):
        SimulationSettings(deadline=5.0, num_workers=0)
    with pytest.raises(ConfigError, match="scaling must be one of"):
        SimulationSettings(deadline=5.0, num_workers=2, scaling="fast")
    with pytest.raises(ConfigError, match="unknown search procedure 'nope'"):
        run_simulation("nope", SimulationSettings(deadline=5.0, num_workers=2), seed=0)
    with pytest.raises(ConfigError, match="seeds must name at least one seed"):
        compare_procedures(["asha"], SimulationSettings(deadline=5.0, num_workers=2), seeds=[])


def test_deadline_procedures_beat_asha_on_a_tight_deadline() -> None:
    """The direction of HyperSched Fig. 5/8 and SEER Table 2 (benchmark, small setting)."""
    settings = SimulationSettings(deadline=20.0, num_workers=32)
    asha, hypersched, seer = compare_procedures(["asha", "hypersched", "seer"], settings, seeds=10)
    assert hypersched.mean > asha.mean
    assert seer.mean > asha.mean


# -- the epoch template's rules (search/_template.py), as the driver applies them


class AsksForWorkers(RandomSearch):
    workers = 0

    def resources(self, trial_id: str) -> int:
        return self.workers


class ResumesStopped(RandomSearch):
    def resumed(self) -> list[str]:
        return sorted(self._stopped)[:1]


class NeverFinishes(RandomSearch):
    def is_finished(self) -> bool:
        return False


@pytest.mark.parametrize("workers", [0, -1, True, 2.0])
def test_resources_that_are_no_integer_of_at_least_one_are_refused_not_clamped(
    monkeypatch: pytest.MonkeyPatch, workers: object
) -> None:
    monkeypatch.setattr(AsksForWorkers, "workers", workers)
    monkeypatch.setitem(PROCEDURES, "asks", AsksForWorkers)
    settings = SimulationSettings(deadline=10.0, num_workers=2, epochs=3)
    with pytest.raises(ProcedureContractError) as error:
        run_simulation("asks", settings, seed=0, options={"num_trials": 1})
    assert str(error.value) == (
        f"search procedure 'asks' asked for resources={workers!r} for trial t0000; "
        "resources must be an integer >= 1 (workers)"
    )


def test_a_trial_asking_for_more_workers_than_the_cluster_trains_on_all_of_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(AsksForWorkers, "workers", 8)
    monkeypatch.setitem(PROCEDURES, "asks", AsksForWorkers)
    settings = SimulationSettings(deadline=100.0, num_workers=2, epochs=4)
    result = run_simulation("asks", settings, seed=0, options={"num_trials": 1})
    assert (result.reason, result.trial_epochs, result.end) == ("finished", 4, 2.0)


def test_resuming_a_trial_that_is_not_paused_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PROCEDURES, "resumes-stopped", ResumesStopped)
    settings = SimulationSettings(deadline=100.0, num_workers=2, epochs=2)
    with pytest.raises(ProcedureContractError) as error:
        options = {"num_trials": 4, "max_concurrent": 2}  # stops t0000 while t0002 waits
        run_simulation("resumes-stopped", settings, seed=0, options=options)
    assert str(error.value) == (
        "search procedure 'resumes-stopped' resumed trial 't0000', which is completed; "
        "resumed() names only paused trials"
    )


def test_a_procedure_with_nothing_to_train_that_is_not_finished_stalls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(PROCEDURES, "never-finishes", NeverFinishes)
    settings = SimulationSettings(deadline=100.0, num_workers=2, epochs=3)
    result = run_simulation("never-finishes", settings, seed=0, options={"num_trials": 2})
    assert (result.reason, result.end, result.trial_epochs) == ("stalled", 3.0, 6)
