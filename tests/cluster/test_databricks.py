"""DatabricksCluster against a fake Databricks workspace on 127.0.0.1.

The fast tests run databricks-sdk against :class:`FakeDatabricks` without Spark: the
application's executors come from :class:`NodeExecutors`, a stand-in for Spark's view that
shows a node's executor ``register_s`` after the node starts and keeps listing a removed
node's executor for ``linger_s`` (Spark's lag). The Spark test
(:func:`test_resize_a_real_spark_application`) runs a Spark driver in a child process (this
module, run with ``python -m``: a process has one SparkContext, and the test process may
already hold a local one) against a loopback standalone master whose worker daemons the
fake workspace starts and crashes as it resizes.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.backends._transport import Location
from cerebro_spark.cluster import ClusterManager, Executor, ResizeTimeout
from cerebro_spark.cluster._base import Capabilities
from cerebro_spark.cluster._databricks import (
    CLUSTER_ID_CONF,
    LOOPBACK,
    DatabricksCluster,
    Node,
    billed_by_node,
    host_key,
    match_workers,
    node_executors,
)
from cerebro_spark.errors import ConfigError
from tests.cluster.fake_databricks import FakeDatabricks, isolate_databricks_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_databricks_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate_databricks_config(monkeypatch, tmp_path)


class NodeExecutors(ClusterManager):
    """Spark's view of the fake cluster: one executor per node, on the node's IP."""

    capabilities = Capabilities(resizable=False, choose_victims=False)

    def __init__(self, fake: FakeDatabricks, register_s: float = 0.0, linger_s: float = 0.0):
        self.fake = fake
        self.register_s = register_s
        self.linger_s = linger_s

    def executors(self) -> list[Executor]:
        now = time.time()
        with self.fake._lock:
            nodes = [n for n in self.fake.nodes if now - n.started >= self.register_s]
            nodes += [n for n, gone in self.fake.removed if now - gone < self.linger_s]
        return [Executor(str(n.instance), n.ip, 1, since=n.started + 1.0) for n in nodes]

    def resize(self, target: int, victims: Sequence[str] = ()) -> None:
        raise AssertionError("DatabricksCluster must resize through the clusters API")


def distinct_ip(instance: int) -> str:
    return f"10.1.0.{instance}"


@pytest.fixture
def fake() -> Iterator[FakeDatabricks]:
    with FakeDatabricks(2, resize_s=0.3, node_ip=distinct_ip) as server:
        yield server


def manager(fake: FakeDatabricks, view: ClusterManager | None = None, **kwargs: Any) -> Any:
    kwargs.setdefault("backoff_s", 0.05)
    return DatabricksCluster(
        view or NodeExecutors(fake),
        cluster_id=fake.cluster_id,
        host=fake.host,
        token=fake.token,
        nodes_refresh_s=0.2,
        **kwargs,
    )


def accepted_targets(fake: FakeDatabricks) -> list[int]:
    return [c.body["num_workers"] for c in fake.resizes(200)]


# -- attaching -------------------------------------------------------------------------------


def test_attach_reads_the_cluster_and_bills_executors_as_nodes(fake: FakeDatabricks) -> None:
    begun = time.time()
    cluster = manager(fake)
    try:
        assert cluster.initial_workers == 2
        caps = cluster.capabilities
        assert caps.resizable and not caps.choose_victims
        assert (caps.min_executors, caps.max_executors) == (1, None)
        assert caps.instance_type == "m5.xlarge"
        live = cluster.executors()
        assert [e.instance for e in live] == ["i-fake00000001", "i-fake00000002"]
        assert [e.host for e in live] == ["10.1.0.1", "10.1.0.2"]
        # Nodes that ran before the manager attached are billed from the attach.
        assert all(e.since >= begun for e in live)
        assert [c.path for c in fake.calls][:2] == [
            "/.well-known/databricks-config",
            "/api/2.1/clusters/get",
        ]
        assert fake.resizes() == []
    finally:
        cluster.close()
    assert fake.resizes() == [], "close resized a cluster that was never resized"


def test_an_autoscaling_cluster_is_refused() -> None:
    with (
        FakeDatabricks(autoscale=(2, 8)) as fake,
        pytest.raises(ConfigError, match=r"autoscales \(min_workers 2, max_workers 8\)") as err,
    ):
        manager(fake)
    assert "fixed num_workers" in str(err.value)


def test_a_missing_cluster_id_names_the_spark_setting(fake: FakeDatabricks) -> None:
    with pytest.raises(ConfigError, match=CLUSTER_ID_CONF.replace(".", r"\.")) as err:
        DatabricksCluster(NodeExecutors(fake), host=fake.host, token=fake.token)
    assert "elastic.databricks.cluster_id" in str(err.value)


def test_an_unknown_cluster_is_named(fake: FakeDatabricks) -> None:
    with pytest.raises(ConfigError, match="has no cluster 0000-nope"):
        DatabricksCluster(
            NodeExecutors(fake), cluster_id="0000-nope", host=fake.host, token=fake.token
        )


def test_the_token_is_required(
    fake: FakeDatabricks, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(ConfigError, match=r"refused the credentials.*Invalid access token"):
        DatabricksCluster(
            NodeExecutors(fake), cluster_id=fake.cluster_id, host=fake.host, token="dapi-wrong"
        )
    with pytest.raises(ConfigError, match="cannot configure the Databricks client"):
        DatabricksCluster(NodeExecutors(fake), cluster_id=fake.cluster_id, host=fake.host)
    options = {"cluster_id": fake.cluster_id, "host": fake.host, "token_env": "FAKE_DBX_TOKEN"}
    with pytest.raises(ConfigError, match=r"elastic\.databricks\.token_env .*FAKE_DBX_TOKEN"):
        DatabricksCluster.from_options(NodeExecutors(fake), options)
    unauthenticated = [c for c in fake.calls if c.status == 401]
    assert len(unauthenticated) == 1 and unauthenticated[0].path == "/api/2.1/clusters/get"
    monkeypatch.setenv("FAKE_DBX_TOKEN", fake.token)
    with caplog.at_level(logging.WARNING, logger="cerebro_spark.cluster._databricks"):
        cluster = DatabricksCluster.from_options(NodeExecutors(fake), options, instance_type="x1")
    assert cluster.capabilities.instance_type == "x1"
    assert "runs node type m5.xlarge, but its nodes are billed as x1" in caplog.text
    cluster.close()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"clusterid": "x"}, r"unknown key\(s\) \['clusterid'\]"),
        ({"resize_retry_s": 0}, r"elastic\.databricks\.resize_retry_s must be a number > 0"),
        ({"resize_retry_s": "60"}, r"elastic\.databricks\.resize_retry_s .* got '60'"),
        ({"host": "127.0.0.1:1"}, r"elastic\.databricks\.host must be a workspace URL"),
        ({"cluster_id": ""}, r"elastic\.databricks\.cluster_id must be a non-empty string"),
        ({"max_workers": 0}, r"elastic\.databricks\.max_workers must be an integer >= "),
        ({"min_workers": -1}, r"elastic\.databricks\.min_workers must be an integer >= 0"),
        ({"min_workers": 3, "max_workers": 2}, r"max_workers .*min_workers 3.*got 2"),
    ],
)
def test_bad_options_name_the_key(
    fake: FakeDatabricks, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        DatabricksCluster.from_options(NodeExecutors(fake), options)
    assert fake.calls == [], "a bad option must be refused before the workspace is asked"


def test_victims_and_bounds_are_refused(fake: FakeDatabricks) -> None:
    cluster = manager(fake, max_workers=4)
    try:
        with pytest.raises(ConfigError, match="cannot choose which executors"):
            cluster.resize(1, ["1"])
        with pytest.raises(ConfigError, match=r"target 5 is outside its bounds \[1, 4\]"):
            cluster.resize(5)
        with pytest.raises(ConfigError, match=r"target 0 is outside its bounds"):
            cluster.resize(0)
    finally:
        cluster.close()
    assert fake.resizes() == []
    with pytest.raises(RuntimeError, match="is closed"):
        cluster.resize(3)


# -- resizing --------------------------------------------------------------------------------


def test_wait_returns_when_executors_serve_not_when_the_cluster_is_running(
    fake: FakeDatabricks,
) -> None:
    cluster = manager(fake, NodeExecutors(fake, register_s=1.5))
    try:
        begun = time.monotonic()
        cluster.resize(3)
        assert time.monotonic() - begun < 0.5, "resize must not block"
        live = cluster.wait(3, timeout_s=30)
        done = time.monotonic()
        running = [at for at, state in fake.states if state == "RUNNING" and at > begun]
        assert running, fake.states
        assert done - running[0] >= 1.0, "wait returned on the cluster state, not the executors"
        assert len(live) == 3 and live[-1].instance == "i-fake00000003"
        node = fake.nodes[-1]
        assert live[-1].since == pytest.approx(node.started, abs=0.01)
        assert fake.cluster_json()["num_workers"] == 3
        assert accepted_targets(fake) == [3]
    finally:
        cluster.close()


def test_a_busy_cluster_is_retried_with_backoff(fake: FakeDatabricks) -> None:
    fake.resize_s = 1.5
    cluster = manager(fake)
    try:
        cluster.resize(3)
        deadline = time.monotonic() + 10
        while cluster.requested != 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fake.state == "RESIZING"
        cluster.resize(4)
        cluster.wait(4, timeout_s=30)
        assert accepted_targets(fake) == [3, 4]
        rejected = [c for c in fake.resizes(400) if c.error_code == "INVALID_STATE"]
        assert len(rejected) >= 3, fake.calls
        assert all(c.state == "RESIZING" and c.body["num_workers"] == 4 for c in rejected)
        gaps = [b.at - a.at for a, b in itertools.pairwise(rejected)]
        assert gaps[-1] >= 3 * gaps[0], f"no exponential backoff: {gaps}"
        assert fake.resizes(200)[-1].at > rejected[-1].at
    finally:
        cluster.close()
    assert fake.cluster_json()["num_workers"] == 2


def test_a_newer_resize_replaces_one_still_waiting(fake: FakeDatabricks) -> None:
    fake.resize_s = 1.0
    cluster = manager(fake)
    try:
        cluster.resize(3)
        deadline = time.monotonic() + 10
        while cluster.requested != 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        cluster.resize(4)  # rejected while RESIZING, retried ...
        time.sleep(0.3)
        cluster.resize(5)  # ... and replaced before it is accepted
        cluster.wait(5, timeout_s=30)
        assert accepted_targets(fake) == [3, 5]
        assert {c.body["num_workers"] for c in fake.resizes(400)} <= {4, 5}
        fake.wait_running()
        assert len(fake.nodes) == 5
    finally:
        cluster.close()


def test_a_resize_that_stays_busy_is_given_up_and_wait_says_why(fake: FakeDatabricks) -> None:
    fake.resize_s = 4.0
    cluster = manager(fake, resize_retry_s=0.6)
    try:
        cluster.resize(3)
        deadline = time.monotonic() + 10
        while cluster.requested != 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        cluster.resize(4)
        begun = time.monotonic()
        with pytest.raises(ResizeTimeout, match=r"INVALID_STATE|unexpected state") as err:
            cluster.wait(4, timeout_s=60)
        assert time.monotonic() - begun < 3.5, "wait did not notice the resize was given up"
        assert err.value.target == 4 and err.value.live in (2, 3)
        assert "the Databricks resize failed: still busy" in str(err.value)
        assert 4 not in accepted_targets(fake)
        assert cluster.requested == 3
        with pytest.raises(ResizeTimeout, match=r"is (RESIZING|RUNNING) with num_workers 3"):
            cluster.wait(5, timeout_s=0.3)  # nothing asked: times out, naming the cluster
    finally:
        cluster.close()


def test_executors_of_released_nodes_are_not_counted(fake: FakeDatabricks) -> None:
    view = NodeExecutors(fake, linger_s=30.0)  # Spark would list them for 30 s more
    cluster = manager(fake, view)
    try:
        cluster.resize(1)
        live = cluster.wait(1, timeout_s=10)
        assert [e.instance for e in live] == ["i-fake00000001"]
        assert len(view.executors()) == 2, "the stand-in for Spark forgot the node too soon"
    finally:
        cluster.close()


def test_close_restores_the_size_it_found_and_is_idempotent(fake: FakeDatabricks) -> None:
    fake.resize_s = 0.8
    cluster = manager(fake)
    cluster.resize(4)
    cluster.wait(4, timeout_s=30)
    cluster.resize(3)
    deadline = time.monotonic() + 10
    while cluster.requested != 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    cluster.close()  # the cluster is RESIZING to 3: close retries until it is accepted
    assert fake.cluster_json()["num_workers"] == 2
    assert accepted_targets(fake) == [4, 3, 2]
    assert [c.body["num_workers"] for c in fake.resizes(400)][:1] == [2]
    calls = len(fake.calls)
    cluster.close()
    assert len(fake.calls) == calls
    fake.wait_running()
    assert [n.instance for n in fake.nodes] == [1, 2], "the newest nodes go first"


def test_nodes_shared_by_a_host_bill_executors_as_themselves() -> None:
    nodes = [Node("n1", "127.0.0.1", "i-1", 100.0), Node("n2", "127.0.0.1", "i-2", 100.0)]
    executors = [Executor("1", "127.0.0.1", 1, since=150.0), Executor("2", "10.0.0.9", 1)]
    billed = billed_by_node(executors, nodes, not_before=120.0)
    assert [e.instance for e in billed] == [None, None]
    assert [e.since for e in billed] == [150.0, 120.0]
    one = billed_by_node(executors[:1], nodes[:1], not_before=50.0)
    assert (one[0].instance, one[0].since) == ("i-1", 100.0)
    alone = billed_by_node([*executors[:1], Executor("3", "127.0.0.1", 1)], nodes[:1])
    assert [e.instance for e in alone] == [None, None], "two executors on one node's host"


# -- Spark Connect: the REST API only (issue 28 part 3) --------------------------------------


def test_hosts_compare_without_case_brackets_or_loopback_names() -> None:
    assert [host_key(h) for h in ("localhost", "127.0.1.1", "[::1]", "LOCALHOST")] == [LOOPBACK] * 4
    assert host_key(" 10.1.0.7 ") == "10.1.0.7" and host_key("Node-A") == "node-a"
    assert [host_key(h) for h in (None, "", "unknown")] == [None, None, None]


def test_workers_are_matched_to_the_nodes_on_their_hosts() -> None:
    nodes = [
        Node("n1", "10.1.0.1", "i-1", 100.0),
        Node("n2", "10.1.0.2", "i-2", 101.0),
        Node("n3", "10.1.0.3", "i-3", 102.0),
        Node("n4", None, "i-4", 103.0),  # being set up: no private IP yet
    ]
    workers = {"w0": "10.1.0.2", "w1": "10.1.0.1", "w2": "10.9.9.9", "w3": None}
    placement = match_workers(nodes, workers)
    assert placement.nodes == {"n1": ("w1",), "n2": ("w0",), "n3": ()}
    assert placement.idle == ("n3",)
    assert placement.elsewhere == ("w2", "w3")  # a host the API does not list, none known


def test_nodes_sharing_a_host_get_its_workers_in_turn() -> None:
    """A loopback cluster: every node on 127.0.0.1, the Connect workers on ``localhost``."""
    nodes = [Node("b", "127.0.0.1", started=2.0), Node("a", "127.0.0.1", started=1.0)]
    one = match_workers(nodes, {"w0": "localhost"})
    assert one.nodes == {"a": ("w0",), "b": ()} and one.idle == ("b",)
    three = match_workers(nodes, {"w10": "localhost", "w2": "127.0.0.1", "w1": "localhost"})
    assert three.nodes == {"a": ("w1", "w10"), "b": ("w2",)}
    assert three.idle == () and three.elsewhere == ()
    assert match_workers([], {"w0": "localhost"}).elsewhere == ("w0",)


def test_serving_nodes_are_the_executors_billed_as_themselves() -> None:
    nodes = [Node("n1", "10.1.0.1", "i-1", 100.0), Node("n2", "10.1.0.2", None, None)]
    nodes.append(Node("n3", None, "i-3", 150.0))
    live = node_executors(nodes, 4, not_before=120.0)
    assert [(e.executor_id, e.host, e.cores) for e in live] == [
        ("n1", "10.1.0.1", 4),
        ("n2", "10.1.0.2", 4),
    ]
    assert [(e.billed_as, e.since) for e in live] == [("i-1", 120.0), ("n2", 120.0)]


class ConnectConf:
    def __init__(self, settings: dict[str, str], refused: tuple[str, ...] = ()) -> None:
        self.settings = settings
        self.refused = refused

    def get(self, key: str, default: Any = None) -> Any:
        if key in self.refused:
            raise RuntimeError(f"[CONFIG_NOT_AVAILABLE] {key}")
        return self.settings.get(key, default)


class ConnectSession:
    """What the manager reads of a Spark Connect session: ``conf`` (no SparkContext)."""

    def __init__(self, settings: dict[str, str], refused: tuple[str, ...] = ()) -> None:
        self.conf = ConnectConf(settings, refused)

    @property
    def sparkContext(self) -> Any:
        raise AssertionError("JVM_ATTRIBUTE_NOT_SUPPORTED: the manager asked for the JVM")


ConnectSession.__module__ = "pyspark.sql.connect.session"  # is_connect_session's test


def connect_manager(fake: FakeDatabricks, settings: dict[str, str], **kwargs: Any) -> Any:
    kwargs.setdefault("backoff_s", 0.05)
    return DatabricksCluster(
        ConnectSession(settings),  # type: ignore[arg-type]
        host=fake.host,
        token=fake.token,
        nodes_refresh_s=0.2,
        **kwargs,
    )


def test_on_spark_connect_the_nodes_are_the_executors_and_resizes_go_through_rest(
    fake: FakeDatabricks,
) -> None:
    settings = {CLUSTER_ID_CONF: fake.cluster_id, "spark.executor.cores": "4"}
    cluster = connect_manager(fake, settings)
    try:
        assert cluster.rest_only and cluster.cluster_id == fake.cluster_id
        assert not cluster.capabilities.workers_follow
        live = cluster.executors()
        assert [(e.executor_id, e.host, e.cores) for e in live] == [
            ("fake-node-0001", "10.1.0.1", 4),
            ("fake-node-0002", "10.1.0.2", 4),
        ]
        cluster.resize(3)
        live = cluster.wait(3, timeout_s=30)
        assert [e.instance for e in live][-1] == "i-fake00000003"
        assert accepted_targets(fake) == [3]
        placement = cluster.placement({"w0": "10.1.0.1", "w1": "10.1.0.3", "w2": "127.0.0.1"})
        assert placement.idle == ("fake-node-0002",) and placement.elsewhere == ("w2",)
    finally:
        cluster.close()
    assert accepted_targets(fake) == [3, 2]


def test_on_spark_connect_the_cluster_id_and_dynamic_allocation_are_read_from_spark_conf(
    fake: FakeDatabricks,
) -> None:
    with pytest.raises(ConfigError, match="serverless compute has no cluster id") as err:
        DatabricksCluster(
            ConnectSession({}, refused=(CLUSTER_ID_CONF,)),  # type: ignore[arg-type]
            host=fake.host,
            token=fake.token,
        )
    assert "elastic.databricks.cluster_id" in str(err.value)
    with pytest.raises(ConfigError, match=r"spark\.dynamicAllocation\.enabled=true"):
        connect_manager(fake, {"spark.dynamicAllocation.enabled": "true"})
    assert fake.calls == []
    cluster = connect_manager(fake, {}, cluster_id=fake.cluster_id)  # the option, no conf
    assert cluster.rest_only and cluster.executors()[0].cores == 1
    cluster.close()


def test_a_connect_worker_is_located_at_the_address_it_connected_from() -> None:
    """The REST API lists a node's private IP: a Connect worker reports it, not its name."""
    from cerebro_spark.backends._connect import ConnectTransport

    transport = ConnectTransport(ConnectSession({"spark.master": "yarn"}))
    transport.open(2, 1.0)
    registration = {"hostname": "0101-node-a", "executor_hint": "3"}
    where = transport.locate("w0", registration, "10.1.0.7")
    assert (where.host, where.executor_id) == ("10.1.0.7", "3")  # type: ignore[union-attr]
    loopback = transport.locate("w1", registration, "127.0.0.1")
    assert loopback is not None and loopback.host == "0101-node-a"
    local = ConnectTransport(ConnectSession({"spark.master": "local[2]"}))
    local.open(2, 1.0)
    assert local.locate("w0", registration, "10.1.0.7") == Location("localhost", "driver")


# -- a real Spark application --------------------------------------------------------------------

CHILD_TIMEOUT_S = 240


def _kill_tree(pid: int) -> None:
    from cerebro_spark.cluster._daemons import descendants

    for member in [pid, *descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)


@pytest.mark.spark
def test_resize_a_real_spark_application(tmp_path: Path) -> None:
    """2 → 3 → 1 → close (2): executors appear and disappear in Spark; wait waits for them."""
    from cerebro_spark.cluster import SparkDaemons
    from cerebro_spark.cluster._daemons import MASTER_CLASS, WORKER_CLASS, alive, wait_until

    daemons = SparkDaemons(tmp_path / "standalone")
    daemons.start_master()
    try:
        with FakeDatabricks(2, daemons=daemons, resize_s=1.0) as fake:
            wait_until(lambda: daemons.alive_workers() == 2, "two worker daemons", 120)
            report = tmp_path / "report.json"
            args = {
                "master": daemons.url,
                "host": fake.host,
                "cluster_id": fake.cluster_id,
                "report": str(report),
            }
            log = tmp_path / "driver.log"
            with log.open("w") as sink:
                child = subprocess.Popen(
                    [sys.executable, "-m", "tests.cluster.test_databricks", json.dumps(args)],
                    cwd=ROOT,
                    env={**os.environ, "PYTHONPATH": str(ROOT), "FAKE_DBX_TOKEN": fake.token},
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                )
                try:
                    child.wait(timeout=CHILD_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    _kill_tree(child.pid)
                    child.wait()
            lines = log.read_text(errors="replace").splitlines()
            tail = "\n".join(line for line in lines if " WARN " not in line)[-6000:]
            assert child.returncode == 0 and report.exists(), f"driver failed:\n{tail}"
            result = json.loads(report.read_text())
            logging.getLogger(__name__).info("report: %s", result)
            accepted = accepted_targets(fake)
            fake.wait_running()
            nodes_at_end = len(fake.nodes)
    finally:
        for instance in daemons.worker_instances():
            daemons.crash_worker(instance)
        daemons.stop(MASTER_CLASS, 1)
    pids = [daemons.pid_of(WORKER_CLASS, i) for i in daemons.worker_instances(running=False)]
    pids.append(daemons.pid_of(MASTER_CLASS, 1))
    assert len(pids) >= 4, "the fake started no daemon for the grow and the restore"
    assert not [p for p in pids if p is not None and alive(p)], "daemons still run"

    assert result["initial"] == 2
    steps = {s["target"]: s for s in result["steps"]}
    assert list(steps) == [3, 1]
    grow, shrink = steps[3], steps[1]
    assert len(grow["before"]) == 2 and len(grow["after"]) == 3
    assert set(grow["before"]) < set(grow["after"]), "growing replaced an executor"
    # The API said RUNNING before Spark had the new executor: wait waited for Spark.
    assert grow["spark_executors_when_running"] < 3, grow
    assert grow["waited_after_running_s"] > 0, grow
    assert len(shrink["after"]) == 1 and set(shrink["after"]) < set(grow["after"])
    assert shrink["count_after_wait"] == 1
    assert result["restored"] == 2, "close did not bring the executors back to 2"
    assert accepted == [3, 1, 2]
    assert nodes_at_end == 2
    assert result["rows"] == [100, 100, 100]


def _child_main(raw: str) -> None:
    """The Spark driver: a session on the loopback master, resized through the fake API."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(threadName)s %(name)s: %(message)s"
    )
    from cerebro_spark.cluster import DatabricksCluster
    from cerebro_spark.spark_session import spark_session

    args = json.loads(raw)
    session = spark_session(
        args["master"],
        "cerebro-databricks-test",
        {
            CLUSTER_ID_CONF: args["cluster_id"],
            "spark.ui.enabled": "false",
            "spark.executor.cores": "1",
            "spark.executor.memory": "1g",
            "spark.dynamicAllocation.enabled": "false",
        },
    )
    report: dict[str, Any] = {"steps": [], "rows": []}
    try:
        cluster = DatabricksCluster.from_options(
            session, {"host": args["host"], "token_env": "FAKE_DBX_TOKEN", "resize_retry_s": 60}
        )
        report["initial"] = cluster.initial_workers
        cluster.wait(2, timeout_s=120)
        report["rows"].append(session.range(100).count())
        for target in (3, 1):
            before = [e.executor_id for e in cluster.executors()]
            cluster.resize(target)
            running_at, when_running = None, None
            begun = time.monotonic()
            while running_at is None and time.monotonic() - begun < 60:
                state = cluster.workspace.clusters.get(cluster.cluster_id).state
                if cluster.requested == target and state is not None and state.value == "RUNNING":
                    running_at = time.monotonic()
                    when_running = len(cluster.executors())
                time.sleep(0.1)
            live = cluster.wait(target, timeout_s=120)
            done = time.monotonic()
            report["rows"].append(session.range(100).count())
            report["steps"].append(
                {
                    "target": target,
                    "before": before,
                    "after": [e.executor_id for e in live],
                    "spark_executors_when_running": when_running,
                    "waited_after_running_s": None if running_at is None else done - running_at,
                    "count_after_wait": len(cluster.executors()),
                    "billed_as": [e.billed_as for e in live],
                }
            )
        cluster.close()
        report["restored"] = len(cluster.wait(2, timeout_s=120))
    finally:
        session.stop()
    Path(args["report"]).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    _child_main(sys.argv[1])
