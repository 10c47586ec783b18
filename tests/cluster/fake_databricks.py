"""A fake Databricks workspace on 127.0.0.1: one cluster, resized through the clusters API.

It speaks the part of the REST API that ``databricks-sdk`` 0.156.0 calls for
:class:`~cerebro_spark.cluster.DatabricksCluster`, with the SDK's JSON shapes
(``databricks.sdk.service.compute.ClusterDetails``, ``SparkNode``):

* ``GET /.well-known/databricks-config``: 404 (the SDK's host metadata probe; a plain
  workspace without it is fine);
* ``GET /api/2.1/clusters/get?cluster_id=``: the cluster (``num_workers`` is the size asked
  for, ``state``, ``executors`` the worker nodes that run now, ``driver``);
* ``POST /api/2.1/clusters/resize``: ``{cluster_id, num_workers}`` or ``{cluster_id,
  autoscale}``. Only while the cluster is ``RUNNING``: otherwise HTTP 400
  ``INVALID_STATE``, as Databricks answers a second resize while the first one runs.

Every request needs ``Authorization: Bearer <token>`` (401 ``UNAUTHENTICATED`` otherwise).

A resize walks the cluster ``RUNNING`` → ``RESIZING`` → ``RUNNING``: ``num_workers`` takes
the new value at once (as the real field does), the cluster stays ``RESIZING`` for
``resize_s`` seconds (provisioning), then worker nodes are added or removed (the newest
first) and the state is ``RUNNING`` again. With ``daemons`` each node is a real Spark
worker daemon on 127.0.0.1: an added node starts a daemon (it registers with the master,
which gives the application an executor, seconds *after* the API says ``RUNNING``, as on
Databricks), a removed node's daemon is crashed with its whole process tree at once, as a
terminated cloud node is (a daemon stopped politely may still relaunch the executor it was
told to replace, an orphan that outlives it). Without daemons the nodes are records only.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import logging
import os
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cerebro_spark.cluster import SparkDaemons

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Call:
    """One request the server answered.

    Attributes:
        at: ``time.monotonic()`` when it arrived.
        method: HTTP method.
        path: Path without the query.
        body: The JSON body (``{}`` without one).
        status: HTTP status answered.
        error_code: Databricks error code answered (``None`` on success).
        state: The cluster's state when it arrived.
    """

    at: float
    method: str
    path: str
    body: dict[str, Any]
    status: int
    error_code: str | None
    state: str


@dataclasses.dataclass
class Node:
    """A worker node (``SparkNode``) and the daemon instance that stands for it."""

    instance: int
    started: float
    ip: str = "127.0.0.1"

    @property
    def instance_id(self) -> str:
        return f"i-fake{self.instance:08d}"

    def to_json(self) -> dict[str, Any]:
        return {
            "node_id": f"fake-node-{self.instance:04d}",
            "instance_id": self.instance_id,
            "private_ip": self.ip,
            "host_private_ip": self.ip,
            "start_timestamp": int(self.started * 1000),
        }


class FakeDatabricks:
    """A fake workspace with one cluster (see the module docstring).

    Args:
        workers: Worker nodes the cluster starts with.
        token: The bearer token every request must carry.
        cluster_id: The cluster's id.
        resize_s: Seconds a resize keeps the cluster ``RESIZING`` before nodes change.
        daemons: Start and crash a real worker daemon per node (its master must run).
        autoscale: ``(min_workers, max_workers)``: an autoscaling cluster instead of a
            fixed ``num_workers``.
        node_type_id: The cluster's node type.
        worker_memory: Memory of each worker daemon.
        node_ip: The private IP the API lists for node ``instance`` (default: 127.0.0.1,
            where the daemons run; without daemons tests may tell nodes apart by IP).
    """

    def __init__(
        self,
        workers: int = 2,
        *,
        token: str = "dapi-fake-token",
        cluster_id: str = "0101-000000-fake0001",
        resize_s: float = 0.5,
        daemons: SparkDaemons | None = None,
        autoscale: tuple[int, int] | None = None,
        node_type_id: str = "m5.xlarge",
        worker_memory: str = "1g",
        node_ip: Callable[[int], str] = lambda instance: "127.0.0.1",
    ) -> None:
        self.token = token
        self.cluster_id = cluster_id
        self.resize_s = resize_s
        self.daemons = daemons
        self.autoscale = autoscale
        self.node_type_id = node_type_id
        self.worker_memory = worker_memory
        self.node_ip = node_ip
        self.removed: list[tuple[Node, float]] = []
        self.calls: list[Call] = []
        self.states: list[tuple[float, str]] = []
        self.num_workers = workers
        self.nodes: list[Node] = []
        self.started = time.time()
        self._state = "RUNNING"
        self._lock = threading.RLock()
        self._walks: list[threading.Thread] = []
        self._next_instance = 1
        self._closed = False
        self._closing = threading.Event()
        self._set_state("RUNNING")
        for _ in range(workers):
            self._add_node()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-databricks",
            daemon=True,
        )
        self._thread.start()

    @property
    def host(self) -> str:
        """The workspace URL (``http://127.0.0.1:PORT``)."""
        port = self._server.server_address[1]
        return f"http://127.0.0.1:{port}"

    @property
    def state(self) -> str:
        """The cluster's state now."""
        with self._lock:
            return self._state

    def wait_running(self, timeout_s: float = 30.0) -> None:
        """Wait until no resize walks any more and the cluster is ``RUNNING``."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                walks = [w for w in self._walks if w.is_alive()]
                if not walks and self._state == "RUNNING":
                    return
            if time.monotonic() > deadline:
                raise AssertionError(f"the fake cluster is still {self.state}")
            for walk in walks:
                walk.join(timeout=max(0.0, deadline - time.monotonic()))

    def resizes(self, status: int | None = None) -> list[Call]:
        """The resize requests answered (with ``status`` only, when given)."""
        with self._lock:
            return [
                c
                for c in self.calls
                if c.path == "/api/2.1/clusters/resize" and status in (None, c.status)
            ]

    def cluster_json(self) -> dict[str, Any]:
        """The cluster as ``clusters/get`` returns it."""
        with self._lock:
            size: dict[str, Any] = (
                {"autoscale": {"min_workers": self.autoscale[0], "max_workers": self.autoscale[1]}}
                if self.autoscale is not None
                else {"num_workers": self.num_workers}
            )
            return {
                "cluster_id": self.cluster_id,
                "cluster_name": "cerebro-fake",
                "spark_version": "16.4.x-scala2.13",
                "node_type_id": self.node_type_id,
                "driver_node_type_id": self.node_type_id,
                **size,
                "state": self._state,
                "state_message": "" if self._state == "RUNNING" else "Resizing the cluster",
                "cluster_source": "UI",
                "start_time": int(self.started * 1000),
                "spark_context_id": 4242,
                "driver": {
                    "node_id": "fake-driver",
                    "instance_id": "i-fakedriver",
                    "private_ip": "127.0.0.1",
                    "host_private_ip": "127.0.0.1",
                    "start_timestamp": int(self.started * 1000),
                },
                "executors": [n.to_json() for n in self.nodes],
            }

    def close(self) -> None:
        """Stop the server, let running walks end, crash every daemon it started (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            walks = list(self._walks)
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
        for walk in walks:
            walk.join(timeout=60)
        with self._lock:
            nodes, self.nodes = self.nodes, []
        if self.daemons is not None:
            for node in nodes:
                self.daemons.crash_worker(node.instance)

    def __enter__(self) -> FakeDatabricks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the cluster ---------------------------------------------------------------------

    def _set_state(self, state: str) -> None:
        with self._lock:
            self._state = state
            self.states.append((time.monotonic(), state))

    def _add_node(self) -> None:
        with self._lock:
            instance = self._next_instance
            self._next_instance += 1
        if self.daemons is not None:
            self.daemons.start_worker(instance, cores=1, memory=self.worker_memory)
        with self._lock:
            self.nodes.append(Node(instance, time.time(), self.node_ip(instance)))
        logger.info("fake databricks: node %d added", instance)

    def _remove_newest_node(self) -> None:
        with self._lock:
            node = self.nodes.pop()
        if self.daemons is not None:
            self.daemons.crash_worker(node.instance)
        with self._lock:
            self.removed.append((node, time.time()))
        logger.info("fake databricks: node %d removed", node.instance)

    def _walk(self, target: int) -> None:
        """RESIZING for ``resize_s``, nodes to ``target``, then RUNNING."""
        try:
            self._closing.wait(self.resize_s)
            while len(self.nodes) < target and not self._closed:
                self._add_node()
            while len(self.nodes) > target:
                self._remove_newest_node()
        except Exception:
            logger.exception("fake databricks: the resize to %d failed", target)
        finally:
            self._set_state("RUNNING")

    def resize(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Answer ``clusters/resize``."""
        with self._lock:
            if body.get("cluster_id") != self.cluster_id:
                return _error(
                    400,
                    "INVALID_PARAMETER_VALUE",
                    f"Cluster {body.get('cluster_id')} does not exist",
                )
            if self._state != "RUNNING":
                return _error(
                    400,
                    "INVALID_STATE",
                    f"Cluster {self.cluster_id} is in unexpected state {self._state.title()}.",
                )
            if "autoscale" in body:
                scale = body["autoscale"]
                self.autoscale = (int(scale["min_workers"]), int(scale["max_workers"]))
                target = self.autoscale[0]
            else:
                target = body.get("num_workers")
                if isinstance(target, bool) or not isinstance(target, int) or target < 0:
                    return _error(
                        400, "INVALID_PARAMETER_VALUE", f"num_workers must be >= 0, got {target!r}"
                    )
                self.autoscale = None
            self.num_workers = target
            self._set_state("RESIZING")
            walk = threading.Thread(
                target=self._walk, args=(target,), name=f"fake-databricks-resize-{target}"
            )
            self._walks.append(walk)
        walk.start()
        return 200, {}

    def get(self, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        """Answer ``clusters/get``."""
        asked = (query.get("cluster_id") or [""])[0]
        if asked != self.cluster_id:
            return _error(400, "INVALID_PARAMETER_VALUE", f"Cluster {asked} does not exist")
        return 200, self.cluster_json()


def _error(status: int, code: str, message: str) -> tuple[int, dict[str, Any]]:
    return status, {"error_code": code, "message": message}


def _handler(fake: FakeDatabricks) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            logger.debug("fake databricks: " + format, *args)

        def _answer(self, method: str) -> None:
            url = urllib.parse.urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else {}
            except json.JSONDecodeError:
                body = {}
            state = fake.state
            if url.path == "/.well-known/databricks-config":
                status, answer = _error(404, "NOT_FOUND", "no such endpoint")
            elif self.headers.get("Authorization") != f"Bearer {fake.token}":
                status, answer = _error(401, "UNAUTHENTICATED", "Invalid access token.")
            elif method == "GET" and url.path == "/api/2.1/clusters/get":
                status, answer = fake.get(urllib.parse.parse_qs(url.query))
            elif method == "POST" and url.path == "/api/2.1/clusters/resize":
                status, answer = fake.resize(body)
            else:
                status, answer = _error(404, "ENDPOINT_NOT_FOUND", f"No API found for {url.path}")
            with fake._lock:
                fake.calls.append(
                    Call(
                        time.monotonic(),
                        method,
                        url.path,
                        body,
                        status,
                        answer.get("error_code") if status >= 400 else None,
                        state,
                    )
                )
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._answer("GET")

        def do_POST(self) -> None:
            self._answer("POST")

    return Handler


def isolate_databricks_config(monkeypatch: Any, tmp_path: Path) -> None:
    """No credentials of this machine leak into a test: only what the test gives counts.

    Drops every ``DATABRICKS_*`` variable and points the SDK's config file at nothing
    (``monkeypatch``: pytest's, so both come back after the test).
    """
    for key in list(os.environ):
        if key.startswith("DATABRICKS_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("DATABRICKS_CONFIG_FILE", str(tmp_path / "no-databrickscfg"))
