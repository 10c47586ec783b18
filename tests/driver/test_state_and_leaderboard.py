from cerebro_spark.engine import ExperimentState, format_table, leaderboard_csv


def events():
    return [
        {
            "event": "trial_added",
            "trial": "t0000",
            "params": {"lr": 0.1},
            "seed": 1,
            "spec": "m:S",
            "clone_from": None,
        },
        {
            "event": "trial_added",
            "trial": "t0001",
            "params": {"lr": 0.2},
            "seed": 2,
            "spec": "m:S",
            "clone_from": None,
        },
        {
            "event": "round_start",
            "round": 0,
            "trials": ["t0000", "t0001"],
            "epochs": {},
            "visit_orders": None,
            "procedure_state": {"n": 1},
        },
        {
            "event": "unit_end",
            "trial": "t0000",
            "partition": 0,
            "kind": "train",
            "step": 0,
            "checkpoint": "c/a",
            "checkpoint_sha256": "aa",
            "metric_sums": {"loss": 3.0},
            "rows": 3,
        },
        {
            "event": "unit_end",
            "trial": "t0000",
            "partition": 0,
            "kind": "validate",
            "step": 0,
            "checkpoint": None,
            "checkpoint_sha256": None,
            "metric_sums": {"loss": 2.0, "accuracy": 1.0},
            "rows": 2,
        },
        {
            "event": "unit_end",
            "trial": "t0000",
            "partition": 1,
            "kind": "validate",
            "step": 1,
            "checkpoint": None,
            "checkpoint_sha256": None,
            "metric_sums": {"loss": 6.0, "accuracy": 5.0},
            "rows": 6,
        },
        {"event": "some_future_event"},
    ]


def test_fold_tracks_open_round_units_and_row_weighted_sums():
    state = ExperimentState.from_events(events())
    assert state.round == 0 and state.round_open
    assert state.trials["t0000"].checkpoint == "c/a"
    assert len(state.done_units) == 3
    assert state.validation_rows["t0000"] == 8
    assert state.validation_sums["t0000"] == {"loss": 8.0, "accuracy": 6.0}
    assert state.live_trials() == ["t0000", "t0001"]


def test_decisions_and_round_end():
    log = [
        *events(),
        {
            "event": "trial_epoch",
            "round": 0,
            "trial": "t0000",
            "epoch": 1,
            "metrics": {"accuracy": 0.75},
        },
        {"event": "trial_failed", "trial": "t0001", "error": "boom"},
        {
            "event": "decision",
            "round": 0,
            "trial": "t0000",
            "epoch": 1,
            "decision": "stop",
            "status": "completed",
        },
        {"event": "round_end", "round": 0, "procedure_state": {"n": 2}},
    ]
    state = ExperimentState.from_events(log)
    assert not state.round_open
    assert state.procedure_state == {"n": 2}
    assert state.trials["t0000"].status == "completed"
    assert state.trials["t0000"].history == [{"accuracy": 0.75}]
    assert state.trials["t0001"].status == "failed"
    assert state.live_trials() == []


def test_clone_inherits_parent_checkpoint():
    log = [
        *events(),
        {
            "event": "trial_added",
            "trial": "t0002",
            "params": {},
            "seed": 3,
            "spec": "m:S",
            "clone_from": "t0000",
        },
    ]
    state = ExperimentState.from_events(log)
    assert state.trials["t0002"].checkpoint == "c/a"


def epoch(trial, number, metrics, best_epoch, checkpoint="c/x"):
    return {
        "event": "trial_epoch",
        "round": number - 1,
        "trial": trial,
        "epoch": number,
        "metrics": metrics,
        "checkpoint": checkpoint,
        "checkpoint_sha256": "s",
        "best_epoch": best_epoch,
        "best_checkpoint": None if best_epoch is None else checkpoint,
        "best_checkpoint_sha256": None if best_epoch is None else "s",
    }


def test_leaderboard_is_ranked_and_exact():
    log = [
        *events(),
        epoch("t0000", 1, {"accuracy": 0.5, "loss": 1.0}, 1, "experiments/e/checkpoints/t0000/a"),
        epoch("t0001", 1, {"accuracy": 0.1 + 0.2, "loss": 2.0}, 1),
    ]
    state = ExperimentState.from_events(log)
    text = leaderboard_csv(state.trials.values(), "accuracy", "max")
    lines = text.splitlines()
    assert lines[0] == (
        "trial_id,status,epochs,best_epoch,accuracy,last_accuracy,loss,best_checkpoint,params,error"
    )
    assert lines[1] == 't0000,running,1,1,0.5,0.5,1.0,checkpoints/t0000/a,"{""lr"": 0.1}",'
    assert lines[2].startswith("t0001,running,1,1,0.30000000000000004,0.30000000000000004,2.0,")
    assert '"{""lr"": 0.2}"' in lines[2]
    assert (
        leaderboard_csv(state.trials.values(), "accuracy", "min")
        .splitlines()[1]
        .startswith("t0001")
    )
    assert "t0000" in format_table(state.trials.values(), "accuracy", "max")


def test_trials_without_metric_rank_last():
    log = [*events(), epoch("t0001", 1, {"accuracy": 0.1}, 1)]
    state = ExperimentState.from_events(log)
    lines = leaderboard_csv(state.trials.values(), "accuracy", "max").splitlines()
    assert lines[1].startswith("t0001") and lines[2].startswith("t0000,running,0,,,,")


def test_experiment_time_does_not_count_driver_downtime():
    log = [
        {"event": "experiment_start", "time": 100.0},
        {"event": "trial_added", "trial": "t", "params": {}, "seed": 0, "spec": "s"},
        {
            "event": "round_start",
            "time": 101.0,
            "round": 0,
            "trials": [],
            "visit_orders": None,
            "procedure_state": None,
        },
        {
            "event": "unit_end",
            "time": 110.0,
            "trial": "t",
            "partition": 0,
            "kind": "validate",
            "step": 0,
            "metric_sums": {},
            "rows": 1,
            "seconds": 2.5,
        },
        # the driver died at 110; resumed an hour later
        {"event": "experiment_start", "time": 3710.0},
        {
            "event": "unit_end",
            "time": 3715.0,
            "trial": "t",
            "partition": 1,
            "kind": "validate",
            "step": 1,
            "metric_sums": {},
            "rows": 1,
            "seconds": 1.5,
        },
    ]
    state = ExperimentState.from_events(log)
    assert state.experiment_seconds == 15.0
    assert state.active_seconds == 10.0
    assert state.unit_seconds["t"] == 4.0
