"""Ec2Cluster: a Spark standalone cluster whose workers are EC2 instances cerebro-spark launches.

cerebro-spark starts the standalone master on the driver's machine and launches one EC2
instance per worker (``run_instances``, through boto3). An instance's user data, rendered
from :data:`USER_DATA_TEMPLATE`, starts a Spark worker that registers with the master; the
master gives the application one executor on it. The cluster grows by launching instances
and shrinks by releasing executors through Spark (``killExecutors``), then terminating
their instances once Spark has let the executors go. An executor is billed as its
instance (``Executor.instance`` is the instance id, ``since`` its launch time), found
through the host its worker announces (by default the instance's private IP address).

Every instance carries the tags ``cerebro-spark:cluster`` (this cluster's name, unique per
cluster), ``cerebro-spark:experiment`` and ``cerebro-spark:launch`` (one launch call), and a
``Name``. :class:`Ec2Fleet` does the EC2 side: it never holds more than ``max_instances``
instances, terminates what a failed launch started (found by the launch's tag, so an
instance launched by a call that then failed is found too), and terminates only instances
with its cluster's tag; closing the cluster terminates every instance with the tag, so a
crashed run's instances are found as well.

What the image needs (the user data installs nothing): Java 17, Spark at
``spark_home`` (a distribution, or the ``pyspark`` package: only ``sbin/spark-daemon.sh``
is used), and the driver's Python environment (cerebro-spark, torch, the model code) at the
same path as on the driver (Spark runs the driver's ``PYSPARK_PYTHON`` on executors). The
network: the instances reach the master's port and the driver (``spark.driver.host`` is the
master's host, see :meth:`Ec2Cluster.spark_conf`), and the driver reaches the instances'
executors: a security group that allows TCP between the driver and the instances.

Tested against moto's EC2 server on 127.0.0.1 (``tests/cluster/test_ec2.py``): moto runs
no user data, so the tests pass a ``bootstrap`` hook that runs the rendered user data on
this machine, one loopback address per instance.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import re
import shlex
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cerebro_spark.cluster._daemons import SparkDaemons, free_port, wait_until
from cerebro_spark.cluster._standalone import StandaloneCluster, check_positive_int
from cerebro_spark.errors import ConfigError

logger = logging.getLogger(__name__)

TAG_CLUSTER = "cerebro-spark:cluster"
TAG_EXPERIMENT = "cerebro-spark:experiment"
TAG_LAUNCH = "cerebro-spark:launch"
_RESERVED_TAGS = (TAG_CLUSTER, TAG_EXPERIMENT, TAG_LAUNCH, "Name")
#: Instance states that still hold (and may bill) an instance.
HELD_STATES = ("pending", "running", "stopping", "stopped")

#: The default user data: a bash script that starts one Spark worker and installs nothing.
#: ``{{name}}`` placeholders are filled by :func:`render_user_data`: every value is
#: shell-quoted, except ``host_command``, a command whose output is the address the worker
#: binds to and announces (the instance's private IP address from the instance metadata
#: service by default).
USER_DATA_TEMPLATE = """#!/bin/bash
# cerebro-spark: one Spark standalone worker of cluster {{cluster}} (experiment {{experiment}}).
set -euo pipefail
export SPARK_HOME={{spark_home}}
HOST="$({{host_command}})"
export SPARK_LOCAL_IP="$HOST"
export SPARK_WORKER_DIR="${SPARK_WORKER_DIR:-{{work_dir}}}"
mkdir -p "$SPARK_WORKER_DIR"
"$SPARK_HOME/sbin/spark-daemon.sh" start org.apache.spark.deploy.worker.Worker 1 \\
  --host "$HOST" --cores {{cores}} --memory {{memory}} \\
  --work-dir "$SPARK_WORKER_DIR" {{master_url}}
"""

_IMDS = "http://169.254.169.254/latest"
#: Values of the template's placeholders that a cluster does not set itself.
USER_DATA_DEFAULTS: Mapping[str, str] = {
    "spark_home": "/opt/spark",
    "work_dir": "/var/lib/spark/work",
    "host_command": (
        f'curl -sf -H "X-aws-ec2-metadata-token: $(curl -sf -X PUT -H '
        f"'X-aws-ec2-metadata-token-ttl-seconds: 300' {_IMDS}/api/token)\" "
        f"{_IMDS}/meta-data/local-ipv4"
    ),
}
_RAW_VALUES = ("host_command",)
_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_USER_DATA_LIMIT = 16 * 1024  # bytes, before base64 (EC2's limit)


def render_user_data(template: str, values: Mapping[str, object]) -> str:
    """Fill ``template``'s ``{{name}}`` placeholders with ``values``.

    Values are shell-quoted, except ``host_command`` (inserted as written).

    Raises:
        ConfigError: A placeholder has no value, or the result is over EC2's 16 KiB.
    """
    missing = sorted({m.group(1) for m in _PLACEHOLDER.finditer(template)} - set(values))
    if missing:
        raise ConfigError(
            f"user data placeholder {{{{{missing[0]}}}}} has no value; known values: "
            f"{sorted(values)}"
        )

    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        value = str(values[name])
        return value if name in _RAW_VALUES else shlex.quote(value)

    text = _PLACEHOLDER.sub(fill, template)
    if len(text.encode()) > _USER_DATA_LIMIT:
        raise ConfigError(
            f"user data is {len(text.encode())} bytes; EC2 takes at most {_USER_DATA_LIMIT}"
        )
    return text


def private_ip(instance: Mapping[str, Any]) -> str:
    """The default bootstrap: an instance's worker announces its private IP address.

    Raises:
        RuntimeError: The instance has none.
    """
    address = instance.get("PrivateIpAddress")
    if not address:
        raise RuntimeError(f"instance {instance.get('InstanceId')} has no private IP address")
    return str(address)


def ec2_client(
    region: str | None = None, endpoint_url: str | None = None, profile: str | None = None
) -> Any:
    """A boto3 EC2 client (credentials from the usual chain, or the named ``profile``)."""
    import boto3

    session = boto3.Session(profile_name=profile, region_name=region)
    return session.client("ec2", endpoint_url=endpoint_url)


class Ec2Fleet:
    """The EC2 instances of one cluster: launched tagged, counted, terminated.

    Args:
        client: A boto3 EC2 client.
        cluster: The cluster's name (its tag; unique per cluster: :meth:`terminate_all`
            terminates every instance that carries it).
        experiment: The experiment's id (a tag).
        image_id: The AMI the instances boot.
        instance_type: Their type.
        user_data: Their user data (rendered).
        subnet_id: Their subnet (``None``: the default VPC's).
        security_group_ids: Their security groups.
        key_name: Their SSH key pair.
        iam_instance_profile: Their IAM instance profile (a name, or an ARN).
        max_instances: Most instances held at once (``None``: no limit).
        tags: More tags (not the ``cerebro-spark:`` ones, nor ``Name``).

    Raises:
        ConfigError: A bad argument.
    """

    def __init__(
        self,
        client: Any,
        *,
        cluster: str,
        experiment: str,
        image_id: str,
        instance_type: str,
        user_data: str = "",
        subnet_id: str | None = None,
        security_group_ids: Sequence[str] = (),
        key_name: str | None = None,
        iam_instance_profile: str | None = None,
        max_instances: int | None = None,
        tags: Mapping[str, str] | None = None,
    ) -> None:
        for name, value in (
            ("cluster", cluster),
            ("experiment", experiment),
            ("image_id", image_id),
            ("instance_type", instance_type),
        ):
            if not isinstance(value, str) or not value or len(value) > 255:
                raise ConfigError(
                    f"Ec2Fleet: {name} must be a non-empty string of at most 255 characters, "
                    f"got {value!r}"
                )
        if max_instances is not None:
            check_positive_int("Ec2Fleet", "max_instances", max_instances)
        clashing = sorted(set(tags or {}) & set(_RESERVED_TAGS))
        if clashing:
            raise ConfigError(f"Ec2Fleet: tag {clashing[0]!r} is set by cerebro-spark itself")
        self.client = client
        self.cluster = cluster
        self.experiment = experiment
        self.max_instances = max_instances
        self._tags = {
            **dict(tags or {}),
            "Name": f"{cluster}-worker",
            TAG_CLUSTER: cluster,
            TAG_EXPERIMENT: experiment,
        }
        self._request: dict[str, Any] = {
            "ImageId": image_id,
            "InstanceType": instance_type,
            "UserData": user_data,
            "InstanceInitiatedShutdownBehavior": "terminate",
        }
        if subnet_id:
            self._request["SubnetId"] = subnet_id
        if security_group_ids:
            self._request["SecurityGroupIds"] = list(security_group_ids)
        if key_name:
            self._request["KeyName"] = key_name
        if iam_instance_profile:
            key = "Arn" if iam_instance_profile.startswith("arn:") else "Name"
            self._request["IamInstanceProfile"] = {key: iam_instance_profile}
        self._lock = threading.Lock()

    @property
    def tags(self) -> dict[str, str]:
        """The tags every instance of the fleet carries (but the launch's)."""
        return dict(self._tags)

    def launch(self, count: int) -> list[dict[str, Any]]:
        """Launch ``count`` instances (all or none); return their descriptions.

        If the call fails, every instance it launched is terminated before the error is
        raised again (found by the launch's tag: a call can fail after EC2 started them).

        Raises:
            ConfigError: ``count`` is not an integer >= 1, or it would hold more than
                ``max_instances``.
        """
        check_positive_int("Ec2Fleet.launch", "count", count)
        with self._lock:
            held = len(self.held())
            if self.max_instances is not None and held + count > self.max_instances:
                raise ConfigError(
                    f"cluster {self.cluster}: launching {count} more instances would hold "
                    f"{held + count}, over max_instances {self.max_instances}"
                )
            launch = uuid.uuid4().hex
            tags = [{"Key": k, "Value": v} for k, v in {**self._tags, TAG_LAUNCH: launch}.items()]
            try:
                answer = self.client.run_instances(
                    **self._request,
                    MinCount=count,
                    MaxCount=count,
                    TagSpecifications=[
                        {"ResourceType": "instance", "Tags": tags},
                        {"ResourceType": "volume", "Tags": tags},
                    ],
                )
            except BaseException:
                self._clean_up_launch(launch)
                raise
        instances: list[dict[str, Any]] = answer["Instances"]
        logger.info(
            "cluster %s launched %s (%s)",
            self.cluster,
            [i["InstanceId"] for i in instances],
            self._request["InstanceType"],
        )
        return instances

    def describe(
        self, ids: Iterable[str] = (), states: Sequence[str] = (), launch: str | None = None
    ) -> list[dict[str, Any]]:
        """This fleet's instances (those named in ``ids``, in ``states``; all by default)."""
        filters = [{"Name": f"tag:{TAG_CLUSTER}", "Values": [self.cluster]}]
        if states:
            filters.append({"Name": "instance-state-name", "Values": list(states)})
        if launch is not None:
            filters.append({"Name": f"tag:{TAG_LAUNCH}", "Values": [launch]})
        request: dict[str, Any] = {"Filters": filters}
        if ids:
            request["InstanceIds"] = list(ids)
        found: list[dict[str, Any]] = []
        for page in self.client.get_paginator("describe_instances").paginate(**request):
            for reservation in page["Reservations"]:
                found += reservation["Instances"]
        return found

    def held(self) -> list[dict[str, Any]]:
        """This fleet's instances that are not shutting down or terminated."""
        return self.describe(states=HELD_STATES)

    def terminate(self, ids: Iterable[str]) -> list[str]:
        """Terminate this fleet's instances named in ``ids``; return those terminated.

        Raises:
            ConfigError: An id is not one of this fleet's instances (nothing is terminated).
        """
        wanted = sorted(set(ids))
        if not wanted:
            return []
        ours = {i["InstanceId"] for i in self.describe(wanted)}
        foreign = [i for i in wanted if i not in ours]
        if foreign:
            raise ConfigError(
                f"instance {foreign[0]} is not one of cluster {self.cluster}'s instances "
                f"(tag {TAG_CLUSTER}); refusing to terminate it"
            )
        self.client.terminate_instances(InstanceIds=wanted)
        logger.info("cluster %s terminated %s", self.cluster, wanted)
        return wanted

    def terminate_all(self) -> list[str]:
        """Terminate every held instance with this fleet's cluster tag; return their ids."""
        ids = [i["InstanceId"] for i in self.held()]
        return self.terminate(ids)

    def _clean_up_launch(self, launch: str) -> None:
        try:
            ids = [i["InstanceId"] for i in self.describe(states=HELD_STATES, launch=launch)]
            if ids:
                logger.warning("launch failed; terminating what it started: %s", ids)
                self.client.terminate_instances(InstanceIds=ids)
        except Exception:
            logger.exception("cluster %s: could not clean up a failed launch", self.cluster)


def _since(instance: Mapping[str, Any]) -> float | None:
    launched = instance.get("LaunchTime")
    return launched.timestamp() if isinstance(launched, datetime.datetime) else None


class Ec2Cluster(StandaloneCluster):
    """A standalone master here and workers on EC2 instances (see the module docstring).

    Creating it starts the master, launches ``workers`` instances and waits until their
    workers register; then create the Spark session on :attr:`master_url` with
    :meth:`spark_conf` and :meth:`attach` it.

    Args:
        workers: Instances to start with.
        image_id: The AMI the workers boot (see the module docstring for what it needs).
        instance_type: Their type (also the price catalog's type).
        experiment: The experiment's id (tagged on every instance).
        client: A boto3 EC2 client (default: one for ``region``, ``endpoint_url`` and
            ``profile``).
        region: The AWS region (default: boto3's).
        endpoint_url: Another EC2 endpoint (tests: moto's server).
        profile: An AWS credentials profile.
        name: The cluster's name, its tag (default: ``cerebro-<experiment>-<random>``):
            closing the cluster terminates every instance that carries it.
        subnet_id: The instances' subnet.
        security_group_ids: Their security groups.
        key_name: Their SSH key pair.
        iam_instance_profile: Their IAM instance profile (name or ARN).
        max_instances: Most instances held at once (``None``: no limit).
        tags: More tags for the instances.
        cores: Cores of each worker (its executor's cores).
        memory: Memory of each worker's executor.
        master_host: The address the master binds to and the workers reach (the driver
            machine's private IP address on EC2).
        master_port: The master's port (default: a free one).
        root: Directory of the master's pid and log files (default: a new temporary one,
            deleted at :meth:`close`).
        user_data: The user data template (default :data:`USER_DATA_TEMPLATE`).
        user_data_values: Values for its placeholders, over :data:`USER_DATA_DEFAULTS`
            (``cluster``, ``experiment``, ``master_url``, ``cores`` and ``memory`` are set
            by the cluster).
        bootstrap: Called with an instance's description once it runs, returns the host
            its executor will announce (default :func:`private_ip`). Runs in a thread per
            instance; an instance whose bootstrap raises is terminated.
        boot_timeout_s: Seconds an instance may take to run.
        register_timeout_s: Seconds to wait for the first workers to register.

    Raises:
        ConfigError: A bad argument.
        TimeoutError: The first workers did not register in time (every instance launched
            is terminated).
    """

    def __init__(
        self,
        workers: int,
        *,
        image_id: str,
        instance_type: str,
        experiment: str,
        client: Any = None,
        region: str | None = None,
        endpoint_url: str | None = None,
        profile: str | None = None,
        name: str | None = None,
        subnet_id: str | None = None,
        security_group_ids: Sequence[str] = (),
        key_name: str | None = None,
        iam_instance_profile: str | None = None,
        max_instances: int | None = None,
        tags: Mapping[str, str] | None = None,
        cores: int = 1,
        memory: str = "1g",
        master_host: str = "127.0.0.1",
        master_port: int | None = None,
        root: str | Path | None = None,
        user_data: str | None = None,
        user_data_values: Mapping[str, object] | None = None,
        bootstrap: Callable[[Mapping[str, Any]], str] = private_ip,
        boot_timeout_s: float = 600.0,
        register_timeout_s: float = 600.0,
    ) -> None:
        owner = type(self).__name__
        check_positive_int(owner, "workers", workers)
        check_positive_int(owner, "cores", cores)
        if max_instances is not None and workers > check_positive_int(
            owner, "max_instances", max_instances
        ):
            raise ConfigError(f"{owner}: workers {workers} is over max_instances {max_instances}")
        name = name or f"cerebro-{experiment}-{uuid.uuid4().hex[:8]}"
        try:
            master_port = master_port or free_port(master_host)
        except OSError as error:
            raise ConfigError(
                f"{owner}: master_host {master_host!r} is not an address of this machine the "
                f"master can bind to ({error})"
            ) from None
        values: dict[str, object] = {**USER_DATA_DEFAULTS, **dict(user_data_values or {})}
        values.update(
            cluster=name,
            experiment=experiment,
            master_url=f"spark://{master_host}:{master_port}",
            cores=cores,
            memory=memory,
        )
        #: The rendered user data of every instance.
        self.user_data = render_user_data(
            USER_DATA_TEMPLATE if user_data is None else user_data, values
        )
        fleet = Ec2Fleet(
            client if client is not None else ec2_client(region, endpoint_url, profile),
            cluster=name,
            experiment=experiment,
            image_id=image_id,
            instance_type=instance_type,
            user_data=self.user_data,
            subnet_id=subnet_id,
            security_group_ids=security_group_ids,
            key_name=key_name,
            iam_instance_profile=iam_instance_profile,
            max_instances=max_instances,
            tags=tags,
        )
        super().__init__(
            SparkDaemons(
                root or tempfile.mkdtemp(prefix="cerebro-ec2-"), master_port, host=master_host
            ),
            cores=cores,
            memory=memory,
            max_executors=max_instances,
            instance_type=instance_type,
        )
        #: The cluster's EC2 instances.
        self.fleet = fleet
        self._own_root = root is None
        self._bootstrap = bootstrap
        self._boot_timeout_s = boot_timeout_s
        self._hosts: dict[str, str] = {}  # executor host -> instance id
        self._launched: set[str] = set()  # launched, not terminated by this cluster
        self._boot_errors: list[str] = []
        self._start(workers, register_timeout_s)
        logger.info("EC2 cluster %s: %d %s workers", name, workers, instance_type)

    @property
    def name(self) -> str:
        """The cluster's name (the ``cerebro-spark:cluster`` tag of its instances)."""
        return self.fleet.cluster

    def spark_conf(self) -> dict[str, str]:
        """:meth:`StandaloneCluster.spark_conf`, and a driver the instances can reach."""
        return {
            **super().spark_conf(),
            "spark.driver.host": self.daemons.host,
            "spark.driver.bindAddress": self.daemons.host,
        }

    def instance_hosts(self) -> dict[str, str]:
        """Instance id -> the host its worker announces, for instances booted so far."""
        with self._lock:
            return {instance: host for host, instance in self._hosts.items()}

    def resize(self, target: int, victims: Sequence[str] = ()) -> None:
        """Launch instances to grow; to shrink, release executors, then their instances.

        Instances still booting beyond ``target`` are terminated too (the newest first):
        the application would not use them.
        """
        super().resize(target, victims)
        kept = [i for i in self._instances() if i not in self._stopping]
        serving = {e.instance for e in self.executors()}
        booting = [i for i in kept if i not in serving]
        booting.sort(key=lambda i: self._started_at.get(i, 0.0), reverse=True)
        surplus = booting[: len(kept) - target]
        if surplus:
            logger.info("resized to %d: terminating surplus booting instances %s", target, surplus)
            self._terminate(surplus)

    # -- instances -------------------------------------------------------------------------

    def _start_workers(self, count: int) -> None:
        room = count
        if self.fleet.max_instances is not None:
            room = min(count, self.fleet.max_instances - len(self.fleet.held()))
            if room < count:
                logger.warning(
                    "cluster %s: %d more instances wanted, but only %d fit under "
                    "max_instances %d (instances still shutting down count)",
                    self.name,
                    count,
                    max(0, room),
                    self.fleet.max_instances,
                )
            if room < 1:
                return
        for instance in self.fleet.launch(room):
            instance_id = instance["InstanceId"]
            with self._lock:
                self._launched.add(instance_id)
            self._mark_started(instance_id, _since(instance))
            threading.Thread(
                target=self._boot,
                args=(instance_id,),
                name=f"cerebro-boot-{instance_id}",
                daemon=True,
            ).start()

    def _boot(self, instance_id: str) -> None:
        """Wait until the instance runs, then bootstrap it (map its host)."""
        try:
            waiter = self.fleet.client.get_waiter("instance_running")
            delay = 2 if self._boot_timeout_s <= 120 else 10
            waiter.wait(
                InstanceIds=[instance_id],
                WaiterConfig={
                    "Delay": delay,
                    "MaxAttempts": max(1, int(self._boot_timeout_s / delay)),
                },
            )
            (instance,) = self.fleet.describe([instance_id])
            if not self._booting(instance_id):
                return
            host = self._bootstrap(instance)
            with self._lock:
                self._hosts[host] = instance_id
            logger.info("instance %s booted; its worker announces %s", instance_id, host)
        except Exception as error:
            if not self._booting(instance_id):
                logger.info("instance %s was terminated while it booted (%s)", instance_id, error)
                return
            logger.exception("instance %s failed to boot; terminating it", instance_id)
            with self._lock:
                self._boot_errors.append(f"{instance_id}: {type(error).__name__}: {error}")
            with contextlib.suppress(Exception):
                self._terminate([instance_id])

    def _booting(self, instance_id: str) -> bool:
        """Whether ``instance_id`` is still wanted (not terminated, cluster not closed)."""
        with self._lock:
            return not self._closed and instance_id in self._launched

    def _registered(self) -> int:
        with self._lock:
            if self._boot_errors:
                raise RuntimeError(f"an instance failed to boot: {self._boot_errors[0]}")
        return super()._registered()

    def _instance_of(self, executor_id: str, host: str) -> str | None:
        with self._lock:
            instance = self._hosts.get(host)
            return instance if instance in self._launched else None

    def _instances(self) -> list[str]:
        with self._lock:
            return sorted(self._launched)

    def _stop_instance(self, executor_id: str, instance: str) -> None:
        """Terminate an instance once Spark has let its released executor go.

        Never before: the master would see its worker lost, not an executor released.
        """
        spark = self._spark
        try:
            if spark is not None:
                wait_until(lambda: spark.ended(executor_id), f"executor {executor_id} to end", 60)
        except TimeoutError:
            logger.warning("executor %s did not end in 60 s; terminating %s", executor_id, instance)
        try:
            self._terminate([instance])
        except Exception:  # close() terminates it by its tag
            logger.exception("could not terminate instance %s", instance)

    def _terminate(self, ids: Sequence[str]) -> None:
        with self._lock:
            self._launched.difference_update(ids)
        self.fleet.terminate(ids)

    def close(self) -> None:
        """Terminate every instance with this cluster's tag and stop the master (idempotent).

        The master's directory goes too if the cluster made it.
        """
        super().close()
        if self._own_root:
            shutil.rmtree(self.daemons.root, ignore_errors=True)

    def _stop_instances(self) -> None:
        with self._lock:
            self._launched.clear()
        terminated = self.fleet.terminate_all()
        logger.info("EC2 cluster %s closed; terminated %s", self.name, terminated)

    # -- configuration ---------------------------------------------------------------------

    @classmethod
    def from_options(
        cls,
        options: Mapping[str, Any],
        *,
        workers: int,
        instance_type: str,
        experiment: str,
        bootstrap: Callable[[Mapping[str, Any]], str] = private_ip,
        where: str = "elastic.ec2",
    ) -> Ec2Cluster:
        """Build a cluster from a config section (``elastic: {manager: ec2, ec2: {...}}``).

        Keys: ``image_id`` (required), ``region``, ``endpoint_url``, ``profile``, ``name``,
        ``subnet_id``, ``security_group_ids`` (a list), ``key_name``,
        ``iam_instance_profile``, ``max_instances``, ``tags`` (a mapping), ``cores``,
        ``memory``, ``master_host``, ``master_port``, ``root``, ``user_data`` (a template
        text), ``user_data_file`` (a template's path), ``user_data_values`` (a mapping),
        ``boot_timeout``, ``register_timeout`` (seconds).

        Raises:
            ConfigError: An unknown key or a bad value (``where.key`` is named).
        """
        if not isinstance(options, Mapping):
            raise ConfigError(f"{where} must be a mapping, got {type(options).__name__}")
        raw = dict(options)
        text, integer, number = (
            ((str,), "a string"),
            ((int,), "an integer"),
            ((int, float), "a number"),
        )
        kinds: dict[str, tuple[tuple[type, ...], str]] = {
            "image_id": text,
            "region": text,
            "endpoint_url": text,
            "profile": text,
            "name": text,
            "subnet_id": text,
            "security_group_ids": ((list, tuple), "a list of strings"),
            "key_name": text,
            "iam_instance_profile": text,
            "max_instances": integer,
            "tags": ((dict,), "a mapping"),
            "cores": integer,
            "memory": text,
            "master_host": text,
            "master_port": integer,
            "root": text,
            "user_data": text,
            "user_data_file": text,
            "user_data_values": ((dict,), "a mapping"),
            "boot_timeout": number,
            "register_timeout": number,
        }
        unknown = sorted(set(raw) - set(kinds))
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]} is not a setting; known: {sorted(kinds)}")
        for key, value in raw.items():
            types, wanted = kinds[key]
            if isinstance(value, bool) or not isinstance(value, types):
                raise ConfigError(f"{where}.{key} must be {wanted}, got {value!r}")
        if "image_id" not in raw:
            raise ConfigError(f"{where}.image_id is required (the AMI the workers boot)")
        for key in ("security_group_ids",):
            if not all(isinstance(v, str) for v in raw.get(key, ())):
                raise ConfigError(f"{where}.{key} must be a list of strings, got {raw[key]!r}")
        for key in ("tags", "user_data_values"):
            bad = [k for k, v in raw.get(key, {}).items() if isinstance(v, (dict, list))]
            if bad:
                raise ConfigError(f"{where}.{key}.{bad[0]} must be a string or a number")
        for key in ("max_instances", "cores", "master_port", "boot_timeout", "register_timeout"):
            if key in raw and not raw[key] > 0:
                raise ConfigError(f"{where}.{key} must be > 0, got {raw[key]!r}")
        if "user_data" in raw and "user_data_file" in raw:
            raise ConfigError(f"{where}: set user_data or user_data_file, not both")
        template = raw.get("user_data")
        if "user_data_file" in raw:
            try:
                template = Path(raw["user_data_file"]).read_text()
            except OSError as error:
                raise ConfigError(
                    f"{where}.user_data_file {raw['user_data_file']} cannot be read: {error}"
                ) from None
        try:
            return cls(
                workers,
                image_id=raw["image_id"],
                instance_type=instance_type,
                experiment=experiment,
                region=raw.get("region"),
                endpoint_url=raw.get("endpoint_url"),
                profile=raw.get("profile"),
                name=raw.get("name"),
                subnet_id=raw.get("subnet_id"),
                security_group_ids=tuple(raw.get("security_group_ids", ())),
                key_name=raw.get("key_name"),
                iam_instance_profile=raw.get("iam_instance_profile"),
                max_instances=raw.get("max_instances"),
                tags={str(k): str(v) for k, v in raw.get("tags", {}).items()},
                cores=raw.get("cores", 1),
                memory=raw.get("memory", "1g"),
                master_host=raw.get("master_host", "127.0.0.1"),
                master_port=raw.get("master_port"),
                root=raw.get("root"),
                user_data=template,
                user_data_values=raw.get("user_data_values"),
                bootstrap=bootstrap,
                boot_timeout_s=float(raw.get("boot_timeout", 600.0)),
                register_timeout_s=float(raw.get("register_timeout", 600.0)),
            )
        except ConfigError as error:
            raise ConfigError(f"{where}: {error}") from None
