"""The driver's pre-flight: bad specs and metrics fail within seconds, before anything is
written or any worker starts; metric and mode follow the dataset and the metric."""

import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from cerebro_spark.data import DatasetInfo
from cerebro_spark.driver._preflight import (
    family_params,
    models_in,
    preflight,
    resolve_objective,
)
from cerebro_spark.engine import parse_config, run_experiment
from cerebro_spark.errors import ConfigError, TrialError
from cerebro_spark.metrics import Accuracy, Loss
from cerebro_spark.store import open_store

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[2]
MLP = "cerebro_spark.training:MLPSpec"
CUSTOM = "tests.training.training_fixtures:CustomMetricSpec"


def raw_config(store, **changes):
    raw = {
        "name": "pre",
        "seed": 1,
        "store": str(store),
        "data": {"source": "sklearn:iris", "partitions": 2},
        "procedure": "grid",
        "epochs": 1,
        "workers": 2,
        "model": MLP,
        "space": {"hidden_units": {"grid": [[8]]}, "batch_size": 16},
    }
    raw.update(changes)
    return raw


def nothing_written(store) -> bool:
    return open_store(str(store)).list("experiments") == []


def test_a_wrong_spec_path_fails_within_seconds_and_writes_nothing(tmp_path):
    config = parse_config(raw_config(tmp_path, model="no_such_module:Spec"))
    started = time.monotonic()
    with pytest.raises(ConfigError, match="spec 'no_such_module:Spec': cannot import module"):
        run_experiment(config, experiment_id="bad")
    assert time.monotonic() - started < 20
    assert nothing_written(tmp_path)


def test_build_model_that_raises_names_the_spec_and_the_params(tmp_path):
    space = {"hidden_units": {"grid": [[8]]}, "lr": 0.5}
    config = parse_config(
        raw_config(tmp_path, model="tests.training.training_fixtures:RaisingSpec", space=space)
    )
    with pytest.raises(TrialError) as caught:
        run_experiment(config, experiment_id="raises")
    message = str(caught.value)
    assert "training_fixtures:RaisingSpec" in message and "boom in build_model" in message
    assert "'lr': 0.5" in message and "build_model raised ValueError" in message
    assert nothing_written(tmp_path)


def test_more_workers_than_partitions_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ConfigError, match=r"workers=3 exceeds num_partitions=2 of dataset"):
        run_experiment(parse_config(raw_config(tmp_path, workers=3)), experiment_id="wide")
    assert nothing_written(tmp_path)


def test_bad_params_are_a_config_error_naming_the_param(tmp_path):
    space = {"hidden_units": {"grid": [[8], [16]]}, "dropout": 2.0}
    config = parse_config(raw_config(tmp_path, space=space))
    with pytest.raises(ConfigError, match=r"dropout must be a float in \[0, 1\), got 2.0"):
        preflight(config, open_store(str(tmp_path)))
    space = {"hidden_units": [8], "validation_batch_size": 0}
    config = parse_config(raw_config(tmp_path, space=space))
    with pytest.raises(ConfigError, match="validation_batch_size must be an int >= 1, got 0"):
        preflight(config, open_store(str(tmp_path)))


def test_a_metric_the_spec_does_not_produce_is_refused_with_what_it_produces(tmp_path):
    config = parse_config(raw_config(tmp_path, metric="auc"))
    with pytest.raises(ConfigError) as caught:
        run_experiment(config, experiment_id="auc")
    message = str(caught.value)
    assert "metric 'auc' is not produced by model spec 'cerebro_spark.training:MLPSpec'" in message
    assert "'roc_auc'" in message and "'accuracy'" in message
    assert nothing_written(tmp_path)


def test_every_family_is_built_and_must_produce_the_metric(tmp_path):
    space = {
        "choice": [
            {"model": MLP, "hidden_units": [4]},
            {"model": CUSTOM, "hidden_units": [4]},
        ]
    }
    raw = raw_config(tmp_path, space=space, metric="positives")
    del raw["model"]
    config = parse_config(raw)
    assert set(family_params(config)) == {MLP, CUSTOM}
    with pytest.raises(ConfigError, match=f"not produced by model spec '{MLP}'"):
        preflight(config, open_store(str(tmp_path)))
    checked = preflight(config.replace(metric="f1_macro"), open_store(str(tmp_path)))
    assert set(checked.families) == {MLP, CUSTOM}
    assert "positives" in checked.families[CUSTOM]
    assert checked.config.objective == ("f1_macro", "max")


def test_defaults_follow_the_task_and_the_metric(tmp_path):
    store = open_store(str(tmp_path))
    classification = preflight(parse_config(raw_config(tmp_path)), store)
    assert classification.config.objective == ("accuracy", "max")
    regression = parse_config(raw_config(tmp_path, data={"source": "sklearn:diabetes"}))
    assert preflight(regression, store).config.objective == ("rmse", "min")
    log_loss = parse_config(raw_config(tmp_path, metric="log_loss"))
    assert preflight(log_loss, store).config.objective == ("log_loss", "min")
    loss = parse_config(raw_config(tmp_path, metric="loss"))
    assert preflight(loss, store).config.objective == ("loss", "min")


def test_an_explicit_mode_against_the_metric_is_kept_with_a_warning(caplog):
    config = parse_config(raw_config("runs", metric="accuracy", mode="min"))
    info = DatasetInfo((4,), "classification", 3)
    families = {MLP: {"loss": Loss(), "accuracy": Accuracy()}}
    with caplog.at_level(logging.WARNING):
        resolved = resolve_objective(config, info, families)
    assert resolved.objective == ("accuracy", "min")
    assert "natural mode is 'max'" in caplog.text


def test_models_in_finds_constants_choices_and_branches():
    space = {
        "choice": [
            {"model": "a:A", "x": 1},
            {"model": {"choice": ["b:B", "c:C"]}, "inner": {"model": {"grid": ["d:D"]}}},
        ]
    }
    assert models_in(space) == ["a:A", "b:B", "c:C"]  # inner.model is a param, not a spec
    assert models_in({"model": "x:X", "lr": 0.1}) == ["x:X"]
    assert models_in({"lr": 0.1}) == []


def test_a_space_with_no_spec_is_refused(tmp_path):
    raw = raw_config(tmp_path)
    del raw["model"]
    with pytest.raises(ConfigError, match="has no model spec"):
        family_params(parse_config(raw))


def cli(args, cwd, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPARK_LOCAL_IP": "127.0.0.1"}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "cerebro_spark.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done, time.monotonic() - started


@pytest.mark.parametrize("backend", ["local", pytest.param("spark", marks=pytest.mark.spark)])
def test_the_cli_exits_non_zero_within_seconds_on_a_wrong_spec(tmp_path, backend):
    raw = raw_config(tmp_path / "store", model="my_specs:Missing", backend=backend)
    if backend == "spark":
        raw["spark"] = {"master": "local[2]"}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    done, seconds = cli(["run", str(path)], cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "cannot import module 'my_specs'" in done.stderr
    assert seconds < 60, seconds  # python and torch start-up included; no Spark, no worker
    assert "SparkContext" not in done.stderr


SPEC_MODULE = textwrap.dedent(
    '''
    from cerebro_spark.training import MLPSpec


    class BesideTheConfig(MLPSpec):
        """An MLP whose module lies next to the config, not on any installed path."""
    '''
)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", pytest.param("spark", marks=pytest.mark.spark)])
def test_a_spec_module_beside_the_config_trains_on_every_backend(tmp_path, backend):
    project = tmp_path / "project"
    project.mkdir()
    module = f"specs_beside_{backend}"  # a name no other test imports
    (project / f"{module}.py").write_text(SPEC_MODULE)
    raw = raw_config(tmp_path / "store", model=f"{module}:BesideTheConfig", backend=backend)
    if backend == "spark":
        raw["spark"] = {"master": "local[2]"}
    path = project / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done, _ = cli(["run", str(path), "--experiment-id", "beside"], cwd=elsewhere, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "accuracy" in done.stdout and "completed" in done.stdout, done.stdout
    if backend == "spark":  # executors do not share the driver's sys.path: it was shipped
        assert f"shipped spec module {project / module}.py" in done.stderr


def test_a_spec_with_deprecated_per_batch_metrics_is_warned_about(tmp_path, caplog):
    config = parse_config(
        raw_config(tmp_path, model="tests.training.training_fixtures:BatchMeanSpec", metric="half")
    )
    with caplog.at_level(logging.WARNING):
        checked = preflight(config, open_store(str(tmp_path)))
    assert "deprecated per-batch ModelSpec.metrics" in caplog.text
    assert checked.config.objective == ("half", "max")
    family = checked.families["tests.training.training_fixtures:BatchMeanSpec"]
    assert type(family["accuracy"]).__name__ == "BatchMean"  # the spec's own replaces it
