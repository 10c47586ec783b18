"""load_model on a real experiment: every source form, every input form, the metadata a
checkpoint carries, old checkpoints without it, and clear errors."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pyarrow as pa
import pytest
import torch

import cerebro_spark
from cerebro_spark.data import load_source, prepare_dataset, read_manifest, read_partition
from cerebro_spark.engine import read_events
from cerebro_spark.errors import CheckpointCorruptError, ConfigError, DataError
from cerebro_spark.scoring import ScoringModel, best_checkpoint_uri, load_model
from cerebro_spark.store import open_store
from cerebro_spark.training import (
    CheckpointError,
    Standardize,
    decode_checkpoint,
    encode_checkpoint,
    run_unit,
)
from cerebro_spark.units import UnitKind, UnitTask

pytestmark = [pytest.mark.torch, pytest.mark.slow]


@pytest.fixture(scope="module")
def model(trained):
    return load_model(trained.experiment_uri, device="cpu")


def dataset_uri(trained):
    events = read_events(open_store(trained.experiment_uri))
    return next(e["uri"] for e in events if e["event"] == "dataset")


def test_the_best_model_predicts_the_held_out_rows_with_their_original_labels(trained, model):
    assert isinstance(model, ScoringModel) and isinstance(model, torch.nn.Module)
    predicted = model.predict(trained.held_out)
    truth = trained.held_out["diagnosis"].to_numpy()
    assert set(predicted) <= {"malignant", "benign"}
    accuracy = float(np.mean(predicted == truth))
    assert accuracy >= 0.9, accuracy
    proba = model.predict_proba(trained.held_out)
    assert proba.shape == (len(truth), 2) and model.classes == ("benign", "malignant")
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-12)
    np.testing.assert_array_equal(np.asarray(model.classes)[proba.argmax(axis=1)], predicted)


def test_every_source_form_gives_the_same_model(trained, model):
    expected = model.predict_proba(trained.held_out)
    uri = best_checkpoint_uri(trained.store, trained.experiment_id)
    assert uri.endswith(f"experiments/{trained.experiment_id}/best.pt")
    with open(uri, "rb") as handle:
        blob = handle.read()
    for other in (
        load_model(uri),
        load_model(trained.experiment_id, store=trained.store),
        load_model(f"experiments/{trained.experiment_id}", store=trained.store),
        load_model(blob),
        cerebro_spark.load_model(f"file://{trained.experiment_uri}"),
    ):
        np.testing.assert_array_equal(other.predict_proba(trained.held_out), expected)


def test_every_input_form_gives_the_same_predictions(trained, model):
    frame = trained.held_out
    expected = model.predict(frame)
    matrix = frame[trained.features].to_numpy()
    assert (model.predict(matrix) == expected).all()
    assert (model.predict(torch.from_numpy(matrix)) == expected).all()
    assert (model.predict(pa.Table.from_pandas(frame)) == expected).all()
    shuffled = frame[list(reversed(frame.columns))]  # columns are found by name
    assert (model.predict(shuffled) == expected).all()
    assert model.predict(frame.iloc[:0]).shape == (0,)


def test_the_models_epoch_counts_from_1_as_the_leaderboards(trained, model):
    """The checkpoint keeps its 0-based ``counters.epoch`` (replays compare its bytes);
    scoring reads the epoch counted from 1, the best epoch the leaderboard shows."""
    end = next(
        e for e in read_events(open_store(trained.experiment_uri)) if e["event"] == "experiment_end"
    )
    checkpoint = decode_checkpoint(open_store(trained.experiment_uri).get("best.pt"))
    assert model.metadata.trial_id == end["best_trial"]
    assert model.metadata.epoch == end["best_epoch"] == checkpoint["counters"]["epoch"] + 1


def test_the_checkpoint_carries_what_scoring_needs(trained):
    checkpoint = decode_checkpoint(open_store(trained.experiment_uri).get("best.pt"))
    manifest = read_manifest(dataset_uri(trained))
    data = checkpoint["data"]
    assert data["dataset_id"] == manifest.dataset_id
    assert [c["name"] for c in data["features"]] == trained.features
    assert all(c["shape"] == [] for c in data["features"]) and data["feature_shape"] == [30]
    assert data["label"] == "diagnosis" and data["task"] == "classification"
    assert data["classes"] == ["benign", "malignant"] and data["num_classes"] == 2
    assert manifest.statistics is not None
    assert data["statistics"] == manifest.statistics.to_dict()
    assert checkpoint["trial"]["spec"] == "cerebro_spark.training:MLPSpec"
    assert checkpoint["trial"]["params"]["lr"] == 0.01
    # the standardization travels inside the weights
    mean = np.asarray(manifest.statistics.mean, dtype=np.float32)
    np.testing.assert_array_equal(checkpoint["model"]["0.mean"].numpy(), mean)


def test_the_model_standardizes_with_the_training_statistics(model):
    first = model.network[0]
    assert isinstance(first, Standardize)
    stats = model.metadata.statistics
    np.testing.assert_array_equal(first.std.numpy(), np.asarray(stats.std, dtype=np.float32))


def strip_metadata(blob: bytes) -> bytes:
    checkpoint = decode_checkpoint(blob)
    del checkpoint["data"]
    return encode_checkpoint(checkpoint)


def test_an_old_checkpoint_without_metadata_needs_its_dataset(trained, model, tmp_path):
    old = tmp_path / "old.pt"
    old.write_bytes(strip_metadata(open_store(trained.experiment_uri).get("best.pt")))
    with pytest.raises(CheckpointError, match=r"no dataset metadata.*dataset="):
        load_model(str(old))
    given = load_model(str(old), dataset=dataset_uri(trained))
    np.testing.assert_array_equal(
        given.predict_proba(trained.held_out), model.predict_proba(trained.held_out)
    )
    # an experiment directory finds its dataset in its event log (an old experiment:
    # its log recorded the SHA-256 of the old best.pt)
    copy = tmp_path / "experiment"
    shutil.copytree(trained.experiment_uri, copy)
    (copy / "best.pt").write_bytes(old.read_bytes())
    with pytest.raises(CheckpointCorruptError, match=r"checkpoint corrupt: .*best\.pt"):
        load_model(str(copy))
    events = read_events(open_store(str(copy)))
    for event in events:
        if event["event"] == "experiment_end":
            event["best_checkpoint_sha256"] = hashlib.sha256(old.read_bytes()).hexdigest()
    (copy / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    found = load_model(str(copy))
    assert (found.predict(trained.held_out) == model.predict(trained.held_out)).all()


def test_a_dataset_that_is_not_the_checkpoints_is_refused(trained, tmp_path):
    table, meta = load_source("sklearn:wine")
    other = prepare_dataset(
        table, str(tmp_path), features=meta["features"], label="label", num_partitions=1, seed=0
    )
    with pytest.raises(ConfigError, match="trained on dataset"):
        load_model(trained.experiment_uri, dataset=other)


def test_bad_rows_are_refused_with_the_column_and_the_rule(trained, model):
    frame = trained.held_out
    with pytest.raises(DataError, match="mean_radius"):
        model.predict(frame.drop(columns=["mean_radius"]))
    broken = frame.copy()
    broken.loc[3, "worst_area"] = np.nan
    with pytest.raises(DataError, match="worst_area"):
        model.predict(broken)
    with pytest.raises(DataError, match=r"shape \(5, 29\)"):
        model.predict(np.zeros((5, 29)))
    with pytest.raises(DataError, match="NaN"):
        model.predict(np.full((2, 30), np.inf))
    with pytest.raises(TypeError, match="pandas DataFrame"):
        model.predict([[1.0] * 30])


def test_missing_sources_say_what_is_missing(trained, tmp_path):
    with pytest.raises(FileNotFoundError, match="no experiment"):
        best_checkpoint_uri(trained.store, "nope")
    with pytest.raises(FileNotFoundError, match="no experiment"):
        load_model("nope", store=trained.store)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_model(str(tmp_path / "missing.pt"))
    running = tmp_path / "store" / "experiments" / "running"
    running.mkdir(parents=True)
    (running / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"has no best\.pt: no trial has finished"):
        load_model(str(running))
    with pytest.raises(FileNotFoundError, match=r"has no best\.pt"):
        best_checkpoint_uri(str(tmp_path / "store"), "running")
    with pytest.raises(CheckpointError, match=r"torch\.load"):
        load_model(b"not a checkpoint")
    with pytest.raises(ConfigError, match="source must be"):
        load_model(3)  # type: ignore[arg-type]


def test_a_regression_model_predicts_values(tmp_path):
    table, meta = load_source("sklearn:diabetes")
    manifest = prepare_dataset(
        table, str(tmp_path), features=meta["features"], label="label", num_partitions=1, seed=0
    )
    uri = f"{tmp_path}/datasets/{manifest.dataset_id}"
    train = read_partition(uri, "train", 0, manifest=manifest)
    store = open_store(str(tmp_path))
    task = UnitTask(
        kind=UnitKind.TRAIN,
        trial_id="r",
        spec="cerebro_spark.training:MLPSpec",
        params={"hidden_units": [16], "lr": 0.01},
        trial_seed=0,
        epoch=0,
        partition=0,
        step=0,
        epoch_units=1,
        checkpoint_out="r.pt",
    )
    run_unit(task, train, store, manifest.info)
    regression = load_model(store.get("r.pt"))
    assert regression.task == "regression" and regression.classes is None
    values = regression.predict(train.features)
    assert values.dtype == np.float64 and values.shape == (train.rows,)
    with torch.no_grad():
        direct = regression(torch.from_numpy(train.features)).reshape(-1).double().numpy()
    np.testing.assert_allclose(values, direct, rtol=1e-6)
    with pytest.raises(ConfigError, match="classification"):
        regression.predict_proba(train.features)


def test_an_experiment_on_s3_loads_by_directory_checkpoint_uri_or_id(trained, model, s3_server):
    local = open_store(trained.experiment_uri)
    lake = open_store(s3_server.uri("lake"))
    for key in ("config.json", "best.pt"):
        lake.put(f"experiments/{trained.experiment_id}/{key}", local.get(key))
    uri = best_checkpoint_uri(s3_server.uri("lake"), trained.experiment_id)
    assert uri.startswith("s3://") and "endpoint_override=" in uri
    expected = model.predict_proba(trained.held_out)
    directory = s3_server.uri(f"lake/experiments/{trained.experiment_id}")
    for loaded in (
        load_model(uri),
        load_model(directory),
        load_model(trained.experiment_id, store=s3_server.uri("lake")),
    ):
        np.testing.assert_array_equal(loaded.predict_proba(trained.held_out), expected)
    with pytest.raises(FileNotFoundError, match="no experiment"):
        load_model("nope", store=s3_server.uri("lake"))
