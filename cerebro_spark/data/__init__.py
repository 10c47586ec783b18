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
from cerebro_spark.data._reader import read_manifest, read_partition
from cerebro_spark.data._sources import SOURCES, load_source, read_table
from cerebro_spark.data._writer import (
    PARQUET_OPTIONS,
    content_hash,
    dataset_id_for,
    encode_partition,
    prepare_dataset,
    write_dataset,
)

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "PARQUET_OPTIONS",
    "SOURCES",
    "SPLITS",
    "ColumnInfo",
    "DatasetInfo",
    "Manifest",
    "PartitionData",
    "PartitionInfo",
    "content_hash",
    "dataset_id_for",
    "encode_partition",
    "load_source",
    "partition_path",
    "prepare_dataset",
    "read_manifest",
    "read_partition",
    "read_table",
    "write_dataset",
]
