"""The command line: the subcommands that need neither torch nor Spark."""

import json

from cerebro_spark.cli import main


def test_plan_reproduces_the_seer_worked_example(capsys):
    code = main(
        [
            "plan",
            "--procedure",
            "seer",
            "--deadline",
            "10",
            "--budget",
            "80",
            "--eta",
            "2",
            "--v",
            "2",
            "--format",
            "json",
        ]
    )
    assert code == 0
    plan = json.loads(capsys.readouterr().out)
    assert (plan["K"], plan["N"], plan["P"]) == (3, [8, 4], [1, 2])
    assert abs(plan["t1"] - 10 / 7) < 1e-9


def test_plan_infeasible_is_a_clear_error(capsys, caplog):
    assert main(["plan", "--procedure", "seer", "--deadline", "0.5", "--budget", "80"]) == 2
    assert "T > t_min" in caplog.text


def test_simulate_prints_a_row_per_procedure(capsys):
    code = main(
        [
            "simulate",
            "--procedures",
            "asha,hypersched",
            "--deadline",
            "10",
            "--workers",
            "8",
            "--seeds",
            "2",
            "--format",
            "json",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "asha" in out and "hypersched" in out


def test_unknown_config_field_exits_2_naming_it(tmp_path, caplog):
    path = tmp_path / "c.yaml"
    path.write_text("name: x\ndata: {source: sklearn:digits}\nspace: {}\nworkrs: 2\n")
    assert main(["run", str(path)]) == 2
    assert "unknown field(s) workrs" in caplog.text
