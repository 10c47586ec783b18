"""The registry of cluster managers: names, refusals, caps, and a run opened through it.

No torch, no Spark: a run's cluster is a registered opener that yields the fake cluster of
``test_elastic_controller`` and a WorkerPool over the in-memory fake transport.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cerebro_spark.backends import WorkerPool
from cerebro_spark.driver import cost_table
from cerebro_spark.driver._config import MANAGERS as CONFIG_MANAGERS
from cerebro_spark.driver._preflight import preflight
from cerebro_spark.elastic import PlanInfeasible, load_catalog, load_profile
from cerebro_spark.engine import (
    ExperimentConfig,
    _api,
    _managers,
    experiment_prefix,
    experiment_spec,
    load_state,
    read_events,
    run_experiment,
)
from cerebro_spark.engine._elastic import (
    capacity_type,
    elastic_run,
    given_capacity,
    plan_at_capacity,
    plan_config,
    planned_spec,
)
from cerebro_spark.engine._managers import (
    MANAGERS,
    FixedWorkers,
    GivenCapacity,
    ManagerEntry,
    manager_entry,
    register,
    runs_on_connect,
)
from cerebro_spark.errors import ConfigError
from cerebro_spark.store import open_store
from tests.backends import fake_transport
from tests.backends.fake_transport import ThreadTransport
from tests.engine.test_elastic_controller import PoolCluster
from tests.engine.test_elastic_resume import ROOT, elastic_sha_config

PROFILE = str(ROOT / "conf/profiles/digits-local.yaml")


@pytest.fixture(autouse=True)
def script() -> Iterator[fake_transport.Script]:
    yield fake_transport.reset()
    fake_transport.reset()


def with_elastic(config: ExperimentConfig, **changes: Any) -> ExperimentConfig:
    assert config.elastic is not None
    return config.replace(elastic=dataclasses.replace(config.elastic, **changes))


class PoolClusterOpener:
    """A registered opener: the fake cluster, and a pool whose workers are its executors."""

    def __init__(self) -> None:
        self.opened: list[tuple[int, str]] = []
        self.closed = 0

    @contextlib.contextmanager
    def __call__(
        self, config: ExperimentConfig, elastic: Any, workers: int, instance_type: str
    ) -> Iterator[tuple[PoolCluster, Any]]:
        self.opened.append((workers, instance_type))
        cluster = PoolCluster()

        def factory(c: ExperimentConfig) -> WorkerPool:
            cluster.pool = WorkerPool(
                ThreadTransport(), workers, heartbeat_s=0.5, heartbeat_timeout_s=10
            )
            return cluster.pool

        try:
            yield cluster, factory
        finally:
            self.closed += 1


@pytest.fixture
def opener(monkeypatch: pytest.MonkeyPatch) -> PoolClusterOpener:
    """Registered as the ``spark`` manager for one test."""
    opener = PoolClusterOpener()
    monkeypatch.setitem(
        _managers._REGISTRY, "spark", ManagerEntry("spark", opener, "max_executors")
    )
    return opener


def test_the_names_a_config_accepts_are_the_registrys() -> None:
    """The config parser's names (a floor below) and the registry's are the same, in order."""
    assert MANAGERS == ("standalone", "spark", "databricks", "ec2")
    assert MANAGERS == CONFIG_MANAGERS
    assert [manager_entry(name).name for name in MANAGERS] == list(MANAGERS)


def test_an_unknown_manager_is_refused_naming_the_registered_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        manager_entry("yarn")
    assert str(refused.value) == (
        "elastic.manager must be one of ['standalone', 'spark', 'databricks', 'ec2'], got 'yarn'"
    )
    # elastic_run refuses it before reading its profile (which does not exist here).
    config = with_elastic(elastic_sha_config(tmp_path), manager="yarn", profile="/nowhere.yaml")
    with pytest.raises(ConfigError, match="got 'yarn'"), elastic_run(config):
        pytest.fail("the run started")


def test_a_name_is_registered_once() -> None:
    opener = PoolClusterOpener()
    with pytest.raises(ValueError, match="'spark' is registered already"):
        register("spark", cap_option="max_executors")(opener)
    assert manager_entry("spark").open is not opener


@pytest.mark.parametrize(
    ("manager", "option"),
    [
        ("standalone", "max_executors"),
        ("spark", "max_executors"),
        ("databricks", "max_workers"),
        ("ec2", "max_instances"),
    ],
)
def test_each_manager_caps_the_runs_executors_with_its_own_option(
    tmp_path: Path, manager: str, option: str
) -> None:
    profile = load_profile(PROFILE)
    config = elastic_sha_config(tmp_path)
    assert planned_spec(config, profile).max_workers == profile.partitions  # 4: no cap
    capped = with_elastic(config, manager=manager, options={option: 2})
    assert planned_spec(capped, profile).max_workers == 2
    bad = with_elastic(config, manager=manager, options={option: 0})
    with pytest.raises(ConfigError) as refused:
        planned_spec(bad, profile)
    assert str(refused.value) == f"elastic.{manager}.{option} must be an integer >= 1, got 0"


def test_the_standalone_manager_refuses_an_unknown_option_before_starting_anything(
    tmp_path: Path,
) -> None:
    config = with_elastic(elastic_sha_config(tmp_path), manager="standalone", options={"cpus": 2})
    assert config.elastic is not None
    with pytest.raises(ConfigError) as refused:  # noqa: SIM117 (the open, then the enter)
        with manager_entry("standalone").open(config, config.elastic, 1, "local-core"):
            pytest.fail("the cluster started")
    assert str(refused.value) == (
        "unknown field(s) ['cpus'] in elastic.standalone; "
        "known: ['cores', 'max_executors', 'memory', 'root']"
    )


def test_elastic_run_opens_the_registered_manager_at_the_first_stages_size(
    tmp_path: Path, opener: PoolClusterOpener
) -> None:
    with elastic_run(elastic_sha_config(tmp_path)) as (factory, controller):
        assert opener.opened == [(controller.stages[0].workers, "local-core")]
        assert opener.closed == 0
        pool = factory(elastic_sha_config(tmp_path))
        assert isinstance(controller.manager, PoolCluster) and controller.manager.pool is pool
        pool.close()
    assert opener.closed == 1


def test_a_run_opens_its_cluster_through_the_registry(
    tmp_path: Path, opener: PoolClusterOpener
) -> None:
    """``run_experiment`` with ``elastic:`` plans, opens the registered manager, follows it."""
    result = run_experiment(elastic_sha_config(tmp_path), experiment_id="e1")
    events = read_events(open_store(str(tmp_path)).child(experiment_prefix("e1")))
    plans = [e for e in events if e["event"] == "elastic_plan"]
    assert len(plans) == 1 and plans[0]["manager"] == "spark"
    assert opener.opened == [(plans[0]["workers"][0], "local-core")]
    assert opener.closed == 1
    assert [e["event"] for e in events].count("elastic_summary") == 1
    assert result.experiment_id == "e1"


def refused(store: Path) -> ExperimentConfig:
    """An elastic run no plan can afford: a budget of a ten-millionth of a dollar."""
    return with_elastic(elastic_sha_config(store), budget=1e-7)


def test_a_refused_elastic_run_is_refused_at_the_call(
    tmp_path: Path, opener: PoolClusterOpener
) -> None:
    """A budget no plan meets is refused by ``elastic_run`` before any cluster opens.

    (``run`` enters it before it writes anything: ``tests/driver/test_no_trial.py``.)
    """
    with pytest.raises(PlanInfeasible, match="budget"), elastic_run(refused(tmp_path)):
        pytest.fail("the run started")
    assert opener.opened == []


def optimistic_profile(path: Path) -> str:
    """The demo profile, a hundred times too fast: units, start-up, provider latency."""
    raw = load_profile(PROFILE).to_dict()
    raw["unit_seconds"] = {"local-core": 1e-4}
    raw["validation_seconds"] = {"local-core": 1e-4}
    raw["hop_seconds"] = 1e-5
    raw["worker_start_seconds"] = 0.01
    raw["scale_seconds"] = 0.01
    raw["scale_seconds_each"] = 0.01
    raw["driver_start_seconds"] = 0.01
    for key in [k for k in raw if k.endswith("_spread")]:
        del raw[key]
    out = path / "optimistic.yaml"
    out.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(out)


def test_an_optimistic_profile_misses_its_deadline_aloud(
    tmp_path: Path,
    opener: PoolClusterOpener,
    caplog: pytest.LogCaptureFixture,
    script: fake_transport.Script,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plan far too fast: the run calibrates at once, re-plans, and says the deadline
    was missed against the first plan, why, and as a WARNING.

    The plan says well under a second, and each initial worker's first partition load
    takes as long as the whole deadline. The pre-flight runs once before, untimed, and the
    run is handed its result: on a slow machine the run's own pre-flight (importing torch,
    preparing the dataset) could take the whole deadline and the plan would be refused.
    """
    deadline = 5.0
    for worker in ("w0", "w1", "w2", "w3"):
        script.slow_loads[worker] = deadline
    config = with_elastic(elastic_sha_config(tmp_path), profile=optimistic_profile(tmp_path))
    config = config.replace(deadline=deadline)
    checked = preflight(config, open_store(str(tmp_path)))
    monkeypatch.setattr(_api, "preflight", lambda *args, **kwargs: checked)
    with caplog.at_level(logging.WARNING, logger="cerebro_spark.engine._elastic"):
        run_experiment(config, experiment_id="late")
    events = read_events(open_store(str(tmp_path)).child(experiment_prefix("late")))
    plan = next(e for e in events if e["event"] == "elastic_plan")
    summary = next(e for e in events if e["event"] == "elastic_summary")
    assert plan["seconds"] < 1.0 and plan["load"]["cpus"] >= 1
    assert summary["first_plan"]["seconds"] == plan["seconds"]
    assert summary["deadline"] == deadline and summary["seconds"] > deadline
    assert summary["deadline_met"] is False and summary["budget_met"] is True
    # Start-up was measured at the first boundary, far off the profile: re-planned at once.
    calibrations = [e for e in events if e["event"] == "calibration"]
    assert calibrations[0]["what"] == "start-up" and calibrations[0]["off"] is True
    assert calibrations[0]["measured"] > 10 * calibrations[0]["planned"]
    replans = summary["replans"]
    assert replans and replans[0]["stage"] == 0
    assert replans[0]["reason"].startswith("measured start-up")
    assert summary["last_plan"]["seconds"] > summary["first_plan"]["seconds"]
    # The miss: by how much, against the first plan, which stage and which part.
    (miss,) = summary["misses"]
    over = summary["seconds"] - deadline
    assert miss.startswith(
        f"deadline missed: {summary['seconds']:.1f} s against a deadline of {deadline:.0f} s"
    )
    assert f"({over:.1f} s over; the first plan said {plan['seconds']:.1f} s" in miss
    assert "stage 1 ran" in miss and "over the first plan" in miss
    assert "most in start-up" in miss
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert miss in warned
    assert any(m.startswith("calibrating the profile: measured start-up") for m in warned)
    # Every stage records its parts; they add up to its seconds.
    for actual in (e for e in events if e["event"] == "stage_actual"):
        assert sum(actual["parts"].values()) == pytest.approx(actual["seconds"], abs=0.01)
        assert set(actual["planned_parts"]) <= set(actual["parts"])
    # The table a user reads: the totals against the first plan and the last, then the miss.
    _, state = load_state(str(tmp_path), "late")
    table = cost_table(state)
    assert table is not None
    rows = table.splitlines()
    first = next(r for r in rows if r.split()[:2] == ["total", "first"])
    last = next(r for r in rows if r.split()[:2] == ["total", "last"])
    assert f"{plan['seconds']:.1f}/{summary['seconds']:.1f}" in first.replace(" ", "")
    assert first != last and rows[-1] == miss


# -- the capacity as given (issue 28 part 3: serverless, nothing to resize) ------------------


def given_two(config: ExperimentConfig, elastic: Any) -> GivenCapacity:
    return GivenCapacity(2, "nothing to resize here")


@pytest.fixture
def fixed_opener(monkeypatch: pytest.MonkeyPatch) -> PoolClusterOpener:
    """Registered as the ``spark`` manager, at a capacity of 2 workers taken as given."""
    opener = PoolClusterOpener()
    entry = ManagerEntry("spark", opener, "max_executors", given_two)
    monkeypatch.setitem(_managers._REGISTRY, "spark", entry)
    return opener


def test_a_run_at_the_given_capacity_plans_every_stage_there(
    tmp_path: Path, fixed_opener: PoolClusterOpener, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.INFO, logger="cerebro_spark.engine._elastic"),
        elastic_run(elastic_sha_config(tmp_path)) as (_, controller),
    ):
        assert [s.workers for s in controller.stages] == [2] * len(controller.stages)
        assert fixed_opener.opened == [(2, "local-core")]
        assert controller.stages[-1].end > 0 and sum(s.usd for s in controller.stages) > 0
        fields = controller._plan_fields
        assert fields["given_capacity"] == {"workers": 2, "reason": "nothing to resize here"}
        assert fields["static"]["workers"] == 2
    assert (
        "elastic plan at the capacity the session gives, 2 workers of local-core "
        "(nothing to resize here): stages [2, 2, 2]"
    ) in caplog.text


def test_plan_at_capacity_simulates_the_given_workers_and_refuses_what_it_misses(
    tmp_path: Path,
) -> None:
    profile = load_profile(PROFILE)
    catalog = load_catalog(str(ROOT / "conf/prices/local.yaml"))
    config = elastic_sha_config(tmp_path)
    given = GivenCapacity(3, "serverless")
    spec = planned_spec(config, profile, given.workers)
    assert spec.max_workers == 3
    planned = plan_at_capacity(spec, profile, catalog, given, deadline=600.0, seed=config.seed)
    assert planned.outcome.workers == (3,) * len(spec.stages)
    assert planned.static == planned.outcome and planned.instance_type == "local-core"
    assert plan_config(config, profile, catalog, given).outcome == planned.outcome
    # More workers than the run can use: planned at the most it uses (the partitions).
    wide = plan_at_capacity(
        planned_spec(config, profile), profile, catalog, GivenCapacity(9, "x"), deadline=600.0
    )
    assert set(wide.outcome.workers) == {profile.partitions}
    with pytest.raises(PlanInfeasible) as late:
        plan_at_capacity(spec, profile, catalog, given, deadline=5.0, budget=1e-9)
    message = str(late.value)
    assert message.startswith("at the capacity the session gives, 3 workers of local-core ")
    assert "(serverless)" in message and "over the deadline of 5 s and the budget" in message
    assert "give the session more workers" in message
    assert late.value.fastest[0] == "local-core" and set(late.value.fastest[1].workers) == {3}


def test_the_instance_type_at_a_given_capacity_comes_from_the_config() -> None:
    profile = load_profile(PROFILE)
    catalog = load_catalog(str(ROOT / "conf/prices/aws-us-east-1.yaml"))
    with pytest.raises(ConfigError, match=r"set elastic\.instance_type to what the session"):
        capacity_type(profile, catalog, None)
    with pytest.raises(ConfigError, match="nope"):
        capacity_type(profile, catalog, "nope")
    local = load_catalog(str(ROOT / "conf/prices/local.yaml"))
    assert capacity_type(profile, local, None) == "local-core"  # the one type both share


def test_a_plan_file_off_the_given_capacity_is_refused(
    tmp_path: Path, fixed_opener: PoolClusterOpener
) -> None:
    config = elastic_sha_config(tmp_path)
    spec = experiment_spec(config)
    stages = [{"trials": s.trials, "epochs": s.epochs, "workers": 1} for s in spec.stages]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"feasible": True, "stages": stages}))
    with pytest.raises(ConfigError, match=r"runs stages on \[1, 1, 1\] workers, but the run"):  # noqa: SIM117
        with elastic_run(with_elastic(config, plan=str(plan))):
            pytest.fail("the run started")
    assert fixed_opener.opened == []


def test_the_spark_manager_refuses_a_connect_session_before_planning(tmp_path: Path) -> None:
    """No server needed: an ``sc://`` master says the session will be Spark Connect."""
    config = with_elastic(elastic_sha_config(tmp_path), profile="/nowhere.yaml")
    config = config.replace(spark=dataclasses.replace(config.spark, master="sc://127.0.0.1:9"))
    assert runs_on_connect(config)
    with pytest.raises(ConfigError) as refused, elastic_run(config):
        pytest.fail("the run started")
    message = str(refused.value)
    assert message.startswith("elastic manager 'spark' resizes executors through the SparkContext")
    assert "set elastic.manager to databricks" in message and "leave elastic out" in message


def test_a_classic_config_resizes_without_asking_any_session(tmp_path: Path) -> None:
    config = elastic_sha_config(tmp_path)
    assert config.spark.master is None and not runs_on_connect(config)
    databricks = with_elastic(config, manager="databricks")
    assert given_capacity(databricks) is None
    assert given_capacity(config) is None  # spark, classic
    from cerebro_spark.cluster import _databricks  # imports databricks-sdk

    assert _managers.CLUSTER_ID_CONF == _databricks.CLUSTER_ID_CONF
    assert _managers.DATABRICKS_OPTIONS == _databricks._OPTIONS


def test_the_fixed_workers_are_billed_as_the_plan_priced_them() -> None:
    fixed = FixedWorkers(2, "local-core", "serverless")
    live = fixed.executors()
    assert [e.billed_as for e in live] == ["given-0", "given-1"]
    assert not fixed.capabilities.resizable
    assert fixed.capabilities.min_executors == fixed.capabilities.max_executors == 2
    fixed.resize(2)
    with pytest.raises(
        ConfigError, match=r"cannot resize to 3 workers: .* as given \(serverless\)"
    ):
        fixed.resize(3)
