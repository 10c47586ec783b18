"""run_unit: training, determinism, resume, LR schedule, validation sums, errors."""

import base64
import dataclasses
import hashlib
import json
import math
import subprocess
import sys
import textwrap
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn import metrics as skm
from training_fixtures import BLOBS_INFO, blobs, train_epochs, train_task, validate_task

from cerebro_spark.data import PartitionData
from cerebro_spark.errors import ConfigError, DataError, TrialError
from cerebro_spark.metrics import default_metrics
from cerebro_spark.training import (
    CONTENT_DIGEST_KEY,
    CheckpointError,
    MLPSpec,
    decode_checkpoint,
    encode_checkpoint,
    load_spec,
    run_unit,
    state_digest,
    train_unit,
    weights_digest,
)
from cerebro_spark.training import _checkpoint as checkpoint_module
from cerebro_spark.training import _unit as unit_module
from cerebro_spark.training._unit import (
    _build_model,
    _end_unit,
    _train_pass,
    open_state,
    unit_environment,
)
from cerebro_spark.units import UnitResult
from tests.metrics.auc_reference import auc_bins, sklearn_auc

pytestmark = pytest.mark.torch

DROPOUT = {"hidden_units": [16, 8], "dropout": 0.3, "lr": 0.01, "batch_size": 16}


def digest(store, result):
    return weights_digest(store.get(result.task.checkpoint_out))


def test_a_train_unit_writes_a_checkpoint_and_reports_row_weighted_sums(store):
    task = train_task(params={"hidden_units": [16], "batch_size": 64})
    data = blobs(0, rows=150)  # 64 + 64 + 22: the last batch is partial
    result = run_unit(task, data, store, BLOBS_INFO, worker_id="w3")
    blob = store.get(task.checkpoint_out)
    assert result.rows == 150 and result.worker_id == "w3" and result.task == task
    on_train = {"loss"} | {m.name for m in default_metrics("classification", 2) if m.on_train}
    assert set(result.metric_sums) == set(result.metric_states) == on_train
    assert "roc_auc" not in on_train  # buffers stay off the training passes
    assert result.metric_states["loss"]["count"] == 150
    assert 0 < result.metric_sums["loss"] / 150 < 2
    assert 0 <= result.metric_sums["accuracy"] <= 150
    assert result.checkpoint_bytes == len(blob)
    assert result.checkpoint_sha256 == hashlib.sha256(blob).hexdigest()
    assert 0 < result.io_seconds < result.seconds
    counters = decode_checkpoint(blob)["counters"]
    assert counters == {"epoch": 0, "step": 0, "samples_seen": 150, "trial_seed": 1}


def test_a_trained_unit_encodes_its_checkpoint_in_the_thread_that_writes_it(store, monkeypatch):
    """Encoding and both digests are part of the write, which a worker overlaps with its
    next unit: the content digest (a hash of every tensor) is not computed on the training
    thread, nor is the file's."""
    encoded_in: list[str] = []
    digested_in: list[str] = []
    encode, digest_of = unit_module.encode_payload, checkpoint_module.content_digest

    def recording(payload):
        encoded_in.append(threading.current_thread().name)
        return encode(payload)

    def digesting(checkpoint):
        digested_in.append(threading.current_thread().name)
        return digest_of(checkpoint)

    monkeypatch.setattr(unit_module, "encode_payload", recording)
    monkeypatch.setattr(checkpoint_module, "content_digest", digesting)
    task = train_task(params={"hidden_units": [16], "batch_size": 64})
    trained = train_unit(task, blobs(0, rows=150), store, BLOBS_INFO)
    assert encoded_in == [] == digested_in and not store.exists(task.checkpoint_out)
    assert CONTENT_DIGEST_KEY not in trained.payload
    assert trained.result.checkpoint_bytes == 0 and trained.result.checkpoint_sha256 is None
    with ThreadPoolExecutor(1, thread_name_prefix="writer") as writer:
        result = writer.submit(trained.write).result()
    assert len(encoded_in) == 1 and encoded_in[0].startswith("writer")
    assert len(digested_in) == 1 and digested_in[0].startswith("writer")
    blob = store.get(task.checkpoint_out)
    written = decode_checkpoint(blob)
    assert written[CONTENT_DIGEST_KEY] == digest_of(written)
    assert list(written)[-1] == CONTENT_DIGEST_KEY
    assert result.checkpoint_bytes == result.checkpoint_bytes_written == len(blob)
    assert result.checkpoint_sha256 == hashlib.sha256(blob).hexdigest()
    whole = run_unit(dataclasses.replace(task, checkpoint_out="again.pt"), blobs(0, rows=150),
                     store, BLOBS_INFO)  # fmt: skip
    assert whole.checkpoint_sha256 == result.checkpoint_sha256  # the same bytes


def test_loss_decreases_over_units_on_separable_data(store):
    parts = [blobs(i) for i in range(3)]
    _, results = train_epochs(store, BLOBS_INFO, parts, epochs=3, params={"lr": 0.01})
    losses = [r.metric_sums["loss"] / r.rows for r in results]
    assert losses[-1] < losses[0] / 3, losses
    assert results[-1].metric_sums["accuracy"] / results[-1].rows > 0.95
    # samples_seen accumulates across units.
    last = decode_checkpoint(store.get(results[-1].task.checkpoint_out))["counters"]
    assert last["samples_seen"] == 9 * 200


def test_the_same_unit_twice_gives_identical_weights_and_bytes(store):
    first = run_unit(train_task(params=DROPOUT), blobs(0), store, BLOBS_INFO)
    again = run_unit(
        train_task(params=DROPOUT, checkpoint_out="again.pt"), blobs(0), store, BLOBS_INFO
    )
    assert first.checkpoint_sha256 == again.checkpoint_sha256
    assert digest(store, first) == digest(store, again)
    assert first.metric_sums == again.metric_sums
    other_seed = run_unit(
        train_task(params=DROPOUT, seed=2, checkpoint_out="s2.pt"), blobs(0), store, BLOBS_INFO
    )
    assert digest(store, other_seed) != digest(store, first)


def test_initial_weights_depend_only_on_the_trial_seed():
    spec = load_spec("cerebro_spark.training:MLPSpec")

    def initial(**task):
        with unit_environment("cpu") as dev:
            model = _build_model(spec, train_task(params=DROPOUT, **task), BLOBS_INFO, dev)
        return state_digest(model.state_dict())

    first = initial(seed=5)
    assert initial(seed=5, epoch=3, partition=2, step=1, epoch_units=2) == first
    assert initial(seed=6) != first


def test_results_do_not_depend_on_what_ran_before_in_the_process(store):
    reference = run_unit(train_task(params=DROPOUT), blobs(0), store, BLOBS_INFO)
    # Another trial's units and unrelated global RNG use run first ...
    run_unit(train_task("other", params=DROPOUT, seed=9, partition=1), blobs(1), store, BLOBS_INFO)
    torch.manual_seed(12345)
    torch.rand(1000)
    np.random.seed(7)
    rng_before = torch.get_rng_state()
    replay = run_unit(
        train_task(params=DROPOUT, checkpoint_out="replay.pt"), blobs(0), store, BLOBS_INFO
    )
    assert digest(store, replay) == digest(store, reference)
    # ... and the unit leaves torch's global RNG and deterministic flag as it found them.
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert not torch.are_deterministic_algorithms_enabled()


def test_a_fresh_process_reproduces_the_unit_bit_for_bit(store):
    # Checkpoint bytes (model, Adam state, scheduler, counters) identical across processes.
    params = dict(DROPOUT, lr_schedule="cosine")
    run_unit(train_task(params=params), blobs(0), store, BLOBS_INFO)
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from tests.training.conftest import MemoryStore
        from training_fixtures import BLOBS_INFO, blobs, train_task
        import torch
        from cerebro_spark.training import run_unit
        torch.set_num_threads(1)
        store = MemoryStore()
        run_unit(train_task(params={params!r}), blobs(0), store, BLOBS_INFO)
        sys.stdout.buffer.write(store.get("t0/e0s0.pt"))
        """
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, check=True, cwd=root)
    assert out.stdout == store.get("t0/e0s0.pt")


def run_chain(store, tasks, parts, reencode=False):
    key = None
    for task in tasks:
        task = train_task(**dict(task, checkpoint_in=key))
        run_unit(task, parts[task.partition], store, BLOBS_INFO)
        key = task.checkpoint_out
        if reencode:  # decode and encode between units: must change nothing
            store.put(key, encode_checkpoint(decode_checkpoint(store.get(key))))
    return key


def test_resuming_from_a_checkpoint_equals_continuing_in_memory(store):
    params = dict(DROPOUT, lr_schedule="step", lr_step_gamma=0.5)
    parts = [blobs(0), blobs(1)]
    units = [
        dict(params=params, epoch=0, partition=1, step=0, epoch_units=2),
        dict(params=params, epoch=0, partition=0, step=1, epoch_units=2),
        dict(params=params, epoch=1, partition=0, step=0, epoch_units=2),
    ]
    hopped = run_chain(store, units, parts)
    reencoded = run_chain(store.child("re"), units, parts, reencode=True)
    assert weights_digest(store.get(hopped)) == weights_digest(store.child("re").get(reencoded))

    # The same three units with model, optimizer and scheduler kept alive in memory.
    spec = load_spec("cerebro_spark.training:MLPSpec")
    with unit_environment("cpu") as dev:
        state = None
        for unit in units:
            task = train_task(**unit)
            if state is None:
                state = open_state(spec, task, BLOBS_INFO, dev, None)
            _train_pass(spec, state, task, parts[task.partition], BLOBS_INFO, dev)
            _end_unit(state, task)
        in_memory = state_digest(state.model.state_dict())
    assert in_memory == weights_digest(store.get(hopped))


def test_lr_scheduler_steps_only_after_the_last_unit_of_an_epoch(store):
    params = {"hidden_units": [8], "lr": 0.1, "lr_schedule": "step", "lr_step_gamma": 0.5}
    key, lrs = None, []
    for epoch in range(2):
        for step in range(3):
            task = train_task(
                params=params,
                epoch=epoch,
                partition=step,
                step=step,
                epoch_units=3,
                checkpoint_in=key,
            )
            run_unit(task, blobs(step, rows=20), store, BLOBS_INFO)
            key = task.checkpoint_out
            checkpoint = decode_checkpoint(store.get(key))
            lrs.append(checkpoint["optimizer"]["param_groups"][0]["lr"])
            assert checkpoint["lr_scheduler"]["last_epoch"] == epoch + (step == 2)
    assert lrs == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.05, 0.025])


def test_validation_sums_match_a_hand_computation(store):
    train = train_task(params={"hidden_units": [8], "batch_size": 7, "dropout": 0.5})
    run_unit(train, blobs(0), store, BLOBS_INFO)
    data = blobs(0, rows=50, split="validation")  # 7 * 7 + 1: a partial last batch
    keys_before = store.list()
    result = run_unit(validate_task(train, train.checkpoint_out), data, store, BLOBS_INFO)
    assert store.list() == keys_before  # validation writes nothing
    assert result.rows == 50 and result.checkpoint_sha256 is None
    assert result.checkpoint_bytes == len(store.get(train.checkpoint_out))

    model = MLPSpec().build_model(train.params, BLOBS_INFO)
    model.load_state_dict(decode_checkpoint(store.get(train.checkpoint_out))["model"])
    model.eval()  # dropout off: a validation result must not depend on it
    with torch.no_grad():
        outputs = model(torch.from_numpy(data.features))
    labels = torch.from_numpy(data.labels)
    per_row = torch.nn.functional.cross_entropy(outputs, labels, reduction="none")
    assert result.metric_sums["loss"] == pytest.approx(float(per_row.double().sum()), rel=1e-5)
    correct = int((outputs.argmax(1) == labels).sum())
    assert result.metric_sums["accuracy"] == pytest.approx(correct, rel=1e-9)
    assert result.metrics()["accuracy"] == pytest.approx(correct / 50)
    assert result.metric_states["accuracy"] == {"correct": correct, "count": 50}
    # Exact over the unit's rows, batches of 7 notwithstanding (the AUC: of the binned scores).
    predicted = outputs.argmax(1).numpy()
    binned = auc_bins(outputs.numpy())
    assert result.metrics()["roc_auc"] == pytest.approx(sklearn_auc(labels.numpy(), binned, 2))
    assert result.metrics()["f1_macro"] == pytest.approx(
        skm.f1_score(labels, predicted, average="macro")
    )
    state = result.metric_states["roc_auc"]  # 2 x 1024 counts (class 1): positives, all rows
    dtype, codec, data = state["counts"].split(":", 2)  # "<u2:zlib:<base64>"
    counts = np.frombuffer(zlib.decompress(base64.b64decode(data)), dtype)
    assert (dtype, codec) == ("<u2", "zlib")
    assert (state["bins"], counts.size) == (1024, 2048)
    assert counts[:1024].sum() == int(labels.sum()) and counts[1024:].sum() == 50


def test_validation_batches_have_their_own_size_and_give_the_same_metrics(store, monkeypatch):
    train = train_task(params={"hidden_units": [8], "batch_size": 7})
    run_unit(train, blobs(0), store, BLOBS_INFO)
    data = blobs(0, rows=50, split="validation")
    seen: list[int] = []
    forward = torch.nn.Sequential.forward

    def counting(self, x):
        seen.append(int(x.shape[0]))
        return forward(self, x)

    monkeypatch.setattr(torch.nn.Sequential, "forward", counting)
    small = run_unit(validate_task(train, train.checkpoint_out), data, store, BLOBS_INFO)
    assert seen == [7] * 7 + [1]  # the training batch size by default
    seen.clear()
    wide = dataclasses.replace(train, params={**train.params, "validation_batch_size": 32})
    large = run_unit(validate_task(wide, train.checkpoint_out), data, store, BLOBS_INFO)
    assert seen == [32, 18]
    assert large.rows == small.rows == 50
    for name, value in small.metrics().items():
        assert large.metrics()[name] == pytest.approx(value, rel=1e-6), name
    bad = dataclasses.replace(train, params={**train.params, "validation_batch_size": 0})
    with pytest.raises(TrialError, match="validation_batch_size must be an int >= 1, got 0"):
        run_unit(validate_task(bad, train.checkpoint_out), data, store, BLOBS_INFO)


def test_a_spec_adds_its_own_metric_and_keeps_the_built_ins(store):
    train = train_task(spec="training_fixtures:CustomMetricSpec")
    result = run_unit(train, blobs(0), store, BLOBS_INFO)
    assert "positives" in result.metric_states and "accuracy" in result.metric_states
    data = blobs(0, rows=50, split="validation")
    checked = run_unit(validate_task(train, train.checkpoint_out), data, store, BLOBS_INFO)
    assert checked.metric_states["positives"] == {"hits": int(data.labels.sum()), "count": 50}
    assert checked.metrics()["positives"] == pytest.approx(int(data.labels.sum()) / 50)


def test_a_spec_with_deprecated_per_batch_metrics_still_reports_them(store):
    train = train_task(spec="training_fixtures:BatchMeanSpec", params={"batch_size": 32})
    run_unit(train, blobs(0), store, BLOBS_INFO)
    data = blobs(0, rows=50, split="validation")
    checked = run_unit(validate_task(train, train.checkpoint_out), data, store, BLOBS_INFO)
    # the legacy name replaces the built-in: a row-weighted mean of batch values
    assert checked.metric_states["accuracy"] == {"sum": pytest.approx(50.0), "count": 50}
    assert checked.metrics()["accuracy"] == pytest.approx(1.0)
    assert checked.metrics()["half"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (dict(checkpoint_out=None), ConfigError, "has no checkpoint_out"),
        (dict(seed=-1), ConfigError, "trial_seed must be a non-negative int"),
        (dict(step=3, epoch_units=3), ConfigError, r"step must be in \[0, epoch_units=3\)"),
        (dict(params={"fn": object()}), ConfigError, "JSON values"),
        (dict(partition=5), DataError, "task is for partition 5, got partition 0"),
    ],
)
def test_malformed_train_tasks_are_refused(store, change, error, match):
    task = train_task(**{k: v for k, v in change.items() if k != "checkpoint_out"})
    if "checkpoint_out" in change:
        task = task.__class__(**{**task.__dict__, "checkpoint_out": None})
    with pytest.raises(error, match=match):
        run_unit(task, blobs(0), store, BLOBS_INFO)
    assert store.list() == []


def test_data_mismatches_are_refused(store):
    with pytest.raises(DataError, match="needs 'train'"):
        run_unit(train_task(), blobs(0, split="validation"), store, BLOBS_INFO)
    flat = blobs(0)
    wide = PartitionData.from_arrays("train", 0, np.zeros((200, 5), np.float32), flat.labels, 0)
    with pytest.raises(DataError, match=r"shape \(5,\) per row.*feature_shape is \(4,\)"):
        run_unit(train_task(), wide, store, BLOBS_INFO)


def test_validation_needs_a_checkpoint(store):
    with pytest.raises(ConfigError, match="has no checkpoint_in"):
        run_unit(validate_task(train_task(), None), blobs(0, split="validation"), store, BLOBS_INFO)


def test_a_missing_checkpoint_is_a_store_error_not_a_trial_error(store):
    task = train_task(checkpoint_in="nowhere.pt")
    with pytest.raises(FileNotFoundError, match=r"nowhere\.pt"):
        run_unit(task, blobs(0), store, BLOBS_INFO)


@pytest.mark.parametrize(
    ("spec", "match", "cause"),
    [
        ("training_fixtures:RaisingSpec", "build_model raised ValueError: boom", ValueError),
        ("training_fixtures:NotAModule", "must return a torch.nn.Module", TypeError),
        ("training_fixtures:LossMetricSpec", "must not return 'loss'", ConfigError),
        ("training_fixtures:NoSuchSpec", "loading the spec raised ConfigError", ConfigError),
    ],
)
def test_user_code_errors_become_trial_errors_naming_the_unit(store, spec, match, cause):
    task = train_task("trial-7", spec=spec, epoch=2, partition=0)
    with pytest.raises(TrialError, match=match) as caught:
        run_unit(task, blobs(0), store, BLOBS_INFO)
    assert "trial 'trial-7' (epoch 2, partition 0)" in str(caught.value)
    assert isinstance(caught.value.__cause__, cause)
    assert store.list() == []


def test_a_non_finite_training_loss_is_a_trial_error(store):
    task = train_task("nan-trial", spec="training_fixtures:NaNLossSpec", partition=0)
    with pytest.raises(TrialError, match=r"trial 'nan-trial' .*training loss is nan"):
        run_unit(task, blobs(0), store, BLOBS_INFO)
    assert store.list() == []


def test_bad_params_of_a_ready_spec_become_trial_errors(store):
    task = train_task(params={"hidden_units": [0]})
    with pytest.raises(TrialError, match=r"hidden_units must be a list of positive ints") as caught:
        run_unit(task, blobs(0), store, BLOBS_INFO)
    assert isinstance(caught.value.__cause__, ConfigError)


def test_corrupt_or_incompatible_checkpoints_become_trial_errors(store):
    store.put("corrupt.pt", b"garbage")
    with pytest.raises(TrialError, match=r"decoding checkpoint 'corrupt\.pt'") as caught:
        run_unit(train_task(checkpoint_in="corrupt.pt"), blobs(0), store, BLOBS_INFO)
    assert isinstance(caught.value.__cause__, CheckpointError)

    run_unit(train_task(params={"hidden_units": [16]}), blobs(0), store, BLOBS_INFO)
    wider = train_task(
        params={"hidden_units": [32]}, checkpoint_in="t0/e0s0.pt", step=0, checkpoint_out="wider.pt"
    )
    with pytest.raises(TrialError, match=r"restoring checkpoint 't0/e0s0\.pt'"):
        run_unit(wider, blobs(0), store, BLOBS_INFO)


def test_a_clone_keeps_the_donors_weights_and_moments_but_takes_its_own_hyperparameters(store):
    donor = train_task("donor", params={"hidden_units": [8], "lr": 0.01, "weight_decay": 0.0})
    run_unit(donor, blobs(0, rows=40), store, BLOBS_INFO)
    donor_checkpoint = decode_checkpoint(store.get(donor.checkpoint_out))
    # the same trial continuing keeps the restored hyperparameters...
    same = train_task(
        "donor",
        params={"hidden_units": [8], "lr": 0.5},
        partition=1,
        step=1,
        epoch_units=2,
        checkpoint_in=donor.checkpoint_out,
    )
    run_unit(same, blobs(1, rows=40), store, BLOBS_INFO)
    assert (
        decode_checkpoint(store.get(same.checkpoint_out))["optimizer"]["param_groups"][0]["lr"]
        == 0.01
    )
    # ...a clone (PBT exploit + explore) takes its own params' hyperparameters
    clone = train_task(
        "clone",
        params={"hidden_units": [8], "lr": 0.02, "weight_decay": 0.001},
        seed=9,
        partition=1,
        checkpoint_in=donor.checkpoint_out,
    )
    run_unit(clone, blobs(1, rows=40), store, BLOBS_INFO)
    group = decode_checkpoint(store.get(clone.checkpoint_out))["optimizer"]["param_groups"][0]
    assert (group["lr"], group["weight_decay"]) == (0.02, 0.001)
    # and it started from the donor's weights, not from its own seed's initialisation
    fresh = train_task(
        "clone",
        params={"hidden_units": [8], "lr": 0.02, "weight_decay": 0.001},
        seed=9,
        partition=1,
        checkpoint_out="fresh.pt",
    )
    run_unit(fresh, blobs(1, rows=40), store, BLOBS_INFO)
    assert weights_digest(store.get(fresh.checkpoint_out)) != weights_digest(
        store.get(clone.checkpoint_out)
    )
    assert donor_checkpoint["optimizer"]["state"]  # the donor had moments to hand over


def test_metric_states_cross_the_wire_with_nan_as_text(store):
    train = train_task()
    result = run_unit(train, blobs(0), store, BLOBS_INFO)
    states = {**result.metric_states, "odd": {"sum": math.nan, "buffer": [math.inf, 1.0]}}
    original = dataclasses.replace(result, metric_states=states)
    wire = json.loads(json.dumps(original.to_json(), allow_nan=False))  # strict JSON
    back = UnitResult.from_json(wire)
    assert back.metric_states["accuracy"] == result.metric_states["accuracy"]
    assert math.isnan(back.metric_states["odd"]["sum"])
    assert back.metric_states["odd"]["buffer"] == [math.inf, 1.0]
    old = {k: v for k, v in wire.items() if k != "metric_states"}  # an older worker's result
    assert UnitResult.from_json(old).metric_states == {}
