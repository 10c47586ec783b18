"""``worker_memory`` (issue 25, part 2): refused when it cannot hold one batch, else obeyed.

Bad values are refused with the value and the rule before anything is written (no
``config.json``, no experiment folder); a budget smaller than a worker's partitions spills
them to local disk and the run's results are the same as in memory, each partition read
from the store once.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from cerebro_spark.cli import main
from cerebro_spark.data import read_manifest
from cerebro_spark.engine import parse_config, run_experiment
from cerebro_spark.errors import ConfigError
from cerebro_spark.tuner import Tuner
from tests.reliability.conftest import outcome, strict_events, tiny_config, write_config

RULE = "worker_memory must be a number of bytes (an int ≥ 1) or a size such as '4GiB', "


def _cli(argv: list[str], caplog: pytest.LogCaptureFixture) -> tuple[int, list[str]]:
    caplog.clear()
    with caplog.at_level(logging.INFO):
        code = main(argv)
    return code, [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def _nothing_written(store: Path) -> None:
    assert not list(store.rglob("config.json")) and not (store / "experiments").exists()


@pytest.mark.parametrize("value", ["lots", 0, "-1GiB"])
def test_a_worker_memory_that_is_no_size_is_refused(
    value: object, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = tmp_path / "store"
    config = write_config(tmp_path / "c.yaml", tiny_config(store, worker_memory=value))
    code, errors = _cli(["run", str(config)], caplog)
    rule = f"{RULE}'512MiB' or '2g', got {value!r}"
    assert (code, errors) == (2, [f"{config}: {rule}"])
    assert not store.exists()  # refused before even the data is prepared
    with pytest.raises(ConfigError) as error:
        Tuner(tiny_config(store)["space"], store=str(store), worker_memory=value)
    assert str(error.value) == rule


@pytest.mark.torch
def test_a_worker_memory_smaller_than_one_batch_is_refused_before_anything_is_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = tmp_path / "store"
    config = write_config(tmp_path / "c.yaml", tiny_config(store, worker_memory="1KiB"))
    code, errors = _cli(["run", str(config)], caplog)
    (dataset,) = (store / "datasets").iterdir()  # the source is prepared first
    manifest = read_manifest(str(dataset))
    per_row = max(-(-p.bytes // p.rows) for p in manifest.partitions)
    assert per_row == 94  # iris: a validation file's 1405 bytes / 15 rows
    assert (code, errors) == (
        2,
        [
            f"worker_memory 1024 bytes (1.0 KiB) is smaller than one batch of dataset "
            f"{manifest.dataset_id}: 16 rows x 94 bytes a row (the largest partition's "
            "bytes / rows) = 1504 bytes (1.5 KiB); worker_memory must hold at least one batch"
        ],
    )
    _nothing_written(store)


@pytest.mark.torch
@pytest.mark.slow
def test_a_worker_memory_below_the_partitions_spills_and_changes_no_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """1600 bytes hold one batch (1504) but not a worker's partitions (1440 + 360 held)."""
    results = {}
    for name, budget in (("spilled", 1600), ("in-memory", None)):
        local = tmp_path / f"local-{name}"  # the workers' scratch space, as Spark's
        monkeypatch.setenv("SPARK_LOCAL_DIRS", str(local))
        raw = tiny_config(tmp_path / name, worker_memory=budget)
        run_experiment(parse_config(raw), experiment_id=name)
        _, state = strict_events(str(tmp_path / name), name)
        assert state.finished
        manifest = read_manifest(next((tmp_path / name / "datasets").iterdir()).as_posix())
        assert sum(state.worker_bytes.values()) == sum(p.bytes for p in manifest.partitions)
        results[name] = outcome(state)
        # Created by the first spill only; every local copy removed when the workers end.
        assert list(local.iterdir()) == [] if budget else not local.exists()
    assert results["spilled"] == results["in-memory"]
    assert all(digest for _, _, digest, _, _ in results["spilled"].values())
