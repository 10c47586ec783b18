"""Elastic managers on a Spark Connect session (issue 28, part 3), in the Connect child
process: those that need the SparkContext refuse it, naming why and what to do instead."""

from __future__ import annotations

from typing import Any

import pytest

from cerebro_spark.cluster import DatabricksCluster, SparkExecutors
from cerebro_spark.errors import ConfigError

pytestmark = [pytest.mark.spark]


def test_the_spark_manager_refuses_a_connect_session(spark_connect: Any) -> None:
    refusal = r"which a Spark Connect session \(Databricks Standard access mode, .*\) does not"
    with pytest.raises(ConfigError, match=refusal):
        SparkExecutors(spark_connect)


def test_the_databricks_manager_refuses_a_connect_session_for_now(spark_connect: Any) -> None:
    with pytest.raises(ConfigError, match="a REST-only manager is not built yet"):
        DatabricksCluster(spark_connect, cluster_id="0101-abc", host="http://127.0.0.1:9")
