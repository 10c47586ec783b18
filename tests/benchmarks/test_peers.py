"""``benchmarks/peers.py`` keeps working: its ``quick`` setting, once, on real Spark.

The benchmark's settings (200k rows; 1 GB on S3) are not tests; this runs the tiny one so
a change to the engine, the backend or a peer's API that breaks the script shows up in CI,
and checks what its table rests on: every system trained every config to a real accuracy,
cerebro-spark read each partition once, the peers read the whole dataset per config.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "peers.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("peers_benchmark", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["peers_benchmark"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.spark
@pytest.mark.torch
@pytest.mark.slow
def test_the_quick_setting_trains_every_config_on_all_four_systems(tmp_path: Path) -> None:
    pytest.importorskip("hyperopt")
    peers = load()
    out = tmp_path / "peers.txt"
    args = peers.parse_args(
        ["--setting", "quick", "--repeats", "1", "--data-dir", str(tmp_path), "--out", str(out)]
    )
    text, runs = peers.benchmark(args)
    assert [sorted(run) for run in runs] == [sorted(peers.SYSTEMS)]
    run = runs[0]
    configs = len(peers.SETTINGS["quick"].configs)
    dataset = next(tmp_path.glob("*/datasets/*"))
    parquet = sum(f.stat().st_size for f in dataset.rglob("*.parquet"))
    assert run["cerebro"].bytes_read == parquet  # each partition once, both splits
    assert run["cerebro"].checkpoint_bytes > 0
    for system in ("hyperopt", "plain", "ddp"):
        assert run[system].bytes_read == configs * parquet  # all the data, per config
        assert run[system].checkpoint_bytes == 0
    for system, outcome in run.items():
        assert sorted(outcome.accuracy) == list(range(configs)), system
        assert all(math.isfinite(a) and 0.2 < a <= 1 for a in outcome.accuracy.values()), system
        assert outcome.seconds > 0 and outcome.peak_rss > 0, system
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert [row.split("|")[1].strip() for row in rows[1:5]] == list(peers.SYSTEMS)
    out_text = out.read_text()
    assert out_text == text


def test_systems_picks_and_orders_the_systems_run() -> None:
    peers = load()
    args = peers.parse_args(["--systems", "plain, cerebro"])
    assert args.systems == ("plain", "cerebro")
    assert peers._order(1, args.systems) == ["cerebro", "plain"]
    assert peers.parse_args([]).systems == peers.SYSTEMS
    for bad in ("cerebro,spark", "plain,plain", ","):
        with pytest.raises(SystemExit):
            peers.parse_args(["--systems", bad])


def test_tables_print_only_the_systems_run() -> None:
    peers = load()
    setting = peers.SETTINGS["quick"]
    runs = [
        {
            system: peers.Outcome(system, seconds, 1000, 0, 2**20, {0: 0.5})
            for system, seconds in (("cerebro", 2.0), ("plain", 3.0))
        }
    ]
    text = peers.tables(setting, runs)
    rows = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith("| ")]
    assert [row[0].strip() for row in rows] == [
        "system",
        "cerebro",
        "plain",
        "config",
        "hidden [32], lr 0.003",
    ]
    assert rows[2][2].strip() == "1.50"  # plain's wall time over cerebro's
    without_cerebro = peers.tables(setting, [{"plain": runs[0]["plain"]}])
    assert "| plain | 3.0 | - |" in without_cerebro
