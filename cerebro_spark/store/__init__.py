"""Stores: bytes under keys on a local file system or an object store."""

from cerebro_spark.store._base import Store
from cerebro_spark.store._filesystem import (
    FileSystemStore,
    check_key,
    open_store,
    resolve_filesystem,
)

__all__ = ["FileSystemStore", "Store", "check_key", "open_store", "resolve_filesystem"]
