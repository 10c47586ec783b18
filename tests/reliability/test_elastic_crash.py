"""The driver killed during a resize of an elastic run, and resumed (issue 12, part 6).

The run: successive halving of 4 small MLPs on the digits (rungs of 1 epoch on 2, then 1
executors) with ``manager: spark`` on ``local-cluster[2,1,1024]``, following a plan file
that shrinks the application from 2 executors to 1 between the rungs. The controller
retires a worker, releases its executor with ``killExecutors`` and waits for the
membership to settle, and only then logs ``stage_actual`` and ``resized``: the driver is
killed before ``resized`` is in the log, with SIGKILL while a worker retires, with SIGINT
once an executor is gone (a resize begun, its membership not settled).

The uninterrupted run ends as the same config on two fixed local workers does. A last
case runs the same search with ``manager: standalone`` (a master and worker
daemons the driver starts on 127.0.0.1), killed after the release of an executor.

Each case ends with: the log readable and folding, every unit done before the kill kept
and every unit done exactly once, the results (checkpoint digests, metrics, best epochs)
equal to an uninterrupted run of the same config, and no process of the killed driver
(its JVM, the local-cluster's executors) left running.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from cerebro_spark.cluster import SparkDaemons
from cerebro_spark.cluster._daemons import MASTER_CLASS, WORKER_CLASS, alive, wait_until
from cerebro_spark.engine import experiment_spec, parse_config
from tests.reliability.conftest import (
    Driver,
    outcome,
    strict_events,
    unit_ends,
    whole_lines,
    write_config,
)

pytestmark = [pytest.mark.spark, pytest.mark.torch, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ENV = {
    "SPARK_LOCAL_IP": "127.0.0.1",
    "PYSPARK_PYTHON": sys.executable,
    "PYSPARK_DRIVER_PYTHON": sys.executable,
    "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
}
UNITS = (4 + 2) * 2 * 2  # trial-epochs x partitions x (train, validate)


def elastic_config(store: Path, plan: Path) -> dict[str, Any]:
    """4 MLPs, rungs of 1 epoch, on local-cluster executors that the plan shrinks 2 -> 1."""
    return {
        "name": "resize",
        "seed": 7,
        "store": str(store),
        "backend": "spark",
        "data": {"source": "sklearn:digits", "partitions": 2},
        "procedure": {"name": "sha", "eta": 2, "num_trials": 4},
        "epochs": 2,
        "workers": 2,
        "visit_order": "seeded",
        "space": {
            "model": "cerebro_spark.training:MLPSpec",
            "hidden_units": [8],
            "lr": {"loguniform": [1e-3, 1e-2]},
            "batch_size": 64,
        },
        "spark": {
            "master": "local-cluster[2,1,1024]",
            "conf": {
                "spark.ui.enabled": False,
                "spark.executor.cores": 1,
                "spark.task.cpus": 1,
                "spark.executor.memory": "1g",
                "spark.dynamicAllocation.enabled": False,
            },
        },
        "elastic": {
            "manager": "spark",
            "deadline": 600,
            "prices": str(ROOT / "conf/prices/local.yaml"),
            "instance_type": "local-core",
            "profile": str(ROOT / "conf/profiles/digits-local.yaml"),
            "plan": str(plan),
            "spark": {"max_executors": 2},
        },
    }


def write_plan(path: Path, raw: dict[str, Any], workers: list[int]) -> Path:
    """A plan file (as ``cerebro-spark plan --format json`` writes it) with these workers."""
    spec = experiment_spec(parse_config({**raw, "elastic": None}))
    stages, end = [], 0.0
    for stage, count in zip(spec.stages, workers, strict=True):
        stages.append(
            {
                "trials": stage.trials,
                "epochs": stage.epochs,
                "workers": count,
                "start": end,
                "end": end + 10.0,
                "usd": 0.0,
            }
        )
        end += 10.0
    path.write_text(json.dumps({"feasible": True, "stages": stages}))
    return path


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The store and config file shared by the reference and the faulted runs."""
    where = tmp_path_factory.mktemp("elastic-crash")
    store = where / "store"
    raw = elastic_config(store, where / "plan.json")
    write_plan(where / "plan.json", raw, [2, 1])
    return store, write_config(where / "resize.yaml", raw)


@pytest.fixture(scope="module")
def reference(setup: tuple[Path, Path]) -> dict[str, Any]:
    """The outcome of an uninterrupted run of the config (it resizes 2 -> 1 once)."""
    store, config = setup
    driver = Driver(["run", str(config), "--experiment-id", "reference"], env=ENV)
    assert driver.finish() == 0, driver.output()[-5000:]
    events, state = strict_events(str(store), "reference")
    resized = [e for e in events if e["event"] == "resized"]
    assert [(e["stage"], e["from"], e["target"], e["workers"]) for e in resized] == [(1, 2, 1, 1)]
    assert state.finished
    return outcome(state)


def test_the_elastic_run_trains_what_a_fixed_run_of_its_config_trains(
    setup: tuple[Path, Path], reference: dict[str, Any]
) -> None:
    """Resized between its rungs (two executors, then one), the search ends with the
    weights, metrics and best epochs of its config on two fixed local workers: the
    executor count changes where units run, never what they compute (seeded visit
    orders)."""
    store, config = setup
    raw = yaml.safe_load(config.read_text())
    del raw["elastic"], raw["spark"]
    raw["backend"] = "local"
    fixed = Driver(
        ["run", str(write_config(config.parent / "fixed.yaml", raw)), "--experiment-id", "fixed"],
        env=ENV,
    )
    assert fixed.finish() == 0, fixed.output()[-5000:]
    _, state = strict_events(str(store), "fixed")
    assert state.finished and outcome(state) == reference


def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            pid = int(stat.parent.name)
            if int(fields[2]) == pgid and alive(pid):
                members.append(pid)
    return members


MOMENTS = {
    # the resize begun: the victim's worker is being retired (its partitions re-homing,
    # then drained), its executor held
    "retiring": "retiring worker ",
    # the victim's executor released with killExecutors, the membership not settled yet
    "released": "executors released; waiting for 1",
}


def held_driver(args: list[str], moment: str) -> Driver:
    """A driver held still right after it logs ``MOMENTS[moment]``, until it is signalled.

    Without the hold the next steps of the resize (and the next round) can finish before a
    signal sent from here arrives, on a loaded machine.
    """
    return Driver(args, env=ENV, hold_at=MOMENTS[moment])


class Output:
    """Reads a driver's output as it comes (so that its pipe never fills up)."""

    def __init__(self, driver: Driver) -> None:
        self.lines: list[str] = []
        self._seen = threading.Condition()
        assert driver.process.stdout is not None
        self._thread = threading.Thread(target=self._read, args=(driver.process.stdout,))
        self._thread.daemon = True
        self._thread.start()

    def _read(self, stream: Any) -> None:
        for raw in stream:
            with self._seen:
                self.lines.append(raw.decode(errors="replace"))
                self._seen.notify_all()

    def wait_for(self, text: str, timeout: float) -> bool:
        """Whether a line holding ``text`` came within ``timeout`` seconds."""
        with self._seen:
            return self._seen.wait_for(
                lambda: any(text in line for line in self.lines), timeout=timeout
            )

    def text(self) -> str:
        """Everything read so far (all of it once the driver ended)."""
        self._thread.join(timeout=10)
        with self._seen:
            return "".join(self.lines)


def signal_mid_resize(driver: Driver, events_file: Path, moment: str, sig: int) -> Output:
    """Send ``sig`` to the driver (alone) the moment its resize logs ``MOMENTS[moment]``.

    The driver is one of :func:`held_driver` for that moment.

    Checks that the resize had not settled (no ``resized`` in the log) when it landed.
    """
    output = Output(driver)
    if not output.wait_for(MOMENTS[moment], timeout=240):
        driver.kill(signal.SIGKILL)
        pytest.fail(f"the driver never logged {MOMENTS[moment]!r}:\n{output.text()[-5000:]}")
    os.kill(driver.process.pid, sig)  # the driver alone: what it started must go with it
    driver.process.wait(timeout=120)
    events = whole_lines(events_file)
    assert sum(e["event"] == "round_end" for e in events) == 1, "not at the first boundary"
    assert not any(e["event"] == "resized" for e in events), "the resize had settled"
    return output


def check_nothing_left(pgid: int, timeout: float = 60.0) -> None:
    """No process of the killed driver's group (JVM, executors, Python workers) remains."""
    deadline = time.monotonic() + timeout
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = group_members(pgid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)  # whatever the assertion says: stop it all
    assert not left, f"processes of the killed driver still run: {left}"


def resume_and_check(store: Path, experiment_id: str, reference: dict[str, Any]) -> None:
    """``cerebro-spark resume`` finishes the run as the uninterrupted one finished."""
    events, state = strict_events(str(store), experiment_id)  # the log folds
    assert not state.finished
    kept = set(unit_ends(events))
    assert kept, "the kill landed before any unit was logged"
    before = events
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cerebro_spark.cli",
            "resume",
            str(store / "experiments" / experiment_id),
        ],
        env={**os.environ, **ENV},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    events, state = strict_events(str(store), experiment_id)
    assert state.finished
    assert outcome(state) == reference
    ends = unit_ends(events)
    assert kept <= set(ends)  # the units done before the kill were kept, not redone
    assert len(ends) == len(set(ends)) == UNITS
    assert [e["event"] for e in events].count("experiment_end") == 1
    assert not any(e["event"] == "unit_failed" for e in events)
    # The resumed driver went on elastic: the second rung on the one executor planned.
    after = events[len(before) :]
    resized = [e for e in after if e["event"] == "resized"]
    assert [(e["stage"], e["target"], e["workers"]) for e in resized] == [(1, 1, 1)]
    second_rung = {e["worker"] for e in after if e["event"] == "unit_end" and e["round"] == 1}
    assert len(second_rung) == 1
    assert [a["workers"] for a in state.stage_actuals.values()][-1] == 1
    assert state.elastic_summary is not None


def test_a_driver_sigkilled_during_a_resize_resumes_to_the_same_results(
    setup: tuple[Path, Path], reference: dict[str, Any]
) -> None:
    """SIGKILL while a worker retires; at the other moment, an executor released, the
    driver gets SIGINT here and SIGKILL on its own standalone cluster (the tests below)."""
    store, config = setup
    moment = "retiring"
    experiment_id = f"sigkill-{moment}"
    driver = held_driver(["run", str(config), "--experiment-id", experiment_id], moment)
    try:
        events_file = store / f"experiments/{experiment_id}/events.jsonl"
        signal_mid_resize(driver, events_file, moment, signal.SIGKILL)
        assert driver.process.returncode == -signal.SIGKILL
        check_nothing_left(driver.process.pid)
    finally:
        driver.kill(signal.SIGKILL)
    resume_and_check(store, experiment_id, reference)


def test_a_driver_sigint_during_a_resize_exits_130_and_resumes(
    setup: tuple[Path, Path], reference: dict[str, Any]
) -> None:
    store, config = setup
    driver = held_driver(["run", str(config), "--experiment-id", "sigint"], "released")
    try:
        output = signal_mid_resize(
            driver, store / "experiments/sigint/events.jsonl", "released", signal.SIGINT
        )
        assert driver.process.returncode == 130, output.text()[-5000:]
        assert "continue with 'cerebro-spark resume'" in output.text()
        check_nothing_left(driver.process.pid)
    finally:
        driver.kill(signal.SIGKILL)
    resume_and_check(store, "sigint", reference)


def test_a_driver_sigkilled_during_a_resize_of_its_own_standalone_cluster(
    setup: tuple[Path, Path], reference: dict[str, Any]
) -> None:
    """``manager: standalone``: the driver started a master and worker daemons on 127.0.0.1;
    killed mid-resize, its daemons are stopped all the same (by the cluster's watcher), and
    the resumed run (a new cluster under the same root) ends as the reference did."""
    store, config = setup
    raw = yaml.safe_load(config.read_text())
    root = config.parent / "standalone"
    del raw["spark"]["master"]
    raw["elastic"]["manager"] = "standalone"
    raw["elastic"]["standalone"] = {"root": str(root), "cores": 1, "memory": "1g",
                                    "max_executors": 2}  # fmt: skip
    del raw["elastic"]["spark"]
    path = write_config(config.parent / "standalone.yaml", raw)
    daemons = SparkDaemons(root)
    driver = held_driver(["run", str(path), "--experiment-id", "standalone"], "released")
    try:
        events_file = store / "experiments/standalone/events.jsonl"
        signal_mid_resize(driver, events_file, "released", signal.SIGKILL)
        started = [p for p in map(daemons.pid_of, [MASTER_CLASS, WORKER_CLASS], [1, 1]) if p]
        assert started
        wait_until(lambda: not any(alive(p) for p in started), "the daemons to stop", 60)
        check_nothing_left(driver.process.pid)
    finally:
        driver.kill(signal.SIGKILL)
    try:
        resume_and_check(store, "standalone", reference)
    finally:
        left = daemons.worker_instances()
        daemons.stop_all()
    assert not left, f"worker daemons {left} still run after the resumed run"
