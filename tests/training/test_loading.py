"""load_spec: import path parsing, caching and errors."""

import pytest

from cerebro_spark.errors import ConfigError
from cerebro_spark.training import MLPSpec, load_spec

pytestmark = pytest.mark.torch


def test_loads_and_caches_one_instance_per_path():
    spec = load_spec("cerebro_spark.training:MLPSpec")
    assert isinstance(spec, MLPSpec)
    assert load_spec("cerebro_spark.training:MLPSpec") is spec
    assert type(load_spec("cerebro_spark.training._models:MLPSpec")) is MLPSpec


@pytest.mark.parametrize(
    ("path", "match"),
    [
        ("cerebro_spark.training.MLPSpec", "must be 'package.module:ClassName'"),
        ("a:b:c", "must be 'package.module:ClassName'"),
        (":MLPSpec", "must be 'package.module:ClassName'"),
        ("cerebro_spark.training:", "must be 'package.module:ClassName'"),
        ("no_such_module_for_cerebro:Spec", "cannot import module 'no_such_module_for_cerebro'"),
        ("cerebro_spark.training:NoSuchSpec", "has no 'NoSuchSpec'"),
        ("collections:OrderedDict", "must name a subclass of cerebro_spark.training.ModelSpec"),
        ("math:pi", "must name a subclass"),
        ("cerebro_spark.training:ModelSpec", r"is abstract: .*build_model"),
        ("training_fixtures:BrokenConstructorSpec", "raised RuntimeError: constructor exploded"),
    ],
)
def test_bad_paths_raise_config_error_naming_the_path(path, match):
    with pytest.raises(ConfigError, match=match) as caught:
        load_spec(path)
    assert repr(path) in str(caught.value)


def test_a_module_that_raises_on_import_is_reported(tmp_path, monkeypatch):
    (tmp_path / "cerebro_exploding_spec.py").write_text("raise ImportError('no gpu here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="ImportError: no gpu here") as caught:
        load_spec("cerebro_exploding_spec:Spec")
    assert isinstance(caught.value.__cause__, ImportError)
