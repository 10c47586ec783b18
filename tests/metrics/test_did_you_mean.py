"""A wrong metric, spec class or report metric name is answered with the closest one."""

from __future__ import annotations

import pytest

from cerebro_spark.data import DatasetInfo
from cerebro_spark.driver._preflight import resolve_objective
from cerebro_spark.engine import TrialState, parse_config
from cerebro_spark.errors import ConfigError
from cerebro_spark.metrics import Accuracy, Loss, did_you_mean
from cerebro_spark.report import check_metric
from cerebro_spark.training import load_spec


def test_the_closest_name_as_given_then_ignoring_case() -> None:
    assert did_you_mean("acuracy", ["loss", "accuracy", "f1"]) == " (did you mean 'accuracy'?)"
    assert did_you_mean("mlpspec", ["MLPSpec", "CNNSpec"]) == " (did you mean 'MLPSpec'?)"
    assert did_you_mean("zzz", ["loss", "accuracy"]) == ""
    assert did_you_mean("loss", []) == ""


def test_a_wrong_spec_class_names_the_closest_class_of_the_module() -> None:
    with pytest.raises(ConfigError) as caught:
        load_spec("cerebro_spark.training:MLPspec")
    assert str(caught.value) == (
        "spec 'cerebro_spark.training:MLPspec': module 'cerebro_spark.training' has no "
        "'MLPspec' (did you mean 'MLPSpec'?)"
    )
    with pytest.raises(ConfigError, match=r"has no 'Nothing'$"):
        load_spec("cerebro_spark.training:Nothing")


def test_a_wrong_objective_metric_names_the_closest_metric_of_the_spec() -> None:
    config = parse_config(
        {
            "name": "m",
            "data": {"source": "sklearn:iris"},
            "model": "cerebro_spark.training:MLPSpec",
            "space": {"lr": 0.01},
            "metric": "acuracy",
        }
    )
    info = DatasetInfo(task="classification", feature_shape=(4,), num_classes=3)
    families = {"m:S": {"loss": Loss(), "accuracy": Accuracy()}}
    with pytest.raises(ConfigError) as caught:
        resolve_objective(config, info, families)
    assert str(caught.value).startswith(
        "metric 'acuracy' is not produced by model spec 'm:S' (did you mean 'accuracy'?); it "
        "produces ['accuracy', 'loss']"
    )


def test_a_wrong_leaderboard_metric_names_the_closest_reported_metric() -> None:
    trial = TrialState("t0", {}, 1, "m:S", epochs=1, history=[{"loss": 0.5, "f1_macro": 0.7}])
    with pytest.raises(ConfigError) as caught:
        check_metric([trial], "f1-macro")
    assert str(caught.value) == (
        "no trial reported metric 'f1-macro' (did you mean 'f1_macro'?); the trials report "
        "['f1_macro', 'loss']"
    )
