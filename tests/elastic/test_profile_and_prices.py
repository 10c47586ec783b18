"""Profiles and price catalogs: what the planner reads, and the errors for bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cerebro_spark.elastic import (
    PriceCatalog,
    load_catalog,
    load_profile,
    parse_catalog,
    parse_profile,
)
from cerebro_spark.elastic._profile import parse_scaling
from cerebro_spark.errors import ConfigError
from tests.elastic.helpers import TYPE, catalog, profile

GOOD: dict[str, Any] = profile().to_dict()


def test_a_profile_round_trips_through_yaml(tmp_path: Path) -> None:
    original = profile(unit_seconds_spread={TYPE: 0.1}, families={"MLPSpec": {"unit": 1.0}})
    original.dump(tmp_path / "p.yaml")
    again = load_profile(tmp_path / "p.yaml")
    assert again == original
    view = again.for_type(TYPE)
    assert (view.unit.mean, view.unit.spread, view.hop.mean) == (1.0, 0.1, 0.25)
    assert view.trial_epoch_seconds(1) == pytest.approx(6.0)
    assert view.trial_epoch_seconds(2) == pytest.approx(4 * (1 / 1.5 + 0.25) + 1)


def test_the_start_up_keys_default_to_nothing_and_round_trip(tmp_path: Path) -> None:
    plain = profile().for_type(TYPE)
    assert (plain.driver_start.mean, plain.scale_each, plain.scale_seconds(8)) == (0, 0, 5.0)
    timed = profile(driver_start_seconds=4.0, driver_start_seconds_spread=0.5,
                    scale_seconds_each=2.5)  # fmt: skip
    timed.dump(tmp_path / "p.yaml")
    assert load_profile(tmp_path / "p.yaml") == timed
    view = timed.for_type(TYPE)
    assert (view.driver_start.mean, view.driver_start.spread) == (4.0, 0.5)
    assert (view.scale_seconds(1), view.scale_seconds(3)) == (5.0, 10.0)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"unit_seconds": None}, "profile key 'unit_seconds' is required"),
        ({"partitions": 0}, "'partitions' must be an integer >= 1, got 0"),
        ({"hop_seconds": -1}, "'hop_seconds' must be a number >= 0, got -1"),
        ({"unit_seconds": {TYPE: 0}}, r"'unit_seconds.t1' must be a number > 0"),
        ({"unit_seconds": 1.0}, "'unit_seconds' must map instance types to seconds"),
        ({"validation_seconds": {"other": 1.0}}, "must name the same instance types"),
        ({"scaling": {2: 1.5}}, "must give 1 worker the speedup 1.0"),
        ({"scaling": {1: 1.0, "two": 2}}, "group size 'two' is not an integer"),
        ({"scaling": {1: 1.0, 2: 0}}, r"'scaling.2' must be a number > 0"),
        ({"scaling": "cubic"}, "must be one of"),
        ({"unit_seconds_spread": {"t9": 0.1}}, "names instance types"),
        ({"bogus": 1}, r"unknown profile key\(s\) \['bogus'\]"),
        ({"hop_seconds": "fast"}, "'hop_seconds' must be a number >= 0, got 'fast'"),
        ({"partition_bytes": "nan"}, "'partition_bytes' must be a number >= 0, got 'nan'"),
        ({"scaling": {1: 1.0, 2: 2.5}}, r"'scaling.2' must be at most 2 .*superlinear"),
        ({"scaling": {1: 1.0, 2: "1.5x"}}, r"'scaling.2' must be a number > 0, got '1.5x'"),
        ({"driver_start_seconds": -2}, "'driver_start_seconds' must be a number >= 0, got -2"),
        ({"scale_seconds_each": "x"}, "'scale_seconds_each' must be a number >= 0, got 'x'"),
    ],
)
def test_a_bad_profile_names_the_key(change: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_profile({**GOOD, **change})


def test_numbers_may_be_numeric_strings(tmp_path: Path) -> None:
    """YAML reads ``1.0e9`` as a number but ``1e9`` as a string: both are accepted."""
    (tmp_path / "p.yaml").write_text(
        "partitions: 4\nunit_seconds: {t1: 1e0}\nvalidation_seconds: {t1: 1.0}\n"
        "hop_seconds: 25e-2\nworker_start_seconds: 10\nscale_seconds: 5\n"
        "scaling: {1: 1.0, 2: 15e-1}\npartition_bytes: 1e9\n"
    )
    read = load_profile(tmp_path / "p.yaml")
    assert read.partition_bytes == 1e9 and read.hop_seconds == 0.25
    assert read.unit_seconds == {"t1": 1.0} and read.scaling(2) == 1.5
    assert (
        parse_catalog({"instances": {"a": {"usd_per_hour": "3.06"}}}).price("a").usd_per_hour
        == 3.06
    )


def test_a_missing_file_and_a_type_the_profile_lacks(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_profile(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("partitions: 4\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: profile key 'unit_seconds' is required"):
        load_profile(tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match=r"no unit_seconds for instance type 'p3.2xlarge'"):
        profile().for_type("p3.2xlarge")


def test_scaling_is_interpolated_and_flat_beyond_what_was_measured() -> None:
    table = parse_scaling({1: 1.0, 2: 1.8, 4: 3.0})
    assert [table(g) for g in (1, 2, 3, 4, 8)] == pytest.approx([1.0, 1.8, 2.4, 3.0, 3.0])
    assert parse_scaling("linear")(8) == 8.0
    assert parse_scaling("sqrt")(4) == 2.0
    assert parse_scaling("none")(4) == 1.0


def test_the_shipped_catalog_has_the_types_and_where_their_prices_come_from() -> None:
    cat = load_catalog("conf/prices/aws-us-east-1.yaml")
    for name, price in (("p3.2xlarge", 3.06), ("p3.8xlarge", 12.24), ("p3.16xlarge", 24.48),
                        ("g4dn.xlarge", 0.526), ("g5.xlarge", 1.006),
                        ("p4d.24xlarge", 32.7726)):  # fmt: skip
        entry = cat.price(name)
        assert entry.usd_per_hour == price and entry.effective == "2026-11-22" and entry.source
    assert any(cat.price(t).gpus == 0 for t in cat.instances)  # a CPU type or two
    assert (cat.billing, cat.granularity_seconds, cat.minimum_seconds) == ("per_instance", 1, 60)
    assert cat.billed_seconds(10) == 60 and cat.billed_seconds(60.2) == 61
    # Minimum paid before (re-planning): by the second only. Arrays of samples alike.
    assert (
        cat.billed_seconds(10, minimum=False) == 10 and cat.billed_seconds(0.0, minimum=False) == 0
    )
    assert list(cat.billed_seconds(np.array([10.0, 60.2]))) == [60, 61]


def test_dbus_are_added_and_bad_catalogs_are_refused() -> None:
    with_dbu = catalog(
        databricks={"dbu_usd_per_hour": 0.5},
        instances={TYPE: {"usd_per_hour": 1.0, "dbus_per_hour": 2}},
    )
    assert with_dbu.price(TYPE).usd_per_hour == 2.0
    for raw, match in (
        ({"instances": {}}, "'instances' must map"),
        ({"instances": {"a": {}}}, r"instances.a.usd_per_hour is required"),
        ({"instances": {"a": {"usd_per_hour": -1}}}, r"instances.a.usd_per_hour must be"),
        ({"instances": {"a": {"usd_per_hour": 1, "executors": 0}}}, "executors must be"),
        ({"instances": {"a": {"usd_per_hour": 1}}, "billing": {"model": "free"}}, "billing.model"),
        ({"instances": {"a": {"usd_per_hour": 1, "recorded": "2026"}}},
         r"unknown price catalog key\(s\) \['instances.a.recorded'\]"),
        ({"instances": {"a": {"usd_per_hour": 1}}, "billing": {"minimum": 60}},
         r"\['billing.minimum'\]; known keys here: \['billing.model'"),
        ({"instances": {"a": {"usd_per_hour": 1}}, "zone": "us-east-1a"}, r"\['zone'\]"),
        ({"instances": {"a": {"usd_per_hour": 1}}, "currency": "EUR"}, "currency' must be USD"),
    ):  # fmt: skip
        with pytest.raises(ConfigError, match=match):
            parse_catalog(raw)


def test_a_catalog_and_its_dataclass_share_their_defaults() -> None:
    parsed = parse_catalog({"instances": {"a": {"usd_per_hour": 1}}})
    built = PriceCatalog(instances=parsed.instances)
    assert (
        (parsed.billing, parsed.granularity_seconds, parsed.minimum_seconds)
        == (
            built.billing,
            built.granularity_seconds,
            built.minimum_seconds,
        )
        == ("per_instance", 1.0, 60.0)
    )


def test_a_pilot_never_writes_a_speedup_the_profile_refuses(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from cerebro_spark.engine._pilot import _speedup

    assert _speedup(4, 1.0, 2.0) == 2.0  # 4 x 1 s of units in 2 s
    assert _speedup(2, 1.0, 0.8) == 2.0  # 2.5 measured: noise, written as 2
    assert "a group of 2 measured a speedup of 2.500, more than 2: written as 2" in caplog.text
    assert parse_scaling({1: 1.0, 2: _speedup(2, 1.0, 0.8)})(2) == 2.0
