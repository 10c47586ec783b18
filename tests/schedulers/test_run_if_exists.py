"""``cerebro-spark run --if-exists resume``: what a scheduler's retry calls."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from cerebro_spark.cli import main


def test_if_exists_resume_needs_the_id_it_would_look_for(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "name: x\nstore: runs\ndata: {source: sklearn:iris}\n"
        "space: {model: cerebro_spark.training:MLPSpec}\n"
    )
    with caplog.at_level(logging.ERROR):
        status = main(["run", str(config), "--if-exists", "resume"])
    assert status == 2
    assert "--if-exists resume needs --experiment-id" in caplog.text


def test_if_exists_refuses_other_values(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "c.yaml", "--if-exists", "overwrite"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'overwrite'" in capsys.readouterr().err
