"""Catalogue: checkpoint and dataset-partition faults (issue 12, "checkpoints are verified").

Each case names the fault, the exact error expected and checks that nothing was lost.
Faults are made on real files (a FileSystemStore on local disk) and read by real torch:

* a swapped checkpoint (another trial's file copied over it), a truncated one, one flipped
  byte -- read by a unit (a hop), by the next round of a running experiment, by a
  resumed experiment, by a replay, and by ``load_model``;
* a truncated Parquet partition, read by a worker and prepared again.

A corrupt checkpoint is a storage fault: the unit raises
:class:`~cerebro_spark.errors.CheckpointCorruptError` (never a ``TrialError``), the driver
checks the file itself and reports the trial failed with ``"checkpoint corrupt: <url>"``;
every other trial goes on exactly as in an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from cerebro_spark.data import load_source, prepare_dataset, read_manifest, read_partition
from cerebro_spark.data._reader import damaged_partitions
from cerebro_spark.engine import (
    ExperimentState,
    Stage,
    leaderboard_csv,
    load_state,
    logged_visit_orders,
    parse_config,
    read_events,
    replay_experiment,
    resume_experiment,
    run_experiment,
)
from cerebro_spark.errors import CheckpointCorruptError, DataError, TrialError
from cerebro_spark.scoring import load_model
from cerebro_spark.scoring._model import model_from_bytes
from cerebro_spark.store import FileSystemStore, Store, open_store
from cerebro_spark.training import (
    CONTENT_DIGEST_KEY,
    CheckpointError,
    content_digest,
    decode_checkpoint,
    prefetch_checkpoint,
    run_unit,
)
from cerebro_spark.training._cache import CACHE_BYTES_ENV, CheckpointCache, set_worker_cache_bytes
from cerebro_spark.training._checkpoint import encode_payload
from cerebro_spark.units import UnitResult, UnitTask
from tests.training.training_fixtures import BLOBS_INFO, blobs, train_task, validate_task

pytestmark = [pytest.mark.torch]

Fault = Callable[[Store, str, str], None]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- the faults: (store, the checkpoint to damage, another trial's checkpoint) -------------


def swap(store: Store, key: str, other: str) -> None:
    """Another trial's checkpoint copied over ``key``."""
    store.put(key, store.get(other))


def truncate(store: Store, key: str, other: str) -> None:
    """``key`` cut to half its bytes (a copy or a write cut short)."""
    data = store.get(key)
    store.put(key, data[: len(data) // 2])


def flip(store: Store, key: str, other: str) -> None:
    """One bit of one byte in the middle of ``key`` flipped (same size)."""
    data = bytearray(store.get(key))
    data[len(data) // 2] ^= 0x01
    store.put(key, bytes(data))


FAULTS = {"swapped": swap, "truncated": truncate, "flipped": flip}


# -- unit level: a hop reads a damaged checkpoint ------------------------------------------


@pytest.fixture(autouse=True)
def fresh_cache() -> Any:
    """Each test starts with an empty checkpoint cache in this process."""
    cache = set_worker_cache_bytes(CheckpointCache().max_bytes)
    yield cache
    set_worker_cache_bytes(CheckpointCache().max_bytes)


def _two_trials(store: Store) -> tuple[Any, Any]:
    """One unit of trials a and b on partition 0; their results (checkpoints written)."""
    a = run_unit(
        train_task("a", checkpoint_out="a/e0.pt", epoch_units=2), blobs(0), store, BLOBS_INFO
    )
    b = run_unit(
        train_task("b", checkpoint_out="b/e0.pt", epoch_units=2, seed=2),
        blobs(0),
        store,
        BLOBS_INFO,
    )
    return a, b


def _hop(a: UnitResult) -> UnitTask:
    """Trial a's next unit (partition 1), from its checkpoint as the log recorded it."""
    hop = train_task(
        "a", step=1, partition=1, epoch_units=2, checkpoint_in="a/e0.pt", checkpoint_out="a/e1.pt"
    )
    return dataclasses.replace(hop, checkpoint_in_sha256=a.checkpoint_sha256)


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_hop_refuses_a_damaged_checkpoint_as_a_storage_fault(tmp_path: Path, fault: str) -> None:
    store = open_store(str(tmp_path))
    a, _ = _two_trials(store)
    hop = _hop(a)
    clean = run_unit(hop, blobs(1), store, BLOBS_INFO)
    set_worker_cache_bytes(0)  # the bytes must come from the damaged file, not memory
    FAULTS[fault](store, "a/e0.pt", "b/e0.pt")
    damaged = sha256(store.get("a/e0.pt"))
    with pytest.raises(CheckpointCorruptError) as caught:
        run_unit(hop, blobs(1), store, BLOBS_INFO)
    error = caught.value
    assert not isinstance(error, TrialError)  # never blamed on the user's code
    assert isinstance(error, OSError)  # a storage fault: the engine may retry the unit
    assert (error.expected, error.actual) == (a.checkpoint_sha256, damaged)
    assert str(error).startswith(f"checkpoint corrupt: {store.url('a/e0.pt')} has SHA-256 ")
    # nothing lost: the checkpoint the good hop wrote is intact and still verifies
    assert sha256(store.get("a/e1.pt")) == clean.checkpoint_sha256


def test_a_clone_refuses_a_damaged_donor_checkpoint(tmp_path: Path) -> None:
    """PBT's exploit: trial c starts from trial a's checkpoint, checked with a's digest."""
    store = open_store(str(tmp_path))
    a, _ = _two_trials(store)
    clone = train_task("c", seed=3, epoch=1, epoch_units=2, checkpoint_in="a/e0.pt")
    clone = dataclasses.replace(clone, checkpoint_in_sha256=a.checkpoint_sha256)
    set_worker_cache_bytes(0)
    truncate(store, "a/e0.pt", "b/e0.pt")
    with pytest.raises(CheckpointCorruptError, match=r"checkpoint corrupt: .*a/e0\.pt"):
        run_unit(clone, blobs(0), store, BLOBS_INFO)
    assert not store.exists(clone.checkpoint_out or "")  # nothing written from bad bytes


def test_a_validation_unit_refuses_a_damaged_checkpoint(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    a, _ = _two_trials(store)
    task = validate_task(train_task("a", epoch_units=2), "a/e0.pt")
    task = dataclasses.replace(task, checkpoint_in_sha256=a.checkpoint_sha256)
    set_worker_cache_bytes(0)
    swap(store, "a/e0.pt", "b/e0.pt")
    with pytest.raises(CheckpointCorruptError, match=r"checkpoint corrupt: .*a/e0\.pt"):
        run_unit(task, blobs(0, split="validation"), store, BLOBS_INFO)


def test_the_cache_serves_only_the_logged_bytes(tmp_path: Path) -> None:
    """A trial returning to the worker that wrote its checkpoint is not read back; a hit
    is the logged bytes even when the file was damaged since (never used silently: the
    store's copy is refused on the next miss)."""
    store = open_store(str(tmp_path))
    cache = set_worker_cache_bytes(64 * 1024 * 1024)
    a, _ = _two_trials(store)
    hop = _hop(a)
    hit = run_unit(hop, blobs(1), store, BLOBS_INFO)
    assert (hit.checkpoint_cache_hits, hit.checkpoint_bytes_read) == (1, 0)
    assert hit.checkpoint_bytes_written == hit.checkpoint_bytes > 0
    cache.clear()
    miss = run_unit(hop, blobs(1), store, BLOBS_INFO)
    assert (miss.checkpoint_cache_hits, miss.checkpoint_bytes_read) == (0, a.checkpoint_bytes)
    assert miss.checkpoint_sha256 == hit.checkpoint_sha256  # same bytes either way
    # the file is damaged after the worker cached it: the hit still gives the logged bytes
    flip(store, "a/e0.pt", "b/e0.pt")
    again = run_unit(hop, blobs(1), store, BLOBS_INFO)
    assert again.checkpoint_cache_hits == 1 and again.checkpoint_sha256 == hit.checkpoint_sha256
    cache.clear()  # and a worker without it refuses the damaged file
    with pytest.raises(CheckpointCorruptError):
        run_unit(hop, blobs(1), store, BLOBS_INFO)
    # without the logged digest there is no hit
    cache.put("y", sha256(b"data"), b"data")
    assert cache.get("y", None) is None


def test_a_checkpoint_read_ahead_is_restored_from_memory_and_its_traffic_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 27 part 3: a worker reads its next unit's checkpoint while it trains; the unit
    then restores it from the cache, reports the store bytes it caused and trains exactly
    what a unit reading the store trains. Damaged bytes are never kept."""
    store = open_store(str(tmp_path))
    cache = set_worker_cache_bytes(64 * 1024 * 1024)
    a, _ = _two_trials(store)
    hop = _hop(a)
    cache.clear()
    plain = run_unit(hop, blobs(1), store, BLOBS_INFO)  # read from the store
    assert (plain.checkpoint_prefetched, plain.checkpoint_bytes_read) == (0, a.checkpoint_bytes)
    cache.clear()
    assert prefetch_checkpoint(store, "a/e0.pt", a.checkpoint_sha256)
    assert not prefetch_checkpoint(store, "a/e0.pt", a.checkpoint_sha256)  # held already
    assert cache.stats.prefetched == 1
    set_worker_cache_bytes(0)  # nowhere to keep it: not read at all
    assert not prefetch_checkpoint(store, "a/e0.pt", a.checkpoint_sha256)
    cache = set_worker_cache_bytes(64 * 1024 * 1024)
    assert prefetch_checkpoint(store, "a/e0.pt", a.checkpoint_sha256)
    assert cache.stats.prefetched == 1
    ahead = run_unit(hop, blobs(1), store, BLOBS_INFO)
    assert (ahead.checkpoint_cache_hits, ahead.checkpoint_prefetched) == (1, 1)
    assert ahead.checkpoint_bytes_read == a.checkpoint_bytes  # read, if ahead of time
    assert ahead.checkpoint_sha256 == plain.checkpoint_sha256  # the same training
    again = run_unit(hop, blobs(1), store, BLOBS_INFO)  # reported once
    assert (again.checkpoint_prefetched, again.checkpoint_bytes_read) == (0, 0)
    # a damaged file is not kept: the unit reads the store and refuses it itself
    cache.clear()
    flip(store, "a/e0.pt", "b/e0.pt")
    with caplog.at_level(logging.WARNING, logger="cerebro_spark.training._unit"):
        assert not prefetch_checkpoint(store, "a/e0.pt", a.checkpoint_sha256)
    assert "not the logged" in caplog.text and len(cache) == 0
    with pytest.raises(CheckpointCorruptError):
        run_unit(hop, blobs(1), store, BLOBS_INFO)


def test_a_unit_waits_for_the_read_ahead_of_its_checkpoint(tmp_path: Path) -> None:
    """A unit that needs a checkpoint being read ahead takes that read, not a second one."""
    store = open_store(str(tmp_path))
    cache = set_worker_cache_bytes(64 * 1024 * 1024)
    a, _ = _two_trials(store)
    cache.clear()
    hop = _hop(a)
    release = threading.Event()
    reads: list[str] = []

    class SlowStore(FileSystemStore):
        def get(self, key: str) -> bytes:
            reads.append(key)
            release.wait(10)
            return super().get(key)

    slow = SlowStore(str(tmp_path))
    ahead = threading.Thread(
        target=prefetch_checkpoint, args=(slow, "a/e0.pt", a.checkpoint_sha256)
    )
    ahead.start()
    while not reads:
        time.sleep(0.01)
    threading.Timer(0.2, release.set).start()
    result = run_unit(hop, blobs(1), slow, BLOBS_INFO)
    ahead.join()
    assert reads == ["a/e0.pt"]  # one read: the unit waited for the read ahead
    assert (result.checkpoint_cache_hits, result.checkpoint_prefetched) == (1, 1)


def test_the_digest_and_the_traffic_cross_the_wire_and_old_messages_still_read(
    tmp_path: Path,
) -> None:
    store = open_store(str(tmp_path))
    a, _ = _two_trials(store)
    hop = train_task("a", step=1, epoch_units=2, checkpoint_in="a/e0.pt", checkpoint_out="a/1.pt")
    hop = dataclasses.replace(hop, checkpoint_in_sha256=a.checkpoint_sha256)
    wire = json.loads(json.dumps(hop.to_json(), allow_nan=False))
    assert UnitTask.from_json(wire) == hop
    older = {k: v for k, v in wire.items() if k != "checkpoint_in_sha256"}  # an older driver
    assert UnitTask.from_json(older).checkpoint_in_sha256 is None
    assert (
        "checkpoint_in_sha256" not in dataclasses.replace(hop, checkpoint_in_sha256=None).to_json()
    )
    result = run_unit(hop, blobs(0), store, BLOBS_INFO)
    back = UnitResult.from_json(json.loads(json.dumps(result.to_json(), allow_nan=False)))
    assert back == result and back.checkpoint_cache_hits == 1
    fields = (
        "checkpoint_bytes_read",
        "checkpoint_bytes_written",
        "checkpoint_cache_hits",
        "checkpoint_prefetched",
    )
    old = {k: v for k, v in result.to_json().items() if k not in fields}  # an older worker
    assert [getattr(UnitResult.from_json(old), name) for name in fields] == [0, 0, 0, 0]


def test_the_cache_stays_within_its_bound() -> None:
    cache = CheckpointCache(max_bytes=10)
    for index in range(5):
        data = bytes([index]) * 4
        cache.put(f"k{index}", sha256(data), data)
    assert cache.nbytes <= 10 and len(cache) == 2 and cache.stats.evictions == 3
    assert cache.get("k4", sha256(bytes([4]) * 4)) == bytes([4]) * 4
    assert cache.get("k0", sha256(bytes([0]) * 4)) is None
    cache.put("big", sha256(b"x" * 11), b"x" * 11)  # larger than the bound: not kept
    assert cache.get("big", sha256(b"x" * 11)) is None


# -- experiment level: a real run, on worker processes ------------------------------------


def config(store: Path, **changes: Any) -> Any:
    raw: dict[str, Any] = {
        "name": "ckpt",
        "seed": 5,
        "store": str(store),
        "data": {"source": "sklearn:digits", "partitions": 2},
        "procedure": "grid",
        "epochs": 2,
        "workers": 2,
        "backend": "local",
        "model": "cerebro_spark.training:MLPSpec",
        "space": {"hidden_units": {"grid": [[16], [32]]}, "lr": 0.003, "batch_size": 64},
    }
    raw.update(changes)
    return parse_config(raw)


def summary(state: ExperimentState) -> dict[str, Any]:
    """What an uninterrupted run is compared on: each trial's epochs and final weights."""
    return {t.trial_id: (t.status, t.history, t.checkpoint_sha256) for t in state.trials.values()}


def fold(store: Path, name: str) -> tuple[ExperimentState, list[dict[str, Any]]]:
    events = read_events(open_store(str(store)).child(f"experiments/{name}"))
    return ExperimentState.from_events(events), events


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ExperimentState]:
    store = tmp_path_factory.mktemp("baseline")
    run_experiment(config(store), experiment_id="clean")
    state, _ = fold(store, "clean")
    return store, state


def damage_before_round(
    store: Path, name: str, fault: Fault, number: int = 1
) -> tuple[Callable[[Stage, Any], None], dict[str, str]]:
    """A stage hook that damages the first trial's latest checkpoint before round ``number``."""
    damaged: dict[str, str] = {}

    def hook(stage: Stage, backend: Any) -> None:
        if stage.round != number or stage.final:
            return
        root = open_store(str(store))
        state, _ = fold(store, name)
        first, second = sorted(state.trials)
        key, other = state.trials[first].checkpoint, state.trials[second].checkpoint
        assert key is not None and other is not None
        fault(root, key, other)
        damaged.update(trial=first, url=root.url(key))

    return hook, damaged


def check_failed_as_corrupt(
    store: Path, name: str, damaged: dict[str, str], clean: ExperimentState
) -> ExperimentState:
    """The damaged trial failed with "checkpoint corrupt: <url>"; nothing else changed."""
    state, events = fold(store, name)
    trial = state.trials[damaged["trial"]]
    assert trial.status == "failed"
    assert trial.error is not None
    assert trial.error.startswith(f"checkpoint corrupt: {damaged['url']} has SHA-256 ")
    assert "TrialError" not in trial.error
    failed_units = [e for e in events if e["event"] == "unit_failed"]
    assert failed_units and {e["reason"] for e in failed_units} == {"checkpoint_corrupt"}
    # completed units kept: the epoch trained before the fault is in its history
    assert trial.history == clean.trials[damaged["trial"]].history[:1]
    # every other trial is exactly the uninterrupted run's (same metrics, same weights)
    others = {k: v for k, v in summary(state).items() if k != damaged["trial"]}
    assert others == {k: v for k, v in summary(clean).items() if k != damaged["trial"]}
    assert damaged["trial"] in leaderboard_csv(state.trials.values(), "accuracy", "max")
    return state


@pytest.mark.slow
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_damaged_checkpoint_between_rounds_fails_its_trial_only(
    tmp_path: Path, baseline: tuple[Path, ExperimentState], fault: str, monkeypatch: Any
) -> None:
    monkeypatch.setenv(CACHE_BYTES_ENV, "0")  # workers must read the damaged file
    hook, damaged = damage_before_round(tmp_path, "hop", FAULTS[fault])
    run_experiment(config(tmp_path), experiment_id="hop", on_stage=hook)
    check_failed_as_corrupt(tmp_path, "hop", damaged, baseline[1])


@pytest.mark.slow
def test_resume_verifies_the_latest_checkpoints(
    tmp_path: Path, baseline: tuple[Path, ExperimentState], monkeypatch: Any
) -> None:
    monkeypatch.setenv(CACHE_BYTES_ENV, "0")

    class DriverDied(Exception):
        pass

    def die(stage: Stage, backend: Any) -> None:
        if stage.round == 1:
            raise DriverDied

    with pytest.raises(DriverDied):
        run_experiment(config(tmp_path), experiment_id="resumed", on_stage=die)
    state, _ = fold(tmp_path, "resumed")
    first, second = sorted(state.trials)
    root = open_store(str(tmp_path))
    key = state.trials[first].checkpoint
    assert key is not None and state.trials[second].checkpoint is not None
    swap(root, key, state.trials[second].checkpoint)
    resume_experiment(str(tmp_path), "resumed")
    check_failed_as_corrupt(
        tmp_path, "resumed", {"trial": first, "url": root.url(key)}, baseline[1]
    )


@pytest.mark.slow
def test_a_replay_verifies_its_checkpoints(
    tmp_path: Path, baseline: tuple[Path, ExperimentState], monkeypatch: Any
) -> None:
    """A replay (the original's visit orders imposed) reads its checkpoints verified too:
    the damaged trial fails, the other is reproduced bit for bit."""
    monkeypatch.setenv(CACHE_BYTES_ENV, "0")
    store, clean = baseline
    orders = logged_visit_orders(open_store(str(store)), "clean")
    hook, damaged = damage_before_round(tmp_path, "replay", truncate)
    run_experiment(config(tmp_path), experiment_id="replay", visit_orders=orders, on_stage=hook)
    check_failed_as_corrupt(tmp_path, "replay", damaged, clean)


@pytest.mark.slow
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_load_model_refuses_a_damaged_best_checkpoint(
    baseline: tuple[Path, ExperimentState], tmp_path: Path, fault: str
) -> None:
    store, clean = baseline
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    experiment = copy / "experiments" / "clean"
    root = open_store(str(copy))
    model = load_model(str(experiment), device="cpu")  # intact: loads
    keys = sorted(t.checkpoint for t in clean.trials.values() if t.checkpoint is not None)
    best = "experiments/clean/best.pt"
    other = next(k for k in keys if root.get(k) != root.get(best))
    FAULTS[fault](root, best, other)
    for source in (str(experiment), str(experiment / "best.pt")):
        with pytest.raises(CheckpointCorruptError, match=r"checkpoint corrupt: .*best\.pt"):
            load_model(source, device="cpu")
    with pytest.raises(CheckpointCorruptError):
        load_model("clean", store=str(copy), device="cpu")
    # a trial's own checkpoint in the experiment is checked against its unit_end
    trial_key, second = keys
    assert load_model(trial_key, store=str(copy), device="cpu") is not None
    FAULTS[fault](root, trial_key, second)
    with pytest.raises(CheckpointCorruptError, match=trial_key.rpartition("/")[2]):
        load_model(trial_key, store=str(copy), device="cpu")
    assert model is not None


def test_a_damaged_checkpoint_on_s3_is_refused_by_every_source_form(s3_server: Any) -> None:
    """best.pt and a trial's checkpoint on S3 (moto), by URI, experiment directory and
    key: verified against the experiment's log like local files."""
    from cerebro_spark.scoring._source import read_source

    root = open_store(s3_server.uri("lake"))
    experiment = root.child("experiments/e")
    good, trial = b"best checkpoint bytes", b"trial checkpoint bytes"
    key = "experiments/e/checkpoints/t0/e0000-s0001.pt"
    experiment.put("best.pt", good)
    root.put(key, trial)
    events = [
        {"event": "unit_end", "checkpoint": key, "checkpoint_sha256": sha256(trial)},
        {"event": "experiment_end", "best_checkpoint_sha256": sha256(good)},
    ]
    experiment.put("events.jsonl", "".join(json.dumps(e) + "\n" for e in events).encode())
    sources = {
        "experiments/e/best.pt": [
            (root.url("experiments/e/best.pt"), None),
            ("e", root),
            (experiment.uri, None),
        ],
        key: [(root.url(key), None), (key, root)],
    }
    for stored, forms in sources.items():
        for source, relative_to in forms:
            assert read_source(source, relative_to).sha256 == sha256(root.get(stored))
        root.put(stored, root.get(stored)[:-1])  # truncated by one byte
        for source, relative_to in forms:
            with pytest.raises(CheckpointCorruptError, match=r"checkpoint corrupt: s3://"):
                read_source(source, relative_to)


# -- dataset partitions --------------------------------------------------------------------


def test_a_truncated_partition_is_refused_and_prepared_again(tmp_path: Path) -> None:
    table, meta = load_source("sklearn:digits")
    args: dict[str, Any] = {
        "features": meta["features"],
        "label": "label",
        "num_partitions": 2,
        "seed": 0,
        "feature_shapes": meta.get("feature_shapes"),
    }
    manifest = prepare_dataset(table, str(tmp_path), **args)
    dataset = open_store(str(tmp_path)).child(f"datasets/{manifest.dataset_id}")
    part = manifest.partitions[1]
    original = dataset.get(part.path)
    assert damaged_partitions(dataset, manifest) == []
    dataset.put(part.path, original[: len(original) // 3])
    with pytest.raises(DataError, match=rf"{part.path} has {len(original) // 3} bytes"):
        read_partition(dataset.uri, part.split, part.index, manifest=manifest)
    assert damaged_partitions(dataset, manifest) == [part.path]
    again = prepare_dataset(table, str(tmp_path), **args)  # rewritten like a missing one
    assert again == manifest
    assert dataset.get(part.path) == original
    data = read_partition(dataset.uri, part.split, part.index, manifest=read_manifest(dataset))
    assert data.rows == part.rows and np.isfinite(data.features).all()
    # a flipped byte keeps the size: only the full check (and every worker's load) sees it
    flipped = bytearray(original)
    flipped[len(flipped) // 2] ^= 0x01
    dataset.put(part.path, bytes(flipped))
    assert damaged_partitions(dataset, manifest) == []
    assert damaged_partitions(dataset, manifest, verify=True) == [part.path]
    with pytest.raises(DataError, match="does not match its SHA-256"):
        read_partition(dataset.uri, part.split, part.index, manifest=manifest)


@pytest.mark.spark
def test_spark_prepare_rewrites_a_truncated_partition(spark: Any, tmp_path: Path) -> None:
    """The Spark path reuses a complete dataset and rewrites one with a cut-short file."""
    from cerebro_spark.data import prepare_with_spark

    table, meta = load_source("sklearn:digits")
    source = tmp_path / "digits.parquet"
    pq.write_table(table, source)
    args: dict[str, Any] = {
        "features": meta["features"],
        "label": "label",
        "num_partitions": 2,
        "seed": 0,
        "feature_shapes": meta.get("feature_shapes"),
    }
    manifest = prepare_with_spark(str(source), str(tmp_path / "store"), spark=spark, **args)
    dataset = open_store(str(tmp_path / "store")).child(f"datasets/{manifest.dataset_id}")
    part = manifest.partitions[0]
    original = dataset.get(part.path)
    dataset.put(part.path, original[:100])
    assert damaged_partitions(dataset, manifest) == [part.path]
    again = prepare_with_spark(str(source), str(tmp_path / "store"), spark=spark, **args)
    assert again == manifest and dataset.get(part.path) == original
    assert damaged_partitions(dataset, manifest, verify=True) == []


# -- a checkpoint's own digest (issue 29 part 6) -------------------------------------------


def tamper_content(data: bytes) -> bytes:
    """Checkpoint bytes that decode, with one weight changed and the old digest kept."""
    payload = decode_checkpoint(data)
    name = next(iter(payload["model"]))
    payload["model"][name].view(-1)[0] += 1.0
    return encode_payload(payload)


def without_digest(data: bytes) -> bytes:
    """The bytes the writer made before checkpoints carried their own digest."""
    payload = decode_checkpoint(data)
    del payload[CONTENT_DIGEST_KEY]
    return encode_payload(payload)


@pytest.mark.slow
def test_a_checkpoint_outside_its_experiment_is_checked_by_its_own_digest(
    baseline: tuple[Path, ExperimentState], tmp_path: Path
) -> None:
    """``load_model`` of a copied ``.pt`` and the Transformer's bytes: no log to check
    against, so the checkpoint's ``content_sha256`` is; older ones load unchecked."""
    store, _ = baseline
    best = (store / "experiments" / "clean" / "best.pt").read_bytes()
    assert content_digest(decode_checkpoint(best)) == decode_checkpoint(best)[CONTENT_DIGEST_KEY]
    copy = tmp_path / "model.pt"
    copy.write_bytes(best)
    assert load_model(str(copy), device="cpu") is not None
    copy.write_bytes(tamper_content(best))
    message = rf"checkpoint {copy} is damaged: it carries content SHA-256 [0-9a-f]{{64}}, but"
    with pytest.raises(CheckpointError, match=message):
        load_model(str(copy), device="cpu")
    with pytest.raises(CheckpointError, match="checkpoint <bytes> is damaged"):
        model_from_bytes(tamper_content(best))
    copy.write_bytes(without_digest(best))  # written before digests: read as before
    assert load_model(str(copy), device="cpu") is not None


@pytest.mark.slow
def test_a_replay_of_a_log_from_before_checkpoint_digests_compares_content(
    baseline: tuple[Path, ExperimentState], tmp_path: Path
) -> None:
    """A log whose checkpoints lack ``content_sha256`` (rewritten so, with the log's
    SHA-256s): the replay's bytes differ by the digest, its content is the original's."""
    store, clean = baseline
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    log = copy / "experiments" / "clean" / "events.jsonl"
    first, *others = sorted(clean.trials)
    changed = copy / str(clean.trials[first].checkpoint)  # its content differs, too
    text = log.read_text()
    for path in sorted((copy / "experiments" / "clean").rglob("*.pt")):
        old = path.read_bytes()
        new = without_digest(old)
        if path == changed:
            new = tamper_content(new)
        path.write_bytes(new)
        text = text.replace(sha256(old), sha256(new))
    log.write_text(text)
    report = replay_experiment(str(copy), "clean", workers=1)
    rows = {row.trial_id: row for row in report.rows}
    assert others and all(rows[t].same_content and rows[t].identical for t in others), rows
    assert all(rows[t].original_sha256 != rows[t].replay_sha256 for t in clean.trials)
    assert rows[first].same_content is False and not report.identical


# -- a copied experiment folder (issue 29 part 6) ------------------------------------------


@pytest.mark.slow
def test_a_copied_experiment_reads_its_own_checkpoints(
    baseline: tuple[Path, ExperimentState], tmp_path: Path
) -> None:
    """The log names checkpoints relative to its folder: a copy whose original is gone
    folds, verifies and scores from its own files; so does an older log (whole keys, with
    the original's id) read from the copy."""
    store, clean = baseline
    log = (store / "experiments" / "clean" / "events.jsonl").read_text()
    assert '"checkpoint":"checkpoints/' in log.replace(" ", "")
    assert "experiments/clean/checkpoints" not in log
    copy = tmp_path / "store"
    shutil.copytree(store / "experiments" / "clean", copy / "experiments" / "copy")
    shutil.copytree(store / "datasets", copy / "datasets")
    root = open_store(str(copy))

    def check_copy() -> None:
        _, state = load_state(str(copy), "copy")
        for trial in state.trials.values():
            for key in (trial.checkpoint, trial.best_checkpoint):
                assert key is not None and key.startswith("experiments/copy/checkpoints/")
                assert root.exists(key)
        rel = str(clean.trials[sorted(clean.trials)[0]].checkpoint).partition("clean/")[2]
        assert load_model(f"experiments/copy/{rel}", store=str(copy), device="cpu")
        assert load_model("copy", store=str(copy), device="cpu") is not None
        root.put(f"experiments/copy/{rel}", b"not the logged bytes")
        with pytest.raises(CheckpointCorruptError, match=rel.rpartition("/")[2]):
            load_model(f"experiments/copy/{rel}", store=str(copy), device="cpu")
        root.put(f"experiments/copy/{rel}", (store / "experiments" / "clean" / rel).read_bytes())

    check_copy()
    older = copy / "experiments" / "copy" / "events.jsonl"
    older.write_text(log.replace('"checkpoints/', '"experiments/clean/checkpoints/'))
    check_copy()
