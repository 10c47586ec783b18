"""Prepared datasets: the partitioned-Parquet format, its writer and its reader."""

from cerebro_spark.data._format import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    SPLITS,
    ColumnInfo,
    DatasetInfo,
    Manifest,
    PartitionData,
    PartitionInfo,
    partition_path,
)

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "SPLITS",
    "ColumnInfo",
    "DatasetInfo",
    "Manifest",
    "PartitionData",
    "PartitionInfo",
    "partition_path",
]
