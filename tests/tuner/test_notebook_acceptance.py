"""Issue 10's check, as a notebook user runs it: tune on a Spark DataFrame of the active
session, read the leaderboard, score held-out rows with the best model as a Spark ML
Transformer, and check the reported metrics against scikit-learn's on the best checkpoint."""

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.datasets import load_wine

import cerebro_spark as cs
from cerebro_spark.scoring import ModelTransformer
from tests.metrics.auc_reference import auc_bins, sklearn_auc

pytestmark = [pytest.mark.torch, pytest.mark.slow]

MLP = {"model": "cerebro_spark.training:MLPSpec", "hidden_units": [32], "batch_size": 16}


@pytest.mark.spark
def test_tune_score_held_out_rows_and_save_the_model(spark, tmp_path):
    wine = load_wine(as_frame=True).frame  # unscaled: values from 0.1 to 1,680
    wine.insert(0, "id", np.arange(len(wine)))
    features = [c for c in wine.columns if c not in ("id", "target")]
    train, held = spark.createDataFrame(wine).randomSplit([0.75, 0.25], seed=11)

    tuner = cs.Tuner(
        {**MLP, "lr": cs.Grid([0.003, 0.01])},
        epochs=5,
        workers=2,
        store=str(tmp_path / "store"),
        progress=False,
    )
    result = tuner.fit(train, features=features, label="target")
    board = result.leaderboard()
    assert board.loc[0, "trial_id"] == result.best.trial_id
    assert board.loc[0, "best_epoch"] == result.best.best_epoch

    model = result.best_model()
    scored = model.transform(held).toPandas().sort_values("id")
    accuracy = float((scored["target"] == scored["prediction"]).mean())
    assert accuracy >= 0.85, accuracy
    probabilities = np.array(scored["probability"].tolist())
    assert probabilities.shape == (len(scored), 3)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-6)

    rows = held.toPandas().sort_values("id")
    assert list(result.load_model().predict(rows[features])) == list(scored["prediction"])

    path = str(tmp_path / "wine-model")
    model.write().save(path)
    again = ModelTransformer.load(path).transform(held).toPandas().sort_values("id")
    pd.testing.assert_series_equal(
        again["prediction"].reset_index(drop=True), scored["prediction"].reset_index(drop=True)
    )


def validation_split(result):
    """The run's validation split: (features, labels as stored), all partitions."""
    from cerebro_spark.data import read_manifest, read_partition

    uri = f"{result.store}/datasets/{result.state.dataset_id}"
    manifest = read_manifest(uri)
    parts = [read_partition(uri, "validation", i) for i in range(manifest.num_partitions)]
    return np.concatenate([p.features for p in parts]), np.concatenate([p.labels for p in parts])


@pytest.mark.parametrize(
    ("source", "metric", "score"),
    [
        ("sklearn:diabetes", None, "rmse"),
        ("sklearn:breast_cancer", "roc_auc", "roc_auc"),
    ],
)
def test_reported_metrics_are_scikit_learns_on_the_best_checkpoint(tmp_path, source, metric, score):
    from sklearn import metrics as skm

    from cerebro_spark.data import load_source

    table, _ = load_source(source)
    frame = table.to_pandas()
    tuner = cs.Tuner(
        {**MLP, "lr": cs.Grid([0.001, 0.03])},
        epochs=4,
        workers=2,
        backend="local",
        metric=metric,
        store=str(tmp_path),
        progress=False,
    )
    result = tuner.fit(frame)
    assert result.metric == score  # regression's default is rmse
    best = result.best
    model = result.load_model()  # best.pt: the best epoch of the best trial
    features, labels = validation_split(result)
    if score == "rmse":
        expected = skm.mean_squared_error(labels, model.predict(features)) ** 0.5
    else:  # the default roc_auc is binned: sklearn's AUC of the binned scores
        with torch.no_grad():
            logits = model.forward(torch.from_numpy(features)).numpy()
        expected = sklearn_auc(labels, auc_bins(logits), 2)
        exact = skm.roc_auc_score(labels, model.predict_proba(features)[:, 1])
        assert best.best_metrics[score] == pytest.approx(exact, abs=5e-3)
    assert best.best_metrics[score] == pytest.approx(expected, rel=1e-5)
    assert best.best_metrics == best.history[best.best_epoch - 1]
