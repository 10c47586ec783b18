"""The ``simulate`` and ``plan`` commands on a local parser (the lead wires them in)."""

from __future__ import annotations

import argparse
import json

import pytest

from cerebro_spark.errors import ConfigError
from cerebro_spark.simulate import add_plan_command, add_simulate_command
from cerebro_spark.simulate._cli import parse_options


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    parser = argparse.ArgumentParser(prog="cerebro-spark")
    commands = parser.add_subparsers(dest="command", required=True)
    add_simulate_command(commands)
    add_plan_command(commands)
    args = parser.parse_args(argv)
    assert args.handler(args) == 0
    return capsys.readouterr().out


def test_plan_json_reproduces_section_3_4(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(
        ["plan", "--procedure", "seer", "--deadline", "10", "--budget", "80", "--format", "json"],
        capsys,
    )
    plan = json.loads(out)
    assert plan["K"] == 3
    assert plan["t1"] == pytest.approx(1.4286, abs=1e-4)
    assert plan["N"] == [8, 4]
    assert plan["P"] == [1, 2]
    assert [[b["trials"] for b in s["brackets"]] for s in plan["stages"]] == [
        [8, 4],
        [4, 2],
        [2, 1],
    ]
    assert [[b["resources"] for b in s["brackets"]] for s in plan["stages"]] == [[1, 2]] * 3


def test_plan_table_for_other_inputs(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(
        ["plan", "--deadline", "60", "--budget", "960", "--eta", "4", "--epoch-seconds", "0.25"],
        capsys,
    )
    assert "K = 3" in out
    assert "N = [32, 16, 12]   P = [1, 2, 4]" in out
    assert "| 3 | 14.29 | 60 | 2 x 1, 1 x 2, 0 x 4 | 182, 365, 731 | 4 | 182.9 |" in out
    assert "epochs per trial" in out


def test_plan_infeasible_is_a_config_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match=r"infeasible: deadline T=0.5 and budget B=80"):
        run(["plan", "--deadline", "0.5", "--budget", "80"], capsys)


def test_simulate_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "simulate",
        "--procedures",
        "asha,seer",
        "--deadline",
        "8",
        "--workers",
        "4",
        "--seeds",
        "2",
        "--scaling",
        "sqrt",
        "--overhead",
        "0.1",
    ]
    table = run(argv, capsys)
    assert "T=8 s, N=4 workers, scaling=sqrt, overhead=0.1 s" in table
    assert table.count("| 2 |") == 2
    document = json.loads(run([*argv, "--format", "json"], capsys))
    assert [r["procedure"] for r in document["results"]] == ["asha", "seer"]
    assert document["settings"]["scaling"] == "sqrt"
    assert len(document["results"][0]["runs"]) == 2


def test_simulate_passes_procedure_options(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "simulate",
        "--procedures",
        "hypersched",
        "--deadline",
        "8",
        "--workers",
        "2",
        "--seeds",
        "1",
        "--option",
        "hypersched.max_trials=1",
        "--format",
        "json",
    ]
    document = json.loads(run(argv, capsys))
    assert document["results"][0]["runs"][0]["trials"] == 1


def test_option_parsing() -> None:
    assert parse_options(["seer.eta=3", "seer.v=1.5", "asha.x=abc"], ["seer", "asha"]) == {
        "seer": {"eta": 3, "v": 1.5},
        "asha": {"x": "abc"},
    }
    with pytest.raises(ConfigError, match=r"must look like PROC\.KEY=VALUE, got 'eta=3'"):
        parse_options(["eta=3"], ["seer"])
    with pytest.raises(ConfigError, match="names procedure 'tpe', which is not among"):
        parse_options(["tpe.n=3"], ["seer"])


def test_simulate_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="--seeds must be >= 1, got 0"):
        run(["simulate", "--deadline", "5", "--seeds", "0"], capsys)
    with pytest.raises(ConfigError, match="search procedure 'seer' has no option 'bogus'"):
        run(
            [
                "simulate",
                "--procedures",
                "seer",
                "--deadline",
                "5",
                "--seeds",
                "1",
                "--option",
                "seer.bogus=1",
            ],
            capsys,
        )
