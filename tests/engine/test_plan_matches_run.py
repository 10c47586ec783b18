"""``plan CONFIG`` plans what ``run CONFIG`` does: the spec the planner reads
(``experiment_spec``) against the rounds a real run of the same config trains.

The runs use the engine on a WorkerPool over the in-memory fake transport (no torch): every
trial-epoch it trains is a ``trial_epoch`` event.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.backends import WorkerPool
from cerebro_spark.engine import experiment_spec, parse_config, read_events, run_experiment
from cerebro_spark.store import open_store
from tests.backends import fake_transport
from tests.backends.fake_transport import ThreadTransport


@pytest.fixture(autouse=True)
def script() -> Iterator[fake_transport.Script]:
    yield fake_transport.reset()
    fake_transport.reset()


@pytest.mark.parametrize(
    ("procedure", "epochs"),
    [
        ({"name": "sha", "num_trials": 8, "eta": 2}, 4),
        ({"name": "hyperband", "eta": 2, "min_epochs": 1}, 4),
        (
            {
                "name": "seer",
                "deadline": 600,
                "worker_seconds": 1200,
                "eta": 2,
                "epoch_seconds": 2.0,
            },
            12,
        ),
        ({"name": "grid"}, 3),
    ],
    ids=["sha", "hyperband", "seer", "grid"],
)
def test_the_planned_spec_is_what_the_run_trains(
    tmp_path: Path, procedure: dict[str, Any], epochs: int
) -> None:
    raw = {
        "name": "planned",
        "seed": 3,
        "store": str(tmp_path),
        "data": {"source": "sklearn:digits", "partitions": 2},
        "procedure": procedure,
        "epochs": epochs,
        "workers": 2,
        "model": "tests.engine.free_spec:FreeSpec",  # built once by the pre-flight
        "space": {"lr": {"grid": [0.1, 0.2, 0.3]}, "x": {"grid": [1, 2, 3, 4]}},
    }
    config = parse_config(raw)
    spec = experiment_spec(config)
    assert spec.procedure == procedure["name"]
    # A procedure's own deadline and assumed epoch time travel with its stages (the plan
    # must end by the one and warns about the other).
    assert spec.deadline == procedure.get("deadline")
    assert spec.epoch_seconds == procedure.get("epoch_seconds")
    run_experiment(config, experiment_id="e", backend_factory=lambda c: WorkerPool(
        ThreadTransport(), c.workers))  # fmt: skip
    events = read_events(open_store(str(tmp_path)).child("experiments/e"))
    trained = Counter(e["trial"] for e in events if e["event"] == "trial_epoch")
    # Every trial the spec starts was started, and all the work it plans was trained.
    assert len(trained) == spec.stages[0].trials
    assert sum(trained.values()) == sum(stage.trial_epochs for stage in spec.stages)
    if procedure["name"] in ("sha", "grid"):
        # Stage by stage: consecutive rounds with the same trials.
        rounds = [tuple(e["trials"]) for e in events if e["event"] == "round_start"]
        stages: list[tuple[int, int]] = []
        for i, trials in enumerate(rounds):
            if i and trials == rounds[i - 1]:
                stages[-1] = (len(trials), stages[-1][1] + 1)
            else:
                stages.append((len(trials), 1))
        assert stages == [spec.get_stage(i) for i in range(spec.num_stages())]
