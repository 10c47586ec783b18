"""Stores: bytes under keys on a local file system or an object store."""

from cerebro_spark.store._base import Store
from cerebro_spark.store._filesystem import (
    DEFAULT_RETRY_SECONDS,
    RETRY_SECONDS_ENV,
    FileSystemStore,
    check_key,
    is_transient,
    open_store,
    resolve_filesystem,
    retry_seconds,
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
    "DEFAULT_RETRY_SECONDS",
    "LEASE_NAME",
    "RETRY_SECONDS_ENV",
    "ExperimentLease",
    "FileSystemStore",
    "LeaseHolder",
    "LeaseObject",
    "LocalLeaseObject",
    "S3LeaseObject",
    "Store",
    "check_key",
    "experiment_lease",
    "is_transient",
    "lease_object",
    "open_store",
    "resolve_filesystem",
    "retry_seconds",
]
