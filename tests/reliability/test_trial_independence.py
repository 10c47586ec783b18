"""One trial's fate never changes another's weights (issue 29, part 4).

Each trial's visit orders come from its own stream (the experiment seed, the trial's
slot, the epoch): a search in which one trial fails in its first epoch, and a search with
fewer trials, end with every other trial's weights and metrics bit for bit those of the
clean search, through the rounds after the failure.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.engine import ExperimentState, parse_config, read_events, run_experiment
from cerebro_spark.store import open_store
from tests.reliability.specs import FAIL_LR_ENV

pytestmark = pytest.mark.torch

ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:  # the workers import tests.reliability.specs
    sys.path.insert(0, ROOT)

LRS = [0.01, 0.02, 0.03, 0.05]


def run(store: Path, name: str, lrs: list[float], fail_lr: float | None = None) -> ExperimentState:
    """Run the search; the trial with ``fail_lr`` fails (its workers read the environment)."""
    config = parse_config(
        {
            "name": "independence",
            "seed": 3,
            "store": str(store),
            "data": {"source": "sklearn:iris", "partitions": 3},
            "procedure": "grid",
            "epochs": 3,
            "workers": 2,
            "backend": "local",
            "model": "tests.reliability.specs:FailsOneTrialSpec",
            "space": {
                "hidden_units": [8],
                "lr": {"grid": lrs},
                "batch_size": 16,
            },
        }
    )
    with pytest.MonkeyPatch.context() as patch:
        if fail_lr is None:
            patch.delenv(FAIL_LR_ENV, raising=False)
        else:
            patch.setenv(FAIL_LR_ENV, str(fail_lr))
        run_experiment(config, experiment_id=name)
    return ExperimentState.from_events(
        read_events(open_store(str(store)).child(f"experiments/{name}"))
    )


def outcome(state: ExperimentState) -> dict[str, Any]:
    return {
        t.trial_id: (t.status, t.epochs, t.checkpoint_sha256, t.history)
        for t in state.trials.values()
    }


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> ExperimentState:
    return run(tmp_path_factory.mktemp("clean"), "clean", LRS)


def test_a_trial_that_fails_changes_no_other_trials_weights(
    clean: ExperimentState, tmp_path: Path
) -> None:
    faulted = run(tmp_path, "faulted", LRS, fail_lr=0.02)
    failed = [t for t in faulted.trials.values() if t.status == "failed"]
    assert [t.params["lr"] for t in failed] == [0.02]
    assert failed[0].epochs == 0 and "FailsOneTrialSpec" in (failed[0].error or "")
    others, expected = outcome(faulted), outcome(clean)
    del others[failed[0].trial_id], expected[failed[0].trial_id]
    assert all(status == "completed" and epochs == 3 for status, epochs, *_ in others.values())
    assert others == expected


def test_a_smaller_search_trains_its_trials_to_the_same_weights(
    clean: ExperimentState, tmp_path: Path
) -> None:
    smaller = outcome(run(tmp_path, "smaller", LRS[:2]))
    assert smaller == {t: v for t, v in outcome(clean).items() if t in smaller}
    assert len(smaller) == 2
