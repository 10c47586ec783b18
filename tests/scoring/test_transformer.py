"""ModelTransformer on real local Spark: the held-out rows scored on executors equal
load_model(...).predict row for row; saved and loaded through Spark ML, it outlives its
experiment; vector features; clear errors."""

from __future__ import annotations

import hashlib
import shutil

import numpy as np
import pandas as pd
import pytest

from cerebro_spark.errors import ConfigError, DataError
from cerebro_spark.scoring import ModelTransformer, best_checkpoint_uri, load_model
from cerebro_spark.scoring import _transformer as transformer_module
from cerebro_spark.training import decode_checkpoint, encode_checkpoint

pytestmark = [pytest.mark.spark, pytest.mark.torch, pytest.mark.slow]


def scored_rows(frame) -> pd.DataFrame:
    return frame.toPandas().sort_values("row_id").reset_index(drop=True)


def check_equal_to_load_model(scored: pd.DataFrame, held_out: pd.DataFrame, model) -> None:
    held_out = held_out.sort_values("row_id").reset_index(drop=True)
    assert list(scored["row_id"]) == list(held_out["row_id"])
    assert list(scored["prediction"]) == list(model.predict(held_out))
    np.testing.assert_allclose(
        np.stack(scored["probability"].to_numpy()), model.predict_proba(held_out), rtol=1e-6
    )


def test_the_transformer_equals_load_model_row_for_row(spark, trained):
    model = load_model(trained.experiment_uri, device="cpu")
    transformer = ModelTransformer.from_checkpoint(
        best_checkpoint_uri(trained.store, trained.experiment_id)
    )
    frame = spark.read.parquet(trained.held_out_path).repartition(3)
    result = transformer.transform(frame)
    assert result.columns == [*frame.columns, "prediction", "probability"]
    assert dict(result.dtypes)["prediction"] == "string"
    assert dict(result.dtypes)["probability"] == "array<double>"
    scored = scored_rows(result)
    check_equal_to_load_model(scored, trained.held_out, model)
    accuracy = float((scored["prediction"] == scored["diagnosis"]).mean())
    assert accuracy >= 0.9, accuracy
    assert transformer.classes == ("benign", "malignant")


def test_saved_and_loaded_it_outlives_its_experiment(spark, trained, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(trained.store, store)
    transformer = ModelTransformer.from_checkpoint(
        trained.experiment_id, store=str(store), predictionCol="label_hat"
    )
    transformer.write().save(str(tmp_path / "saved"))
    shutil.rmtree(store)
    loaded = ModelTransformer.load(str(tmp_path / "saved"))
    assert loaded.uid == transformer.uid
    assert loaded.getPredictionCol() == "label_hat"
    assert loaded.checkpoint_sha256 == transformer.checkpoint_sha256
    frame = spark.read.parquet(trained.held_out_path)
    scored = scored_rows(loaded.transform(frame)).rename(columns={"label_hat": "prediction"})
    check_equal_to_load_model(scored, trained.held_out, load_model(trained.experiment_uri))
    with pytest.raises(Exception, match="already exists"):
        transformer.write().save(str(tmp_path / "saved"))
    transformer.write().overwrite().save(str(tmp_path / "saved"))


def as_one_vector_column(blob: bytes, name: str) -> bytes:
    """The same weights, described as trained on one 30-value array column ``name``."""
    checkpoint = decode_checkpoint(blob)
    checkpoint["data"]["features"] = [{"name": name, "dtype": "float32", "shape": [30]}]
    return encode_checkpoint(checkpoint)


def test_vector_features_and_no_probability_column(spark, trained):
    from pyspark.ml.feature import VectorAssembler

    model = load_model(trained.experiment_uri)
    with open(best_checkpoint_uri(trained.store, trained.experiment_id), "rb") as handle:
        blob = as_one_vector_column(handle.read(), "v")
    transformer = ModelTransformer.from_checkpoint(blob, probabilityCol="")
    frame = spark.read.parquet(trained.held_out_path)
    assembled = VectorAssembler(inputCols=trained.features, outputCol="v").transform(frame)
    result = transformer.transform(assembled.drop(*trained.features))
    assert result.columns == ["row_id", "diagnosis", "v", "prediction"]
    scored = scored_rows(result)
    held_out = trained.held_out.sort_values("row_id")
    assert list(scored["prediction"]) == list(model.predict(held_out))
    assert type(scored["v"].iloc[0]).__name__ == "DenseVector"  # passed through unchanged


def test_bad_input_is_refused_with_the_column(spark, trained):
    transformer = ModelTransformer.from_checkpoint(trained.experiment_uri)
    frame = spark.read.parquet(trained.held_out_path)
    with pytest.raises(DataError, match="worst_area"):
        transformer.transform(frame.drop("worst_area"))
    with pytest.raises(ConfigError, match="already exist"):
        transformer.transform(frame.withColumnRenamed("diagnosis", "prediction"))
    with pytest.raises(ConfigError, match="holds no checkpoint"):
        ModelTransformer().transform(frame)
    with pytest.raises(ConfigError, match="device"):
        ModelTransformer.from_checkpoint(trained.experiment_uri, device="tpu")


def test_the_model_is_built_once_per_worker(trained):
    with open(best_checkpoint_uri(trained.store, trained.experiment_id), "rb") as handle:
        blob = handle.read()
    sha = hashlib.sha256(blob).hexdigest()
    first = transformer_module.cached_model(sha, blob, "cpu", 64)
    assert transformer_module.cached_model(sha, b"ignored on a hit", "cpu", 64) is first
    with pytest.raises(Exception, match="SHA-256"):
        transformer_module.cached_model("0" * 64, blob, "cpu", 64)


def test_it_is_a_pipeline_stage_and_keeps_the_label_type(spark, trained, tmp_path):
    from pyspark.ml import Pipeline, PipelineModel

    with open(best_checkpoint_uri(trained.store, trained.experiment_id), "rb") as handle:
        checkpoint = decode_checkpoint(handle.read())
    checkpoint["data"]["classes"] = [0, 1]  # the same model, as if the labels were 0 / 1
    transformer = ModelTransformer.from_checkpoint(encode_checkpoint(checkpoint))
    frame = spark.read.parquet(trained.held_out_path)
    pipeline = Pipeline(stages=[transformer]).fit(frame)
    pipeline.write().save(str(tmp_path / "pipeline"))
    loaded = PipelineModel.load(str(tmp_path / "pipeline"))
    result = loaded.transform(frame)
    assert dict(result.dtypes)["prediction"] == "bigint"
    scored = scored_rows(result)
    names = np.asarray(["benign", "malignant"])
    model = load_model(trained.experiment_uri)
    held_out = trained.held_out.sort_values("row_id")
    assert list(names[scored["prediction"].to_numpy()]) == list(model.predict(held_out))
