"""Cluster managers: the executors a search runs on, resized between its stages.

:class:`ClusterManager` is the seam (rules in :mod:`cerebro_spark.cluster._base`):
:class:`SparkExecutors` resizes the running application through Spark
(standalone, YARN, Kubernetes; ``local[N]`` is fixed). A :class:`StandaloneCluster` is a
master cerebro-spark starts and one worker per instance: :class:`LocalStandaloneCluster`
starts and stops worker daemons on this machine, :class:`Ec2Cluster` launches and
terminates EC2 instances (:class:`Ec2Fleet`). :class:`DatabricksCluster` resizes the
Databricks cluster a notebook or job runs on. :class:`CostMeter` bills what a
manager's executors held. :class:`SparkDaemons` drives standalone
daemons through ``spark-daemon.sh``. Nothing here imports pyspark or databricks-sdk at
import time (:class:`DatabricksCluster` is imported when first used).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from cerebro_spark.cluster._base import Capabilities, ClusterManager, Executor, ResizeTimeout
from cerebro_spark.cluster._daemons import SparkDaemons
from cerebro_spark.cluster._ec2 import Ec2Cluster, Ec2Fleet
from cerebro_spark.cluster._meter import CostMeter, Held
from cerebro_spark.cluster._spark import SparkExecutors, check_static_allocation
from cerebro_spark.cluster._standalone import LocalStandaloneCluster, StandaloneCluster

if TYPE_CHECKING:
    from cerebro_spark.cluster._databricks import DatabricksCluster

__all__ = [
    "Capabilities",
    "ClusterManager",
    "CostMeter",
    "DatabricksCluster",
    "Ec2Cluster",
    "Ec2Fleet",
    "Executor",
    "Held",
    "LocalStandaloneCluster",
    "ResizeTimeout",
    "SparkDaemons",
    "SparkExecutors",
    "StandaloneCluster",
    "check_static_allocation",
]

#: Managers whose module imports a cloud SDK: imported when first asked for.
_LAZY = {"DatabricksCluster": "cerebro_spark.cluster._databricks"}


def __getattr__(name: str) -> Any:
    """Import a manager of :data:`_LAZY` (and its SDK) when first asked for."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
