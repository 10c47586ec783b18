"""The driver's per-unit bookkeeping stays flat in |S| and answers as the full scans did.

``needs_checkpoint`` asks a checkpoint's owner and the clones instead of every trial, the
progress line's best trial is kept incrementally instead of ranking every trial after
every epoch, and the work-aware rule the engine builds is the indexed one.
"""

from __future__ import annotations

import gc
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.driver._experiment import Experiment
from cerebro_spark.driver._leaderboard import best_trial, rank, rank_key
from cerebro_spark.driver._preflight import preflight
from cerebro_spark.driver._state import ExperimentState, TrialState
from cerebro_spark.mop import WorkAwareRule
from cerebro_spark.store import open_store

PREFIX = "experiments/x/checkpoints"


def added(trial: str, clone_from: str | None = None) -> dict[str, Any]:
    return {
        "event": "trial_added",
        "trial": trial,
        "params": {},
        "seed": 1,
        "spec": "m:S",
        "clone_from": clone_from,
    }


def trained(trial: str, step: int) -> dict[str, Any]:
    return {
        "event": "unit_end",
        "trial": trial,
        "kind": "train",
        "partition": step,
        "step": step,
        "seconds": 0.1,
        "checkpoint": f"{PREFIX}/{trial}/e0000-s{step:04d}.pt",
        "checkpoint_sha256": "0" * 64,
    }


def test_a_checkpoint_is_needed_by_its_owner_or_a_clone_only() -> None:
    state = ExperimentState.from_events(
        [added("a"), added("b"), trained("a", 0), added("c", clone_from="a"), trained("a", 1)]
    )
    first, second = f"{PREFIX}/a/e0000-s0000.pt", f"{PREFIX}/a/e0000-s0001.pt"
    assert state.needs_checkpoint(second)  # a's latest
    assert state.needs_checkpoint(first)  # a moved on, but its clone c starts from it
    state.apply(trained("c", 0))
    assert not state.needs_checkpoint(first)
    assert not state.needs_checkpoint(f"{PREFIX}/b/e0000-s0000.pt")
    # Keys of another shape, or in the folder of no trial: every trial is asked.
    state.trials["b"].checkpoint = "elsewhere/b.pt"
    assert state.needs_checkpoint("elsewhere/b.pt")
    state.trials["b"].best_checkpoint = f"{PREFIX}/gone/e0000-s0000.pt"
    assert state.needs_checkpoint(f"{PREFIX}/gone/e0000-s0000.pt")


def test_rank_key_orders_as_rank() -> None:
    trials = [
        TrialState("d", {}, 1, "m:S", best_metrics={"loss": 0.5}, best_epoch=1),
        TrialState("a", {}, 1, "m:S", best_metrics={"loss": 0.5}, best_epoch=2),
        TrialState("c", {}, 1, "m:S", status="failed", best_metrics={"loss": 0.1}),
        TrialState("b", {}, 1, "m:S"),
        TrialState("e", {}, 1, "m:S", best_metrics={"loss": 0.2}, best_epoch=1),
    ]
    expected = rank(trials, "loss", "min")
    assert [t.trial_id for t in expected] == ["e", "a", "d", "b", "c"]
    assert sorted(trials, key=lambda t: rank_key(t, "loss", "min")) == expected


def load_benchmark() -> Any:
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "driver_scale.py"
    spec = importlib.util.spec_from_file_location("driver_scale", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["driver_scale"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def checked_best(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str | None]]:
    """After every incremental update, the best trial must be the full ranking's."""
    seen: list[str | None] = []
    update = Experiment._update_best

    def checked(self: Experiment, reported: str) -> None:
        update(self, reported)
        full = best_trial(rank(self.state.trials.values(), self.metric, self.mode))
        assert self._top == (None if full is None else full.trial_id)
        seen.append(self._top)

    monkeypatch.setattr(Experiment, "_update_best", checked)
    yield seen


@pytest.mark.torch
def test_the_best_trial_kept_incrementally_is_the_full_rankings(
    tmp_path: Path, checked_best: list[str | None]
) -> None:
    bench = load_benchmark()
    config = bench.config(tmp_path, 3, 12, 3, 2)
    store = open_store(config.store)
    checked = preflight(config, store)
    backend = bench.InstantBackend(3)
    experiment = Experiment(checked.config, store, "x", lambda c: backend, preflight=checked)
    assert isinstance(experiment._rule(), WorkAwareRule) and experiment._rule().indexable
    experiment.run()
    assert len(checked_best) == 12 * 2  # one update per trial and epoch
    assert experiment.progress.best.endswith(f"({checked_best[-1]}, epoch 1)")


@pytest.mark.torch
def test_a_run_freezes_what_predates_it_and_thaws_it_at_its_end(tmp_path: Path) -> None:
    bench = load_benchmark()
    config = bench.config(tmp_path, 2, 3, 2, 1)
    store = open_store(config.store)
    checked = preflight(config, store)
    backend = bench.InstantBackend(2)
    experiment = Experiment(checked.config, store, "x", lambda c: backend, preflight=checked)
    frozen: list[int] = []
    experiment.log.listeners.append(lambda event: frozen.append(gc.get_freeze_count()))
    gc.unfreeze()
    experiment.run()
    assert frozen and min(frozen) > 0  # every event is logged inside the run
    assert gc.get_freeze_count() == 0
