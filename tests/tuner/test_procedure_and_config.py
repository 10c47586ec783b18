"""The Tuner's typed objects and its config round trip (no Spark, no training)."""

import io

import pytest

from cerebro_spark.driver._config import load_yaml
from cerebro_spark.engine import load_config, parse_config
from cerebro_spark.errors import ConfigError
from cerebro_spark.search import Choice, Grid, LogUniform
from cerebro_spark.tuner import Procedure, Tuner

SPACE = {
    "model": "cerebro_spark.training:MLPSpec",
    "hidden_units": Choice([[32], [64]]),
    "lr": LogUniform(1e-3, 1e-1),
    "batch_size": 32,
}


def test_procedure_checks_its_options_when_made():
    assert Procedure("sha", num_trials=8, eta=3).to_config() == {
        "name": "sha",
        "num_trials": 8,
        "eta": 3,
    }
    with pytest.raises(ConfigError, match=r"'random' has no option 'num_trails'.*num_trials"):
        Procedure("random", num_trails=4)
    with pytest.raises(ConfigError, match="unknown search procedure 'shaa'"):
        Procedure("shaa")
    assert Procedure.of({"name": "random", "num_trials": 3}) == Procedure("random", num_trials=3)
    assert Procedure.of("grid") == Procedure("grid")
    with pytest.raises(ConfigError, match="must have a 'name'"):
        Procedure.of({"eta": 2})


def test_typed_space_and_procedure_give_the_yaml_configs_mapping():
    tuner = Tuner(
        SPACE, procedure=Procedure("random", num_trials=3), epochs=2, store="s", seed=7, workers=2
    )
    config = tuner.to_config(data={"source": "sklearn:digits"})
    assert config["space"]["lr"] == {"loguniform": [1e-3, 1e-1]}
    assert config["space"]["hidden_units"] == {"choice": [[32], [64]]}
    assert config["procedure"] == {"name": "random", "num_trials": 3}
    parsed = parse_config(load_yaml(tuner.to_yaml(data={"source": "sklearn:digits"})))
    assert parsed == parse_config(config)
    assert parsed.seed == 7 and parsed.epochs == 2 and parsed.workers == 2


def test_from_config_reads_a_jobs_yaml_and_writes_it_back(tmp_path):
    path = "conf/experiments/digits.yaml"
    tuner = Tuner.from_config(path)
    assert parse_config(tuner.to_config()) == load_config(path)
    copy = tmp_path / "copy.yaml"
    copy.write_text(tuner.to_yaml())
    assert load_config(copy) == load_config(path)


def test_bad_settings_are_refused_before_any_data_is_touched():
    with pytest.raises(ConfigError, match="epochs"):
        Tuner(SPACE, epochs=0)
    with pytest.raises(ConfigError, match=r"space\.lr"):
        Tuner({**SPACE, "lr": {"loguniform": [0, 1]}})
    with pytest.raises(ConfigError, match="rulez"):
        Tuner(SPACE, rulez="x")
    with pytest.raises(ConfigError, match="fit's data must be"):
        Tuner(SPACE, backend="local", workers=1).fit(io.BytesIO(b""))
    with pytest.raises(ConfigError, match="no data section"):
        Tuner(SPACE, backend="local", workers=1).fit()
    with pytest.raises(ConfigError, match="does not exist"):
        Tuner.from_config("no/such/config.yaml")


def test_pack_is_a_config_field_of_the_tuner():
    tuner = Tuner(SPACE, workers=1, pack=4)
    assert tuner.to_config()["pack"] == 4
    assert parse_config({**tuner.to_config(), "data": {"source": "sklearn:digits"}}).pack == 4
    assert "pack" not in Tuner(SPACE, workers=1).to_config()
    with pytest.raises(ConfigError, match=r"pack must be 'off', 'auto' or an int >= 1.*got 0"):
        Tuner(SPACE, workers=1, pack=0)


def test_grid_values_stay_literal():
    tuner = Tuner({**SPACE, "lr": Grid([0.1, 0.01])}, workers=1)
    assert tuner.to_config()["space"]["lr"] == {"grid": [0.1, 0.01]}


def test_a_prepared_dataset_refuses_what_its_manifest_fixed(tmp_path):
    from cerebro_spark.data import load_source, prepare_dataset

    table, _ = load_source("sklearn:iris")
    features = [c for c in table.column_names if c != "label"]
    manifest = prepare_dataset(
        table, str(tmp_path), features=features, label="label", num_partitions=2, seed=0
    )
    uri = str(tmp_path / "datasets" / manifest.dataset_id)
    with pytest.raises(ConfigError, match=r"is a prepared dataset.*leave label out"):
        Tuner(SPACE, backend="local", workers=1, store=str(tmp_path)).fit(uri, label="y")


def test_a_deadline_bound_procedure_takes_the_configs_one_deadline():
    """SEER's and HyperSched's deadline (and SEER's num_workers) are the config's: a
    Procedure without them is whole; the Tuner refuses a search without a deadline."""
    assert Procedure("seer", worker_seconds=120).to_config() == {
        "name": "seer",
        "worker_seconds": 120,
    }
    with pytest.raises(ConfigError, match="'sha' has no option 'deadline'"):
        Procedure("sha", deadline=30)
    with pytest.raises(ConfigError, match="'seer' needs a deadline: set the top-level deadline"):
        Tuner(SPACE, procedure=Procedure("seer"))
    tuner = Tuner(SPACE, procedure=Procedure("hypersched"), deadline=30)
    data = {"source": "sklearn:digits"}
    assert parse_config(load_yaml(tuner.to_yaml(data=data))).deadline == 30
    seer = Tuner.from_config("conf/experiments/digits-seer.yaml")
    assert parse_config(seer.to_config()) == load_config("conf/experiments/digits-seer.yaml")


def test_one_feature_column_named_by_a_string_is_that_column(tmp_path):
    import numpy as np
    import pandas as pd

    from cerebro_spark.data import read_manifest
    from cerebro_spark.store import open_store
    from cerebro_spark.tuner._tuner import _DataRequest, feature_columns

    assert feature_columns("ab") == ("ab",)  # not the columns "a" and "b"
    assert feature_columns(["a", "b"]) == ("a", "b") and feature_columns(None) is None
    with pytest.raises(
        ConfigError, match=r"features must name columns \(strings\), got \['a', 3\]"
    ):
        feature_columns(["a", 3])
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        {"ab": rng.normal(size=40), "a": rng.normal(size=40), "label": np.arange(40) % 2}
    )
    request = _DataRequest(feature_columns("ab"), None, 2, 0, 0.25, None, None)
    section = request.section(frame, None, open_store(str(tmp_path)))
    assert [c.name for c in read_manifest(section["dataset"]).features] == ["ab"]
