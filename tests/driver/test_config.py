from pathlib import Path

import pytest

from cerebro_spark.driver._config import load_yaml
from cerebro_spark.engine import load_config, parse_config
from cerebro_spark.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def minimal(**changes):
    raw = {
        "name": "exp",
        "data": {"source": "sklearn:digits"},
        "model": "cerebro_spark.training:MLPSpec",
        "space": {"lr": {"grid": [0.001]}},
    }
    raw.update(changes)
    return raw


def test_demo_config_loads():
    config = load_config(ROOT / "conf/experiments/digits.yaml")
    assert config.workers == 2
    assert config.data.partitions == 4
    assert config.procedure == "grid"


def test_defaults_and_round_trip():
    config = parse_config(minimal())
    # metric and mode follow the dataset's task and the metric: resolved by a run
    assert (config.epochs, config.metric, config.mode, config.visit_order) == (
        10,
        None,
        None,
        "seeded",
    )
    assert parse_config(config.to_dict()) == config
    with pytest.raises(ConfigError, match="not resolved yet"):
        config.objective  # noqa: B018
    resolved = config.replace(metric="rmse", mode="min")
    assert resolved.objective == ("rmse", "min")
    assert parse_config(resolved.to_dict()) == resolved


def test_round_trip_without_default_model():
    raw = minimal(space={"choice": [{"model": "m:A"}, {"model": "m:B"}]})
    del raw["model"]
    config = parse_config(raw)
    assert config.model is None
    assert parse_config(config.to_dict()) == config


def test_spark_section():
    config = parse_config(
        minimal(
            backend="spark",
            spark={"master": "local[2]", "conf": {"spark.ui.enabled": False, "spark.task.cpus": 1}},
        )
    )
    assert config.backend == "spark"
    assert config.spark.master == "local[2]"
    assert config.spark.conf == {"spark.ui.enabled": "false", "spark.task.cpus": "1"}
    assert parse_config(config.to_dict()) == config
    with pytest.raises(ConfigError, match="unknown field"):
        parse_config(minimal(spark={"mastr": "local"}))
    with pytest.raises(ConfigError, match=r"spark\.conf\.a must be a string"):
        parse_config(minimal(spark={"conf": {"a": [1]}}))


def test_procedure_options_are_kept():
    config = parse_config(minimal(procedure={"name": "random", "num_trials": 5}))
    assert config.procedure == "random"
    assert config.procedure_options == {"num_trials": 5}
    assert parse_config(config.to_dict()).procedure_options == {"num_trials": 5}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"workers": 0}, "workers must be an int ≥ 1, got 0"),
        ({"workers": "two"}, "workers must be of type int"),
        ({"epochs": True}, "epochs must not be a boolean"),
        ({"mode": "maximize"}, "mode must be one of ['max', 'min'], got 'maximize'"),
        ({"visit_order": "random"}, "visit_order must be one of"),
        ({"wokers": 2}, "unknown field(s) wokers"),
        ({"name": "a b"}, "name must be letters"),
        ({"data": {"source": "x", "dataset": "y"}}, "exactly one of 'source'"),
        ({"data": {"source": "x", "partitions": 0}}, "data.partitions must be an int ≥ 1, got 0"),
        (
            {"data": {"source": "x", "validation_fraction": 1.5}},
            "data.validation_fraction must be in (0, 1)",
        ),
        (
            {"data": {"source": "x", "feature_shapes": {"image": [8, -1]}}},
            "data.feature_shapes.image",
        ),
        ({"data": {"source": "x", "colour": 1}}, "unknown field(s) colour in data"),
        ({"procedure": {"num_trials": 3}}, "procedure.name must be"),
        (
            {"device": "gpu"},
            "device must be 'auto', 'cpu', 'cuda' or 'cuda:N' (N a GPU index), got 'gpu'",
        ),
        ({"device": "cuda:-1"}, "got 'cuda:-1'"),
        ({"device": 0}, "device must be of type str"),
        (
            {"device": "cuda:1", "backend": "spark"},
            "device 'cuda:1' pins every worker to one GPU, which Spark does not schedule",
        ),
    ],
)
def test_errors_name_the_field_and_rule(changes, message):
    with pytest.raises(ConfigError) as error:
        parse_config(minimal(**changes))
    assert message in str(error.value)


def test_an_elastic_search_runs_on_spark_and_refuses_the_local_backend():
    elastic = {"manager": "standalone", "prices": "conf/prices/local.yaml"}
    config = parse_config(minimal(deadline=60, elastic=elastic))
    assert config.backend == "spark"  # its default: what it resizes
    assert parse_config(config.to_dict()) == config
    with pytest.raises(ConfigError, match="elastic: plans and resizes a Spark cluster, but"):
        parse_config(minimal(deadline=60, elastic=elastic, backend="local"))
    assert parse_config(minimal(backend="local")).backend == "local"  # no elastic: as before


def test_missing_required_field():
    raw = minimal()
    del raw["space"]
    with pytest.raises(ConfigError, match="space is required"):
        parse_config(raw)


def test_bad_yaml_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml is not valid YAML"):
        load_config(path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_yaml_exponent_floats_are_numbers(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "name: e\ndata: {source: sklearn:digits}\nmodel: m:S\n"
        "space: {lr: 1e-4, wd: {grid: [0, 1e-5]}}\n"
    )
    config = load_config(path)
    assert config.space["lr"] == 1e-4
    assert config.space["wd"] == {"grid": [0, 1e-5]}


def test_a_key_given_twice_is_refused_but_merge_keys_may_be_overridden(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("name: a\nepochs: 2\nspace: {lr: 1}\nepochs: 3\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'epochs' \(first given on line 2\)"):
        load_config(path)
    assert load_yaml("c: &c {lr: 1, x: 2}\nd: {<<: *c, lr: 3}\n")["d"] == {"lr": 3, "x": 2}


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_device_values_round_trip(device):
    config = parse_config(minimal(device=device))
    assert config.device == device
    assert parse_config(config.to_dict()) == config


def test_device_defaults_to_auto_but_a_stored_local_run_without_it_stays_on_the_cpu():
    assert parse_config(minimal()).device == "auto"
    # config.json of a version before `device`: local workers trained on the CPU, Spark
    # tasks on their GPU resource; resumed or replayed, each goes on where it ran
    assert parse_config(minimal(), stored=True).device == "cpu"
    assert parse_config(minimal(backend="spark"), stored=True).device == "auto"
    assert parse_config(minimal(device="auto"), stored=True).device == "auto"


def seer_config(**options):
    return minimal(procedure={"name": "seer", "deadline": 60, **options})


def test_seers_old_budget_loads_as_worker_seconds_with_a_warning(caplog):
    with caplog.at_level("WARNING"):
        config = parse_config(seer_config(budget=120, eta=2))
    assert config.procedure_options == {"worker_seconds": 120, "eta": 2}
    assert config.deadline == 60
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("read as procedure.worker_seconds: 120; rename it" in m for m in warned)
    # Written back under the new name: loading it again warns no more.
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert parse_config(config.to_dict()) == config
    assert not [r for r in caplog.records if "old name" in r.getMessage()]


def test_a_stored_config_with_seers_old_budget_is_upgraded_without_a_warning(caplog):
    with caplog.at_level("WARNING"):
        config = parse_config(seer_config(budget=120), stored=True)
    assert config.procedure_options["worker_seconds"] == 120
    assert not [r for r in caplog.records if "old name" in r.getMessage()]


def test_seers_budget_and_worker_seconds_together_are_refused_naming_both():
    with pytest.raises(ConfigError) as error:
        parse_config(seer_config(budget=120, worker_seconds=100))
    assert "procedure.budget and procedure.worker_seconds are both given" in str(error.value)


def test_the_seer_demo_config_uses_worker_seconds():
    config = load_config(ROOT / "conf/experiments/digits-seer.yaml")
    assert "budget" not in config.procedure_options
    assert config.procedure_options["worker_seconds"] == 120
