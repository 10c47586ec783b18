"""The ``simulate`` command on a local parser (``plan`` is tested in ``tests/elastic``)."""

from __future__ import annotations

import argparse
import json

import pytest

from cerebro_spark.errors import ConfigError
from cerebro_spark.simulate import add_simulate_command
from cerebro_spark.simulate._cli import parse_options


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    parser = argparse.ArgumentParser(prog="cerebro-spark")
    commands = parser.add_subparsers(dest="command", required=True)
    add_simulate_command(commands)
    args = parser.parse_args(argv)
    assert args.handler(args) == 0
    return capsys.readouterr().out


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
