"""Resolve an experiment's data section to a prepared dataset in the store."""

from __future__ import annotations

import logging
import re

import pyarrow as pa

from cerebro_spark.data import Manifest, load_source, prepare_dataset, read_manifest, read_table
from cerebro_spark.data._names import find_dataset
from cerebro_spark.driver._config import ExperimentConfig, check_data_section
from cerebro_spark.errors import DataError
from cerebro_spark.store import Store

logger = logging.getLogger(__name__)


def resolve_dataset(config: ExperimentConfig, store: Store) -> tuple[str, Manifest]:
    """Return the URI and the manifest of the experiment's dataset, preparing it if needed.

    ``dataset:`` is a prepared dataset's URI (in any store), its id or a name given to it
    in the experiment's store (:func:`~cerebro_spark.data.find_dataset`); the resolved URI
    is what the workers read (and what the ``dataset`` event logs, with the id). A
    ``source`` is shuffled once, split and partitioned into ``<store>/datasets/<id>``; the
    id depends only on the content and the preparation parameters, so a second run
    reuses the dataset instead of rewriting it. Spark ML vector columns of a source are
    decoded (dense and sparse).

    Raises:
        ConfigError: Preparation fields beside ``dataset`` (a config built in code).
        DataError: No such dataset, or a source this (plain-Python) path cannot read,
            with the ``prepare`` command that can.
    """
    data = config.data
    if data.dataset is not None:
        check_data_section(data)
        uri = find_dataset(store, data.dataset)
        manifest = read_manifest(uri)
        logger.info("dataset %s resolves to %s at %s", data.dataset, manifest.dataset_id, uri)
        return uri, manifest
    assert data.source is not None  # ok: the config parser requires source or dataset
    shapes: dict[str, tuple[int, ...]] = {}
    kinds = data.kinds
    if data.source.startswith("sklearn:"):
        table, meta = load_source(data.source)
        shapes.update(meta.get("feature_shapes", {}))
        if kinds is None:
            kinds = meta.get("kinds")
    else:
        table = _read_source(data.source)
    shapes.update(data.feature_shapes or {})
    features = data.features
    if features is None:
        skip = {data.label, data.validation_column}
        features = tuple(name for name in table.column_names if name not in skip)
    manifest = prepare_dataset(
        table,
        store,
        features=list(features),
        label=data.label,
        num_partitions=data.partitions,
        seed=config.seed if data.seed is None else data.seed,
        validation_fraction=data.validation_fraction,
        validation_column=data.validation_column,
        feature_shapes=shapes or None,
        kinds=kinds,
        source=data.source,
    )
    return store.url(f"datasets/{manifest.dataset_id}"), manifest


_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){0,2}")


def _read_source(source: str) -> pa.Table:
    """Read a ``source`` file or directory; say what to do with what cannot be read here."""
    try:
        return read_table(source)
    except FileNotFoundError:
        if _TABLE_NAME.fullmatch(source) and not source.endswith(
            (".parquet", ".csv", ".json", ".jsonl")
        ):
            raise DataError(
                f"data.source {source!r} is not a file or directory; a config's source is "
                f"read without Spark, so a table of a Spark catalog is prepared first: "
                f"'cerebro-spark prepare --table {source} --name NAME', then "
                "data: {dataset: NAME}"
            ) from None
        raise
