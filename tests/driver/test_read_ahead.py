"""Reading checkpoints ahead end to end (issue 27 part 3) on real worker processes.

Digits in 4 partitions on 2 LocalBackend workers, 4 MLP trials, 2 epochs. While a worker
trains, the driver tells it which trials it may run next (``MopScheduler.upcoming``) and
the worker reads, verifies and decodes their checkpoints into its cache. Checked: units
restore checkpoints that were read ahead (``unit_end.checkpoint_prefetched``), every unit
writes the very checkpoint (SHA-256) the same run without reading ahead writes, the store
bytes each unit read are reported either way, and restores that read the store on a
unit's critical path without hints are read ahead with them (16 of 20 here, measured; how
many depends on timing: a round's first units start before any hint could help).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.backends import Backend, WorkerPool
from cerebro_spark.engine import parse_config, read_events, run_experiment
from cerebro_spark.store import open_store

pytestmark = pytest.mark.torch


def run(store: Path) -> list[dict[str, Any]]:
    config = parse_config(
        {
            "name": "ahead",
            "seed": 3,
            "store": str(store),
            "data": {"source": "sklearn:digits", "partitions": 4},
            "procedure": "grid",
            "epochs": 2,
            "workers": 2,
            "device": "cpu",
            "model": "cerebro_spark.training:MLPSpec",
            "space": {"hidden_units": [16], "lr": {"grid": [0.001, 0.003, 0.01, 0.03]}},
        }
    )
    run_experiment(config, experiment_id="ahead")
    events = read_events(open_store(str(store)).child("experiments/ahead"))
    return [e for e in events if e["event"] == "unit_end"]


def test_units_restore_checkpoints_read_ahead_and_train_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ahead = run(tmp_path / "ahead")
    with monkeypatch.context() as patch:  # a backend that takes no hint
        patch.setattr(WorkerPool, "prefetch", Backend.prefetch)
        plain = run(tmp_path / "plain")

    def written(units: list[dict[str, Any]]) -> dict[tuple[str, int, int], str]:
        return {
            (e["trial"], e["epoch"], e["step"]): e["checkpoint_sha256"]
            for e in units
            if e["kind"] == "train"
        }

    assert written(ahead) == written(plain) and len(written(plain)) == 4 * 2 * 4
    read_ahead = [e for e in ahead if e["checkpoint_prefetched"]]
    assert read_ahead, "no unit restored a checkpoint read ahead"
    assert all(e["checkpoint_cache_hits"] == 1 for e in read_ahead)
    assert all(e["checkpoint_bytes_read"] > 0 for e in read_ahead)  # its traffic, reported
    assert not any(e["checkpoint_prefetched"] for e in plain)
    with_hints, without = restores(ahead), restores(plain)
    assert without["ahead"] == 0 and without["store"] > 0
    assert with_hints["own"] == without["own"]  # a worker's own checkpoints: its cache
    assert with_hints["ahead"] + with_hints["store"] == without["store"]
    assert with_hints["store"] < without["store"]  # how many fewer depends on timing


def restores(units: list[dict[str, Any]]) -> dict[str, int]:
    """How the units restored their checkpoints: read ahead, own cache, or the store."""
    out = {"ahead": 0, "own": 0, "store": 0}
    for e in units:
        if e["checkpoint_prefetched"]:
            out["ahead"] += 1
        elif e["checkpoint_cache_hits"]:
            out["own"] += 1
        elif e["checkpoint_bytes_read"]:
            out["store"] += 1
    return out
