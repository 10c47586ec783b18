"""``pack: off | auto | N`` in the config (issue 27): parsing, round trip and errors."""

import pytest

from cerebro_spark.driver._config import load_yaml, pack_size, validate_config
from cerebro_spark.engine import parse_config
from cerebro_spark.errors import ConfigError
from tests.driver.test_config import minimal


def test_pack_defaults_to_off_and_is_left_out_of_the_stored_config():
    config = parse_config(minimal())
    assert config.pack == "off"
    assert pack_size(config) == 1
    assert "pack" not in config.to_dict()


@pytest.mark.parametrize(
    ("text", "value", "size"),
    [("off", "off", 1), ("'off'", "off", 1), ("auto", "auto", None), ("1", 1, 1), ("8", 8, 8)],
)
def test_pack_values_from_yaml_round_trip(text, value, size):
    raw = minimal(pack=load_yaml(f"pack: {text}")["pack"])
    config = parse_config(raw)
    assert config.pack == value
    assert pack_size(config) == size
    assert parse_config(config.to_dict()) == config
    assert validate_config(config) is config


@pytest.mark.parametrize("value", [0, -2, True, "on", "4", 2.0, [4]])
def test_bad_pack_values_are_refused_naming_the_value_and_the_rule(value):
    with pytest.raises(ConfigError) as error:
        parse_config(minimal(pack=value))
    text = str(error.value)
    assert "pack" in text
    assert repr(value) in text
    if not isinstance(value, (float, list)):  # the type check names the types instead
        assert "'off', 'auto' or an int >= 1" in text


def test_a_pack_set_in_code_is_checked_too():
    config = parse_config(minimal()).replace(pack=0)
    with pytest.raises(ConfigError, match="pack must be 'off', 'auto' or an int >= 1"):
        validate_config(config)
