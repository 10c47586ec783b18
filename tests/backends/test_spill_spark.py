"""``worker_memory`` on Spark executors: spilled partitions on ``local-cluster[2,1,1024]``.

One child driver (this module, run with ``python -m``: a process has one SparkContext)
runs two applications, each executor's scratch space under the test's folder
(``SPARK_LOCAL_DIRS``):

1. on ``local-cluster[2,1,1024]`` with ``spark.executor.pyspark.memory=1536m`` (PySpark
   caps each Python worker's address space, ``RLIMIT_AS``, at 1536 MiB): a probe task
   measures the cap and what importing PyTorch takes in an executor's Python worker;
   then the same search (2 MLPs on the digits, 4 partitions, 2 epochs, 2 workers) runs
   with ample ``worker_memory`` and with a quarter of what each worker holds, while a
   thread lists the spill folders;
2. on ``local-cluster[1,1,1024]`` (one executor: its one worker is enough to fail) with
   ``spark.executor.pyspark.memory=512m``, too small for PyTorch: the search (1 worker)
   must fail with an error naming the setting.

The spilled run must end as the in-memory one (checkpoint digests, metrics, best epochs),
read each partition from the store once, spill on the executors (each worker its own
folder in its executor's local dir) and leave no spill folder once the run has ended
(checked while the executors still run: Spark removes their local dirs only when the
application ends).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
MASTER = "local-cluster[2,1,1024]"
SMALL_CAP_MASTER = "local-cluster[1,1,1024]"
CAP_MIB = 1536
SMALL_CAP = "512m"
CHILD_TIMEOUT_S = 900

pytestmark = [pytest.mark.spark, pytest.mark.torch, pytest.mark.slow]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("spill-spark")
    out = tmp / "report.json"
    child = subprocess.run(
        [sys.executable, "-m", "tests.backends.test_spill_spark", str(tmp), str(out)],
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_LOCAL_DIRS": str(tmp / "local"),
        },
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        check=False,
    )
    output = child.stdout + child.stderr
    tail = "\n".join(line for line in output.splitlines() if " WARN " not in line)[-8000:]
    assert child.returncode == 0 and out.exists(), f"driver failed ({child.returncode}):\n{tail}"
    result: dict[str, Any] = json.loads(out.read_text())
    if "error" in result:
        pytest.fail(f"the child driver failed:\n{result['error']}\n{tail}")
    logging.getLogger(__name__).info(
        "probe %s, budget %s, seconds %s (runs: %s)",
        result["probe"],
        result["budget"],
        result["seconds"],
        {name: run["seconds"] for name, run in result["runs"].items()},
    )
    return result


def test_a_search_that_spills_on_executors_ends_as_the_one_in_memory(
    report: dict[str, Any],
) -> None:
    runs = report["runs"]
    spilled, in_memory = runs["spilled"], runs["in-memory"]
    assert spilled["finished"] and in_memory["finished"]
    assert spilled["outcome"] == in_memory["outcome"]
    assert all(trial[2] for trial in spilled["outcome"].values())  # checkpoint digests
    for run in (spilled, in_memory):  # each partition read from the store once
        assert run["bytes_read"] == report["partition_bytes"]
    # The budget is a few times smaller than what each worker holds.
    assert all(held >= 3 * report["budget"] for held in spilled["held"].values())


def test_spill_folders_are_made_on_the_executors_and_removed_when_the_run_ends(
    report: dict[str, Any],
) -> None:
    spilled = report["runs"]["spilled"]
    folders = spilled["seen"]  # relative to the local root: {folder: [files seen]}
    by_worker: dict[str, list[str]] = {}
    for folder, files in folders.items():
        parts = Path(folder).parts
        assert parts[0].startswith("spark-") and parts[1].startswith("executor-"), folder
        name = parts[-1]
        assert name.startswith("cerebro-"), folder
        worker, pid = name.split("-")[1], int(name.split("-")[2])
        assert pid != report["driver_pid"]  # made by an executor's Python worker
        by_worker.setdefault(worker, []).extend(files)
    assert sorted(by_worker) == ["w0", "w1"]
    for worker, files in by_worker.items():
        assert files, f"{worker} spilled nothing"
        held = {(s, i) for i in spilled["partitions"][worker] for s in ("train", "validation")}
        for file in files:
            split, index = file.removesuffix(".arrow").split("-")
            assert (split, int(index)) in held, (worker, file)
    assert report["runs"]["in-memory"]["seen"] == {}  # ample worker_memory: nothing spilled
    for run in report["runs"].values():
        assert run["left"] == []  # no spill folder once the run ended, executors still up


def test_python_workers_run_under_the_pyspark_memory_cap(report: dict[str, Any]) -> None:
    probe = report["probe"]
    assert probe["limit"] == CAP_MIB << 20  # RLIMIT_AS, set by PySpark
    assert probe["share_mb"] == str(CAP_MIB)
    assert probe["torch_mib"] > 0 and probe["after_mib"] < CAP_MIB  # PyTorch fits under it


def test_a_pyspark_memory_too_small_for_pytorch_fails_naming_the_setting(
    report: dict[str, Any],
) -> None:
    capped = report["runs"]["small-cap"]
    assert "finished" not in capped
    error = capped["error"]
    assert "cannot import PyTorch (it takes about 640.0 MiB): this Python worker's address " in (
        error
    )
    assert (
        "address space is limited to 512.0 MiB (RLIMIT_AS, set by PySpark from "
        "spark.executor.pyspark.memory: 512 MiB per Python worker) and "
    ) in error
    assert error.endswith("of it is in use; raise spark.executor.pyspark.memory or unset it")
    assert capped["left"] == []


# -- the child driver --------------------------------------------------------------------------


def _probe(_: object) -> dict[str, Any]:
    """In an executor's Python worker: its address-space cap and what PyTorch takes."""
    from cerebro_spark.data._residence import address_space_in_use, address_space_limit

    before = address_space_in_use()
    import torch
    import torch._dynamo  # noqa: F401

    import cerebro_spark.training  # noqa: F401

    after = address_space_in_use()
    return {
        "limit": address_space_limit(),
        "share_mb": os.environ.get("PYSPARK_EXECUTOR_MEMORY_MB"),
        "before_mib": before >> 20,
        "after_mib": after >> 20,
        "torch_mib": (after - before) >> 20,
    }


def _session(local: Path, pyspark_memory: str, master: str = MASTER) -> Any:
    from cerebro_spark.spark_session import spark_session

    return spark_session(
        master,
        "cerebro-spill-spark",
        {
            "spark.ui.enabled": "false",
            "spark.executor.memory": "1g",
            "spark.executor.cores": "1",
            "spark.task.cpus": "1",
            "spark.dynamicAllocation.enabled": "false",
            "spark.local.dir": str(local),
            "spark.executor.pyspark.memory": pyspark_memory,
            "spark.executorEnv.PYTHONPATH": str(ROOT),
        },
        preload_torch=True,
    )


def _run(
    tmp: Path, name: str, worker_memory: int | str, master: str = MASTER, workers: int = 2
) -> dict[str, Any]:
    """One search; what it left and produced, and the spill folders seen while it ran."""
    from cerebro_spark.data import read_manifest, read_partition
    from cerebro_spark.engine import parse_config, run_experiment
    from tests.reliability.conftest import outcome, strict_events, tiny_config

    local, store = tmp / "local", tmp / "store"
    raw = tiny_config(
        store,
        backend="spark",
        data={"source": "sklearn:digits", "partitions": 4},
        space={
            "model": "cerebro_spark.training:MLPSpec",
            "hidden_units": [8],
            "lr": {"grid": [0.01, 0.05]},
            "batch_size": 32,
        },
        spark={"master": master},
        workers=workers,
        worker_memory=worker_memory,
    )
    seen: dict[str, set[str]] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.05):
            for folder in local.rglob("cerebro-*"):
                files = seen.setdefault(str(folder.relative_to(local)), set())
                files.update(p.name for p in folder.glob("*.arrow"))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    result: dict[str, Any] = {}
    start = time.monotonic()
    try:
        run_experiment(parse_config(raw), experiment_id=name)
    except Exception as error:
        result["error"] = str(error)
    finally:
        stop.set()
        watcher.join()
        result["seconds"] = round(time.monotonic() - start, 1)
    result["seen"] = {folder: sorted(files) for folder, files in seen.items()}
    result["left"] = sorted(str(p.relative_to(local)) for p in local.rglob("*cerebro-*"))
    if "error" in result:
        return result
    events, state = strict_events(str(store), name)
    uri = manifest_uri(store)
    manifest = read_manifest(uri)
    partitions = {e["worker"]: e["partitions"] for e in events if e["event"] == "worker_ready"}
    result.update(
        finished=state.finished,
        outcome=outcome(state),
        bytes_read=sum(state.worker_bytes.values()),
        partitions=partitions,
        held={
            worker: sum(
                read_partition(uri, split, index, manifest=manifest).nbytes
                for index in indices
                for split in ("train", "validation")
            )
            for worker, indices in partitions.items()
        },
    )
    return result


def manifest_uri(store: Path) -> str:
    """The store's one dataset."""
    return next((store / "datasets").iterdir()).as_posix()


def _child_main(tmp: Path, out: Path) -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(threadName)s %(name)s: %(message)s"
    )
    report: dict[str, Any] = {"driver_pid": os.getpid(), "runs": {}, "seconds": {}}
    seconds = report["seconds"]
    try:
        from cerebro_spark.data import read_manifest

        start = time.monotonic()
        session = _session(tmp / "local", f"{CAP_MIB}m")
        seconds["session"] = round(time.monotonic() - start, 1)
        try:
            start = time.monotonic()
            report["probe"] = session.sparkContext.parallelize([0], 1).map(_probe).collect()[0]
            seconds["probe"] = round(time.monotonic() - start, 1)
            runs = report["runs"]
            runs["in-memory"] = _run(tmp, "in-memory", "64MiB")
            manifest = read_manifest(manifest_uri(tmp / "store"))
            report["partition_bytes"] = sum(p.bytes for p in manifest.partitions)
            report["budget"] = min(runs["in-memory"]["held"].values()) // 4
            runs["spilled"] = _run(tmp, "spilled", report["budget"])
        finally:
            session.stop()
        start = time.monotonic()
        session = _session(tmp / "local", SMALL_CAP, SMALL_CAP_MASTER)
        seconds["small-cap session"] = round(time.monotonic() - start, 1)
        try:
            report["runs"]["small-cap"] = _run(
                tmp, "small-cap", "64MiB", master=SMALL_CAP_MASTER, workers=1
            )
        finally:
            session.stop()
    except Exception:
        report["error"] = traceback.format_exc()
    out.write_text(json.dumps(report))


if __name__ == "__main__":
    _child_main(Path(sys.argv[1]), Path(sys.argv[2]))
