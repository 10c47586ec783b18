"""Fixtures shared by every test package.

``s3_server``: a real S3 API (moto's server, one per test session, bound to 127.0.0.1) with
a fresh bucket per test and fake AWS credentials in the environment. It yields an
:class:`S3Server`; ``s3_server.uri("some/prefix")`` is an ``s3://`` URI that pyarrow (and
so :func:`cerebro_spark.store.open_store`) can use directly.

Spark's JVMs (drivers, executors, the standalone daemons) started by the tests and their
child processes run with C1 only, the serial collector and no verification of the bytecode
of Spark's jars (``JVM_OPTIONS``): through
``SPARK_CONF_DIR`` (``tests/spark-conf/spark-defaults.conf``: the drivers' and executors'
``defaultJavaOptions``) and ``SPARK_DAEMON_JAVA_OPTS``, unless those are set already. A
test's JVM lives for seconds to minutes and spends most of its CPU compiling Spark's
start-up code: on a 2-core machine this halves the CPU of a ``local-cluster[2,1,1024]``
start (about 110 -> 65 CPU-seconds) and of ``tests/data/test_spark_prepare.py``
(300 -> 165); not verifying the jars' bytecode saves a tenth more of a Spark job's CPU (a
trivial ``spark-submit``: 31-34 -> 28-31 CPU-seconds). Nothing Spark does changes, only how
its bytecode is loaded and compiled.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REGION = "us-east-1"

JVM_OPTIONS = (  # also in tests/spark-conf
    "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    " -XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote"
)
os.environ.setdefault("SPARK_CONF_DIR", str(Path(__file__).with_name("spark-conf")))
os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", JVM_OPTIONS)


@pytest.fixture(autouse=True)
def _no_warm_workers_left() -> Iterator[None]:
    """Close the workers a test's last search kept warm (``Tuner`` keeps them 120 s), so
    that no test inherits another's workers, executor slots or processes."""
    yield
    warm = sys.modules.get("cerebro_spark.driver._warm")
    if warm is not None:
        warm.release_workers()


@dataclasses.dataclass(frozen=True)
class S3Server:
    """A running moto S3 server and the bucket created for one test.

    Attributes:
        endpoint: ``"127.0.0.1:PORT"`` (pyarrow's ``endpoint_override``).
        bucket: Name of the (empty) bucket made for this test.
    """

    endpoint: str
    bucket: str

    @property
    def endpoint_url(self) -> str:
        """``"http://127.0.0.1:PORT"`` (boto3's ``endpoint_url``)."""
        return f"http://{self.endpoint}"

    def uri(self, prefix: str = "") -> str:
        """Return ``s3://<bucket>/<prefix>?endpoint_override=...&scheme=http&region=...``."""
        path = f"{self.bucket}/{prefix.strip('/')}".rstrip("/")
        return f"s3://{path}?endpoint_override={self.endpoint}&scheme=http&region={REGION}"

    def client(self) -> Any:
        """Return a boto3 S3 client for the server (cached: building one costs ~0.2 s)."""
        return _client(self.endpoint_url)

    def __str__(self) -> str:
        return self.endpoint


@functools.cache
def _client(endpoint_url: str) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture(scope="session")
def _moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_server(_moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """A moto S3 server on 127.0.0.1 with a fresh bucket and fake credentials in the env."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    server = S3Server(endpoint=_moto_endpoint, bucket=f"test-{uuid.uuid4().hex[:16]}")
    server.client().create_bucket(Bucket=server.bucket)
    return server


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real Spark Connect server (``local[4]``, its own process on 127.0.0.1,
    :mod:`tests.connect_server`), stopped at the end of the test session."""
    from tests.connect_server import ConnectServer

    server = ConnectServer(tmp_path_factory.mktemp("spark-connect"))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def connect_cluster_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real Spark Connect server on ``local-cluster[2,1,1024]`` (two executor JVMs of one
    core and 1 GiB, which a test may kill from the OS: :meth:`~tests.connect_server.
    ConnectServer.executor_pids`), for one module: stopped, executors and all, at its end."""
    from tests.connect_server import ConnectServer

    server = ConnectServer(
        tmp_path_factory.mktemp("spark-connect-cluster"), master="local-cluster[2,1,1024]"
    )
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def spark_connect(connect_server: Any) -> Iterator[Any]:
    """A Spark Connect session on ``connect_server`` for one module (no SparkContext);
    stopped at its end, so that no later module finds it active."""
    session = connect_server.session()
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark():
    """A local[4] Spark session shared by the Spark tests of a session (stopped at the end).

    Four slots: every SparkBackend worker holds a task slot for its whole life, and the
    backend contract runs a shared backend beside private ones.
    """
    from cerebro_spark.spark_session import spark_session

    session = spark_session(
        "local[4]",
        "cerebro-spark-tests",
        {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "4"},
        preload_torch=True,
    )
    yield session
    session.stop()
