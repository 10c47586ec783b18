"""The command line: the subcommands that need neither torch nor Spark."""

import json

from cerebro_spark.cli import main


def test_plan_reproduces_the_seer_worked_example(capsys):
    """SEER §3.4: T = 10, B = 80, eta = v = 2 gives N = [8, 4], P = [1, 2] (stages only)."""
    code = main(
        ["plan", "--procedure", "seer", "--deadline", "10", "--option", "worker_seconds=80",
         "--eta", "2", "--option", "v=2", "--workers", "4", "--max-epochs", "100",
         "--format", "json"]
    )  # fmt: skip
    assert code == 0
    plan = json.loads(capsys.readouterr().out)
    first = [(c["trials"], c["resources"]) for c in plan["stages"][0]["cohorts"]]
    assert (len(plan["stages"]), first) == (3, [(8, 1), (4, 2)])


def test_plan_infeasible_is_a_clear_error(capsys, caplog):
    argv = ["plan", "--procedure", "seer", "--deadline", "0.5", "--option", "worker_seconds=80",
            "--max-epochs", "10"]  # fmt: skip
    assert main(argv) == 2
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
