"""``cerebro-spark plan``: from flags and from configs, with and without a profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cerebro_spark.cli import main
from tests.elastic.helpers import profile

PRICES = "conf/prices/aws-us-east-1.yaml"


def plan_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:  # type: ignore[type-arg]
    assert main(["-q", "plan", *argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


@pytest.fixture
def p3(tmp_path: Path) -> str:
    """A hand-written profile on p3.2xlarge (ResNet-like: 8 partitions, 4 s units)."""
    path = tmp_path / "p3.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "partitions": 8,
                "unit_seconds": {"p3.2xlarge": 4.0},
                "validation_seconds": {"p3.2xlarge": 2.0},
                "hop_seconds": 0.5,
                "worker_start_seconds": 15,
                "scale_seconds": 15,
                "scaling": {1: 1.0, 2: 1.9, 4: 3.5, 8: 6.0},
                "partition_load_seconds": 2,
            }
        )
    )
    return str(path)


def test_seer_from_flags_shows_its_stages_without_a_profile(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """SEER §3.4: T = 10, B = 80 gives N = [8, 4], P = [1, 2] over three stages."""
    out = plan_json(["--procedure", "seer", "--deadline", "10", "--option", "budget=80",
                     "--workers", "4", "--max-epochs", "100"], capsys)  # fmt: skip
    assert out["feasible"] is None
    cohorts = [[(c["trials"], c["resources"]) for c in s["cohorts"]] for s in out["stages"]]
    assert cohorts == [[(8, 1), (4, 2)], [(4, 1), (2, 2)], [(2, 1), (1, 2)]]
    assert main(["-q", "plan", "--procedure", "sha", "--trials", "8", "--max-epochs", "4"]) == 0
    table = capsys.readouterr().out
    assert "| 1 | 8 | 1 | 8 x 1 x 1 |" in table and "| 3 | 1 | 1 | 1 x 1 x 1 |" in table  # eta 3


def test_sha_from_flags_with_a_profile_and_prices(
    p3: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--procedure", "sha", "--trials", "32", "--eta", "3", "--max-epochs", "50",
            "--profile", p3, "--prices", PRICES, "--deadline", "700"]  # fmt: skip
    out = plan_json(argv, capsys)
    assert out["feasible"] is True and out["instance_type"] == "p3.2xlarge"
    assert out["seconds"] <= 700
    assert out["usd"] <= out["static"]["usd"]
    assert out["saving"] > 0.3
    for stage in out["stages"]:
        assert {"trials", "epochs", "workers", "seconds", "usd", "group", "start", "end"} <= set(
            stage
        )
    assert [s["trials"] for s in out["stages"]] == [32, 10, 3, 1, 1]
    assert sum(s["usd"] for s in out["stages"]) == pytest.approx(out["usd"])
    assert {"workers", "seconds", "usd"} == set(out["static"])
    assert main(["-q", "plan", *argv]) == 0
    table = capsys.readouterr().out
    assert "| stage | trials | epochs | workers | group | instances | type |" in table
    assert "cheapest static plan:" in table and "the plan saves" in table


def test_an_infeasible_budget_exits_2_with_the_numbers(
    p3: str, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    argv = ["plan", "--procedure", "sha", "--trials", "32", "--eta", "3", "--max-epochs", "50",
            "--profile", p3, "--prices", PRICES, "--deadline", "1200", "--budget", "2"]  # fmt: skip
    assert main(argv) == 2
    message = " ".join(r.getMessage() for r in caplog.records)
    assert "no allocation meets the deadline 1200 s and budget $2.00" in message
    assert "the cheapest found takes" in message


def test_a_config_is_planned_with_the_procedure_run_would_build(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """digits-seer.yaml: SEER's defaults (t_min = epoch_seconds, budget...) come from the
    procedure class, as in ``run``: the plan shows the trials the run would start."""
    from cerebro_spark.engine import experiment_spec, load_config

    config = "conf/experiments/digits-seer.yaml"
    out = plan_json([config], capsys)
    expected = experiment_spec(load_config(config))
    assert out["stages"] == expected.to_dict()["stages"]
    path = tmp_path / "digits.yaml"
    profile(partitions=4, unit_seconds={"m5.xlarge": 0.02}, validation_seconds={"m5.xlarge": 0.02},
            scale_seconds=0.0, worker_start_seconds=2.0).dump(path)  # fmt: skip
    planned = plan_json([config, "--profile", str(path), "--prices", PRICES, "--deadline",
                         "120"], capsys)  # fmt: skip
    assert planned["procedure"] == "seer" and planned["seconds"] <= 120
    assert [s["trials"] for s in planned["stages"]] == [s.trials for s in expected.stages]


def test_bad_plan_arguments(p3: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-q", "plan"]) == 2  # neither a config nor --procedure
    assert main(["-q", "plan", "--procedure", "sha", "--max-epochs", "4"]) == 2  # no --trials
    assert (
        main(
            [
                "-q",
                "plan",
                "--procedure",
                "sha",
                "--trials",
                "4",
                "--max-epochs",
                "4",
                "--profile",
                p3,
            ]
        )
        == 2
    )  # fmt: skip  (no prices, no deadline)
    wrong = "conf/experiments/digits.yaml"  # 4 partitions; the profile measured 8
    assert main(["-q", "plan", wrong, "--profile", p3, "--prices", PRICES,
                 "--deadline", "60"]) == 2  # fmt: skip
