"""Stores: bytes under keys on a local file system or an object store."""

from cerebro_spark.store._base import Store

__all__ = ["Store"]
