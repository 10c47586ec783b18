"""The training unit (one sub-epoch of one trial on one partition) and the validation unit.

A training unit is Cerebro §3.1's sub-epoch; the validation unit evaluates a checkpoint on
one validation partition (§4.1: "we assume validation data is also partitioned and use the
same infrastructure for evaluation").

A unit is a pure function of (spec, params, checkpoint, partition data): its result does
not depend on which worker or process runs it, nor on what ran there before.

* Initial weights: torch is seeded from the trial seed alone before ``build_model``.
* Batch order: a permutation from ``numpy.random.default_rng(SeedSequence((trial_seed,
  epoch, partition)))``.
* Other randomness (dropout, random transforms): torch is reseeded at the start of the
  pass from the same triple (a separate ``SeedSequence`` stream).
* ``torch.use_deterministic_algorithms(True)`` holds during the unit; torch's global RNG
  and the flag are restored afterwards, so a unit leaves no trace in the process.

The intra-op thread count also changes float results on CPU; the worker pins it
(``WorkerJob.torch_threads``), not the unit. Torch's RNG and the deterministic flag are
process-global, so units in one process run one at a time (a process-wide lock):
parallel workers must be separate processes to run in parallel.

The group unit (:mod:`._group`) is made of the same pieces, public here for it: the lock
(:data:`UNIT_LOCK`) and :func:`unit_environment`; :func:`check_task`; :class:`UserCode`
and :func:`unit_label` (how user code's errors name a unit); the seeds
(:func:`stream_seed`, :data:`TORCH_STREAM`, :func:`batch_order`);
:func:`unit_batch_size`; the checkpoint's keys, reads and writes (:func:`required_key`,
:func:`read_checkpoint`, :func:`load_checkpoint`, :func:`write_checkpoint`,
:func:`snapshot`); the trial's live
objects (:class:`LiveTrial`, :func:`open_state`); the metrics (:func:`pass_metrics`,
:func:`add_batch`, :func:`report_metrics`). So a group unit seeds, restores, checkpoints
and reports errors exactly as an ordinary unit does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from cerebro_spark.data import DatasetInfo, PartitionData, feature_shape, tensor_input
from cerebro_spark.errors import CheckpointCorruptError, ConfigError, DataError, TrialError
from cerebro_spark.metrics import State
from cerebro_spark.store import Store
from cerebro_spark.training._batches import BatchMaker, BatchSeeds
from cerebro_spark.training._cache import worker_cache
from cerebro_spark.training._checkpoint import (
    Checkpoint,
    checkpoint_payload,
    decode_checkpoint,
    encode_payload,
    seal,
    with_dataset,
)
from cerebro_spark.training._loading import load_spec
from cerebro_spark.training._metrics import PassMetrics
from cerebro_spark.training._spec import ModelSpec, checked_batch_size
from cerebro_spark.units import UnitKind, UnitResult, UnitTask

logger = logging.getLogger(__name__)

UNIT_LOCK = threading.Lock()
"""Held while a unit runs: torch's RNG and deterministic flag are process-global."""
_INIT_STREAM = 0
TORCH_STREAM = 1
"""The SeedSequence stream torch is reseeded from at the start of a pass."""
#: The training loss is checked for finiteness (one host sync) once per this many batches.
_CHECK_BATCHES = 64


@dataclasses.dataclass
class LiveTrial:
    """A trial's live training objects between restoring and checkpointing."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    samples_seen: int


def run_unit(
    task: UnitTask,
    data: PartitionData,
    store: Store,
    info: DatasetInfo,
    *,
    worker_id: str = "",
    device: str = "cpu",
) -> UnitResult:
    """Run one train or validation unit.

    Train: start from ``task.checkpoint_in`` (or a fresh model seeded by the trial seed),
    train one pass over ``data`` in seeded random mini-batches, step the LR scheduler if
    the unit ends the trial's epoch, and write the new checkpoint to
    ``task.checkpoint_out``. Validate: evaluate ``task.checkpoint_in`` on ``data`` with
    ``model.eval()`` and no gradients; nothing is written.

    Args:
        task: The unit to run.
        data: The partition ``task.partition`` (the train split for train units).
        store: Where checkpoints are read and written.
        info: The dataset description handed to the spec.
        worker_id: Reported back in the result.
        device: Torch device to run on (``"cpu"``, ``"cuda:0"``).

    Returns:
        The result: rows, the mergeable state of ``"loss"`` and of each of the spec's
        metrics (``build_metrics``; training passes skip those with ``on_train = False``),
        their row-weighted sums, timings and, for train units, the checkpoint's size and
        SHA-256.

    Raises:
        ConfigError: If the task is malformed (missing checkpoint key, negative seed ...).
        DataError: If ``data`` does not match ``task`` or ``info``.
        TrialError: If the spec or user code raised, the checkpoint cannot be decoded or
            restored, or the training loss is not finite (the original error is chained).
        CheckpointCorruptError: If the checkpoint read is not the one the log recorded
            (``task.checkpoint_in_sha256``): a storage fault, not the trial's.
        OSError: If the store fails (not the trial's fault; the unit can be retried).
    """
    if task.kind is UnitKind.TRAIN:
        return train_unit(task, data, store, info, worker_id=worker_id, device=device).write()
    check_task(task, data, info)
    with UNIT_LOCK, unit_environment(device) as dev:
        start = time.perf_counter()
        spec = _spec(task)
        result = _validate(spec, task, data, store, info, dev, worker_id, start)
    _log_unit(result)
    return result


def train_unit(
    task: UnitTask,
    data: PartitionData,
    store: Store,
    info: DatasetInfo,
    *,
    worker_id: str = "",
    device: str = "cpu",
) -> TrainedUnit:
    """Train one unit's pass and take its checkpoint; encode and write nothing yet.

    :func:`run_unit` of a train task is ``train_unit(...).write()``. Split in two, a worker
    can encode and write the checkpoint (:meth:`TrainedUnit.write`, in another thread)
    while it already trains its next unit: the unit is done only once
    :meth:`~TrainedUnit.write` returned. The arguments, and the errors raised before the
    write, are :func:`run_unit`'s.
    """
    check_task(task, data, info)
    with UNIT_LOCK, unit_environment(device) as dev:
        start = time.perf_counter()
        trained = _train(_spec(task), task, data, store, info, dev, worker_id, start)
    return trained


def _spec(task: UnitTask) -> ModelSpec:
    with UserCode(task, "loading the spec"):
        return load_spec(task.spec)


def _log_unit(result: UnitResult) -> None:
    task = result.task
    logger.debug(
        "%s unit trial=%s epoch=%d partition=%d rows=%d took %.3fs (checkpoint io %.3fs)",
        task.kind.value,
        task.trial_id,
        task.epoch,
        task.partition,
        result.rows,
        result.seconds,
        result.io_seconds,
    )


@dataclasses.dataclass(frozen=True)
class TrainedUnit:
    """A train unit whose pass is done and whose checkpoint is taken, not yet encoded.

    Encoding (``torch.save``, tens of milliseconds for a checkpoint of tens of megabytes)
    is part of the write, so a worker that writes in another thread does both while its
    next unit trains. The payload's tensors are the unit's own (on the CPU, the trained
    model's and optimizer's): nothing changes them after the unit, which built them for
    itself.

    Attributes:
        result: The unit's result as it will be reported, but for the write: its
            ``seconds`` and ``io_seconds`` are those up to now, its checkpoint sizes are 0
            and ``checkpoint_sha256`` is ``None`` (set as the bytes are written).
        payload: The checkpoint (:func:`checkpoint_payload`), to be encoded and written to
            ``result.task.checkpoint_out``, and kept decoded in the worker's cache.
        store: Where it is written.
    """

    result: UnitResult
    payload: Checkpoint
    store: Store

    def write(self) -> UnitResult:
        """Encode and write the checkpoint durably (and into the worker's cache).

        Thread-safe with units training meanwhile. The time the encoding and the write
        took is added to the result's ``seconds`` and ``io_seconds`` (not the time it
        waited to start). Returns the unit's result.

        Raises:
            OSError: The store failed (the unit is not done; it can be retried).
        """
        began = time.perf_counter()
        key = required_key(self.result.task, self.result.task.checkpoint_out, "checkpoint_out")
        payload = seal(self.payload)  # its content digest, off the training thread
        blob = encode_payload(payload)
        sha256 = write_checkpoint(self.store, key, blob, payload)
        took = time.perf_counter() - began
        result = dataclasses.replace(
            self.result,
            seconds=self.result.seconds + took,
            io_seconds=self.result.io_seconds + took,
            checkpoint_bytes=len(blob),
            checkpoint_bytes_written=len(blob),
            checkpoint_sha256=sha256,
        )
        _log_unit(result)
        return result


def check_task(task: UnitTask, data: PartitionData, info: DatasetInfo) -> None:
    """Refuse a task or partition a unit cannot run.

    Raises:
        ConfigError: A field of the task breaks its rule (the message names it).
        DataError: The partition is not the task's, or does not match the dataset.
    """
    if not isinstance(task.kind, UnitKind):
        raise ConfigError(f"task.kind must be a UnitKind, got {task.kind!r}")
    for name in ("trial_seed", "epoch", "partition", "step"):
        value = getattr(task, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"task.{name} must be a non-negative int, got {value!r}")
    try:
        json.dumps(dict(task.params), allow_nan=True)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"task.params must hold JSON values only: {error}") from error
    if task.kind is UnitKind.TRAIN:
        if task.checkpoint_out is None:
            raise ConfigError(f"train unit of trial {task.trial_id!r} has no checkpoint_out")
        if not 0 <= task.step < task.epoch_units:
            raise ConfigError(
                f"task.step must be in [0, epoch_units={task.epoch_units}), got {task.step}"
            )
        if data.split != "train":
            raise DataError(f"train unit got a {data.split!r} partition; it needs 'train'")
    elif task.checkpoint_in is None:
        raise ConfigError(
            f"validation unit of trial {task.trial_id!r} has no checkpoint_in to evaluate"
        )
    if data.index != task.partition:
        raise DataError(f"task is for partition {task.partition}, got partition {data.index}")
    for column in data.columns:
        if column.rows != data.rows:
            raise DataError(
                f"partition {data.index} column {column.info.name!r} has {column.rows} rows "
                f"but {data.rows} labels"
            )
    if not info.tensor_input and [c.name for c in info.features] != [c.name for c in data.infos]:
        raise DataError(
            f"partition {data.index} has feature columns {[c.name for c in data.infos]}, "
            f"but the dataset's are {[c.name for c in info.features]}"
        )
    shape = feature_shape(data.infos)
    if tensor_input(data.infos) and shape != tuple(info.feature_shape):
        raise DataError(
            f"partition {data.index} features have shape {shape} per row, but the "
            f"dataset's feature_shape is {tuple(info.feature_shape)}"
        )


@contextlib.contextmanager
def unit_environment(device: str) -> Iterator[torch.device]:
    """Deterministic algorithms on, torch RNG forked; both restored on exit."""
    dev = torch.device(device)
    rng_devices: list[int] = []
    if dev.type == "cuda":
        # cuBLAS is only deterministic with a fixed workspace (read when it initialises).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        rng_devices = [dev.index if dev.index is not None else torch.cuda.current_device()]
    previous = torch.are_deterministic_algorithms_enabled()
    previous_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    previous_benchmark = torch.backends.cudnn.benchmark
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    try:
        fork_type = dev.type if dev.type != "cpu" else "cuda"
        with torch.random.fork_rng(devices=rng_devices, device_type=fork_type):
            yield dev
    finally:
        torch.use_deterministic_algorithms(previous, warn_only=previous_warn_only)
        torch.backends.cudnn.benchmark = previous_benchmark


class UserCode:
    """Wrap exceptions raised inside in :class:`TrialError` naming the trial and unit.

    A class, not a ``contextlib.contextmanager``: it is entered once per batch, with
    :attr:`what` set before each step (a training step costs microseconds per Python
    call on a small model).
    """

    __slots__ = ("task", "what")

    def __init__(self, task: UnitTask, what: str) -> None:
        self.task = task
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _: Any
    ) -> None:
        if error is None or isinstance(error, TrialError) or not isinstance(error, Exception):
            return
        raise TrialError(
            f"{unit_label(self.task)}: {self.what} raised {type(error).__name__}: {error}"
        ) from error


def unit_label(task: UnitTask) -> str:
    """``"trial 't' (epoch e, partition p)"``: how errors name a unit."""
    return f"trial {task.trial_id!r} (epoch {task.epoch}, partition {task.partition})"


def stream_seed(entropy: int | tuple[int, ...], stream: int) -> int:
    """Return a 64-bit torch seed from a numpy SeedSequence stream."""
    sequence = np.random.SeedSequence(entropy, spawn_key=(stream,))
    return int(sequence.generate_state(1, dtype=np.uint64)[0])


def _manual_seed(seed: int, dev: torch.device) -> None:
    """Seed the generator a unit on ``dev`` draws from (and, off the CPU, the CPU's too).

    On the CPU this is ``torch.manual_seed`` without what it adds for every accelerator
    type torch knows (queued seeds, a stack trace each: 0.2 ms, twice a unit); the CPU
    generator ends in the same state.
    """
    if dev.type == "cpu":
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


def batch_order(task: UnitTask, rows: int) -> np.ndarray:
    """The unit's row permutation, from SeedSequence((trial_seed, epoch, partition))."""
    sequence = np.random.SeedSequence((task.trial_seed, task.epoch, task.partition))
    return np.random.default_rng(sequence).permutation(rows)


def unit_batch_size(spec: ModelSpec, task: UnitTask, *, validation: bool = False) -> int:
    """The spec's (validation) batch size for the task's params, checked; user code."""
    with UserCode(task, "validation_batch_size" if validation else "batch_size"):
        return checked_batch_size(spec, task.params, validation=validation)


def required_key(task: UnitTask, key: str | None, name: str) -> str:
    """Return ``key``, the task's field ``name``; :class:`ConfigError` when it is ``None``."""
    if key is None:
        raise ConfigError(f"{task.kind.value} unit of trial {task.trial_id!r} has no {name}")
    return key


@dataclasses.dataclass(frozen=True)
class _CheckpointRead:
    """A checkpoint read for a unit, and what reading it cost."""

    checkpoint: Checkpoint
    size: int
    seconds: float
    store_bytes: int  # read from the store: 0 on a cache hit, but for one read ahead
    cache_hit: bool
    prefetched: bool = False  # the hit was read ahead while an earlier unit trained


def _load_checkpoint(store: Store, task: UnitTask, key: str) -> _CheckpointRead:
    """Read and decode checkpoint ``key``, verified against the digest the log recorded.

    The worker's cache answers when it holds ``key`` with the task's
    ``checkpoint_in_sha256``; otherwise the store is read and the bytes' SHA-256 compared
    with it before anything is decoded.

    The tensors are decoded into host memory whatever the unit's device:
    ``load_state_dict`` copies them to the model's device, and the optimizer keeps its
    step counts on the host, as torch does for an optimizer that is not ``capturable``
    (Adam reads a step count with ``.item()`` per parameter per batch: on a GPU, a host
    sync each time, measured on an H100 as most of a unit's fixed cost).

    Raises:
        CheckpointCorruptError: The bytes read are not those the log recorded (a storage
            fault: the engine retries the unit or reports the checkpoint corrupt).
        OSError: The store failed.
        TrialError: Verified bytes (or bytes with no digest to check) cannot be decoded.
    """
    started = time.perf_counter()
    expected = task.checkpoint_in_sha256 if key == task.checkpoint_in else None
    cache = worker_cache()
    held = cache.get_checkpoint(key, expected)
    if held is None and cache.wait_prefetch(key, expected):  # being read ahead: wait for it
        held = cache.get_checkpoint(key, expected)
    hit = held is not None
    checkpoint: Checkpoint | None = None
    if held is None:
        blob = store.get(key)
        actual = hashlib.sha256(blob).hexdigest()
        if expected is not None and actual != expected:
            raise CheckpointCorruptError(store.url(key), expected, actual, len(blob))
        cache.put(key, actual, blob)
        store_bytes = len(blob)
    else:
        blob, checkpoint = held  # a checkpoint this worker wrote or read ahead comes decoded
        store_bytes = cache.take_prefetched(key, expected)
    if checkpoint is None:
        with UserCode(task, f"decoding checkpoint {key!r}"):
            checkpoint = decode_checkpoint(blob)
    seconds = time.perf_counter() - started
    prefetched = hit and store_bytes > 0
    return _CheckpointRead(checkpoint, len(blob), seconds, store_bytes, hit, prefetched)


def prefetch_checkpoint(store: Store, key: str, sha256: str) -> bool:
    """Read checkpoint ``key`` ahead into the worker's cache, verified and decoded.

    Issue 27 part 3: a worker reads the checkpoints its next units will likely restore
    while it trains the current one, so that restoring is a cache hit (a copy of decoded
    tensors) instead of a store read, a SHA-256 and ``torch.load`` on the critical path.
    Bytes whose SHA-256 is not ``sha256`` are not kept (the unit reads the store and
    reports the corruption itself); neither is a checkpoint that does not decode. A
    unit that needs ``key`` while it is read waits for this read
    (:meth:`~cerebro_spark.training._cache.CheckpointCache.wait_prefetch`).

    Returns:
        Whether it was read (``False``: held already, read by another thread, refused, or
        the cache is disabled).

    Raises:
        OSError: The store failed (the unit will read it again).
    """
    cache = worker_cache()
    if cache.max_bytes == 0 or not cache.begin_prefetch(key, sha256):
        return False  # nowhere to keep it, or held (or being read) already
    try:
        blob = store.get(key)
        actual = hashlib.sha256(blob).hexdigest()
        if actual != sha256:
            logger.warning(
                "checkpoint %s read ahead has SHA-256 %s, not the logged %s: not kept",
                store.url(key),
                actual,
                sha256,
            )
            return False
        try:
            checkpoint = decode_checkpoint(blob)
        except Exception as error:  # the unit decodes it again and reports the error
            logger.warning("checkpoint %s read ahead does not decode: %s", store.url(key), error)
            return False
        cache.put(key, actual, blob, checkpoint, prefetched=True)
        return True
    finally:
        cache.end_prefetch(key, sha256)


def load_checkpoint(store: Store, task: UnitTask, key: str) -> _CheckpointRead:
    """Read checkpoint ``key`` for ``task`` as a train unit does, with what it cost.

    :func:`_load_checkpoint` (verified, through the worker's cache); the packed unit reads
    each trial's checkpoint with it and reports its bytes and cache hits as ``run_unit``.
    """
    return _load_checkpoint(store, task, key)


def read_checkpoint(store: Store, task: UnitTask, key: str) -> tuple[Checkpoint, int, float]:
    """Return (checkpoint, its size, seconds reading it): :func:`_load_checkpoint`."""
    read = _load_checkpoint(store, task, key)
    return read.checkpoint, read.size, read.seconds


def write_checkpoint(store: Store, key: str, blob: bytes, decoded: Checkpoint | None = None) -> str:
    """Write ``blob`` durably to ``key``, keep it in the worker's cache; return its SHA-256.

    ``decoded`` (the payload ``blob`` encodes) is cached with it, so that the unit that
    next restores this checkpoint here need not decode the bytes.
    """
    store.put(key, blob)
    sha256 = hashlib.sha256(blob).hexdigest()
    worker_cache().put(key, sha256, blob, decoded)
    return sha256


def _build_model(
    spec: ModelSpec, task: UnitTask, info: DatasetInfo, dev: torch.device
) -> nn.Module:
    with UserCode(task, "build_model"):
        _manual_seed(stream_seed(task.trial_seed, _INIT_STREAM), dev)
        model = spec.build_model(task.params, info)
        if not isinstance(model, nn.Module):
            raise TypeError(f"build_model must return a torch.nn.Module, got {model!r}")
        return model.to(dev)


def open_state(
    spec: ModelSpec,
    task: UnitTask,
    info: DatasetInfo,
    dev: torch.device,
    checkpoint: Checkpoint | None,
) -> LiveTrial:
    """Build model, optimizer and scheduler; restore them from ``checkpoint`` if given."""
    model = _build_model(spec, task, info, dev)
    with UserCode(task, "build_optimizer"):
        optimizer = spec.build_optimizer(model, task.params)
    with UserCode(task, "build_lr_scheduler"):
        scheduler = spec.build_lr_scheduler(optimizer, task.params)
    samples_seen = 0
    if checkpoint is not None:
        # A checkpoint of another trial is a clone (PBT's exploit): weights and optimizer
        # moments come from it, hyperparameters from this trial's params (explore).
        cloned = checkpoint["trial"]["trial_id"] != task.trial_id
        own_hyperparameters = [
            {k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups
        ]
        with UserCode(task, f"restoring checkpoint {task.checkpoint_in!r}"):
            model.load_state_dict(checkpoint["model"])
            optimizer.load_state_dict(dict(checkpoint["optimizer"]))
            if cloned:
                for group, own in zip(optimizer.param_groups, own_hyperparameters, strict=True):
                    group.update(own)
            saved_scheduler = checkpoint["lr_scheduler"]
            if scheduler is not None and saved_scheduler is not None and not cloned:
                scheduler.load_state_dict(dict(saved_scheduler))
        samples_seen = checkpoint["counters"]["samples_seen"]
    return LiveTrial(model, optimizer, scheduler, samples_seen)


def pass_metrics(
    spec: ModelSpec, task: UnitTask, info: DatasetInfo, dev: torch.device, *, training: bool
) -> PassMetrics:
    """The metrics of one pass (the spec's ``metrics`` are user code)."""
    with UserCode(task, "build_metrics"):
        return PassMetrics(spec, info, dev, training=training)


def add_batch(
    metrics: PassMetrics,
    task: UnitTask,
    outputs: torch.Tensor,
    labels: torch.Tensor,
    loss: torch.Tensor,
) -> None:
    """Add one batch to the pass's metrics (user code)."""
    with UserCode(task, "metrics"):  # PassMetrics detaches; no grad mode switch per batch
        metrics.add(outputs, labels, loss)


def report_metrics(
    metrics: PassMetrics, task: UnitTask
) -> tuple[dict[str, State], dict[str, float]]:
    """The pass's mergeable metric states and row-weighted sums (user code)."""
    with UserCode(task, "metrics"):
        return metrics.report()


def _train_pass(
    spec: ModelSpec,
    state: LiveTrial,
    task: UnitTask,
    data: PartitionData,
    info: DatasetInfo,
    dev: torch.device,
) -> tuple[PassMetrics, int, float]:
    """Train one pass over ``data``; return its metrics, the rows seen and the data wait.

    No host sync per batch: the metrics accumulate on the device in groups
    (:class:`PassMetrics`) and the loss is checked for finiteness once per
    :data:`_CHECK_BATCHES` batches and at the end (a non-finite loss still fails the unit,
    naming the first such batch, before anything is written).
    """
    size = unit_batch_size(spec, task)
    with UserCode(task, "augmentation"):
        augmentation = spec.augmentation(task.params, info)
    seeds = BatchSeeds(task.trial_seed, task.epoch, task.partition)
    maker = BatchMaker(data, info, dev, augmentation=augmentation, seeds=seeds)
    _manual_seed(stream_seed((task.trial_seed, task.epoch, task.partition), TORCH_STREAM), dev)
    model, optimizer, transform, loss_of = state.model, state.optimizer, spec.transform, spec.loss
    model.train()
    metrics = pass_metrics(spec, task, info, dev, training=True)
    rows = 0
    losses: list[torch.Tensor] = []  # the detached losses not yet checked, from row `checked`
    checked = 0
    first = 0
    user_code = UserCode(task, "")  # one guard, entered once per batch, names each step
    with maker.batches(batch_order(task, data.rows), size) as batches:
        for x, y in batches:
            with user_code:
                user_code.what = "transform"
                x, y = transform(x, y)
                user_code.what = "the forward pass or loss"
                optimizer.zero_grad(set_to_none=True)
                outputs = model(x)
                loss = loss_of(outputs, y, info)
                value = loss.detach()  # one detached scalar for the check and the metrics
                if value.dim() != 0:
                    if value.numel() != 1:
                        raise ValueError(
                            f"the loss must be one value, got shape {tuple(loss.shape)}"
                        )
                    value = value.reshape(())
                user_code.what = "the backward pass or optimizer step"
                torch.autograd.backward(loss)
                optimizer.step()
                user_code.what = "metrics"  # PassMetrics detaches; no grad mode switch per batch
                metrics.add(outputs, y, value)
            losses.append(value)
            rows += y.shape[0]
            first += size
            if len(losses) == _CHECK_BATCHES:
                _check_finite(task, losses, checked, size, data.rows)
                losses, checked = [], first
        _check_finite(task, losses, checked, size, data.rows)
        waited = batches.wait_seconds
    state.samples_seen += rows
    return metrics, rows, waited


def _check_finite(
    task: UnitTask, losses: list[torch.Tensor], first: int, size: int, total: int
) -> None:
    """Raise :class:`TrialError` naming the first batch whose loss is not finite.

    ``losses`` are consecutive batches of ``size`` rows, the first starting at row ``first``.
    """
    if not losses:
        return
    finite = torch.isfinite(torch.stack(losses))
    if bool(finite.all()):
        return
    bad = int(torch.nonzero(~finite)[0, 0])
    raise TrialError(
        f"{unit_label(task)}: training loss is {float(losses[bad])} (not finite) in the batch at "
        f"row {first + bad * size} of {total}"
    )


def _end_unit(state: LiveTrial, task: UnitTask) -> None:
    """Step the LR scheduler if this unit is the last of the trial's epoch."""
    if state.scheduler is not None and task.step == task.epoch_units - 1:
        with UserCode(task, "lr_scheduler.step"):
            state.scheduler.step()


def snapshot(state: LiveTrial, task: UnitTask) -> Checkpoint:
    """The checkpoint of a trial after ``task`` (not encoded; its tensors are the trial's)."""
    return {
        "model": state.model.state_dict(),
        "optimizer": state.optimizer.state_dict(),
        "lr_scheduler": state.scheduler.state_dict() if state.scheduler else None,
        "torch_rng_state": torch.get_rng_state(),
        "counters": {
            "epoch": task.epoch,
            "step": task.step,
            "samples_seen": state.samples_seen,
            "trial_seed": task.trial_seed,
        },
        "trial": {
            "trial_id": task.trial_id,
            "spec": task.spec,
            # sorted: the bytes must not depend on the order params were built in
            "params": json.loads(json.dumps(dict(task.params), sort_keys=True)),
        },
    }


def _train(
    spec: ModelSpec,
    task: UnitTask,
    data: PartitionData,
    store: Store,
    info: DatasetInfo,
    dev: torch.device,
    worker_id: str,
    start: float,
) -> TrainedUnit:
    io_seconds = 0.0
    checkpoint = None
    read = None
    if task.checkpoint_in is not None:
        read = _load_checkpoint(store, task, task.checkpoint_in)
        checkpoint, io_seconds = read.checkpoint, read.seconds
    state = open_state(spec, task, info, dev, checkpoint)
    metrics, rows, waited = _train_pass(spec, state, task, data, info, dev)
    states, sums = report_metrics(metrics, task)
    _end_unit(state, task)
    taking = time.perf_counter()
    payload = checkpoint_payload(with_dataset(snapshot(state, task), info), sealed=False)
    io_seconds += time.perf_counter() - taking
    result = UnitResult(
        task=task,
        worker_id=worker_id,
        rows=rows,
        seconds=time.perf_counter() - start,
        metric_sums=sums,
        metric_states=states,
        io_seconds=io_seconds,
        checkpoint_bytes_read=read.store_bytes if read is not None else 0,
        checkpoint_cache_hits=int(read is not None and read.cache_hit),
        checkpoint_prefetched=int(read is not None and read.prefetched),
        data_wait_seconds=waited,
    )
    return TrainedUnit(result, payload, store)


def _validate(
    spec: ModelSpec,
    task: UnitTask,
    data: PartitionData,
    store: Store,
    info: DatasetInfo,
    dev: torch.device,
    worker_id: str,
    start: float,
) -> UnitResult:
    key = required_key(task, task.checkpoint_in, "checkpoint_in")
    read = _load_checkpoint(store, task, key)
    checkpoint, io_seconds = read.checkpoint, read.seconds
    model = _build_model(spec, task, info, dev)
    with UserCode(task, f"restoring checkpoint {task.checkpoint_in!r}"):
        model.load_state_dict(checkpoint["model"])
    size = unit_batch_size(spec, task, validation=True)
    with UserCode(task, "augmentation"):
        augmentation = spec.augmentation(task.params, info)  # its normalize applies here too
    maker = BatchMaker(data, info, dev, augmentation=augmentation)
    _manual_seed(stream_seed((task.trial_seed, task.epoch, task.partition), TORCH_STREAM), dev)
    model.eval()
    metrics = pass_metrics(spec, task, info, dev, training=False)
    rows = 0
    user_code = UserCode(task, "")  # one guard, entered once per batch, names each step
    with torch.no_grad(), maker.batches(np.arange(data.rows), size) as batches:
        for x, y in batches:
            with user_code:
                user_code.what = "transform"
                x, y = spec.transform(x, y)
                user_code.what = "the forward pass or loss"
                outputs = model(x)
                loss = spec.loss(outputs, y, info)
                user_code.what = "metrics"
                metrics.add(outputs, y, loss)
            rows += int(y.shape[0])
        waited = batches.wait_seconds
    states, sums = report_metrics(metrics, task)
    return UnitResult(
        task=task,
        worker_id=worker_id,
        rows=rows,
        seconds=time.perf_counter() - start,
        metric_sums=sums,
        metric_states=states,
        checkpoint_bytes=read.size,
        io_seconds=io_seconds,
        checkpoint_bytes_read=read.store_bytes,
        checkpoint_cache_hits=int(read.cache_hit),
        checkpoint_prefetched=int(read.prefetched),
        data_wait_seconds=waited,
    )
