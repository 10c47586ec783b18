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

__all__ = [
    "DEFAULT_RETRY_SECONDS",
    "RETRY_SECONDS_ENV",
    "FileSystemStore",
    "Store",
    "check_key",
    "is_transient",
    "open_store",
    "resolve_filesystem",
    "retry_seconds",
]
