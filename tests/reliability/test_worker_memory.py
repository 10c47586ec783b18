"""``worker_memory`` (issue 25, part 2): refused when it cannot hold one batch, else obeyed.

Bad values are refused with the value and the rule before anything is written (no
``config.json``, no experiment folder); a budget smaller than a worker's partitions spills
them to local disk and the run's results are the same as in memory, each partition read
from the store once. A worker killed with ``SIGKILL`` leaves its local directory behind:
the next worker on the host removes it (never a live worker's). A worker whose address
space is capped too small for PyTorch (PySpark's ``spark.executor.pyspark.memory``) fails
its load with an error naming the setting. (On Spark executors:
``tests/backends/test_spill_spark.py``.)
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.backends import Worker, WorkerJob
from cerebro_spark.cli import main
from cerebro_spark.data import read_manifest
from cerebro_spark.data._residence import format_bytes
from cerebro_spark.engine import parse_config, run_experiment
from cerebro_spark.errors import ConfigError
from cerebro_spark.store import open_store
from cerebro_spark.tuner import Tuner
from tests.backends.contract import make_dataset
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


ROOT = Path(__file__).resolve().parents[2]

_SPILLING_WORKER = """
import sys, time
from cerebro_spark.backends import Worker, WorkerJob
from cerebro_spark.store import open_store

dataset, store, local, worker_id = sys.argv[1:]
job = WorkerJob(dataset, open_store(store), 1, worker_memory=1)  # every partition spilled
worker = Worker(worker_id, job, spill_dir=local)
worker.load([0, 1])
print(worker.spill_directory, flush=True)
time.sleep(600)
"""


def _spilling_workers(
    dataset: str, store: Path, local: Path, worker_ids: list[str]
) -> list[tuple[Any, Path]]:
    """Worker processes (started at once) that spilled partitions 0 and 1; and their local
    directories, once each has spilled."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _SPILLING_WORKER, dataset, str(store), str(local), worker_id],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for worker_id in worker_ids
    ]
    started = []
    for worker_id, child in zip(worker_ids, children, strict=True):
        assert child.stdout is not None
        line = child.stdout.readline().strip()
        if not line:
            for other in children:
                other.kill()
                other.wait(timeout=30)
        assert line, f"worker {worker_id} did not start (exit {child.poll()})"
        started.append((child, Path(line)))
    return started


@pytest.mark.torch
def test_a_worker_killed_by_sigkill_leaves_its_spills_and_the_next_worker_removes_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dataset = make_dataset(tmp_path / "dataset")
    local = tmp_path / "local"
    store = tmp_path / "store"
    (killed, stale), (alive, kept) = _spilling_workers(dataset.uri, store, local, ["w0", "w1"])
    try:
        spills = sorted(f"{s}-0000{i}.arrow" for s in ("train", "validation") for i in (0, 1))
        assert sorted(p.name for p in stale.iterdir()) == spills
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        assert sorted(p.name for p in stale.iterdir()) == spills  # nothing cleaned up
        with caplog.at_level(logging.WARNING):
            Worker("w2", WorkerJob(dataset.uri, open_store(str(store)), 1), spill_dir=str(local))
        assert not stale.exists()
        assert sorted(p.name for p in kept.iterdir()) == spills  # a live worker's stays
        assert [r.getMessage() for r in caplog.records] == [
            f"worker w2 removed {stale}, the local directory a dead worker left behind"
        ]
    finally:
        for child in (killed, alive):
            child.kill()
            child.wait(timeout=30)
            if child.stdout is not None:
                child.stdout.close()
    assert kept.exists()  # killed too: the next worker's sweep would remove it
    Worker("w3", WorkerJob(dataset.uri, open_store(str(store)), 1), spill_dir=str(local))
    assert list(local.iterdir()) == []


_CAPPED_WORKER = """
import json, resource, sys
from cerebro_spark.backends import Worker, WorkerJob
from cerebro_spark.data._residence import address_space_in_use
from cerebro_spark.store import open_store

dataset, store = sys.argv[1:]
cap = address_space_in_use() + (128 << 20)  # as PySpark does, soft = hard
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
worker = Worker("w0", WorkerJob(dataset, open_store(store), 1))
worker.warm_up()
try:
    worker.load([0])
except Exception as error:
    print(json.dumps({"cap": cap, "type": type(error).__name__, "error": str(error),
                      "partitions": sorted(worker.partitions)}))
"""


@pytest.mark.torch
def test_an_address_space_cap_too_small_for_pytorch_fails_the_load_naming_the_setting(
    tmp_path: Path,
) -> None:
    """PySpark caps a Python worker (RLIMIT_AS) at spark.executor.pyspark.memory's share."""
    dataset = make_dataset(tmp_path / "dataset")
    child = subprocess.run(
        [sys.executable, "-c", _CAPPED_WORKER, dataset.uri, str(tmp_path / "store")],
        cwd=ROOT,
        env={**os.environ, "PYSPARK_EXECUTOR_MEMORY_MB": "512"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-3000:]  # no abort, no segfault
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert (report["type"], report["partitions"]) == ("ConfigError", [])
    expected = (
        "worker w0 cannot import PyTorch (it takes about 640.0 MiB): this Python worker's "
        f"address space is limited to {format_bytes(report['cap'])} (RLIMIT_AS, set by "
        "PySpark from spark.executor.pyspark.memory: 512 MiB per Python worker) and IN_USE "
        "of it is in use; raise spark.executor.pyspark.memory or unset it"
    )
    pattern = re.escape(expected).replace("IN_USE", r"[0-9.]+ MiB")
    assert re.fullmatch(pattern, report["error"]), report["error"]
