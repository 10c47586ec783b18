"""The digits experiment with ASHA and with SEER on local Spark."""

import pytest

from cerebro_spark.engine import parse_config, read_events, run_experiment
from cerebro_spark.store import open_store

pytestmark = [pytest.mark.spark, pytest.mark.torch, pytest.mark.slow]

SPACE = {
    "model": "cerebro_spark.training:MLPSpec",
    "hidden_units": {"choice": [[32], [64], [128]]},
    "lr": {"loguniform": [1.0e-3, 1.0e-2]},
    "batch_size": 64,
}


def config(store, procedure, epochs):
    return parse_config(
        {
            "name": procedure["name"],
            "seed": 4,
            "store": str(store),
            "data": {"source": "sklearn:digits", "partitions": 2},
            "procedure": procedure,
            "epochs": epochs,
            "workers": 2,
            "backend": "spark",
            "spark": {"master": "local[4]", "conf": {"spark.ui.enabled": False}},
            "space": SPACE,
        }
    )


@pytest.mark.parametrize(
    ("procedure", "epochs"),
    [
        ({"name": "asha", "num_trials": 6, "eta": 3}, 3),
        ({"name": "seer", "deadline": 40, "budget": 80, "epoch_seconds": 1.0}, 4),
    ],
    ids=["asha", "seer"],
)
def test_digits_finishes_on_local_spark(spark, tmp_path, procedure, epochs):
    result = run_experiment(config(tmp_path, procedure, epochs), experiment_id=procedure["name"])
    assert result.trials and all(t.status in ("completed", "stopped") for t in result.trials)
    assert result.best.metrics["accuracy"] > 0.7
    events = read_events(open_store(str(tmp_path)).child(f"experiments/{procedure['name']}"))
    assert events[-1]["event"] == "experiment_end"
    assert {e["decision"] for e in events if e["event"] == "decision"} & {"stop", "pause"}
