"""200 trials of 2 epochs with the driver killed halfway (issue 12, part 6).

The driver (the CLI, a child process) is SIGKILLed once half of the 1,600 units are
logged; ``resume`` finishes the experiment with the results of an uninterrupted run:
every trial's final checkpoint digest, metrics and best epoch equal, every unit done
exactly once, the units done before the kill kept.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

import pytest

from cerebro_spark.engine import parse_config, resume_experiment, run_experiment
from tests.reliability.conftest import (
    Driver,
    outcome,
    strict_events,
    tiny_config,
    unit_ends,
    write_config,
)

pytestmark = [pytest.mark.torch, pytest.mark.slow]

TRIALS = 200
UNITS = TRIALS * 2 * 2 * 2  # trials x epochs x partitions x (train, validate)


def config(store):
    space = {
        "model": "cerebro_spark.training:MLPSpec",
        "hidden_units": {"grid": [[2], [3], [4], [5]]},
        "lr": {"loguniform": [0.001, 0.1]},
        "batch_size": 32,
    }
    return tiny_config(store, space=space, procedure={"name": "random", "num_trials": TRIALS})


def test_200_trials_driver_killed_halfway_resume_equals_uninterrupted(tmp_path):
    store = tmp_path / "store"
    path = write_config(tmp_path / "many.yaml", config(store))
    driver = Driver(["run", str(path), "--experiment-id", "killed"])
    events_file = store / "experiments/killed/events.jsonl"
    halfway: dict[str, Any] = {}

    def kill_halfway() -> None:
        try:
            halfway["before"] = driver.wait_for(
                events_file, lambda events: len(unit_ends(events)) >= UNITS // 2, timeout=900
            )
        except BaseException as error:  # pytest.fail's, re-raised below
            halfway["error"] = error
        finally:
            driver.kill(signal.SIGKILL)

    # The uninterrupted run goes on here, in a store of its own, while the driver runs (and
    # is killed) beside it.
    whole_store = tmp_path / "whole"
    watcher = threading.Thread(target=kill_halfway, daemon=True)
    watcher.start()
    try:
        run_experiment(parse_config(config(whole_store)), experiment_id="whole")
    except BaseException:
        driver.kill(signal.SIGKILL)  # not left to run to its end
        raise
    finally:
        watcher.join()
    if "error" in halfway:
        raise halfway["error"]
    before = halfway["before"]
    whole_events, whole = strict_events(str(whole_store), "whole")
    assert len(whole.trials) == TRIALS and len(unit_ends(whole_events)) == UNITS

    _, state = strict_events(str(store), "killed")
    assert not state.finished

    resume_experiment(str(store), "killed")
    events, state = strict_events(str(store), "killed")
    assert state.finished
    assert outcome(state) == outcome(whole)
    ends = unit_ends(events)
    assert len(ends) == len(set(ends)) == UNITS
    assert set(unit_ends(before)) <= set(ends)
