"""Elastic runs on a Spark Connect session (issue 28, part 3), in the Connect child process.

* ``spark`` needs the SparkContext: it is refused, naming the alternatives, before an
  elastic run plans anything.
* ``databricks`` works through the REST API only: it attaches to the fake workspace of
  ``tests/cluster/fake_databricks.py`` (its nodes on 127.0.0.1, where the Connect
  server's workers run) with the cluster id of the session's ``spark.conf``, lists the
  nodes as executors billed by node, resizes through ``clusters/resize`` and waits on the
  nodes the API lists; the pool's real Connect workers are matched to the nodes by host.
  An elastic run on Connect grows the cluster between stages through the API and the
  controller starts the new workers itself (the pool does not see executors arrive).
* With no cluster id (serverless) an elastic run takes the capacity the session gives as
  given: it plans stages, seconds and dollars at those workers, runs them and resizes
  nothing; a deadline that capacity misses is refused, saying why and what to do.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cerebro_spark.backends import SparkBackend, WorkerJob
from cerebro_spark.cli import main as cli_main
from cerebro_spark.cluster import DatabricksCluster, SparkExecutors
from cerebro_spark.cluster._databricks import CLUSTER_ID_CONF
from cerebro_spark.driver import experiment_spec
from cerebro_spark.elastic import PlanInfeasible
from cerebro_spark.engine import parse_config, read_events, run_experiment
from cerebro_spark.errors import ConfigError
from cerebro_spark.store import open_store
from tests.backends.contract import RESULT_TIMEOUT_S, make_dataset
from tests.cluster.fake_databricks import FakeDatabricks, isolate_databricks_config

pytestmark = [pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]
TOKEN_ENV = "FAKE_DBX_TOKEN"


@pytest.fixture(autouse=True)
def _no_databricks_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate_databricks_config(monkeypatch, tmp_path)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDatabricks]:
    """A fake workspace whose cluster has two nodes on 127.0.0.1 (the Connect workers')."""
    with FakeDatabricks(2, resize_s=0.3) as server:
        monkeypatch.setenv(TOKEN_ENV, server.token)
        yield server


@pytest.fixture
def cluster_id_in_conf(spark_connect: Any, fake: FakeDatabricks) -> Iterator[str]:
    """The session's ``spark.conf`` names the fake's cluster, as a Databricks notebook's."""
    spark_connect.conf.set(CLUSTER_ID_CONF, fake.cluster_id)
    try:
        yield fake.cluster_id
    finally:
        spark_connect.conf.unset(CLUSTER_ID_CONF)


def accepted_targets(fake: FakeDatabricks) -> list[int]:
    return [c.body["num_workers"] for c in fake.resizes(200)]


def rest_manager(spark: Any, fake: FakeDatabricks, **kwargs: Any) -> DatabricksCluster:
    return DatabricksCluster(
        spark, host=fake.host, token=fake.token, nodes_refresh_s=0.2, backoff_s=0.05, **kwargs
    )


def elastic_config(store: Path, master: str, manager: str, **elastic: Any) -> dict[str, Any]:
    """SHA over 4 trials on the iris rows, 2 workers, through the Connect server."""
    return {
        "name": "connect-elastic",
        "seed": 5,
        "store": str(store),
        "data": {"source": "sklearn:iris", "partitions": 2},
        "procedure": {"name": "sha", "eta": 2, "num_trials": 4},
        "epochs": 2,
        "workers": 2,
        "backend": "spark",
        "spark": {"master": master},
        "model": "cerebro_spark.training:MLPSpec",
        "space": {"hidden_units": [8], "lr": {"grid": [0.01, 0.02, 0.03, 0.05]}, "batch_size": 16},
        "deadline": 600,
        "elastic": {
            "manager": manager,
            "prices": str(ROOT / "conf/prices/local.yaml"),
            "instance_type": "local-core",
            "profile": str(ROOT / "conf/profiles/digits-local.yaml"),
            **elastic,
        },
    }


def events_of(store: Path, experiment: str) -> list[dict[str, Any]]:
    return read_events(open_store(str(store)).child(f"experiments/{experiment}"))


# -- refusals --------------------------------------------------------------------------------


def test_the_spark_manager_refuses_a_connect_session(spark_connect: Any) -> None:
    refusal = r"which a Spark Connect session \(Databricks Standard access mode, .*\) does not"
    with pytest.raises(ConfigError, match=refusal):
        SparkExecutors(spark_connect)


def test_an_elastic_run_with_the_spark_manager_is_refused_naming_the_alternatives(
    spark_connect: Any, connect_server: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = parse_config(elastic_config(tmp_path, connect_server.url, "spark"))
    with (
        caplog.at_level(logging.INFO, logger="cerebro_spark.engine"),
        pytest.raises(ConfigError, match="elastic manager 'spark' resizes executors") as err,
    ):
        run_experiment(config, experiment_id="refused")
    assert "set elastic.manager to databricks" in str(err.value)
    assert "capacity the session gives" in str(err.value)
    assert "elastic plan" not in caplog.text, "refused only after planning"


def test_the_databricks_manager_without_a_cluster_id_says_where_it_runs(
    spark_connect: Any, fake: FakeDatabricks
) -> None:
    with pytest.raises(ConfigError, match="no Databricks cluster id") as err:
        rest_manager(spark_connect, fake)
    assert "elastic.databricks.cluster_id" in str(err.value)
    assert "serverless compute has no cluster id" in str(err.value)
    assert fake.calls == [], "asked the workspace without a cluster to ask about"


# -- the databricks manager through the REST API ---------------------------------------------


def test_the_databricks_manager_attaches_through_the_rest_api_and_bills_nodes(
    spark_connect: Any, fake: FakeDatabricks, cluster_id_in_conf: str
) -> None:
    begun = time.time()
    cluster = rest_manager(spark_connect, fake)  # the cluster id: the session's spark.conf
    try:
        assert cluster.rest_only and cluster.cluster_id == cluster_id_in_conf
        caps = cluster.capabilities
        assert caps.resizable and not caps.choose_victims and not caps.workers_follow
        assert caps.instance_type == "m5.xlarge"
        live = cluster.executors()
        assert [e.executor_id for e in live] == ["fake-node-0001", "fake-node-0002"]
        assert [e.instance for e in live] == ["i-fake00000001", "i-fake00000002"]
        assert {e.host for e in live} == {"127.0.0.1"}
        assert all(e.since >= begun for e in live), "nodes that ran before billed from attach"
        assert {c.path for c in fake.calls} == {
            "/.well-known/databricks-config",
            "/api/2.1/clusters/get",
        }
    finally:
        cluster.close()
    assert fake.resizes() == []


def test_a_resize_reaches_the_workspace_and_wait_waits_on_its_nodes(
    spark_connect: Any, fake: FakeDatabricks
) -> None:
    cluster = rest_manager(spark_connect, fake, cluster_id=fake.cluster_id)
    try:
        begun = time.monotonic()
        cluster.resize(3)
        assert time.monotonic() - begun < 0.5, "resize must not block"
        live = cluster.wait(3, timeout_s=30)
        assert accepted_targets(fake) == [3]
        assert fake.cluster_json()["num_workers"] == 3
        assert live[-1].instance == "i-fake00000003"
        assert live[-1].since == pytest.approx(fake.nodes[-1].started, abs=0.01)
        cluster.resize(1)
        assert [e.instance for e in cluster.wait(1, timeout_s=30)] == ["i-fake00000001"]
    finally:
        cluster.close()  # back to the 2 workers it found
    assert accepted_targets(fake) == [3, 1, 2]
    fake.wait_running()
    assert len(fake.nodes) == 2


def test_the_pools_connect_workers_are_matched_to_the_nodes_by_host(
    spark_connect: Any, fake: FakeDatabricks, tmp_path: Path
) -> None:
    dataset = make_dataset(tmp_path / "dataset")
    job = WorkerJob(dataset_uri=dataset.uri, store=open_store(str(tmp_path)), torch_threads=1)
    cluster = rest_manager(spark_connect, fake, cluster_id=fake.cluster_id)
    try:
        with SparkBackend(2, spark=spark_connect) as backend:
            backend.start(job)
            backend.wait_started(RESULT_TIMEOUT_S)
            hosts = {w: info.host for w, info in backend.workers().items()}
            placement = cluster.placement(hosts)
        assert placement.nodes == {"fake-node-0001": ("w0",), "fake-node-0002": ("w1",)}
        assert placement.idle == () and placement.elsewhere == ()
    finally:
        cluster.close()


def test_an_elastic_run_grows_the_cluster_through_the_rest_api(
    spark_connect: Any, connect_server: Any, fake: FakeDatabricks, tmp_path: Path
) -> None:
    """Stage 1 on one node, stage 2 on two (a plan file): the run shrinks the cluster to
    one node, then grows it through ``clusters/resize`` and starts the second worker
    itself; at the end the cluster is back at its two nodes."""
    options = {"cluster_id": fake.cluster_id, "host": fake.host, "token_env": TOKEN_ENV}
    raw = elastic_config(tmp_path, connect_server.url, "databricks", databricks=options)
    spec = experiment_spec(parse_config(raw))
    stages = []
    for i, (stage, workers) in enumerate(zip(spec.stages, [1, 2], strict=True)):
        times = {"start": 10.0 + 30.0 * i, "end": 30.0 * (i + 1), "usd": 0.0}
        stages.append({"trials": stage.trials, "epochs": stage.epochs, "workers": workers, **times})
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"feasible": True, "instance_type": "local-core", "stages": stages}))
    raw["elastic"]["plan"] = str(plan)
    raw["elastic"]["resize_timeout"] = 120
    result = run_experiment(parse_config(raw), experiment_id="grown")
    assert {t.status for t in result.trials} <= {"completed", "stopped"}
    events = events_of(tmp_path, "grown")
    assert [e["workers"] for e in events if e["event"] == "stage_actual"] == [1, 2]
    (grown,) = [e for e in events if e["event"] == "resized"]
    assert (grown["from"], grown["target"], grown["workers"]) == (1, 2, 2)
    assert not [e for e in events if e["event"] == "resize_failed"]
    plan_event = next(e for e in events if e["event"] == "elastic_plan")
    assert plan_event["capabilities"]["workers_follow"] is False
    assert accepted_targets(fake) == [1, 2], "the run's resizes did not reach the workspace"
    summary = next(e for e in events if e["event"] == "elastic_summary")
    assert summary["instances"] == 2 and summary["usd"] > 0  # billed by node


# -- serverless: the capacity as given -------------------------------------------------------


def test_an_elastic_run_on_serverless_plans_and_runs_at_the_given_capacity(
    spark_connect: Any, connect_server: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    raw = elastic_config(tmp_path, connect_server.url, "databricks")
    with caplog.at_level(logging.INFO, logger="cerebro_spark.engine"):
        result = run_experiment(parse_config(raw), experiment_id="serverless")
    assert "elastic plan at the capacity the session gives, 2 workers of local-core" in (
        caplog.text
    )
    assert "serverless compute" in caplog.text
    assert {t.status for t in result.trials} <= {"completed", "stopped"}
    events = events_of(tmp_path, "serverless")
    plan_event = next(e for e in events if e["event"] == "elastic_plan")
    assert plan_event["given_capacity"]["workers"] == 2
    assert plan_event["workers"] == [2, 2]
    assert plan_event["seconds"] > 0 and plan_event["usd"] > 0
    assert plan_event["capabilities"]["resizable"] is False
    plans = [e for e in events if e["event"] == "stage_plan"]
    assert plans and {e["workers"] for e in plans} == {2}
    assert [e["workers"] for e in events if e["event"] == "stage_actual"] == [2, 2]
    assert not [e for e in events if e["event"] in ("resized", "resize_failed")]
    summary = next(e for e in events if e["event"] == "elastic_summary")
    assert summary["instances"] == 2 and summary["usd"] > 0


def test_a_budget_the_given_capacity_overruns_is_refused_saying_what_to_do(
    spark_connect: Any, connect_server: Any, tmp_path: Path
) -> None:
    raw = elastic_config(tmp_path, connect_server.url, "databricks", budget=0.0001)
    with pytest.raises(PlanInfeasible) as err:
        run_experiment(parse_config(raw), experiment_id="dear")
    message = str(err.value)
    assert message.startswith("at the capacity the session gives, 2 workers of local-core")
    assert "serverless compute" in message and "over the budget of $0.0001" in message
    assert "give the session more workers" in message


def test_plan_on_serverless_shows_the_plan_at_the_given_capacity(
    spark_connect: Any, connect_server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``cerebro-spark plan`` plans what ``run`` follows: every stage on the session's 2
    workers, not the 1 worker the planner would choose if it could resize."""
    raw = elastic_config(tmp_path, connect_server.url, "databricks")
    raw["data"]["partitions"] = 4  # the profile's
    path = tmp_path / "serverless.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert cli_main(["plan", str(path), "--format", "json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert set(planned["workers"]) == {2} and planned["seconds"] > 0 and planned["usd"] > 0
    raw["elastic"]["manager"] = "standalone"  # free to choose: it takes 1 here
    path.write_text(yaml.safe_dump(raw))
    assert cli_main(["plan", str(path), "--format", "json"]) == 0
    chosen = json.loads(capsys.readouterr().out)
    assert set(chosen["workers"]) != {2}
