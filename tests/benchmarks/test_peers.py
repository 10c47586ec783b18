"""``benchmarks/peers.py`` keeps working: its ``quick`` setting, once, on real Spark.

The benchmark's settings (200k rows; 1 GB on S3) are not tests; this runs the tiny one so
a change to the engine, the backend or a peer's API that breaks the script shows up in CI,
and checks what its table rests on: every system trained every config to a real accuracy,
cerebro-spark read each partition once, the peers read the whole dataset per config.
Optuna's peer (MLflow's ``MlflowSparkStudy``) runs against a real MLflow server from the
tracking tests' server venv; Ray Tune on Spark runs where Ray is installed (the ``peers``
extra; CI's ``dev`` has it, so it runs there).
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.tracking.conftest import _server_venv

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "peers.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("peers_benchmark", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["peers_benchmark"] = module
    spec.loader.exec_module(module)
    return module


def check_quick_run(peers: ModuleType, run: dict[str, Any], data_dir: Path) -> None:
    """What the table rests on, for the systems of one repeat of the quick setting."""
    configs = len(peers.SETTINGS["quick"].configs)
    dataset = next(data_dir.glob("*/datasets/*"))
    parquet = sum(f.stat().st_size for f in dataset.rglob("*.parquet"))
    for system, outcome in run.items():
        if system == "cerebro":
            assert outcome.bytes_read == parquet  # each partition once, both splits
            assert outcome.checkpoint_bytes > 0
        else:
            assert outcome.bytes_read == configs * parquet, system  # all the data, per config
            assert outcome.checkpoint_bytes == 0, system
        assert sorted(outcome.accuracy) == list(range(configs)), system
        assert all(math.isfinite(a) and 0.2 < a <= 1 for a in outcome.accuracy.values()), system
        assert outcome.seconds > 0 and outcome.peak_rss > 0, system


@pytest.mark.spark
@pytest.mark.torch
@pytest.mark.slow
def test_the_quick_setting_trains_every_config_on_every_system_but_ray(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    pytest.importorskip("hyperopt")
    peers = load()
    systems = [system for system in peers.SYSTEMS if system != "ray"]
    out = tmp_path / "peers.txt"
    args = peers.parse_args(
        [
            *("--setting", "quick", "--repeats", "1", "--data-dir", str(tmp_path)),
            *("--systems", ",".join(systems), "--out", str(out)),
            *("--mlflow-venv", str(_server_venv(request.config))),
        ]
    )
    text, runs = peers.benchmark(args)
    assert [sorted(run) for run in runs] == [sorted(systems)]
    check_quick_run(peers, runs[0], tmp_path)
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert [row.split("|")[1].strip() for row in rows[1:6]] == systems
    assert "MlflowSparkStudy (server: mlflow" in text
    out_text = out.read_text()
    assert out_text == text


@pytest.mark.spark
@pytest.mark.torch
@pytest.mark.slow
def test_the_quick_setting_trains_every_config_with_ray_tune_on_spark(tmp_path: Path) -> None:
    pytest.importorskip(
        "ray.util.spark", reason="Ray is the optional 'peers' extra: pip install -e '.[peers]'"
    )
    peers = load()
    args = peers.parse_args(
        ["--setting", "quick", "--repeats", "1", "--data-dir", str(tmp_path), "--systems", "ray"]
    )
    text, runs = peers.benchmark(args)
    assert [sorted(run) for run in runs] == [["ray"]]
    check_quick_run(peers, runs[0], tmp_path)
    assert runs[0]["ray"].note.startswith("(Ray cluster start ")
    assert "ray 2." in text


def test_a_system_whose_package_is_missing_gets_a_row_saying_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    peers = load()
    monkeypatch.setitem(sys.modules, "ray.util.spark", None)  # import it: ImportError
    missing = peers.unavailable(["cerebro", "plain", "ray"])
    assert list(missing) == ["ray"]
    assert missing["ray"].startswith("Ray Tune is not installed here (")
    assert missing["ray"].endswith("; pip install -e '.[peers]')")
    setting = peers.SETTINGS["quick"]
    runs = [{"cerebro": peers.Outcome("cerebro", 2.0, 1000, 0, 2**20, {0: 0.5})}]
    text = peers.tables(setting, runs, missing)
    row = next(line for line in text.splitlines() if line.startswith("| ray |"))
    assert row == f"| ray | not run: {missing['ray']} | - | - | - | - |"
    assert "| config | cerebro |" in text  # no accuracy column for it


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
