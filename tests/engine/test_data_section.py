"""The config's ``data`` section: a prepared dataset by name, id or URI; preparation fields
beside it refused; a Spark ML vector source; old ``config.json`` files still load."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cerebro_spark.backends import WorkerPool
from cerebro_spark.data import load_source, prepare_dataset, read_partition
from cerebro_spark.data._names import name_dataset
from cerebro_spark.driver._config import PREPARATION_FIELDS, DataConfig, check_data_section
from cerebro_spark.driver._dataset import resolve_dataset
from cerebro_spark.engine import parse_config, read_events, run_experiment
from cerebro_spark.engine._api import load_experiment_config
from cerebro_spark.errors import ConfigError, DataError
from cerebro_spark.store import open_store
from tests.backends import fake_transport
from tests.backends.fake_transport import ThreadTransport


@pytest.fixture(autouse=True)
def script() -> Iterator[fake_transport.Script]:
    yield fake_transport.reset()
    fake_transport.reset()


def raw(store: str, data: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "named",
        "seed": 1,
        "store": store,
        "data": data,
        "epochs": 1,
        "workers": 2,
        "model": "tests.engine.free_spec:FreeSpec",  # built once by the pre-flight
        "space": {"hidden": {"grid": [1, 2]}},
    }


VALUES: dict[str, Any] = {
    "features": ["a"],
    "label": "y",
    "partitions": 8,
    "validation_fraction": 0.3,
    "validation_column": "is_val",
    "feature_shapes": {"a": [2]},
    "seed": 3,
    "image_columns": ["a"],
    "categorical": ["a"],
    "sequence_columns": ["a"],
    "image_size": [32, 32],
    "image_channels": 3,
    "vocabulary_limit": 10,
    "hash_buckets": 4,
    "max_length": 16,
}


def test_every_preparation_field_is_known() -> None:
    assert set(VALUES) == set(PREPARATION_FIELDS)


@pytest.mark.parametrize("field", sorted(VALUES))
def test_preparation_fields_beside_a_dataset_are_refused(field: str) -> None:
    with pytest.raises(ConfigError, match=rf"data\.{field} applies only when preparing") as error:
        parse_config(raw("runs", {"dataset": "churn", field: VALUES[field]}))
    assert "'churn'" in str(error.value) and PREPARATION_FIELDS[field] in str(error.value)
    # with a source they are what they always were
    config = parse_config(raw("runs", {"source": "x.parquet", field: VALUES[field]}))
    assert config.data.source == "x.parquet"


def test_several_fields_are_all_named() -> None:
    with pytest.raises(ConfigError, match=r"data\.label .*also set: partitions, seed"):
        parse_config(raw("runs", {"dataset": "d", "label": "y", "partitions": 2, "seed": 0}))


def test_a_stored_config_of_an_earlier_version_still_loads(tmp_path: Path) -> None:
    """Earlier versions wrote label, partitions and validation_fraction beside a dataset."""
    old = raw(str(tmp_path), {"dataset": "/x/d", "label": "label", "partitions": 4,
                              "validation_fraction": 0.2})  # fmt: skip
    store = open_store(str(tmp_path))
    store.put("experiments/old/config.json", json.dumps(old).encode())
    config = load_experiment_config(store, "old")
    assert config.data.dataset == "/x/d"
    # what this version writes parses as a user config again
    written = config.to_dict()
    assert written["data"] == {"dataset": "/x/d"}
    assert parse_config(written) == config
    with_source = parse_config(raw("runs", {"source": "s.csv", "label": "y", "partitions": 3}))
    assert parse_config(with_source.to_dict()) == with_source


def prepared(store: str) -> Any:
    table, meta = load_source("sklearn:digits")
    return prepare_dataset(table, store, num_partitions=2, seed=9, **meta)


def run(config: Any, experiment_id: str) -> Any:
    return run_experiment(
        config,
        experiment_id=experiment_id,
        backend_factory=lambda c: WorkerPool(ThreadTransport(), c.workers),
    )


@pytest.mark.parametrize("how", ["name", "id", "uri"])
def test_a_run_on_a_named_dataset_logs_its_id_and_uri(tmp_path: Path, how: str) -> None:
    store = str(tmp_path / "runs")
    manifest = prepared(store)
    name_dataset(store, "digits-2026-11", manifest)
    uri = open_store(store).url(f"datasets/{manifest.dataset_id}")
    reference = {"name": "digits-2026-11", "id": manifest.dataset_id, "uri": uri}[how]
    result = run(parse_config(raw(store, {"dataset": reference})), "e")
    assert all(t.status == "completed" for t in result.trials)
    events = read_events(open_store(store).child("experiments/e"))
    (logged,) = [e for e in events if e["event"] == "dataset"]
    assert (logged["dataset_id"], logged["uri"]) == (manifest.dataset_id, uri)
    assert {job.dataset_uri for job in fake_transport.SCRIPT.jobs.values()} == {uri}
    start = next(e for e in events if e["event"] == "experiment_start")
    assert start["config"]["data"] == {"dataset": reference}


def test_an_unknown_name_fails_before_any_worker(tmp_path: Path) -> None:
    store = str(tmp_path / "runs")
    name_dataset(store, "real", prepared(store))
    with pytest.raises(DataError, match=r"no dataset name 'reel'.*names there: real"):
        run(parse_config(raw(store, {"dataset": "reel"})), "e")
    assert fake_transport.SCRIPT.jobs == {}


def test_a_spark_ml_vector_parquet_source(tmp_path: Path) -> None:
    """VectorAssembler output as Parquet (the struct pyarrow sees), dense and sparse rows."""
    rng = np.random.default_rng(0)
    matrix = np.where(rng.random((40, 4)) < 0.5, 0.0, rng.standard_normal((40, 4)))
    cells = [
        {"type": 1, "size": None, "indices": None, "values": row.tolist()}
        if i % 2
        else {
            "type": 0,
            "size": 4,
            "indices": np.flatnonzero(row).tolist(),
            "values": row[row != 0].tolist(),
        }
        for i, row in enumerate(matrix)
    ]
    vector = pa.struct(
        [("type", pa.int8()), ("size", pa.int32()), ("indices", pa.list_(pa.int32())),
         ("values", pa.list_(pa.float64()))]
    )  # fmt: skip
    labels = np.arange(40) % 2
    path = tmp_path / "va.parquet"
    pq.write_table(pa.table({"features": pa.array(cells, type=vector), "label": labels}), path)
    config = parse_config(raw(str(tmp_path / "runs"), {"source": str(path), "partitions": 2}))
    uri, manifest = resolve_dataset(config, open_store(config.store))
    assert [(c.name, c.shape) for c in manifest.features] == [("features", (4,))]
    rows = np.concatenate(
        [read_partition(uri, s, i).features for s in ("train", "validation") for i in range(2)]
    )
    expected = {tuple(r) for r in matrix.astype(np.float32).tolist()}
    assert {tuple(r) for r in rows.tolist()} == expected


def test_a_table_name_as_source_says_to_prepare_it(tmp_path: Path) -> None:
    config = parse_config(raw(str(tmp_path), {"source": "sales.churn_2026"}))
    with pytest.raises(DataError, match=r"prepare --table sales\.churn_2026 --name NAME"):
        resolve_dataset(config, open_store(config.store))


def test_a_data_section_built_in_code_is_checked_too(tmp_path: Path) -> None:
    """A config built without the parser (an API) gets the same refusal at run time."""
    config = parse_config(raw(str(tmp_path), {"dataset": "anything"}))
    built = config.replace(data=DataConfig(dataset="anything", label="churned"))
    with pytest.raises(ConfigError, match=r"data\.label applies only when preparing"):
        resolve_dataset(built, open_store(str(tmp_path)))
    check_data_section(DataConfig(dataset="anything"))  # defaults: nothing was set
    check_data_section(DataConfig(source="x.csv", label="y", partitions=2))
