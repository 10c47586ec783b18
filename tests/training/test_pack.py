"""Packed units (issue 27): k trials of one architecture trained in one visit of a partition.

The tolerance: a packed trial's weights equal its unpacked twin's within RTOL/ATOL after a
unit and after an epoch of units. Not bit for bit: vmapped layers run batched kernels
(bmm, grouped convolutions) that accumulate in another order (see _pack's docstring).
"""

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn
from training_fixtures import BLOBS_INFO, CNN, blobs, train_task

from cerebro_spark.data import DatasetInfo, FeatureStatistics, PartitionData
from cerebro_spark.errors import ConfigError, TrialError
from cerebro_spark.training import (
    MLPSpec,
    choose_pack_size,
    decode_checkpoint,
    pack_fingerprint,
    pack_throughput,
    run_pack,
    run_unit,
)
from cerebro_spark.units import GroupSpec, UnitKind, UnitResult

pytestmark = pytest.mark.torch

RTOL, ATOL = 1e-5, 1e-6
CNN_INFO = DatasetInfo(feature_shape=(1, 8, 8), task="classification", num_classes=3)


def images(index: int, rows: int = 160) -> PartitionData:
    rng = np.random.default_rng([7, index])
    labels = rng.integers(0, 3, size=rows).astype(np.int64)
    features = (rng.normal(size=(rows, 1, 8, 8)) + labels[:, None, None, None]).astype(np.float32)
    return PartitionData.from_arrays("train", index, features, labels, features.nbytes)


class Poison(nn.Module):
    """Multiplies the outputs by a buffer: NaN for a poisoned trial, 1 otherwise."""

    def __init__(self, poisoned: bool) -> None:
        super().__init__()
        self.register_buffer("factor", torch.tensor(float("nan") if poisoned else 1.0))

    def forward(self, x):
        return x * self.factor


class PoisonSpec(MLPSpec):
    """An MLP whose loss is NaN from the first batch when its trial's ``poison`` is set."""

    hyperparameters = MLPSpec.hyperparameters | {"poison"}

    def build_model(self, params, info):
        return nn.Sequential(super().build_model(params, info), Poison(params.get("poison", False)))


class RMSpropSpec(MLPSpec):
    """An optimizer the pack steps per trial (no stacked step for it)."""

    def build_optimizer(self, model, params):
        return torch.optim.RMSprop(model.parameters(), lr=params["lr"], momentum=0.5)


class Exploding(torch.optim.SGD):
    def step(self, closure=None):
        raise RuntimeError("boom in step")


class ExplodingStepSpec(MLPSpec):
    """A trial whose ``explode`` param is set gets an optimizer whose step raises."""

    def build_optimizer(self, model, params):
        kind = Exploding if params.get("explode") else torch.optim.SGD
        return kind(model.parameters(), lr=params["lr"])


MLP_PARAMS = [
    {"hidden_units": [16], "lr": 0.01, "batch_size": 32},
    {"hidden_units": [16], "lr": 0.05, "weight_decay": 0.01, "batch_size": 32},
    {
        "hidden_units": [16],
        "lr": 0.003,
        "optimizer": "adamw",
        "weight_decay": 0.1,
        "batch_size": 32,
    },
    {"hidden_units": [16], "lr": 0.02, "optimizer": "sgd", "momentum": 0.9, "batch_size": 32},
    {"hidden_units": [16], "lr": 0.1, "optimizer": "sgd", "batch_size": 32},
    {
        "hidden_units": [16],
        "lr": 0.01,
        "lr_schedule": "step",
        "lr_step_gamma": 0.5,
        "batch_size": 32,
    },
]


def pack_tasks(params_list, *, spec=None, epoch=0, partition=0, step=0, units=1, inputs=None):
    return [
        train_task(
            f"t{i}",
            spec=spec or "cerebro_spark.training:MLPSpec",
            params=params,
            seed=11 + i,
            epoch=epoch,
            partition=partition,
            step=step,
            epoch_units=units,
            checkpoint_in=None if inputs is None else inputs[i],
        )
        for i, params in enumerate(params_list)
    ]


def assert_twins(packed_store, single_store, key):
    packed = decode_checkpoint(packed_store.get(key))
    single = decode_checkpoint(single_store.get(key))
    assert packed.keys() == single.keys()
    assert packed["counters"] == single["counters"]
    assert packed["trial"] == single["trial"]
    assert packed["lr_scheduler"] == single["lr_scheduler"]
    assert torch.equal(packed["torch_rng_state"], single["torch_rng_state"])
    assert packed["model"].keys() == single["model"].keys()
    for name, tensor in single["model"].items():
        assert packed["model"][name].dtype == tensor.dtype
        torch.testing.assert_close(packed["model"][name], tensor, rtol=RTOL, atol=ATOL)
    p_opt, s_opt = packed["optimizer"], single["optimizer"]
    assert p_opt["param_groups"] == s_opt["param_groups"]
    assert p_opt["state"].keys() == s_opt["state"].keys()
    for index, state in s_opt["state"].items():
        assert list(p_opt["state"][index]) == list(state)  # torch's keys, torch's order
        for name, value in state.items():
            torch.testing.assert_close(p_opt["state"][index][name], value, rtol=RTOL, atol=ATOL)


def assert_same_metrics(packed: UnitResult, single: UnitResult):
    assert packed.rows == single.rows
    assert packed.metric_states.keys() == single.metric_states.keys()
    assert packed.metric_states["loss"]["count"] == single.metric_states["loss"]["count"]
    assert packed.metric_sums == pytest.approx(single.metric_sums, rel=1e-5, abs=1e-6)
    assert packed.metric_states["accuracy"] == single.metric_states["accuracy"]


def test_mlp_epoch_packed_equals_unpacked_per_trial_hyperparameters(store):
    from tests.training.conftest import MemoryStore

    parts = [blobs(0, rows=150), blobs(1, rows=130)]
    single_store = MemoryStore()
    inputs = [None] * len(MLP_PARAMS)
    for step, partition in enumerate([1, 0]):  # one epoch of two units, LR schedule steps
        tasks = pack_tasks(MLP_PARAMS, partition=partition, step=step, units=2, inputs=inputs)
        tasks = [dataclasses.replace(t, checkpoint_out=f"{t.trial_id}/s{step}.pt") for t in tasks]
        singles = [run_unit(t, parts[partition], single_store, BLOBS_INFO) for t in tasks]
        packed = run_pack(tasks, parts[partition], store, BLOBS_INFO)
        for result, single in zip(packed, singles, strict=True):
            assert isinstance(result, UnitResult)
            assert_same_metrics(result, single)
            assert result.checkpoint_sha256 == store_digest(store, result.task.checkpoint_out)
        for task in tasks:
            assert_twins(store, single_store, task.checkpoint_out)
        inputs = [t.checkpoint_out for t in tasks]
    # the scheduler stepped at the epoch's end, in the packed trial as in its twin
    last = decode_checkpoint(store.get(inputs[5]))
    assert last["optimizer"]["param_groups"][0]["lr"] == pytest.approx(0.005)


def store_digest(store, key):
    import hashlib

    return hashlib.sha256(store.get(key)).hexdigest()


def test_cnn_packed_equals_unpacked(store):
    from tests.training.conftest import MemoryStore

    params = [
        {"channels": 4, "dense_units": 16, "lr": lr, "batch_size": 32, "weight_decay": wd}
        for lr, wd in ((0.01, 0.0), (0.002, 0.05), (0.03, 0.0))
    ]
    tasks = pack_tasks(params, spec=CNN)
    data = images(0)
    single_store = MemoryStore()
    singles = [run_unit(t, data, single_store, CNN_INFO) for t in tasks]
    packed = run_pack(tasks, data, store, CNN_INFO)
    for result, single, task in zip(packed, singles, tasks, strict=True):
        assert isinstance(result, UnitResult)
        assert_same_metrics(result, single)
        assert_twins(store, single_store, task.checkpoint_out)


def test_other_optimizers_step_per_trial_and_stay_twins(store):
    from tests.training.conftest import MemoryStore

    params = [{"hidden_units": [8], "lr": lr, "batch_size": 16} for lr in (0.01, 0.001)]
    tasks = pack_tasks(params, spec="test_pack:RMSpropSpec")
    data = blobs(0, rows=100, seed=2)
    single_store = MemoryStore()
    for task in tasks:
        run_unit(task, data, single_store, BLOBS_INFO)
    assert all(isinstance(r, UnitResult) for r in run_pack(tasks, data, store, BLOBS_INFO))
    for task in tasks:
        assert_twins(store, single_store, task.checkpoint_out)


def test_nan_loss_fails_its_trial_alone(store):
    from tests.training.conftest import MemoryStore

    params = [
        {"hidden_units": [8], "lr": 0.01, "batch_size": 16, "poison": poison}
        for poison in (False, True, False)
    ]
    tasks = pack_tasks(params, spec="test_pack:PoisonSpec")
    data = blobs(0, rows=100)
    results = run_pack(tasks, data, store, BLOBS_INFO)
    assert isinstance(results[1], TrialError)
    assert "trial 't1' (epoch 0, partition 0): training loss is nan (not finite)" in str(results[1])
    assert "in the batch at row 0 of 100" in str(results[1])
    assert not store.exists(tasks[1].checkpoint_out)
    single_store = MemoryStore()
    for index in (0, 2):
        assert isinstance(results[index], UnitResult)
        run_unit(tasks[index], data, single_store, BLOBS_INFO)
        assert_twins(store, single_store, tasks[index].checkpoint_out)


def test_optimizer_error_fails_its_trial_alone(store):
    from tests.training.conftest import MemoryStore

    params = [{"hidden_units": [8], "lr": 0.05, "explode": e} for e in (True, False)]
    tasks = pack_tasks(params, spec="test_pack:ExplodingStepSpec")
    data = blobs(0, rows=64)
    results = run_pack(tasks, data, store, BLOBS_INFO)
    assert isinstance(results[0], TrialError)
    assert "trial 't0' (epoch 0, partition 0): the optimizer step raised RuntimeError: boom" in str(
        results[0]
    )
    assert isinstance(results[1], UnitResult)
    single_store = MemoryStore()
    run_unit(tasks[1], data, single_store, BLOBS_INFO)
    assert_twins(store, single_store, tasks[1].checkpoint_out)


def test_checkpoints_are_read_back_by_run_unit(store):
    tasks = pack_tasks(MLP_PARAMS[:3])
    data = blobs(0, rows=120)
    results = run_pack(tasks, data, store, BLOBS_INFO)
    for task, result in zip(tasks, results, strict=True):
        assert isinstance(result, UnitResult)
        follow = train_task(
            task.trial_id,
            params=task.params,
            seed=task.trial_seed,
            epoch=1,
            checkpoint_in=task.checkpoint_out,
        )
        follow = dataclasses.replace(follow, checkpoint_in_sha256=result.checkpoint_sha256)
        after = run_unit(follow, data, store, BLOBS_INFO)
        assert after.rows == 120
        assert (
            decode_checkpoint(store.get(follow.checkpoint_out))["counters"]["samples_seen"] == 240
        )


def test_pack_replays_bit_for_bit_with_dropout():
    from tests.training.conftest import MemoryStore

    params = [{"hidden_units": [16], "dropout": 0.3, "lr": lr} for lr in (0.01, 0.02)]
    tasks = pack_tasks(params)
    data = blobs(0, rows=100)
    first = run_pack(tasks, data, MemoryStore(), BLOBS_INFO)
    again = run_pack(tasks, data, MemoryStore(), BLOBS_INFO)
    digests = [r.checkpoint_sha256 for r in first if isinstance(r, UnitResult)]
    assert len(digests) == 2
    assert digests == [r.checkpoint_sha256 for r in again if isinstance(r, UnitResult)]
    # the grouped pack draws its masks: a trial's weights differ from dropout 0's
    still = pack_tasks([{**p, "dropout": 0.0} for p in params])
    plain = run_pack(still, data, MemoryStore(), BLOBS_INFO)
    assert digests[0] != plain[0].checkpoint_sha256


def test_bad_packs_are_refused(store):
    data = blobs(0, rows=40)
    base = pack_tasks(MLP_PARAMS[:2])
    cases = [
        ([], "non-empty sequence"),
        ([base[0], dataclasses.replace(base[1], partition=1)], "one partition"),
        ([base[0], dataclasses.replace(base[1], spec=CNN)], "one spec"),
        ([base[0], dataclasses.replace(base[1], trial_id="t0")], "distinct"),
        (
            [base[0], dataclasses.replace(base[1], checkpoint_out="t0/e0s0.pt")],
            "its own checkpoint",
        ),
        (
            [base[0], dataclasses.replace(base[1], checkpoint_in="t0/e0s0.pt")],
            "reads as its checkpoint_in",
        ),
        (
            [base[0], dataclasses.replace(base[1], kind=UnitKind.VALIDATE)],
            "packed units train",
        ),
        (
            [dataclasses.replace(base[0], group=GroupSpec(0, 1, "127.0.0.1", 1, (0,), "g"))],
            "group unit",
        ),
        (pack_tasks([MLP_PARAMS[0], {**MLP_PARAMS[0], "batch_size": 16}]), "one batch_size"),
        (
            pack_tasks([MLP_PARAMS[0], {**MLP_PARAMS[0], "hidden_units": [8]}]),
            "'t0' and 't1' cannot share a pack: their models differ",
        ),
        (pack_tasks([MLP_PARAMS[0], {**MLP_PARAMS[0], "dropout": 0.5}]), "Dropout"),
    ]
    for tasks, message in cases:
        with pytest.raises(ConfigError, match=message):
            run_pack(tasks, data, store, BLOBS_INFO)
    assert store.list() == []


def test_fingerprint_groups_trials_by_structure():
    spec = MLPSpec()
    one = pack_fingerprint(spec, {"hidden_units": [16], "lr": 0.1}, BLOBS_INFO)
    assert one == pack_fingerprint(
        spec, {"hidden_units": [16], "lr": 0.001, "weight_decay": 0.1}, BLOBS_INFO
    )
    assert one == pack_fingerprint(spec, {"hidden_units": [16], "optimizer": "sgd"}, BLOBS_INFO)
    for other in ({"hidden_units": [8]}, {"hidden_units": [16], "dropout": 0.2}):
        assert pack_fingerprint(spec, other, BLOBS_INFO) != one
    with pytest.raises(ConfigError, match="hidden_units"):
        pack_fingerprint(spec, {"hidden_units": "many"}, BLOBS_INFO)


def test_throughput_curve_and_choice():
    task = train_task(params={"hidden_units": [16], "batch_size": 16})
    curve = pack_throughput(task, blobs(0, rows=64), BLOBS_INFO, max_k=4, batches=2)
    assert sorted(curve) == [1, 2, 4]
    assert all(rate > 0 for rate in curve.values())
    assert choose_pack_size({1: 100.0, 2: 190.0, 4: 300.0, 8: 400.0}) == 8
    assert choose_pack_size({1: 100.0, 2: 190.0, 4: 300.0, 8: 301.0}) == 4
    # with the trials and workers: a size must leave no worker idle to win
    curve = {1: 100.0, 2: 190.0, 4: 300.0, 8: 400.0}
    assert choose_pack_size(curve, trials=8, workers=1) == 8
    assert choose_pack_size(curve, trials=8, workers=2) == 4  # 2 packs of 4 beat 1 of 8
    assert choose_pack_size(curve, trials=64, workers=2) == 8
    assert choose_pack_size(curve, trials=3, workers=1) == 2  # at most the trials
    assert choose_pack_size(curve, trials=1, workers=4) == 1
    with pytest.raises(ConfigError, match="workers must be a positive int, got 0"):
        choose_pack_size(curve, trials=4, workers=0)
    with pytest.raises(ConfigError, match="max_k must be a positive int, got 0"):
        pack_throughput(task, blobs(0, rows=64), BLOBS_INFO, max_k=0)
    with pytest.raises(ConfigError, match="needs a measured curve"):
        choose_pack_size({})


def test_a_trials_numbers_do_not_depend_on_its_pack_mates():
    """Whatever its mates (how many, of which optimizer, in which order), a trial's
    checkpoint is the same bytes: each optimizer kind steps its own slice, a pack of one
    trains beside a ghost (a CNN's batched convolution of one takes another path)."""
    from tests.training.conftest import MemoryStore

    def digests(tasks, data, info):
        results = run_pack(tasks, data, MemoryStore(), info)
        return {r.task.trial_id: r.checkpoint_sha256 for r in results}

    tasks, data = pack_tasks(MLP_PARAMS), blobs(0)  # Adam, AdamW and SGD trials mixed
    whole = digests(tasks, data, BLOBS_INFO)
    assert digests(list(reversed(tasks)), data, BLOBS_INFO) == whole
    for chosen in ([0, 3], [2], [4, 1, 5], [3]):
        part = digests([tasks[i] for i in chosen], data, BLOBS_INFO)
        assert part == {f"t{i}": whole[f"t{i}"] for i in chosen}
    cnn = pack_tasks([{"lr": lr, "batch_size": 16} for lr in (1e-3, 3e-3, 1e-2)], spec=CNN)
    images_0 = images(0)
    three = digests(cnn, images_0, CNN_INFO)
    assert digests(cnn[1:2], images_0, CNN_INFO) == {"t1": three["t1"]}


# -- grouped layers: an MLP's pack without vmap ------------------------------------------


STATS_INFO = DatasetInfo(
    feature_shape=(4,),
    task="classification",
    num_classes=3,
    statistics=FeatureStatistics(
        count=10,
        mean=(0.5, -1.0, 2.0, 0.0),
        std=(2.0, 0.5, 1.0, 0.0),
        min=(-3.0, -3.0, -3.0, 0.0),
        max=(3.0, 3.0, 3.0, 0.0),
    ),
)


class SmoothLossSpec(MLPSpec):
    """A loss of its own: the grouped pack computes it trial by trial."""

    def loss(self, outputs, labels, info):
        return nn.functional.cross_entropy(outputs, labels, label_smoothing=0.1)


class TransformSpec(MLPSpec):
    def transform(self, features, labels):
        return features * 2, labels


@pytest.mark.parametrize(
    ("spec", "params", "info"),
    [
        (MLPSpec(), {"hidden_units": [8, 6], "activation": "gelu"}, STATS_INFO),
        (MLPSpec(), {"hidden_units": [5], "activation": "tanh"}, BLOBS_INFO),
        (SmoothLossSpec(), {"hidden_units": [8]}, STATS_INFO),
        (
            MLPSpec(),
            {"hidden_units": [8]},
            DatasetInfo(feature_shape=(4,), task="regression", num_classes=None),
        ),
    ],
)
def test_grouped_layers_compute_what_vmap_computes(spec, params, info):
    """The grouped forward of a pack gives each trial vmap's loss, outputs and gradients."""
    from torch.func import vmap

    from cerebro_spark.training._pack import _trial_forward
    from cerebro_spark.training._pack_grouped import grouped_forward

    k, rows = 3, 7
    models = []
    for seed in range(k):
        torch.manual_seed(seed)
        models.append(spec.build_model(params, info))
    skeleton = models[0]
    forward = grouped_forward(spec, skeleton, info)
    assert forward is not None
    own = [dict(m.named_parameters()) for m in models]
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.normal(size=(k, rows, 4)), dtype=torch.float32)
    if info.task == "classification":
        y = torch.tensor(rng.integers(0, info.num_classes, size=(k, rows)))
    else:
        y = torch.tensor(rng.normal(size=(k, rows)), dtype=torch.float32)
    buffers = {
        n: torch.stack([dict(m.named_buffers())[n] for m in models])
        for n in dict(skeleton.named_buffers())
    }

    def run(step):
        stacked = {n: torch.stack([p[n].detach() for p in own]).requires_grad_() for n in own[0]}
        loss, outputs, labels = step(stacked, buffers, x, y)
        grads = torch.autograd.grad(loss.sum(), list(stacked.values()))
        return loss, outputs, labels, grads

    grouped = run(forward)
    vmapped = run(vmap(_trial_forward(spec, skeleton, info), randomness="different"))
    for mine, theirs in zip(grouped[:3], vmapped[:3], strict=True):
        torch.testing.assert_close(mine, theirs, rtol=RTOL, atol=ATOL)
    for mine, theirs in zip(grouped[3], vmapped[3], strict=True):
        torch.testing.assert_close(mine, theirs, rtol=RTOL, atol=ATOL)
    # each trial's slice is computed alone: a pack of one gives the same bits
    alone = grouped_forward(spec, skeleton, info)(
        {n: torch.stack([own[1][n].detach()]) for n in own[0]},
        {n: b[1:2] for n, b in buffers.items()},
        x[1:2],
        y[1:2],
    )
    assert torch.equal(alone[0][0], grouped[0][1]) and torch.equal(alone[1][0], grouped[1][1])


def test_only_a_chain_of_batched_layers_is_grouped():
    from cerebro_spark.training import CNNSpec
    from cerebro_spark.training._pack_grouped import grouped_forward

    mlp = MLPSpec()
    assert grouped_forward(mlp, mlp.build_model({}, BLOBS_INFO), BLOBS_INFO) is not None
    dropout = mlp.build_model({"dropout": 0.2}, BLOBS_INFO)  # one draw for the pack
    assert grouped_forward(mlp, dropout, BLOBS_INFO) is not None
    cnn = CNNSpec()
    assert grouped_forward(cnn, cnn.build_model({}, CNN_INFO), CNN_INFO) is None
    shifted = TransformSpec()
    assert grouped_forward(shifted, shifted.build_model({}, BLOBS_INFO), BLOBS_INFO) is None
    poisoned = PoisonSpec()
    assert grouped_forward(poisoned, poisoned.build_model({}, BLOBS_INFO), BLOBS_INFO) is None
