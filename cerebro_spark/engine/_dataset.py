"""Resolve an experiment's data section to a prepared dataset in the store."""

from __future__ import annotations

import logging

from cerebro_spark.data import Manifest, load_source, prepare_dataset, read_manifest, read_table
from cerebro_spark.engine._config import ExperimentConfig
from cerebro_spark.store import Store

logger = logging.getLogger(__name__)


def resolve_dataset(config: ExperimentConfig, store: Store) -> tuple[str, Manifest]:
    """Return the URI and the manifest of the experiment's dataset, preparing it if needed.

    ``dataset:`` names a prepared dataset by URI, in any store: that URI is what the
    workers read. A ``source`` is shuffled once, split and partitioned into
    ``<store>/datasets/<id>``; the id depends only on the content and the preparation
    parameters, so a second run reuses the dataset instead of rewriting it.
    """
    data = config.data
    if data.dataset is not None:
        return data.dataset, read_manifest(data.dataset)
    assert data.source is not None  # ok: the config parser requires source or dataset
    shapes: dict[str, tuple[int, ...]] = {}
    if data.source.startswith("sklearn:"):
        table, meta = load_source(data.source)
        shapes.update(meta.get("feature_shapes", {}))
    else:
        table = read_table(data.source)
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
        source=data.source,
    )
    return store.url(f"datasets/{manifest.dataset_id}"), manifest
