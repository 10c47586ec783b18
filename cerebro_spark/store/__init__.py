"""Stores: bytes under keys on a local file system or an object store."""

from cerebro_spark.store._base import Store
from cerebro_spark.store._filesystem import (
    FileSystemStore,
    check_key,
    open_store,
    resolve_filesystem,
)
from cerebro_spark.store._lease import (
    LEASE_NAME,
    ExperimentLease,
    LeaseHolder,
    LeaseObject,
    LocalLeaseObject,
    S3LeaseObject,
    experiment_lease,
    lease_object,
)

__all__ = [
    "LEASE_NAME",
    "ExperimentLease",
    "FileSystemStore",
    "LeaseHolder",
    "LeaseObject",
    "LocalLeaseObject",
    "S3LeaseObject",
    "Store",
    "check_key",
    "experiment_lease",
    "lease_object",
    "open_store",
    "resolve_filesystem",
]
