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
    out = plan_json(["--procedure", "seer", "--deadline", "10", "--option", "worker_seconds=80",
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
    assert out["price"]["effective"] and out["price"]["usd_per_hour"] == 3.06
    assert main(["-q", "plan", *argv]) == 0
    table = capsys.readouterr().out
    assert "| stage | trials | epochs | workers | group | instances | type |" in table
    assert "cheapest static plan:" in table and "the plan saves" in table
    assert "price: p3.2xlarge $3.06/h, effective 2026-11-22 (https://aws.amazon.com" in table


def test_an_infeasible_budget_exits_2_with_the_numbers(
    p3: str, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    argv = ["plan", "--procedure", "sha", "--trials", "32", "--eta", "3", "--max-epochs", "50",
            "--profile", p3, "--prices", PRICES, "--deadline", "1200", "--budget", "2"]  # fmt: skip
    assert main(argv) == 2
    message = " ".join(r.getMessage() for r in caplog.records)
    assert "no allocation meets the deadline 1200 s and budget $2.00" in message
    assert "the cheapest found within the deadline takes" in message
    capsys.readouterr()
    assert main([*argv, "--format", "json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["feasible"] is False and "budget $2.00" in out["message"]
    for key in ("fastest", "cheapest"):
        assert {"seconds", "usd", "workers", "instance_type"} == set(out[key])
    assert out["cheapest"]["seconds"] <= 1200 and out["cheapest"]["usd"] > 2
    assert out["fastest"]["seconds"] <= out["cheapest"]["seconds"]


def test_a_budget_the_static_plan_misses_is_met_elastically(
    p3: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--procedure", "sha", "--trials", "32", "--eta", "3", "--max-epochs", "50",
            "--profile", p3, "--prices", PRICES, "--deadline", "700"]  # fmt: skip
    free = plan_json(argv, capsys)
    budget = (free["usd"] + free["static"]["usd"]) / 2
    bound = plan_json([*argv, "--budget", str(budget)], capsys)
    assert bound["usd"] <= budget < bound["static"]["usd"]


def test_a_config_is_planned_with_the_procedure_run_would_build(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """digits-seer.yaml: SEER's defaults (t_min = epoch_seconds, worker_seconds...) come from the
    procedure class, as in ``run``: the plan shows the trials the run would start, and is
    planned for SEER's own deadline (60 s)."""
    from cerebro_spark.engine import experiment_spec, load_config

    config = "conf/experiments/digits-seer.yaml"
    out = plan_json([config], capsys)
    expected = experiment_spec(load_config(config))
    assert out["stages"] == expected.to_dict()["stages"] and out["deadline"] == 60
    path = tmp_path / "digits.yaml"
    profile(partitions=4, unit_seconds={"m5.xlarge": 0.02}, validation_seconds={"m5.xlarge": 0.02},
            scale_seconds=0.0, worker_start_seconds=2.0).dump(path)  # fmt: skip
    planned = plan_json([config, "--profile", str(path), "--prices", PRICES], capsys)
    assert planned["procedure"] == "seer" and planned["deadline"] == 60
    assert planned["seconds"] <= 60
    assert [s["trials"] for s in planned["stages"]] == [s.trials for s in expected.stages]
    same = plan_json([config, "--profile", str(path), "--prices", PRICES, "--deadline", "60"],
                     capsys)  # fmt: skip
    assert same["usd"] == planned["usd"]


def test_a_deadline_other_than_the_procedures_own_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "digits.yaml"
    profile(partitions=4, unit_seconds={"m5.xlarge": 0.02}, validation_seconds={"m5.xlarge": 0.02},
            scale_seconds=0.0, worker_start_seconds=2.0).dump(path)  # fmt: skip
    argv = ["-q", "plan", "conf/experiments/digits-seer.yaml", "--profile", str(path),
            "--prices", PRICES, "--deadline", "3000"]  # fmt: skip
    assert main(argv) == 2
    assert "the deadline asked, 3000 s, differs from the deadline 60 s of the seer search" in (
        caplog.text
    )
    caplog.clear()
    flags = ["-q", "plan", "--procedure", "seer", "--max-epochs", "12", "--option",
             "deadline=60", "--deadline", "90"]  # fmt: skip
    assert main(flags) == 2
    assert "the deadline asked, 90 s, differs from the deadline 60 s" in caplog.text


def test_a_deadline_bound_config_is_planned_at_its_deadline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """HyperSched and ASHA with ``deadline: 600`` end 600 s after the start, start-up
    included: ``--deadline 600`` is feasible, and the plan takes exactly 600 s."""
    prof = tmp_path / "digits.profile.yaml"
    profile(partitions=4, unit_seconds={"m5.xlarge": 0.02}, validation_seconds={"m5.xlarge": 0.02},
            scale_seconds=30.0, worker_start_seconds=20.0).dump(prof)  # fmt: skip
    base = yaml.safe_load(Path("conf/experiments/digits-asha.yaml").read_text())
    for procedure in ({"name": "hypersched", "deadline": 600},
                      {"name": "asha", "deadline": 600}):  # fmt: skip
        path = tmp_path / f"{procedure['name']}.yaml"
        path.write_text(yaml.safe_dump({**base, "procedure": procedure}, sort_keys=False))
        out = plan_json([str(path), "--profile", str(prof), "--prices", PRICES,
                         "--deadline", "600"], capsys)  # fmt: skip
        assert out["seconds"] == pytest.approx(600.0) and out["workers"] == [2]
        assert out["stages"][0]["start"] == pytest.approx(30 + 20 + 2 * 0.5)


def test_bad_plan_arguments(
    p3: str, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    assert main(["-q", "plan"]) == 2  # neither a config nor --procedure
    assert main(["-q", "plan", "--procedure", "sha", "--max-epochs", "4"]) == 2  # no --trials
    sha = ["-q", "plan", "--procedure", "sha", "--trials", "4", "--max-epochs", "4"]
    assert main([*sha, "--profile", p3]) == 2  # no prices, no deadline
    assert "needs --prices and --deadline" in caplog.text
    assert main([*sha, "--workers", "8"]) == 2
    assert "--workers is SEER's num_workers; sha has no such option" in caplog.text
    wrong = "conf/experiments/digits.yaml"  # 4 partitions; the profile measured 8
    assert main(["-q", "plan", wrong, "--profile", p3, "--prices", PRICES,
                 "--deadline", "60"]) == 2  # fmt: skip
    assert "measured partitions=8, but the config's data.partitions is 4" in caplog.text


def test_another_catalog_chooses_its_own_instance_type_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 30: the config's ``instance_type`` silently overrode the catalog of ``--prices``.

    The rule: ``plan CONFIG`` plans on the config's type (what ``run`` does); ``--prices``
    naming another catalog lets that catalog choose, with a warning naming both, unless
    ``--instance-type`` names a type.
    """
    prof = tmp_path / "two-types.yaml"
    profile(partitions=4, unit_seconds={"m5.xlarge": 0.02, "p3.2xlarge": 0.02},
            validation_seconds={"m5.xlarge": 0.02, "p3.2xlarge": 0.02},
            scale_seconds=0.0, worker_start_seconds=2.0).dump(prof)  # fmt: skip
    own = tmp_path / "own-prices.yaml"  # the config's catalog: AWS's, under another name
    own.write_text(Path(PRICES).read_text())
    raw = yaml.safe_load(Path("conf/experiments/digits-elastic.yaml").read_text())
    raw["elastic"].update(prices=str(own), instance_type="p3.2xlarge", profile=str(prof))
    config = tmp_path / "elastic.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    warning = (
        f"--prices {PRICES} is not the config's catalog (elastic.prices: {own}): planning on "
        "the instance types it prices, not on the config's elastic.instance_type p3.2xlarge; "
        "pass --instance-type p3.2xlarge to plan on that type"
    )

    assert plan_json([str(config)], capsys)["instance_type"] == "p3.2xlarge"  # as run plans
    same = plan_json([str(config), "--prices", str(own)], capsys)
    assert same["instance_type"] == "p3.2xlarge" and warning not in caplog.text
    other = plan_json([str(config), "--prices", PRICES], capsys)
    assert other["instance_type"] == "m5.xlarge"  # the catalog's choice: as fast, cheaper
    assert warning in caplog.text
    assert [r.levelname for r in caplog.records if r.getMessage() == warning] == ["WARNING"]
    caplog.clear()
    chosen = plan_json([str(config), "--prices", PRICES, "--instance-type", "p3.2xlarge"], capsys)
    assert chosen["instance_type"] == "p3.2xlarge" and warning not in caplog.text
