"""The digits experiment with ASHA, SEER and HyperSched on local Spark."""

import logging

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
        ({"name": "seer", "deadline": 40, "worker_seconds": 80, "epoch_seconds": 1.0}, 4),
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


def test_hypersched_trains_its_best_trials_in_groups_on_local_spark(spark, tmp_path, caplog):
    """HyperSched (Alg. 3) gives the live trials the cluster's idle workers: with two
    trials on two workers, once one is paused at the rung the other trains on both, as
    group units on SparkBackend (Cerebro §5.7)."""
    procedure = {
        "name": "hypersched",
        "deadline": 600,
        "max_trials": 2,
        "eta": 2,
        "epoch_seconds": 1.0,
    }
    with caplog.at_level(logging.WARNING, logger="cerebro_spark"):
        result = run_experiment(config(tmp_path, procedure, 4), experiment_id="hypersched")
    assert result.best.metrics["accuracy"] > 0.7
    events = read_events(open_store(str(tmp_path)).child("experiments/hypersched"))
    grown = {t for e in events if e["event"] == "round_start"
             for t, k in e["resources"].items() if k == 2}  # fmt: skip
    assert grown, "HyperSched never gave a trial two workers"
    groups: dict[str, list[dict]] = {}
    for e in events:
        if e["event"] == "unit_end" and "group" in e:
            groups.setdefault(e["group"], []).append(e)
    assert groups, "no group unit ran"
    for ranks in groups.values():
        assert len(ranks) == 2 and {r["trial"] for r in ranks} <= grown
        assert ranks[0]["worker"] != ranks[1]["worker"]
        assert ranks[0]["checkpoint_sha256"] == ranks[1]["checkpoint_sha256"] is not None
    assert not any(e["event"] == "unit_failed" for e in events)
    assert not [r for r in caplog.records if "group" in r.getMessage().lower()]
