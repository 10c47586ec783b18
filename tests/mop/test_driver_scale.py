"""``benchmarks/driver_scale.py`` keeps working: its smallest case, on the real engine.

The benchmark itself (up to 10,000 trials) is not a test; this runs two tiny cases so a
change to the engine or the backend contract that breaks the script shows up in CI.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "driver_scale.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("driver_scale", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["driver_scale"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.torch
def test_the_smallest_cases_run_and_write_their_table(tmp_path: Path) -> None:
    out = tmp_path / "driver_scale.txt"
    text = load().main(
        ["--workers", "2", "3", "--trials", "3", "5", "--partitions", "2", "--out", str(out)]
    )
    assert out.read_text() == text
    rows = [line for line in text.splitlines() if line[:6].strip("| ").isdigit()]
    assert [row.split("|")[1:4] for row in rows] == [
        ["   2 ", "      3 ", "   2 "],
        ["   2 ", "      5 ", "   2 "],
        ["   3 ", "      3 ", "   2 "],
        ["   3 ", "      5 ", "   2 "],
    ]
    units = [int(row.split("|")[4].replace(",", "")) for row in rows]
    assert units == [12, 20, 12, 20]  # 2 |S| P: every train and validation unit ran
    cpu = [float(row.split("|")[5]) for row in rows]
    assert all(value > 0 for value in cpu)
