"""``cerebro-spark profile``: a real pilot (worker processes, digits, MLP and CNN) writes a
profile the planner reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cerebro_spark.cli import main
from cerebro_spark.elastic import load_profile

pytestmark = [pytest.mark.torch, pytest.mark.slow]


def test_profile_then_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = yaml.safe_load(Path("conf/experiments/digits.yaml").read_text())
    config.update(store=str(tmp_path / "runs"), backend="local", workers=2, pack=4)
    config.pop("spark", None)
    path = tmp_path / "digits.yaml"
    path.write_text(yaml.safe_dump(config))
    out = tmp_path / "digits.profile.yaml"
    assert main(["-q", "profile", str(path), "--instance-type", "m5.xlarge", "--out", str(out),
                 "--scale-seconds", "20"]) == 0  # fmt: skip
    assert f"profile of digits on m5.xlarge: {out}" in capsys.readouterr().out
    profile = load_profile(out)
    assert profile.partitions == 4 and profile.instance_types == ["m5.xlarge"]
    view = profile.for_type("m5.xlarge")
    assert 0 < view.unit.mean < 5 and 0 < view.validation.mean < 5 and 0 < view.hop.mean < 1
    assert view.scale.mean == 20 and view.load.mean > 0 and view.partition_bytes > 0
    assert view.worker_start.mean >= 0
    assert set(profile.extra["families"]) == {"MLPSpec", "CNNSpec"}
    for family in profile.extra["families"].values():
        assert family["unit_seconds"] > 0 and family["unit_seconds_spread"] >= 0
        assert family["validation_seconds_spread"] >= 0 and family["hop_seconds_spread"] >= 0
    measured = profile.extra["measured"]
    assert measured["groups_measured"] == [2] and measured["workers"] == 2
    # pack: 4 -> packs of 2 and 4 measured, each at most k times one trial's throughput
    assert measured["packs_measured"] == [2, 4] and profile.packing is not None
    packing = dict(profile.packing.table)
    assert set(packing) == {1, 2, 4} and packing[1] == 1.0
    assert all(0 < speedup <= k for k, speedup in packing.items())
    # The machine's load before the pilot, for run to compare with today's.
    assert measured["load"]["cpus"] >= 1 and measured["load"]["loadavg_1m"] >= 0
    table = dict(profile.scaling.table)
    assert set(table) == {1, 2, 4} and table[1] == 1.0 and table[2] > 0 and table[4] > 0
    assert all(speedup <= g for g, speedup in table.items())  # never superlinear
    group = profile.extra["group"]
    assert group["param_bytes"] > 0 and group["bandwidth"] > 0
    # Nothing of the pilot is left in the store but the dataset.
    assert not list((tmp_path / "runs").glob("profiles/**/*.pt"))
    # The planner reads it.
    prices = "conf/prices/aws-us-east-1.yaml"
    assert main(["-q", "plan", str(path), "--profile", str(out), "--prices", prices,
                 "--deadline", "300", "--format", "json"]) == 0  # fmt: skip
    planned = json.loads(capsys.readouterr().out)
    assert planned["feasible"] and planned["instance_type"] == "m5.xlarge"
    assert planned["seconds"] <= 300
    assert planned["pack_size"] == 4  # the config's pack, planned with the measured packing
