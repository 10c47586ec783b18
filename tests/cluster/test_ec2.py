"""Ec2Cluster and Ec2Fleet against moto's EC2 server on 127.0.0.1.

The fast tests drive :class:`Ec2Fleet` (launch, tags, user data, max_instances, cleanup of a
failed launch, foreign instances left alone), the user-data template and ``from_options``:
no Spark, no daemons. The Spark tests start a real standalone master; moto runs no user
data, so ``ec2_machines.LoopbackMachines`` plays the machines: per launched instance it
runs the instance's real user data (read back from moto) on its own loopback address, and
stops the daemon once moto says the instance is terminated. The resize scenario runs its
Spark driver in a child process (this module, run with ``python -m``): a process holds one
SparkContext, and the test process may already hold a local one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.cluster import Ec2Cluster, Ec2Fleet
from cerebro_spark.cluster._daemons import MASTER_CLASS, alive, descendants, free_port
from cerebro_spark.cluster._ec2 import (
    TAG_CLUSTER,
    TAG_EXPERIMENT,
    TAG_LAUNCH,
    USER_DATA_DEFAULTS,
    USER_DATA_TEMPLATE,
    render_user_data,
)
from cerebro_spark.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
REGION = "us-east-1"
CHILD_TIMEOUT_S = 300
INSTANCE_TYPE = "m5.xlarge"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": REGION,
    "AWS_EC2_METADATA_DISABLED": "true",
}


def _client(endpoint_url: str) -> Any:
    import boto3

    return boto3.client(
        "ec2",
        endpoint_url=endpoint_url,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@dataclasses.dataclass(frozen=True)
class Network:
    endpoint_url: str
    image_id: str
    subnet_id: str
    security_group_id: str


@pytest.fixture(scope="module")
def ec2(_moto_endpoint: str) -> Any:
    return _client(f"http://{_moto_endpoint}")


@pytest.fixture(scope="module")
def network(ec2: Any, _moto_endpoint: str) -> Network:
    """An AMI, and the default subnet and security group of moto's default VPC."""
    return Network(
        f"http://{_moto_endpoint}",
        ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"],
        ec2.describe_subnets()["Subnets"][0]["SubnetId"],
        ec2.describe_security_groups(GroupNames=["default"])["SecurityGroups"][0]["GroupId"],
    )


def _fleet(ec2: Any, network: Network, name: str, **kwargs: Any) -> Ec2Fleet:
    return Ec2Fleet(
        ec2,
        cluster=name,
        experiment="exp-1",
        image_id=network.image_id,
        instance_type=INSTANCE_TYPE,
        subnet_id=network.subnet_id,
        security_group_ids=[network.security_group_id],
        **kwargs,
    )


def _states(ec2: Any, ids: list[str]) -> dict[str, str]:
    answer = ec2.describe_instances(InstanceIds=ids)
    return {
        i["InstanceId"]: i["State"]["Name"] for r in answer["Reservations"] for i in r["Instances"]
    }


def _tags(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


# -- the fleet (no Spark) ------------------------------------------------------------------


def test_a_fleet_launches_tagged_instances_and_terminates_only_its_own(
    ec2: Any, network: Network, request: pytest.FixtureRequest
) -> None:
    name = f"fleet-{request.node.name[-20:]}-{time.time_ns()}"
    fleet = _fleet(ec2, network, name, user_data="#!/bin/bash\necho hi\n", tags={"team": "ml"})
    other = _fleet(ec2, network, name + "-other")  # same experiment, another cluster
    foreign = ec2.run_instances(
        ImageId=network.image_id, InstanceType=INSTANCE_TYPE, MinCount=1, MaxCount=1
    )["Instances"][0]["InstanceId"]
    neighbour = other.launch(1)[0]["InstanceId"]

    launched = fleet.launch(2)
    ids = [i["InstanceId"] for i in launched]
    assert len(set(ids)) == 2
    for instance in fleet.describe(ids):
        tags = _tags(instance)
        assert tags[TAG_CLUSTER] == name
        assert tags[TAG_EXPERIMENT] == "exp-1"
        assert tags["Name"] == f"{name}-worker"
        assert tags["team"] == "ml"
        assert len(tags[TAG_LAUNCH]) == 32
        assert instance["InstanceType"] == INSTANCE_TYPE
        assert instance["ImageId"] == network.image_id
        assert instance["SubnetId"] == network.subnet_id
        assert [g["GroupId"] for g in instance["SecurityGroups"]] == [network.security_group_id]
        raw = ec2.describe_instance_attribute(
            InstanceId=instance["InstanceId"], Attribute="userData"
        )
        import base64

        assert base64.b64decode(raw["UserData"]["Value"]).decode() == "#!/bin/bash\necho hi\n"
    assert len({_tags(i)[TAG_LAUNCH] for i in fleet.describe(ids)}) == 1  # one launch
    assert sorted(i["InstanceId"] for i in fleet.held()) == sorted(ids)

    with pytest.raises(ConfigError, match=f"instance {foreign} is not one of cluster {name}"):
        fleet.terminate([ids[0], foreign])
    assert _states(ec2, [ids[0], foreign]) == {ids[0]: "running", foreign: "running"}

    assert fleet.terminate([ids[0]]) == [ids[0]]
    assert [i["InstanceId"] for i in fleet.held()] == [ids[1]]
    assert fleet.terminate_all() == [ids[1]]
    assert fleet.held() == []
    assert fleet.terminate_all() == []  # idempotent
    assert set(_states(ec2, ids).values()) == {"terminated"}
    assert _states(ec2, [foreign, neighbour]) == {foreign: "running", neighbour: "running"}
    ec2.terminate_instances(InstanceIds=[foreign])
    other.terminate_all()


def test_a_fleet_never_holds_more_than_max_instances(ec2: Any, network: Network) -> None:
    fleet = _fleet(ec2, network, f"fleet-max-{time.time_ns()}", max_instances=3)
    first = [i["InstanceId"] for i in fleet.launch(2)]
    with pytest.raises(
        ConfigError, match=r"launching 2 more instances would hold 4, over max_instances 3"
    ):
        fleet.launch(2)
    assert len(fleet.held()) == 2  # the refused call launched nothing
    fleet.launch(1)
    fleet.terminate(first[:1])  # a terminated instance no longer counts
    fleet.launch(1)
    assert len(fleet.held()) == 3
    with pytest.raises(ConfigError, match="count must be an integer >= 1, got 0"):
        fleet.launch(0)
    fleet.terminate_all()


def test_a_launch_that_fails_after_ec2_started_instances_terminates_them(
    ec2: Any, network: Network
) -> None:
    """The call fails on the way back (as a timed-out answer would): the instances EC2 did
    start are found by the launch's tag and terminated."""
    fleet = _fleet(ec2, network, f"fleet-fail-{time.time_ns()}")

    def lose_the_answer(**kwargs: Any) -> None:
        raise ConnectionError("the answer to RunInstances was lost")

    ec2.meta.events.register("after-call.ec2.RunInstances", lose_the_answer)
    try:
        with pytest.raises(ConnectionError, match="answer to RunInstances was lost"):
            fleet.launch(2)
    finally:
        ec2.meta.events.unregister("after-call.ec2.RunInstances", lose_the_answer)
    started = fleet.describe()
    assert len(started) == 2  # EC2 did launch them ...
    assert {i["State"]["Name"] for i in started} == {"terminated"}  # ... and they are gone
    assert fleet.held() == []


def test_a_launch_ec2_refuses_raises_its_error_and_holds_nothing(
    ec2: Any, network: Network
) -> None:
    from botocore.exceptions import ClientError

    fleet = _fleet(ec2, network, f"fleet-refused-{time.time_ns()}", iam_instance_profile="nope")
    with pytest.raises(ClientError, match="Instance profile nope not found"):
        fleet.launch(1)
    assert fleet.held() == []


def test_fleet_arguments_are_checked(ec2: Any, network: Network) -> None:
    with pytest.raises(ConfigError, match="max_instances must be an integer >= 1, got 0"):
        _fleet(ec2, network, "x", max_instances=0)
    with pytest.raises(ConfigError, match="tag 'cerebro-spark:cluster' is set by cerebro-spark"):
        _fleet(ec2, network, "x", tags={TAG_CLUSTER: "y"})
    with pytest.raises(ConfigError, match="cluster must be a non-empty string"):
        _fleet(ec2, network, "")


# -- the user data (no Spark) --------------------------------------------------------------


def test_the_default_user_data_is_a_valid_script_that_starts_one_worker(tmp_path: Path) -> None:
    values = {
        **USER_DATA_DEFAULTS,
        "cluster": "c1",
        "experiment": "exp 1",
        "master_url": "spark://10.0.0.5:7077",
        "cores": 4,
        "memory": "12g",
        "spark_home": "/opt/my spark",
    }
    script = render_user_data(USER_DATA_TEMPLATE, values)
    assert "{{" not in script
    assert "export SPARK_HOME='/opt/my spark'" in script  # values are shell-quoted
    assert "--cores 4 --memory 12g" in script
    assert script.rstrip().endswith("spark://10.0.0.5:7077")
    assert "169.254.169.254/latest/meta-data/local-ipv4" in script  # host_command, raw
    path = tmp_path / "user-data.sh"
    path.write_text(script)
    checked = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


def test_user_data_placeholders_and_size_are_checked() -> None:
    assert render_user_data("a {{ x }} b {{y}}", {"x": "1", "y": "two words"}) == (
        "a 1 b 'two words'"
    )
    with pytest.raises(ConfigError, match=r"placeholder \{\{missing\}\} has no value"):
        render_user_data("{{missing}}", {"x": 1})
    with pytest.raises(ConfigError, match="user data is 20000 bytes; EC2 takes at most 16384"):
        render_user_data("#" * 20000, {})


def test_from_options_names_the_bad_key(tmp_path: Path) -> None:
    def build(**options: Any) -> None:
        Ec2Cluster.from_options(
            {"image_id": "ami-1", **options}, workers=1, instance_type="m5.xlarge", experiment="e"
        )

    with pytest.raises(ConfigError, match=r"elastic\.ec2\.image_i is not a setting; known:"):
        Ec2Cluster.from_options(
            {"image_i": "ami-1"}, workers=1, instance_type="m5.xlarge", experiment="e"
        )
    with pytest.raises(ConfigError, match=r"elastic\.ec2\.image_id is required"):
        Ec2Cluster.from_options({}, workers=1, instance_type="m5.xlarge", experiment="e")
    with pytest.raises(
        ConfigError, match=r"elastic\.ec2\.max_instances must be an integer, got '4'"
    ):
        build(max_instances="4")
    with pytest.raises(ConfigError, match=r"elastic\.ec2\.max_instances must be > 0, got 0"):
        build(max_instances=0)
    with pytest.raises(ConfigError, match=r"elastic\.ec2\.security_group_ids must be a list of"):
        build(security_group_ids=[1])
    with pytest.raises(ConfigError, match=r"elastic\.ec2\.tags\.a must be a string or a number"):
        build(tags={"a": [1]})
    with pytest.raises(ConfigError, match="set user_data or user_data_file, not both"):
        build(user_data="x", user_data_file="y")
    with pytest.raises(ConfigError, match=r"elastic\.ec2\.user_data_file /nonexistent cannot"):
        build(user_data_file="/nonexistent")
    with pytest.raises(ConfigError, match=r"elastic\.ec2: user data placeholder \{\{nope\}\}"):
        build(user_data="{{nope}}")
    with pytest.raises(ConfigError, match=r"master_host '192\.0\.2\.1' is not an address of this"):
        build(master_host="192.0.2.1")
    with pytest.raises(ConfigError, match="workers 3 is over max_instances 2"):
        Ec2Cluster.from_options(
            {"image_id": "ami-1", "max_instances": 2},
            workers=3,
            instance_type="m5.xlarge",
            experiment="e",
        )


# -- a real master (Spark daemons, no SparkContext) ----------------------------------------


@pytest.mark.spark
def test_a_failed_boot_terminates_every_instance_and_stops_the_master(
    ec2: Any, network: Network, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    booted: list[bool] = []
    port = free_port()

    def bootstrap(instance: Any) -> str:
        with socket.socket() as probe:  # the master runs while instances boot
            booted.append(probe.connect_ex(("127.0.0.1", port)) == 0)
        raise RuntimeError("this image has no Spark")

    temp = tmp_path / "temp"  # where the cluster makes the master's directory
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    name = f"cluster-fail-{time.time_ns()}"
    with pytest.raises(RuntimeError, match=r"failed to boot: i-.*this image has no Spark"):
        Ec2Cluster(
            2,
            image_id=network.image_id,
            instance_type=INSTANCE_TYPE,
            experiment="exp-fail",
            client=ec2,
            name=name,
            master_port=port,
            bootstrap=bootstrap,
            register_timeout_s=60,
        )
    fleet = _fleet(ec2, network, name)
    instances = fleet.describe()
    assert len(instances) == 2
    assert booted and all(booted)
    assert {i["State"]["Name"] for i in instances} == {"terminated"}
    with socket.socket() as probe:  # the master it started is gone
        assert probe.connect_ex(("127.0.0.1", port)) != 0
    assert list(temp.iterdir()) == []  # and so is its directory


# -- resizing a real cluster (child driver) ------------------------------------------------


@pytest.fixture(scope="module")
def scenario(
    ec2: Any, network: Network, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """Run the resize scenario in a child driver; yield its report and what moto holds."""
    tmp = tmp_path_factory.mktemp("ec2")
    name = f"cerebro-ec2-test-{time.time_ns()}"
    # Instances the cluster did not launch: one untagged, one of the same experiment.
    foreign = [
        ec2.run_instances(
            ImageId=network.image_id, InstanceType=INSTANCE_TYPE, MinCount=1, MaxCount=1
        )["Instances"][0]["InstanceId"],
        _fleet(ec2, network, name + "-neighbour").launch(1)[0]["InstanceId"],
    ]
    report_path = tmp / "report.json"
    args = {
        "network": dataclasses.asdict(network),
        "name": name,
        "root": str(tmp),
        "report": str(report_path),
    }
    log = tmp / "driver.log"
    with log.open("w") as sink:
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.cluster.test_ec2", json.dumps(args)],
            cwd=ROOT,
            env={**os.environ, **CREDENTIALS, "PYTHONPATH": str(ROOT)},
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
        try:
            child.wait(timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for pid in [child.pid, *descendants(child.pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            child.wait()
    leftovers = []
    for pid_file in tmp.glob("**/pids/*.pid"):  # the master's and every machine's daemon
        pid = int(pid_file.read_text())
        if alive(pid):
            leftovers.append(str(pid_file))
            for member in [pid, *descendants(pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(member, signal.SIGKILL)
    lines = log.read_text(errors="replace").splitlines()
    tail = "\n".join(line for line in lines if " WARN " not in line)[-8000:]
    try:
        assert child.returncode == 0 and report_path.exists(), (
            f"driver failed ({child.returncode}):\n{tail}"
        )
        report: dict[str, Any] = json.loads(report_path.read_text())
        if "error" in report:
            pytest.fail(f"the scenario failed in the driver:\n{report['error']}\n{tail}")
        report["leftovers"] = leftovers
        report["instances"] = _fleet(ec2, network, name).describe()
        report["foreign_states"] = _states(ec2, foreign)
        yield report
    finally:
        mine = _fleet(ec2, network, name)
        with contextlib.suppress(Exception):
            mine.terminate_all()
        ec2.terminate_instances(InstanceIds=foreign)


def _instance_ids(executors: list[dict[str, Any]]) -> list[str]:
    return [e["instance"] for e in executors]


@pytest.mark.spark
@pytest.mark.slow
def test_executors_are_billed_as_the_instances_their_workers_boot_on(
    scenario: dict[str, Any],
) -> None:
    start = scenario["at_start"]
    launches = {i["InstanceId"]: i["LaunchTime"].timestamp() for i in scenario["instances"]}
    assert len(start) == 2
    assert len(set(_instance_ids(start))) == 2
    assert set(_instance_ids(start)) <= set(launches)
    hosts = scenario["hosts_at_start"]
    for executor in start:
        assert executor["host"] == hosts[executor["instance"]]  # 127.0.0.N, one per instance
        assert executor["host"].startswith("127.0.0.") and executor["host"] != "127.0.0.1"
        assert executor["since"] == launches[executor["instance"]]
    for instance in scenario["instances"]:
        tags = _tags(instance)
        assert tags[TAG_CLUSTER] == scenario["name"]
        assert tags[TAG_EXPERIMENT] == "exp-ec2"
        assert tags["owner"] == "tests"
    assert scenario["user_data"].count(scenario["master_url"]) == 1
    assert scenario["job"] == sum(x * x for x in range(8))


@pytest.mark.spark
@pytest.mark.slow
def test_growing_launches_an_instance_whose_executor_joins(scenario: dict[str, Any]) -> None:
    assert scenario["executors_right_after_grow"] == 2  # resize returned before it booted
    grown = scenario["grown"]
    assert len(grown) == 3
    new = set(_instance_ids(grown)) - set(_instance_ids(scenario["at_start"]))
    assert len(new) == 1
    assert scenario["capabilities"]["max_executors"] == 4
    assert scenario["capabilities"]["instance_type"] == INSTANCE_TYPE


@pytest.mark.spark
@pytest.mark.slow
def test_shrinking_releases_the_victims_and_terminates_their_instances(
    scenario: dict[str, Any],
) -> None:
    grown = {e["executor_id"]: e["instance"] for e in scenario["grown"]}
    victims = scenario["victims"]
    assert len(victims) == 2
    (survivor,) = scenario["shrunk"]
    assert survivor["executor_id"] not in victims
    victim_instances = [grown[v] for v in victims]
    assert scenario["states_after_shrink"] == dict.fromkeys(victim_instances, "terminated")
    assert scenario["states_after_shrink"].keys().isdisjoint(scenario["running_after_shrink"])
    assert list(scenario["running_after_shrink"]) == [survivor["instance"]]


@pytest.mark.spark
@pytest.mark.slow
def test_a_shrink_terminates_an_instance_still_booting(scenario: dict[str, Any]) -> None:
    assert len(scenario["surplus"]) == 1
    assert scenario["surplus_state"] == "terminated"
    assert scenario["surplus_booted"] == []  # it never ran a worker
    assert len(scenario["after_surplus"]) == 1


@pytest.mark.spark
@pytest.mark.slow
def test_max_instances_is_enforced(scenario: dict[str, Any]) -> None:
    assert scenario["over_max"] == ("Ec2Cluster: target 5 is outside its bounds [1, 4]")


@pytest.mark.spark
@pytest.mark.slow
def test_close_terminates_all_it_launched_and_nothing_else(scenario: dict[str, Any]) -> None:
    assert len(scenario["instances"]) == 4  # 2 at start, 1 to grow, 1 cut while booting
    assert {i["State"]["Name"] for i in scenario["instances"]} == {"terminated"}
    assert scenario["held_after_close"] == []
    assert scenario["master_alive_after_close"] is False
    assert scenario["foreign_states"] == dict.fromkeys(scenario["foreign_states"], "running")
    assert scenario["leftovers"] == []
    assert scenario["machines_running_after_close"] == {}


# -- the child driver ----------------------------------------------------------------------


def _wait(condition: Any, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.2)


def _child_main(raw: str) -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(threadName)s %(name)s: %(message)s"
    )
    logging.getLogger("botocore").setLevel(logging.WARNING)
    args = json.loads(raw)
    network = Network(**args["network"])
    root = Path(args["root"])
    report: dict[str, Any] = {"name": args["name"]}
    from tests.cluster.ec2_machines import LoopbackMachines

    machines = LoopbackMachines(_client(network.endpoint_url), root / "machines", boot_latency_s=2)
    try:
        _scenario(network, root, args["name"], machines, report)
    except Exception:
        logging.getLogger("ec2").exception("the scenario failed")
        report["error"] = traceback.format_exc()
    finally:
        machines.close()
        report["machines_running_after_close"] = machines.running()
        report["refused"] = machines.refused
        Path(args["report"]).write_text(json.dumps(report, indent=2, default=str))


def _scenario(
    network: Network, root: Path, name: str, machines: Any, report: dict[str, Any]
) -> None:
    from cerebro_spark.spark_session import spark_session

    def executors(cluster: Ec2Cluster) -> list[dict[str, Any]]:
        return [dataclasses.asdict(e) for e in cluster.executors()]

    cluster = Ec2Cluster.from_options(
        {
            "image_id": network.image_id,
            "region": REGION,
            "endpoint_url": network.endpoint_url,
            "name": name,
            "subnet_id": network.subnet_id,
            "security_group_ids": [network.security_group_id],
            "key_name": "cerebro-test",
            "max_instances": 4,
            "tags": {"owner": "tests"},
            "root": str(root / "master"),
            "user_data_values": {
                "spark_home": str(Path(__import__("pyspark").__file__).parent),
                "host_command": "printenv WORKER_HOST",
            },
            "boot_timeout": 60,
            "register_timeout": 120,
        },
        workers=2,
        instance_type=INSTANCE_TYPE,
        experiment="exp-ec2",
        bootstrap=machines.bootstrap,
    )
    try:
        report["master_url"] = cluster.master_url
        report["user_data"] = cluster.user_data
        report["capabilities"] = dataclasses.asdict(cluster.capabilities)
        session = spark_session(
            cluster.master_url, "cerebro-ec2", {**cluster.spark_conf(), "spark.ui.enabled": "false"}
        )
        try:
            cluster.attach(session)
            cluster.wait(2, 120)
            report["at_start"] = executors(cluster)
            report["hosts_at_start"] = cluster.instance_hosts()

            cluster.resize(3)
            report["executors_right_after_grow"] = len(cluster.executors())
            cluster.wait(3, 120)
            report["grown"] = executors(cluster)

            victims = [e["executor_id"] for e in report["grown"][:2]]
            report["victims"] = victims
            doomed = [e["instance"] for e in report["grown"][:2]]
            cluster.resize(1, victims)
            cluster.wait(1, 120)
            report["shrunk"] = executors(cluster)
            _wait(
                lambda: not set(doomed) & set(machines.running()),
                "the victims' machines to power off",
                90,
            )
            report["states_after_shrink"] = machines_states(machines, doomed)
            report["running_after_shrink"] = machines.running()

            before = {i["InstanceId"] for i in cluster.fleet.describe()}
            cluster.resize(2)
            cluster.resize(1)  # before the new instance booted (2 s)
            surplus = sorted({i["InstanceId"] for i in cluster.fleet.describe()} - before)
            report["surplus"] = surplus
            # Its boot thread ends (given up): had it booted, its machine would run by then.
            boot = f"cerebro-boot-{surplus[0]}"
            _wait(
                lambda: boot not in {t.name for t in threading.enumerate() if t.is_alive()},
                "the surplus instance's boot to end",
                60,
            )
            report["surplus_booted"] = [i for i in surplus if i in machines.machines]
            report["surplus_state"] = machines.state(surplus[0])
            report["after_surplus"] = executors(cluster)

            try:
                cluster.resize(5)
            except ConfigError as error:
                report["over_max"] = str(error)

            report["job"] = session.sparkContext.parallelize(range(8), 2).map(lambda x: x * x).sum()
        finally:
            session.stop()
    finally:
        cluster.close()
        cluster.close()  # idempotent
    report["held_after_close"] = cluster.fleet.held()
    pid = cluster.daemons.pid_of(MASTER_CLASS, 1)
    report["master_alive_after_close"] = pid is not None and alive(pid)


def machines_states(machines: Any, ids: list[str]) -> dict[str, str]:
    return {i: machines.state(i) for i in ids}


if __name__ == "__main__":
    _child_main(sys.argv[1])
