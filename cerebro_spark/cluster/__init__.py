"""Cluster managers: the executors a search runs on, resized between its stages.

:class:`ClusterManager` is the seam (rules in :mod:`cerebro_spark.cluster._base`):
:class:`SparkExecutors` resizes the running application through Spark
(standalone, YARN, Kubernetes; ``local[N]`` is fixed). A :class:`StandaloneCluster` is a
master cerebro-spark starts and one worker per instance: :class:`LocalStandaloneCluster`
starts and stops worker daemons on this machine. :class:`CostMeter` bills what a
manager's executors held. :class:`SparkDaemons` drives standalone
daemons through ``spark-daemon.sh``. Nothing here imports pyspark at import time.
"""

from cerebro_spark.cluster._base import Capabilities, ClusterManager, Executor, ResizeTimeout
from cerebro_spark.cluster._daemons import SparkDaemons
from cerebro_spark.cluster._meter import CostMeter, Held
from cerebro_spark.cluster._spark import SparkExecutors, check_static_allocation
from cerebro_spark.cluster._standalone import LocalStandaloneCluster, StandaloneCluster

__all__ = [
    "Capabilities",
    "ClusterManager",
    "CostMeter",
    "Executor",
    "Held",
    "LocalStandaloneCluster",
    "ResizeTimeout",
    "SparkDaemons",
    "SparkExecutors",
    "StandaloneCluster",
    "check_static_allocation",
]
