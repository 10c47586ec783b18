"""DatabricksCluster: resize the Databricks cluster a notebook or job runs on.

Through the clusters API of ``databricks-sdk`` (``shared/design.md``, "Elastic layer"):
``clusters.resize(cluster_id, num_workers=n)`` (``POST /api/2.1/clusters/resize``) is
accepted only while the cluster is ``RUNNING``; while it is ``RESIZING`` (or ``PENDING``,
``RESTARTING``) Databricks answers ``INVALID_STATE``, so a resize is retried with
exponential backoff in a background thread, up to ``resize_retry_s`` seconds, and a newer
resize replaces one still waiting. The cluster is ``RUNNING`` again before its new nodes
serve, so :meth:`DatabricksCluster.wait` waits on the executors Spark sees, not on the
cluster's state.

Databricks runs one executor per worker node, so executors = ``num_workers``. It chooses
which nodes a shrink removes: :attr:`Capabilities.choose_victims` is false, and the engine
shrinks only at a stage boundary with nothing in flight (the lost workers' partitions are
re-homed). An autoscaling cluster is refused: Databricks' autoscaler would fight the plan.

Each executor is billed as its node (``instance_id`` of the node in the API's
``executors`` list, matched by host), from the node's start, or from when the manager
attached for nodes that ran before; where hosts do not tell nodes apart (several nodes or
executors on one host, as on a loopback test cluster) the executor is billed as itself.
Executors on a node the API no longer lists are not counted, even while Spark still lists
them. The driver node is not an executor and is not billed here.

On a standalone master (``spark://``, as on Databricks itself and on a loopback test
cluster) the application's executor target is set with ``requestTotalExecutors``: raised
before a grow (a standalone application capped at fewer executors would not use the new
nodes), lowered once a shrink is accepted (Spark never kills an executor to reach a lower
target). With one executor per node the target equals the nodes, so this is harmless where
the platform manages executors itself.

**Under Spark Connect** (Databricks Standard access mode, Databricks Connect: no
``SparkContext``, ``shared/design.md``, "Spark Connect") the manager works through the REST
API only:

* the cluster id comes from ``spark.conf`` (:data:`CLUSTER_ID_CONF`), else the
  ``cluster_id`` option;
* its executors are the worker nodes the cluster's REST description (``clusters.get``)
  lists as serving (listed with a private IP): one executor per node, its id the node's
  id, billed as the node from its start (or from the attach), not Spark's executors;
* no ``requestTotalExecutors`` (no JVM): Databricks starts one executor per node itself;
* :meth:`DatabricksCluster.wait` waits on the nodes the API lists as serving, and the
  pool does not see new executors arrive (:attr:`Capabilities.workers_follow` is false):
  the elastic controller starts the workers of a grow itself;
* the pool's workers are matched to nodes by host (:func:`match_workers`; each Connect
  worker reports where it runs): :meth:`DatabricksCluster.placement` says which node runs
  which worker, which nodes run none and which workers run on no listed node.

Serverless compute has no cluster to resize: the engine runs there at the capacity the
session gives (``engine/_managers.py``); this manager refuses a session without a cluster
id.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cerebro_spark.cluster._base import Capabilities, ClusterManager, Executor, ResizeTimeout
from cerebro_spark.cluster._spark import SparkExecutors, is_local_master
from cerebro_spark.errors import ConfigError
from cerebro_spark.spark_session import is_connect_session

try:
    from databricks.sdk import WorkspaceClient
    from databricks.sdk.errors import (
        InvalidParameterValue,
        InvalidState,
        NotFound,
        PermissionDenied,
        Unauthenticated,
    )
    from databricks.sdk.errors.base import DatabricksError
except ImportError as exc:  # pragma: no cover (databricks-sdk is a dev dependency)
    raise ImportError(
        "the Databricks cluster manager needs databricks-sdk: "
        "pip install 'cerebro-spark[databricks]'"
    ) from exc

if TYPE_CHECKING:
    from databricks.sdk.service.compute import ClusterDetails, SparkNode
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

#: The Spark setting that holds the cluster id in a Databricks notebook or job.
CLUSTER_ID_CONF = "spark.databricks.clusterUsageTags.clusterId"

#: What every loopback name of a host is compared as (:func:`host_key`).
LOOPBACK = "127.0.0.1"

_OPTIONS = ("cluster_id", "host", "token_env", "resize_retry_s", "min_workers", "max_workers")


@dataclasses.dataclass(frozen=True)
class Node:
    """A worker node of the cluster, as the clusters API lists it.

    Attributes:
        node_id: Databricks' node id.
        host: Its private IP (where its executor runs), if listed.
        instance_id: The cloud provider's instance id, if listed.
        started: Unix time it was launched, if listed.
    """

    node_id: str
    host: str | None = None
    instance_id: str | None = None
    started: float | None = None

    @property
    def billed_as(self) -> str:
        """What the provider bills: the instance, else the node."""
        return self.instance_id or self.node_id

    @property
    def serving(self) -> bool:
        """Whether it serves: the API lists its private IP (a node being set up has none)."""
        return self.host is not None

    @classmethod
    def of(cls, node: SparkNode) -> Node:
        """The node of an SDK ``SparkNode``."""
        return cls(
            node_id=node.node_id or node.instance_id or node.private_ip or "unknown",
            host=node.private_ip or node.host_private_ip,
            instance_id=node.instance_id,
            started=node.start_timestamp / 1000.0 if node.start_timestamp else None,
        )


def billed_by_node(
    executors: Sequence[Executor], nodes: Sequence[Node], not_before: float = 0.0
) -> list[Executor]:
    """The executors, each billed as the node that runs it where the host tells which.

    An executor is matched to a node when exactly one node has its host and no other
    executor runs there; it is then billed as the node (:attr:`Node.billed_as`) from the
    node's start. Billing never starts before ``not_before`` (when the manager attached:
    what ran before is not this search's cost).
    """
    by_host: dict[str, list[Node]] = {}
    for node in nodes:
        if node.host:
            by_host.setdefault(node.host, []).append(node)
    per_host = Counter(e.host for e in executors)
    billed = []
    for executor in executors:
        matches = by_host.get(executor.host, [])
        if len(matches) == 1 and per_host[executor.host] == 1:
            node = matches[0]
            since = node.started if node.started is not None else executor.since
            billed.append(
                dataclasses.replace(executor, instance=node.billed_as, since=max(since, not_before))
            )
        else:
            billed.append(dataclasses.replace(executor, since=max(executor.since, not_before)))
    return billed


def host_key(host: str | None) -> str | None:
    """A host as matching compares it (``None`` for none: ``None``, empty, ``unknown``).

    Lower case, without IPv6 brackets, and every loopback name (``localhost``,
    ``127.x.y.z``, ``::1``) as :data:`LOOPBACK`.
    """
    if host is None:
        return None
    text = host.strip().lower().strip("[]")
    if not text or text == "unknown":
        return None
    if text in ("localhost", "localhost.localdomain", "::1") or text.startswith("127."):
        return LOOPBACK
    return text


@dataclasses.dataclass(frozen=True)
class Placement:
    """The worker pool's workers matched to the cluster's nodes by host.

    Attributes:
        nodes: Each serving node's id, with the ids of the workers that run on it (empty:
            none), in the nodes' order.
        idle: The nodes no worker runs on.
        elsewhere: The workers that run on no serving node (the driver, a node the API no
            longer lists, a host it does not know).
    """

    nodes: dict[str, tuple[str, ...]]
    idle: tuple[str, ...]
    elsewhere: tuple[str, ...]


def _worker_order(worker_id: str) -> tuple[int, str]:
    """``w2`` before ``w10``: the pool numbers its workers in the order it starts them."""
    digits = worker_id.lstrip("w")
    return (int(digits) if digits.isdigit() else -1, worker_id)


def match_workers(nodes: Sequence[Node], workers: Mapping[str, str | None]) -> Placement:
    """Match workers (id -> host) to the serving nodes by host (:func:`host_key`).

    A worker runs on the node that has its host. Where several nodes share a host (a
    loopback test cluster) the host's workers go to its nodes in turn, in the order the
    nodes started and the workers were started, one each before any node gets a second:
    the count per host is right, the pairing is as good as hosts tell. Nodes that do not
    serve yet (no private IP) are left out.
    """
    serving = sorted(
        (n for n in nodes if n.serving),
        key=lambda n: (math.inf if n.started is None else n.started, n.node_id),
    )
    by_host: dict[str, list[Node]] = {}
    for node in serving:
        key = host_key(node.host)
        assert key is not None  # ok: a serving node has a host
        by_host.setdefault(key, []).append(node)
    on: dict[str, list[str]] = {n.node_id: [] for n in serving}
    elsewhere: list[str] = []
    turn: Counter[str] = Counter()
    for worker in sorted(workers, key=_worker_order):
        key = host_key(workers[worker])
        hosts = by_host.get(key, []) if key is not None else []
        if key is None or not hosts:
            elsewhere.append(worker)
            continue
        on[hosts[turn[key] % len(hosts)].node_id].append(worker)
        turn[key] += 1
    return Placement(
        nodes={n: tuple(w) for n, w in on.items()},
        idle=tuple(n for n, w in on.items() if not w),
        elsewhere=tuple(elsewhere),
    )


@dataclasses.dataclass
class _Pending:
    target: int
    generation: int
    asked_at: float
    lower_after: bool


class DatabricksCluster(ClusterManager):
    """The Databricks cluster the Spark application runs on (see the module docstring).

    Args:
        spark: The running session: classic (its executors are counted through
            :class:`~cerebro_spark.cluster.SparkExecutors`) or Spark Connect (its executors
            are the nodes the REST API lists: the module docstring); or a manager that
            lists the application's executors (then ``cluster_id`` is required).
        cluster_id: The cluster to resize (default: the Spark setting
            ``spark.databricks.clusterUsageTags.clusterId``).
        workspace: The workspace client (default: one built from ``host`` and ``token``,
            else from the standard ``DATABRICKS_*`` environment, config file or notebook
            authentication).
        host: Workspace URL, when ``workspace`` is not given.
        token: Personal access token, when ``workspace`` is not given.
        resize_retry_s: Seconds a resize is retried while the cluster is busy
            (``INVALID_STATE``) before it is given up.
        min_workers: Fewest workers a resize may ask for.
        max_workers: Most workers a resize may ask for (``None``: no limit; a workspace's
            cluster policy may set one).
        instance_type: The node type in the price catalog (default: the cluster's
            ``node_type_id``).
        request_executors: Set the application's executor target with
            ``requestTotalExecutors`` around each resize (default: on a ``spark://``
            master; never under Spark Connect, which has no JVM to ask).
        backoff_s: First wait before retrying a busy cluster (doubled each time).
        max_backoff_s: Longest wait between retries.
        nodes_refresh_s: Seconds the cluster's node list is cached.

    Raises:
        ConfigError: No cluster id, no credentials, a rejected token, an unknown cluster,
            an autoscaling or single-node cluster, dynamic allocation on, bad bounds.
    """

    def __init__(
        self,
        spark: SparkSession | ClusterManager,
        *,
        cluster_id: str | None = None,
        workspace: WorkspaceClient | None = None,
        host: str | None = None,
        token: str | None = None,
        resize_retry_s: float = 600.0,
        min_workers: int = 1,
        max_workers: int | None = None,
        instance_type: str | None = None,
        request_executors: bool | None = None,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        nodes_refresh_s: float = 5.0,
    ) -> None:
        _check_bounds(min_workers, max_workers, "DatabricksCluster: ")
        if not resize_retry_s > 0:
            raise ConfigError(
                f"DatabricksCluster: resize_retry_s must be > 0 seconds, got {resize_retry_s!r}"
            )
        self._context: SparkContext | None = None
        self._source: ClusterManager | None = None
        #: Under Spark Connect: executors, waits and resizes through the REST API only.
        self.rest_only = False
        cores = 1
        if isinstance(spark, ClusterManager):
            self._source = spark
            if isinstance(spark, SparkExecutors):
                self._context = spark.context
        elif is_connect_session(spark):
            self.rest_only = True
            _check_connect_allocation(spark)
            cores = _cores(_connect_conf(spark, "spark.executor.cores"))
            if cluster_id is None:
                cluster_id = _connect_conf(spark, CLUSTER_ID_CONF)
        else:
            master = spark.sparkContext.master or ""
            if is_local_master(master):
                raise ConfigError(
                    f"the Spark master is {master}: a single-node Databricks cluster runs "
                    "everything on the driver and cannot be resized; use a cluster with "
                    "workers and a fixed num_workers"
                )
            self._source = SparkExecutors(
                spark, min_executors=min_workers, max_executors=max_workers
            )
            self._context = spark.sparkContext
            if cluster_id is None:
                cluster_id = _conf(spark, CLUSTER_ID_CONF)
        if not cluster_id:
            serverless = (
                " (serverless compute has no cluster id and no cluster to resize: there an "
                "elastic run with manager databricks and no cluster_id runs at the capacity "
                "the session gives)"
                if self.rest_only
                else ""
            )
            raise ConfigError(
                f"no Databricks cluster id: the Spark setting {CLUSTER_ID_CONF} is not set "
                "(Databricks sets it in notebooks and jobs); set "
                f"elastic.databricks.cluster_id{serverless}"
            )
        self.cluster_id: str = cluster_id
        self._cores = cores
        master = (self._context.master or "") if self._context is not None else ""
        self._request_executors = (
            request_executors if request_executors is not None else master.startswith("spark://")
        )
        self._retry_s = float(resize_retry_s)
        self._backoff_s = float(backoff_s)
        self._max_backoff_s = float(max_backoff_s)
        self._refresh_s = float(nodes_refresh_s)
        self.workspace = workspace if workspace is not None else _workspace(host, token)
        self._host = str(getattr(self.workspace.config, "host", host) or host)

        details = self._get_cluster()
        if details.autoscale is not None:
            scale = details.autoscale
            raise ConfigError(
                f"Databricks cluster {self.cluster_id} autoscales (min_workers "
                f"{scale.min_workers}, max_workers {scale.max_workers}): its autoscaler would "
                "fight the plan's resizes; give the cluster a fixed num_workers (turn off "
                "autoscaling in its configuration)"
            )
        if details.is_single_node or details.num_workers is None:
            raise ConfigError(
                f"Databricks cluster {self.cluster_id} is single-node (num_workers "
                f"{details.num_workers}): it cannot be resized; use a cluster with workers "
                "and a fixed num_workers"
            )
        self.initial_workers: int = int(details.num_workers)
        if instance_type is not None and details.node_type_id not in (None, instance_type):
            logger.warning(
                "Databricks cluster %s runs node type %s, but its nodes are billed as %s "
                "(the plan's instance type): the cost meter uses %s's price",
                self.cluster_id,
                details.node_type_id,
                instance_type,
                instance_type,
            )
        self.capabilities = Capabilities(
            resizable=True,
            choose_victims=False,
            min_executors=min_workers,
            max_executors=max_workers,
            instance_type=instance_type or details.node_type_id,
            workers_follow=not self.rest_only,
        )
        self._attached_at = time.time()
        self._cond = threading.Condition()
        self._generation = 0
        self._pending: _Pending | None = None
        self._accepted = self.initial_workers
        self._failure: tuple[int, str] | None = None
        self._closed = False
        self._stop = False
        self._thread: threading.Thread | None = None
        self._nodes: list[Node] = []
        self._gone_hosts: set[str] = set()
        self._details = details
        self._refreshed_at = -math.inf
        self._take(details)
        logger.info(
            "attached to Databricks cluster %s at %s%s: %d workers, %s, node type %s",
            self.cluster_id,
            self._host,
            " through the REST API only (Spark Connect)" if self.rest_only else "",
            self.initial_workers,
            details.state.value if details.state is not None else "state unknown",
            details.node_type_id,
        )

    @classmethod
    def from_options(
        cls,
        spark: SparkSession | ClusterManager,
        options: Mapping[str, Any],
        *,
        instance_type: str | None = None,
    ) -> DatabricksCluster:
        """The manager of an ``elastic: {manager: databricks, databricks: {...}}`` section.

        Args:
            spark: The running session (or, as for the constructor, a manager listing
                the application's executors).
            options: The ``databricks`` section: ``cluster_id`` (default: from the Spark
                conf), ``host`` (default: the standard Databricks configuration),
                ``token_env`` (the environment variable that holds the token; never the
                token itself), ``resize_retry_s``, ``min_workers``, ``max_workers``.
            instance_type: The node type in the price catalog (default: the cluster's).

        Raises:
            ConfigError: A key is unknown or has a bad value (the key is named), the
                token variable is not set, or the cluster cannot be managed.
        """
        where = "elastic.databricks"
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise ConfigError(
                f"{where}: unknown key(s) {unknown}; the keys are {', '.join(_OPTIONS)}"
            )
        cluster_id = _text(options, "cluster_id", where)
        host = _text(options, "host", where)
        if host is not None and not host.startswith(("http://", "https://")):
            raise ConfigError(
                f"{where}.host must be a workspace URL starting with https:// (or http://), "
                f"got {host!r}"
            )
        token = None
        token_env = _text(options, "token_env", where)
        if token_env is not None:
            token = os.environ.get(token_env)
            if not token:
                raise ConfigError(
                    f"{where}.token_env names the environment variable {token_env}, which is "
                    "not set: set it to a Databricks personal access token"
                )
        retry = options.get("resize_retry_s", 600.0)
        if isinstance(retry, bool) or not isinstance(retry, int | float) or not retry > 0:
            raise ConfigError(f"{where}.resize_retry_s must be a number > 0, got {retry!r}")
        min_workers = options.get("min_workers", 1)
        max_workers = options.get("max_workers")
        _check_bounds(min_workers, max_workers, f"{where}.")
        return cls(
            spark,
            cluster_id=cluster_id,
            host=host,
            token=token,
            resize_retry_s=float(retry),
            min_workers=min_workers,
            max_workers=max_workers,
            instance_type=instance_type,
        )

    # -- executors -----------------------------------------------------------------------

    def executors(self) -> list[Executor]:
        """Spark's live executors, less those on released nodes, billed as their nodes.

        Under Spark Connect: the nodes the API lists as serving, each an executor billed as
        itself from its start (the module docstring).
        """
        self._refresh(self._refresh_s)
        with self._cond:
            gone = set(self._gone_hosts)
            nodes = list(self._nodes)
        if self._source is None:
            return node_executors(nodes, self._cores, not_before=self._attached_at)
        live = self._source.executors()
        return billed_by_node(
            [e for e in live if e.host not in gone], nodes, not_before=self._attached_at
        )

    def nodes(self) -> list[Node]:
        """The worker nodes the clusters API listed last (refreshed when stale)."""
        self._refresh(self._refresh_s)
        with self._cond:
            return list(self._nodes)

    def placement(self, workers: Mapping[str, str | None]) -> Placement:
        """The pool's workers (id -> the host each reported) matched to the serving nodes.

        See :func:`match_workers`; the nodes are the ones the API listed last.
        """
        return match_workers(self.nodes(), workers)

    # -- resizing ------------------------------------------------------------------------

    def resize(self, target: int, victims: Sequence[str] = ()) -> None:
        """Ask Databricks for ``target`` workers; returns at once.

        A background thread sends the request, retrying while the cluster is busy, and
        replaces any request still waiting. Victims cannot be named: Databricks chooses.

        Raises:
            ConfigError: ``target`` is outside the bounds, or victims were named.
            RuntimeError: The manager is closed.
        """
        self.check_resize(target, victims)
        with self._cond:
            if self._closed:
                raise RuntimeError(f"DatabricksCluster {self.cluster_id} is closed")
        self._submit(target)

    def wait(self, target: int, timeout_s: float, poll_s: float = 0.5) -> list[Executor]:
        """Wait until exactly ``target`` executors serve in Spark; return them.

        The cluster's ``RUNNING`` state is not enough: its new nodes' executors must have
        registered, and its released nodes' executors must be gone. Under Spark Connect,
        which lists no executors, until the API lists exactly ``target`` serving nodes.

        Raises:
            ResizeTimeout: They did not within ``timeout_s``, or the resize to ``target``
                was given up (the Databricks error is named).
        """
        begun = time.monotonic()
        while True:
            self._refresh(min(2.0, self._refresh_s))
            live = self.executors()
            if len(live) == target:
                return live
            waited = time.monotonic() - begun
            with self._cond:
                failure = self._failure if self._pending is None else None
            if failure is not None and failure[0] == target:
                raise ResizeTimeout(
                    target, len(live), waited, f"the Databricks resize failed: {failure[1]}"
                )
            if waited >= timeout_s:
                raise ResizeTimeout(target, len(live), waited, self.describe())
            time.sleep(min(poll_s, max(0.0, timeout_s - waited)))

    def describe(self) -> str:
        """The cluster as last seen, and the resize in progress (for messages)."""
        with self._cond:
            details = self._details
            pending = self._pending
            failure = self._failure
        state = details.state.value if details.state is not None else "in an unknown state"
        text = (
            f"Databricks cluster {self.cluster_id} is {state} with num_workers "
            f"{details.num_workers} and {len(details.executors or [])} worker nodes"
        )
        if pending is not None:
            text += f"; the resize to {pending.target} is not accepted yet"
        elif failure is not None:
            text += f"; the resize to {failure[0]} failed: {failure[1]}"
        return text

    @property
    def requested(self) -> int:
        """The workers Databricks last accepted a resize to."""
        with self._cond:
            return self._accepted

    def close(self) -> None:
        """Resize back to the workers the cluster had when the manager attached.

        Blocks until Databricks accepts that resize (retrying while the cluster is busy,
        up to ``resize_retry_s``), not until the nodes come or go. Idempotent.
        """
        with self._cond:
            if self._closed:
                return
            self._closed = True
            restore = self._pending is not None or self._accepted != self.initial_workers
        if restore:
            logger.info(
                "restoring Databricks cluster %s to its %d workers",
                self.cluster_id,
                self.initial_workers,
            )
            generation = self._submit(self.initial_workers)
            with self._cond:
                self._cond.wait_for(
                    lambda: self._pending is None or self._pending.generation != generation,
                    timeout=self._retry_s + 30.0,
                )
                failure = self._failure
            if failure is not None and failure[0] == self.initial_workers:
                logger.error(
                    "could not restore Databricks cluster %s to %d workers: %s",
                    self.cluster_id,
                    self.initial_workers,
                    failure[1],
                )
        with self._cond:
            self._stop = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=30)

    # -- internals -----------------------------------------------------------------------

    def _submit(self, target: int) -> int:
        try:
            live = self._source.executors() if self._source is not None else self.executors()
            grow = target > len(live)
        except Exception:  # the application has stopped (close after the session)
            grow = target > self._accepted
        if grow:
            self._request_total(target)
        with self._cond:
            self._generation += 1
            self._pending = _Pending(target, self._generation, time.monotonic(), not grow)
            self._failure = None
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"cerebro-databricks-{self.cluster_id}", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()
            logger.info(
                "resize of Databricks cluster %s to %d workers asked", self.cluster_id, target
            )
            return self._generation

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stop or self._pending is not None)
                if self._pending is None:
                    return
                pending = dataclasses.replace(self._pending)
            self._apply(pending)

    def _superseded(self, pending: _Pending) -> bool:
        return self._pending is None or self._pending.generation != pending.generation

    def _apply(self, pending: _Pending) -> None:
        """Send one resize, retrying ``INVALID_STATE`` with exponential backoff."""
        delay = self._backoff_s
        attempts = 0
        while True:
            with self._cond:
                if self._superseded(pending):
                    return
                done = self._accepted == pending.target
            if not done:
                attempts += 1
                try:
                    self.workspace.clusters.resize(self.cluster_id, num_workers=pending.target)
                except InvalidState as error:
                    left = pending.asked_at + self._retry_s - time.monotonic()
                    if left <= 0:
                        self._fail(pending, f"still busy after {attempts} tries: {error}")
                        return
                    wait = min(delay, left)
                    logger.info(
                        "Databricks cluster %s is busy (%s); retrying the resize to %d in %.1f s",
                        self.cluster_id,
                        error,
                        pending.target,
                        wait,
                    )
                    with self._cond:
                        self._cond.wait_for(lambda: self._superseded(pending), timeout=wait)
                    delay = min(delay * 2.0, self._max_backoff_s)
                    continue
                except Exception as error:  # any other answer: give this target up
                    self._fail(pending, f"{type(error).__name__}: {error}")
                    return
                logger.info(
                    "Databricks accepted the resize of cluster %s to %d workers (try %d)",
                    self.cluster_id,
                    pending.target,
                    attempts,
                )
            if pending.lower_after:
                self._request_total(pending.target)
            with self._cond:
                self._accepted = pending.target
                if not self._superseded(pending):
                    self._pending = None
                self._refreshed_at = -math.inf
                self._cond.notify_all()
            return

    def _fail(self, pending: _Pending, message: str) -> None:
        logger.warning(
            "gave up resizing Databricks cluster %s to %d workers: %s",
            self.cluster_id,
            pending.target,
            message,
        )
        with self._cond:
            if not self._superseded(pending):
                self._pending = None
                self._failure = (pending.target, message)
            self._cond.notify_all()

    def _request_total(self, target: int) -> None:
        """Set the application's executor target (standalone masters; see the docstring)."""
        sc = self._context
        if sc is None or not self._request_executors:
            return
        jvm = sc._jvm
        assert jvm is not None  # ok: a live SparkContext has its gateway
        try:
            ok = sc._jsc.sc().requestTotalExecutors(int(target), 0, jvm.PythonUtils.toScalaMap({}))
        except Exception:
            logger.warning("requestTotalExecutors(%d) failed", target, exc_info=True)
            return
        logger.info("asked Spark for %d executors (accepted: %s)", target, ok)

    def _get_cluster(self) -> ClusterDetails:
        try:
            return self.workspace.clusters.get(self.cluster_id)
        except (Unauthenticated, PermissionDenied) as error:
            raise ConfigError(
                f"Databricks at {self._host} refused the credentials ({error}): give a valid "
                "token (DATABRICKS_TOKEN, or the variable elastic.databricks.token_env names) "
                f"with permission to manage cluster {self.cluster_id}"
            ) from error
        except (NotFound, InvalidParameterValue) as error:
            raise ConfigError(
                f"Databricks at {self._host} has no cluster {self.cluster_id} ({error})"
            ) from error

    def _refresh(self, max_age_s: float) -> None:
        """Re-read the cluster's nodes if the last read is older than ``max_age_s``."""
        with self._cond:
            if time.monotonic() - self._refreshed_at < max_age_s:
                return
            self._refreshed_at = time.monotonic()
        try:
            details = self.workspace.clusters.get(self.cluster_id)
        except (DatabricksError, OSError) as error:
            logger.warning("could not read Databricks cluster %s: %s", self.cluster_id, error)
            return
        self._take(details)

    def _take(self, details: ClusterDetails) -> None:
        nodes = [Node.of(n) for n in details.executors or []]
        hosts = {n.host for n in nodes if n.host}
        with self._cond:
            before = {n.host for n in self._nodes if n.host}
            self._gone_hosts = (self._gone_hosts | (before - hosts)) - hosts
            self._nodes = nodes
            self._details = details


def node_executors(nodes: Sequence[Node], cores: int, not_before: float = 0.0) -> list[Executor]:
    """The serving nodes as executors (Spark Connect, which lists none): one per node.

    Each is named and billed as its node (:attr:`Node.billed_as`) from the node's start,
    never before ``not_before`` (when the manager attached).
    """
    return [
        Executor(
            executor_id=node.node_id,
            host=node.host or "unknown",
            cores=cores,
            since=max(node.started if node.started is not None else not_before, not_before),
            instance=node.billed_as,
        )
        for node in nodes
        if node.serving
    ]


def _connect_conf(spark: Any, key: str) -> str | None:
    """A setting of a Spark Connect session; ``None`` when unset or not readable there."""
    try:
        value = spark.conf.get(key, None)
    except Exception as error:  # e.g. CONFIG_NOT_AVAILABLE on serverless
        logger.debug("cannot read %s from the Spark Connect session: %s", key, error)
        return None
    return str(value) if value else None


def _check_connect_allocation(spark: Any) -> None:
    """Refuse dynamic allocation on a Connect session (what the classic path refuses)."""
    enabled = (_connect_conf(spark, "spark.dynamicAllocation.enabled") or "false").strip()
    if enabled.lower() == "true":
        raise ConfigError(
            "the Spark Connect session has spark.dynamicAllocation.enabled=true: Spark's "
            "allocation manager would release executors the plan keeps; set it to false on "
            "the cluster (and give it a fixed num_workers) to resize it with the databricks "
            "manager"
        )


def _cores(raw: str | None) -> int:
    """``spark.executor.cores`` as a number (1 when unset or not a positive integer)."""
    try:
        return max(1, int(raw)) if raw else 1
    except ValueError:
        return 1


def _conf(spark: SparkSession, key: str) -> str | None:
    """A Spark setting of the session or its context, ``None`` when unset."""
    value = spark.conf.get(key, None)
    if value:
        return str(value)
    found = spark.sparkContext.getConf().get(key)
    return str(found) if found else None


def _workspace(host: str | None, token: str | None) -> WorkspaceClient:
    """A workspace client from ``host``/``token``, else the standard configuration."""
    try:
        return WorkspaceClient(host=host, token=token)
    except ValueError as error:
        raise ConfigError(
            f"cannot configure the Databricks client ({error}): set DATABRICKS_HOST and "
            "DATABRICKS_TOKEN, or elastic.databricks.host and token_env, or run on Databricks"
        ) from error


def _text(options: Mapping[str, Any], key: str, where: str) -> str | None:
    value = options.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}.{key} must be a non-empty string, got {value!r}")
    return value.strip()


def _check_bounds(min_workers: Any, max_workers: Any, where: str) -> None:
    if isinstance(min_workers, bool) or not isinstance(min_workers, int) or min_workers < 0:
        raise ConfigError(f"{where}min_workers must be an integer >= 0, got {min_workers!r}")
    if max_workers is not None and (
        isinstance(max_workers, bool)
        or not isinstance(max_workers, int)
        or max_workers < max(1, min_workers)
    ):
        raise ConfigError(
            f"{where}max_workers must be an integer >= max(1, min_workers {min_workers}), "
            f"got {max_workers!r}"
        )
