"""Prepared datasets: the partitioned-Parquet format, its writers and its reader.

Two writers produce the same datasets: :func:`prepare_dataset` (plain Python, the data in
memory) and :func:`prepare_with_spark` (Spark tasks; the data never passes through the
driver). ``prepare_with_spark`` is re-exported here because its module imports pyspark
only when the function is called: ``import cerebro_spark.data`` works without pyspark.
"""

from cerebro_spark.data._format import (
    DENSE_DTYPES,
    FORMAT_VERSION,
    KINDS,
    MANIFEST_NAME,
    SPLITS,
    UNKNOWN_ID,
    ColumnInfo,
    DatasetInfo,
    FeatureStatistics,
    HeldColumn,
    Kind,
    Manifest,
    PartitionData,
    PartitionInfo,
    feature_shape,
    mask_key,
    partition_path,
    tensor_input,
)
from cerebro_spark.data._names import (
    DatasetEntry,
    DatasetName,
    check_dataset_name,
    dataset_names,
    find_dataset,
    list_datasets,
    name_dataset,
    read_dataset_name,
    remove_dataset_name,
)
from cerebro_spark.data._options import DEFAULT_VOCABULARY_LIMIT, KindOptions
from cerebro_spark.data._reader import read_manifest, read_partition
from cerebro_spark.data._sources import SOURCES, load_source, read_table
from cerebro_spark.data._spark_prepare import prepare_with_spark
from cerebro_spark.data._vectors import decode_vectors
from cerebro_spark.data._writer import (
    PARQUET_OPTIONS,
    content_hash,
    dataset_id_for,
    encode_partition,
    prepare_dataset,
    write_dataset,
)

__all__ = [
    "DEFAULT_VOCABULARY_LIMIT",
    "DENSE_DTYPES",
    "FORMAT_VERSION",
    "KINDS",
    "MANIFEST_NAME",
    "PARQUET_OPTIONS",
    "SOURCES",
    "SPLITS",
    "UNKNOWN_ID",
    "ColumnInfo",
    "DatasetEntry",
    "DatasetInfo",
    "DatasetName",
    "FeatureStatistics",
    "HeldColumn",
    "Kind",
    "KindOptions",
    "Manifest",
    "PartitionData",
    "PartitionInfo",
    "check_dataset_name",
    "content_hash",
    "dataset_id_for",
    "dataset_names",
    "decode_vectors",
    "encode_partition",
    "feature_shape",
    "find_dataset",
    "list_datasets",
    "load_source",
    "mask_key",
    "name_dataset",
    "partition_path",
    "prepare_dataset",
    "prepare_with_spark",
    "read_dataset_name",
    "read_manifest",
    "read_partition",
    "read_table",
    "remove_dataset_name",
    "tensor_input",
    "write_dataset",
]
