"""The packed unit: ``k`` trials of one architecture trained together in one visit (issue 27).

Cerebro §7 names "model batching" as future work; HFTA (MLSys 2021) fuses the training of
same-architecture models horizontally. A *packed unit* is ``k`` train units of ``k``
different trials on the same partition, run as one: the trials' parameters are stacked
(one ``(k, *shape)`` tensor per parameter name) and one ``torch.func.vmap`` of
``functional_call`` over them computes all ``k`` forward and backward passes of a batch
(or, for a plain chain of layers such as an MLP, one batched kernel per layer:
:mod:`._pack_grouped`, several times faster on a CPU).
MOP's semantics hold per trial: each trial visits the partition once in its epoch, in its
own scheduled order, and writes its own checkpoint.

* **What packs.** Train tasks of distinct trials with the same spec, the same partition
  and the same batch size, whose models have one structure: the same
  :func:`pack_fingerprint` (module types and their configuration, among it dropout's
  ``p``; parameter and buffer names, shapes and dtypes). Learning rate, weight decay,
  momentum, betas, the optimizer itself and the LR schedule may differ: each trial keeps
  the optimizer and scheduler its spec built (:mod:`._pack_optim` steps them). Anything
  else is refused with :class:`~cerebro_spark.errors.ConfigError` naming the value.
* **Batch order.** Each trial reads the partition in *its own* order, the permutation
  ``run_unit`` uses (seeded by ``(trial_seed, epoch, partition)``): batch ``n`` of the
  pack is the ``n``-th batch of every trial, gathered per trial (one gather of the ``k``
  index batches for numeric data; images are decoded and augmented per trial, with each
  trial's own augmentation seeds) and stacked along the ``vmap`` dimension. One shared
  order would save the gathers but would make a packed trial a different run than its
  unpacked twin; gathering costs one indexing per batch, and keeps the twins equal.
* **Equality with the unpacked run.** Initial weights (seeded by the trial seed alone),
  restored state, batch order, per-trial mean loss and gradient, and the optimizer's
  formulas are the unpacked unit's. The results are equal within float rounding, not bit
  for bit: a vmapped layer runs batched kernels (``bmm``, grouped convolutions) whose
  sums are accumulated in another order than the unbatched ones, and the stacked
  optimizer step rounds per-trial scalars as torch does but may fuse differently
  (tests/training/test_pack.py states the tolerance: ``1e-5`` relative, ``1e-6``
  absolute on the weights after a unit, for an MLP and a CNN).
* **Randomness (dropout).** Each trial's randomness is not drawn from its own stream:
  ``vmap(randomness="different")`` (or, for grouped layers, one dropout over the stacked
  activations) draws one mask per trial from one generator, reseeded
  at the start of the pass from the pack's trials ``(trial_seed, epoch)`` in pack order
  and the partition (for ``k = 1`` the unpacked unit's seed). A packed trial with dropout
  is therefore a run from the same distribution as its unpacked twin, not the same run;
  it is reproducible bit for bit given the same pack (the scheduler's packs are a
  function of the event log, so replays form the same packs). Each trial's checkpoint
  records as ``torch_rng_state`` the state its unpacked twin would hold if it drew no
  random numbers (it is recorded for inspection only).
* **Failures.** A trial whose loss turns non-finite fails alone: its slot in the result
  is a :class:`~cerebro_spark.errors.TrialError` naming the first such batch (checked
  once per 64 batches, as ``run_unit`` does), the others go on and write their
  checkpoints. A trial whose checkpoint cannot be restored, whose params break its
  spec's rules or whose own optimizer step or metrics raise fails alone the same way;
  user code shared by the pack (loading the spec, ``transform``, the forward pass, the
  loss) that raises fails every trial. Store failures (``OSError``,
  :class:`~cerebro_spark.errors.CheckpointCorruptError`) are raised for the whole pack,
  as ``run_unit`` raises them: nothing was written by then, the pack can be retried.
* **Results.** Each trial gets the :class:`~cerebro_spark.units.UnitResult` its unpacked
  unit would report: its rows, its own metric states (its own ``PassMetrics`` over its
  outputs), its checkpoint's size and digest, its checkpoint bytes read and cache hits.
  ``seconds`` and ``data_wait_seconds`` are its share: its own checkpoint reads and
  writes plus the pack's shared time divided among the trials, so the results of a pack
  sum to its wall time.
* **Checkpoints.** Un-stacked: each trial's parameters, buffers and optimizer state are
  copied back into its own model and optimizer before its checkpoint is taken with
  ``run_unit``'s :func:`~._unit.snapshot`, so the checkpoint has today's format and
  ``run_unit`` of that trial restores it.

Determinism: the pass runs under ``run_unit``'s lock and environment
(:data:`~._unit.UNIT_LOCK`, :func:`~._unit.unit_environment`: deterministic algorithms,
torch's RNG forked and restored). A trial's numbers do not depend on its pack mates, so
that a resumed run (whose in-flight mates re-run as a smaller pack) and a replay (whose
packs form anew) reproduce it bit for bit: the batched kernels compute each trial's
slice alone (measured: an MLP's and a CNN's weights after a pass are the same bytes in
packs of 2 to 8), the optimizer steps trials of one kind together whatever the others
are (:func:`~._pack_optim.stacked_optimizer`, the pack ordered by kind), and a pack of
one trains beside a *ghost*, a copy of itself whose result is dropped, because a
batched kernel of one trial may take another path (a CNN's convolution does). Models
that draw random numbers (dropout) are the exception: a pack draws them for all its
trials at once.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from cerebro_spark.data import ColumnInfo, DatasetInfo, PartitionData
from cerebro_spark.errors import ConfigError, TrialError
from cerebro_spark.metrics import State
from cerebro_spark.store import Store
from cerebro_spark.training._batches import PREFETCH_DEPTH, BatchMaker, BatchSeeds, input_threads
from cerebro_spark.training._checkpoint import Checkpoint, checkpoint_payload, with_dataset
from cerebro_spark.training._loading import load_spec
from cerebro_spark.training._metrics import PassMetrics
from cerebro_spark.training._pack_grouped import grouped_forward
from cerebro_spark.training._pack_optim import stacked_optimizer, step_kind
from cerebro_spark.training._pack_structure import check_packable_model, check_same_structure
from cerebro_spark.training._prefetch import Prefetcher
from cerebro_spark.training._spec import ModelSpec
from cerebro_spark.training._unit import (
    TORCH_STREAM,
    UNIT_LOCK,
    LiveTrial,
    TrainedUnit,
    UserCode,
    add_batch,
    batch_order,
    check_task,
    load_checkpoint,
    open_state,
    pass_metrics,
    report_metrics,
    snapshot,
    stream_seed,
    unit_batch_size,
    unit_environment,
    unit_label,
)
from cerebro_spark.units import UnitKind, UnitResult, UnitTask

logger = logging.getLogger(__name__)

#: Non-finite losses are looked for (one host sync) once per this many batches.
_CHECK_BATCHES = 64

PackBatch = tuple["torch.Tensor | dict[str, torch.Tensor]", torch.Tensor]


@dataclasses.dataclass
class PackTrial:
    """One trial of a pack: its task, live objects, and what its unit has cost so far."""

    task: UnitTask
    state: LiveTrial | None = None
    metrics: PassMetrics | None = None
    error: TrialError | None = None
    rows: int = 0
    io_seconds: float = 0.0
    bytes_read: int = 0
    cache_hit: bool = False
    prefetched: bool = False

    def fail(self, error: TrialError) -> None:
        """Fail the trial (its first error counts)."""
        if self.error is None:
            self.error = error


def run_pack(
    tasks: Sequence[UnitTask],
    data: PartitionData,
    store: Store,
    info: DatasetInfo,
    *,
    worker_id: str = "",
    device: str = "cpu",
) -> list[UnitResult | TrialError]:
    """Run ``k`` train units of ``k`` trials as one packed unit (see the module docstring).

    Args:
        tasks: Train tasks of distinct trials: same spec, same partition, same batch
            size, models of one structure (:func:`pack_fingerprint`); each with its own
            ``checkpoint_out``.
        data: The train split of their partition.
        store: Where checkpoints are read and written.
        info: The dataset description handed to the spec.
        worker_id: Reported back in the results.
        device: Torch device to run on (``"cpu"``, ``"cuda:0"``).

    Returns:
        One entry per task, in order: the trial's result (as ``run_unit`` reports it), or
        the :class:`~cerebro_spark.errors.TrialError` that failed the trial alone.

    Raises:
        ConfigError: The tasks cannot form a pack (the message names the value and rule).
        DataError: ``data`` does not match the tasks or ``info``.
        CheckpointCorruptError: A checkpoint read is not the one the log recorded.
        OSError: The store failed (nothing is wrong with the trials; retry the pack).
    """
    trained = train_pack(tasks, data, store, info, worker_id=worker_id, device=device)
    return [unit if isinstance(unit, TrialError) else unit.write() for unit in trained]


def train_pack(
    tasks: Sequence[UnitTask],
    data: PartitionData,
    store: Store,
    info: DatasetInfo,
    *,
    worker_id: str = "",
    device: str = "cpu",
) -> list[TrainedUnit | TrialError]:
    """Train a packed unit's pass; take each trial's checkpoint without writing it yet.

    :func:`run_pack` is this followed by each :meth:`TrainedUnit.write`, as ``run_unit``
    is ``train_unit(...).write()``: a worker can write the ``k`` checkpoints while it
    trains its next unit. Arguments, result slots and errors are :func:`run_pack`'s.
    """
    check_pack(tasks, data, info)
    with UNIT_LOCK, unit_environment(device) as dev:
        start = time.perf_counter()
        trials = [PackTrial(task) for task in tasks]
        ghost = [PackTrial(_ghost(tasks[0]))] if len(tasks) == 1 else []  # module docstring
        spec = _pack_spec(trials)
        if spec is not None:
            open_pack(spec, trials + ghost, store, info, dev)
        waited = 0.0
        live = [t for t in trials + ghost if t.error is None]
        if spec is not None and live and (not ghost or trials[0].error is None):
            waited = train_pass(spec, live, data, info, dev)
        payloads = {id(t): _close(spec, t, info, dev) for t in trials if spec and not t.error}
        shared = time.perf_counter() - start - sum(t.io_seconds for t in trials + ghost)
        out: list[TrainedUnit | TrialError] = []
        for trial in trials:
            if trial.error is not None:
                out.append(trial.error)
                continue
            states, sums = payloads[id(trial)][1]
            result = UnitResult(
                task=trial.task,
                worker_id=worker_id,
                rows=trial.rows,
                seconds=trial.io_seconds + shared / len(trials),
                metric_sums=sums,
                metric_states=states,
                io_seconds=trial.io_seconds,
                checkpoint_bytes_read=trial.bytes_read,
                checkpoint_cache_hits=int(trial.cache_hit),
                checkpoint_prefetched=int(trial.prefetched),
                data_wait_seconds=waited / len(trials),
            )
            out.append(TrainedUnit(result, payloads[id(trial)][0], store))
    logger.debug(
        "pack of %d trials on partition %d: %d failed, took %.3fs",
        len(trials),
        tasks[0].partition,
        sum(isinstance(o, TrialError) for o in out),
        time.perf_counter() - start,
    )
    return out


def _ghost(task: UnitTask) -> UnitTask:
    """A copy of a lone pack member that trains beside it and is dropped (module docstring)."""
    return dataclasses.replace(
        task,
        trial_id=f"{task.trial_id}~ghost",
        checkpoint_out=None if task.checkpoint_out is None else f"{task.checkpoint_out}~ghost",
    )


def check_pack(tasks: Sequence[UnitTask], data: PartitionData, info: DatasetInfo) -> None:
    """Refuse tasks that cannot form a packed unit (before anything is read or built).

    Raises:
        ConfigError: Naming the task field, its value and the rule it breaks.
        DataError: ``data`` does not match the tasks or ``info`` (``run_unit``'s checks).
    """
    if isinstance(tasks, (str, bytes)) or not isinstance(tasks, Sequence) or not tasks:
        raise ConfigError(f"a pack needs a non-empty sequence of UnitTasks, got {tasks!r}")
    for task in tasks:
        if not isinstance(task, UnitTask):
            raise ConfigError(f"a pack holds UnitTasks, got {task!r}")
    first = tasks[0]
    seen: dict[str, str] = {}
    inputs = {t.checkpoint_in for t in tasks if t.checkpoint_in is not None}
    for task in tasks:
        name = f"trial {task.trial_id!r}"
        if task.kind is not UnitKind.TRAIN:
            raise ConfigError(f"packed units train; the task of {name} is a {task.kind!r} unit")
        if task.group is not None:
            raise ConfigError(f"the task of {name} is a rank of a group unit: it cannot be packed")
        if task.partition != first.partition:
            raise ConfigError(
                f"a pack trains one partition: {name} has partition {task.partition}, "
                f"trial {first.trial_id!r} has {first.partition}"
            )
        if task.spec != first.spec:
            raise ConfigError(
                f"a pack trains one spec: {name} has spec {task.spec!r}, "
                f"trial {first.trial_id!r} has {first.spec!r}"
            )
        if task.trial_id in seen:
            raise ConfigError(f"trial ids in a pack must be distinct: {name} appears twice")
        if task.checkpoint_out in seen.values():
            raise ConfigError(
                f"each trial of a pack writes its own checkpoint: {name} has checkpoint_out "
                f"{task.checkpoint_out!r}, as another trial of the pack"
            )
        if task.checkpoint_out in inputs:
            raise ConfigError(
                f"{name} would write checkpoint_out {task.checkpoint_out!r}, which a trial of "
                "the pack reads as its checkpoint_in"
            )
        check_task(task, data, info)
        seen[task.trial_id] = task.checkpoint_out or ""
    check_packable_columns([column.info for column in data.columns])


def check_packable_columns(columns: Sequence[ColumnInfo]) -> None:
    """Refuse feature columns a pack cannot batch: sequences.

    Raises:
        ConfigError: Naming the column and the rule.
    """
    for column in columns:
        if column.feature_kind == "sequence":
            raise ConfigError(
                f"packed units need features of one shape per row: column "
                f"{column.name!r} is a sequence (batches are padded to their longest row); "
                "run its trials unpacked (pack: off)"
            )


def _pack_spec(trials: Sequence[PackTrial]) -> ModelSpec | None:
    """The pack's spec; ``None`` (every trial failed) if loading it raised."""
    try:
        with UserCode(trials[0].task, "loading the spec"):
            return load_spec(trials[0].task.spec)
    except TrialError as error:
        _fail_all(trials, "loading the spec", error)
        return None


def _fail_all(trials: Sequence[PackTrial], what: str, error: BaseException) -> None:
    """Fail every live trial: user code the pack shares raised ``error`` doing ``what``."""
    cause = error.__cause__ if isinstance(error, TrialError) and error.__cause__ else error
    for trial in trials:
        if trial.error is None:
            failure = TrialError(
                f"{unit_label(trial.task)}: {what} raised {type(cause).__name__}: {cause} "
                "(in a packed unit: code the pack shares, every trial fails)"
            )
            failure.__cause__ = cause
            trial.fail(failure)


def open_pack(
    spec: ModelSpec,
    trials: Sequence[PackTrial],
    store: Store | None,
    info: DatasetInfo,
    dev: torch.device,
) -> None:
    """Read each trial's checkpoint and build its model, optimizer, scheduler and metrics.

    A trial that fails to open fails alone. The live trials must share a batch size and a
    model structure. ``store`` may be ``None`` when no trial reads a checkpoint.

    Raises:
        ConfigError: Batch sizes or model structures differ.
        CheckpointCorruptError, OSError: Reading a checkpoint failed (storage, not trial).
    """
    sizes: dict[str, int] = {}
    for trial in trials:
        task = trial.task
        try:
            sizes[task.trial_id] = unit_batch_size(spec, task)
            checkpoint = None
            if task.checkpoint_in is not None:
                if store is None:
                    raise ConfigError(f"trial {task.trial_id!r} has a checkpoint_in but no store")
                read = load_checkpoint(store, task, task.checkpoint_in)
                checkpoint = read.checkpoint
                trial.io_seconds += read.seconds
                trial.bytes_read, trial.cache_hit = read.store_bytes, read.cache_hit
                trial.prefetched = read.prefetched
            trial.state = open_state(spec, task, info, dev, checkpoint)
            trial.metrics = pass_metrics(spec, task, info, dev, training=True)
        except TrialError as error:
            trial.fail(error)
    live = [t for t in trials if t.error is None]
    if len({sizes[t.task.trial_id] for t in live}) > 1:
        listed = ", ".join(f"{t.task.trial_id!r}: {sizes[t.task.trial_id]}" for t in live)
        raise ConfigError(
            f"the trials of a pack must share one batch_size (rows per step), got {listed}"
        )
    models = [(t.task.trial_id, t.state.model) for t in live if t.state is not None]
    check_same_structure(models, spec, sizes[live[0].task.trial_id] if live else 0)
    if models:
        check_packable_model(models[0][1])


def _pack_seed(trials: Sequence[PackTrial]) -> int:
    """The pass's torch seed: the trials' (seed, epoch) in pack order, and the partition.

    For one trial it is ``run_unit``'s seed of the same unit.
    """
    entropy = [value for t in trials for value in (t.task.trial_seed, t.task.epoch)]
    return stream_seed((*entropy, trials[0].task.partition), TORCH_STREAM)


def _seed(seed: int, dev: torch.device) -> None:
    """Seed the generator the pass draws from (``run_unit``'s rule: on the CPU, only it)."""
    if dev.type == "cpu":
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


class _Batches:
    """The pack's batches: batch ``n`` of every trial, in its own order, stacked."""

    def __init__(
        self,
        spec: ModelSpec,
        trials: Sequence[PackTrial],
        data: PartitionData,
        info: DatasetInfo,
        dev: torch.device,
        size: int,
    ) -> None:
        self.size = size
        self.orders = [batch_order(t.task, data.rows) for t in trials]
        self.makers: list[BatchMaker] = []
        first = BatchMaker(data, info, dev)
        if not first.decodes:  # numbers: one maker, one gather of all trials' rows
            self.makers = [first]
            return
        for trial in trials:  # images: each trial's own augmentation and seeds
            task = trial.task
            with UserCode(task, "augmentation"):
                augmentation = spec.augmentation(task.params, info)
            seeds = BatchSeeds(task.trial_seed, task.epoch, task.partition)
            self.makers.append(BatchMaker(data, info, dev, augmentation=augmentation, seeds=seeds))

    def __call__(self, number: int) -> PackBatch:
        first = number * self.size
        rows = [order[first : first + self.size] for order in self.orders]
        k = len(rows)
        if len(self.makers) == 1:
            x, y = self.makers[0](np.concatenate(rows), number)
            return _split(x, k), y.reshape(k, -1, *y.shape[1:])
        batches = [maker(part, number) for maker, part in zip(self.makers, rows, strict=True)]
        return _stack([b[0] for b in batches]), torch.stack([b[1] for b in batches])

    def prefetcher(self, count: int) -> Prefetcher[PackBatch]:
        """The pass's first ``count`` batches, built ahead on threads when images decode."""
        threads = input_threads() if self.makers[0].decodes else 0
        return Prefetcher(self, count, threads=threads, depth=PREFETCH_DEPTH)


def _split(
    x: torch.Tensor | dict[str, torch.Tensor], k: int
) -> torch.Tensor | dict[str, torch.Tensor]:
    if isinstance(x, dict):
        return {name: v.reshape(k, -1, *v.shape[1:]) for name, v in x.items()}
    return x.reshape(k, -1, *x.shape[1:])


def _stack(
    xs: list[torch.Tensor | dict[str, torch.Tensor]],
) -> torch.Tensor | dict[str, torch.Tensor]:
    first = xs[0]
    if isinstance(first, dict):
        return {name: torch.stack([x[name] for x in xs]) for name in first}  # type: ignore[index]
    return torch.stack(xs)  # type: ignore[arg-type]


def train_pass(
    spec: ModelSpec,
    trials: Sequence[PackTrial],
    data: PartitionData,
    info: DatasetInfo,
    dev: torch.device,
    *,
    max_batches: int | None = None,
) -> float:
    """Train the live ``trials`` one pass over ``data`` together; return the data wait.

    Fails trials in place (non-finite loss, their own optimizer or metrics raising, or
    shared user code raising: all). ``max_batches`` stops early (throughput probes).
    """
    trials = sorted(trials, key=_step_kind)  # each kind steps together (stacked_optimizer)
    states = [t.state for t in trials]
    assert all(s is not None for s in states)  # ok: open_pack built them
    models = [s.model for s in states if s is not None]
    own = [dict(m.named_parameters()) for m in models]
    names = list(own[0])
    stacked = {
        n: torch.stack([p[n].detach() for p in own]).requires_grad_(own[0][n].requires_grad)
        for n in names
    }
    own_buffers = [dict(m.named_buffers()) for m in models]
    buffers = {n: torch.stack([b[n] for b in own_buffers]) for n in own_buffers[0]}
    stepper = stacked_optimizer([s.optimizer for s in states if s is not None], own, stacked)
    learned = [n for n in names if stacked[n].requires_grad]
    skeleton = models[0]
    for model in models:
        model.train()
    forward = vmap(_trial_forward(spec, skeleton, info), randomness="different")
    grouped = grouped_forward(spec, skeleton, info)  # a chain of batched layers, if it is one
    size = unit_batch_size(spec, trials[0].task)
    count = -(-data.rows // size)
    if max_batches is not None:
        count = min(count, max_batches)
    _seed(_pack_seed(trials), dev)
    losses: list[torch.Tensor] = []
    checked = 0
    index_of = {id(t): i for i, t in enumerate(trials)}
    with _Batches(spec, trials, data, info, dev, size).prefetcher(count) as batches:
        for number, (x, y) in enumerate(batches):
            live = [t for t in trials if t.error is None]
            if not live:
                break
            what = "the forward pass or loss"
            try:
                if grouped is not None and isinstance(x, torch.Tensor):
                    loss, outputs, labels = grouped(stacked, buffers, x, y)
                else:
                    loss, outputs, labels = forward(stacked, buffers, x, y)
                what = "the backward pass"
                grads = torch.autograd.grad(
                    loss.sum(), [stacked[n] for n in learned], allow_unused=True
                )
            except Exception as error:
                _fail_all(live, what, error)
                break
            value = loss.detach()
            for failed in stepper.step(
                dict(zip(learned, grads, strict=True)), _indices(live, index_of)
            ):
                _fail_step(trials[failed], stepper.errors[failed])
            for trial in live:
                i = index_of[id(trial)]
                try:
                    assert trial.metrics is not None  # ok: open_pack built them
                    add_batch(trial.metrics, trial.task, outputs[i], labels[i], value[i])
                except TrialError as error:
                    trial.fail(error)
                trial.rows += int(labels.shape[1])
            losses.append(value)
            if len(losses) == _CHECK_BATCHES:
                _check_finite(trials, losses, checked, size, data.rows)
                losses, checked = [], number + 1
        _check_finite(trials, losses, checked, size, data.rows)
        waited = float(batches.wait_seconds)
    stepper.finish()
    with torch.no_grad():
        for name, stack in buffers.items():
            for index, held in enumerate(own_buffers):
                held[name].copy_(stack[index])
    for trial, state in zip(trials, states, strict=True):
        if state is not None:
            state.samples_seen += trial.rows
    return waited


def _step_kind(trial: PackTrial) -> tuple[object, ...]:
    assert trial.state is not None  # ok: open_pack built it
    return step_kind(trial.state.optimizer, dict(trial.state.model.named_parameters()))


def _indices(live: Sequence[PackTrial], index_of: dict[int, int]) -> list[int]:
    return [index_of[id(t)] for t in live]


def _fail_step(trial: PackTrial, error: Exception) -> None:
    """Fail ``trial``: its own optimizer's step raised ``error``."""
    failure = TrialError(
        f"{unit_label(trial.task)}: the optimizer step raised {type(error).__name__}: {error}"
    )
    failure.__cause__ = error
    trial.fail(failure)


def _trial_forward(spec: ModelSpec, skeleton: nn.Module, info: DatasetInfo):  # type: ignore[no-untyped-def]
    """One trial's step, written for one trial and vmapped over the pack."""

    def forward(params, buffers, x, y):  # type: ignore[no-untyped-def]
        x, y = spec.transform(x, y)
        outputs = functional_call(skeleton, (params, buffers), (x,))
        loss = spec.loss(outputs, y, info)
        if loss.numel() != 1:
            raise ValueError(f"the loss must be one value, got shape {tuple(loss.shape)}")
        return loss.reshape(()), outputs, y

    return forward


def _check_finite(
    trials: Sequence[PackTrial], losses: list[torch.Tensor], first: int, size: int, total: int
) -> None:
    """Fail each trial whose loss is not finite in ``losses``, naming its first such batch.

    ``losses`` are the batches from batch ``first`` on; the message is ``run_unit``'s.
    """
    if not losses:
        return
    finite = torch.isfinite(torch.stack(losses))  # (batches, k)
    if bool(finite.all()):
        return
    values = torch.stack(losses).cpu()
    for index, trial in enumerate(trials):
        bad = torch.nonzero(~finite[:, index].cpu())
        if trial.error is not None or not len(bad):
            continue
        batch = int(bad[0, 0])
        trial.fail(
            TrialError(
                f"{unit_label(trial.task)}: training loss is {float(values[batch, index])} "
                f"(not finite) in the batch at row {(first + batch) * size} of {total}"
            )
        )


def _close(
    spec: ModelSpec | None, trial: PackTrial, info: DatasetInfo, dev: torch.device
) -> tuple[Checkpoint, tuple[dict[str, State], dict[str, float]]]:
    """Report the trial's metrics, step its scheduler at its epoch's end, take its checkpoint."""
    state, task = trial.state, trial.task
    assert state is not None and trial.metrics is not None  # ok: a live trial was opened
    try:
        reported = report_metrics(trial.metrics, task)
        if state.scheduler is not None and task.step == task.epoch_units - 1:
            with UserCode(task, "lr_scheduler.step"):
                state.scheduler.step()
    except TrialError as error:
        trial.fail(error)
        return {}, ({}, {})
    taking = time.perf_counter()
    # the CPU generator as the unpacked unit leaves it when it draws nothing
    torch.default_generator.manual_seed(
        stream_seed((task.trial_seed, task.epoch, task.partition), TORCH_STREAM)
    )
    payload = checkpoint_payload(with_dataset(snapshot(state, task), info), sealed=False)
    trial.io_seconds += time.perf_counter() - taking
    return payload, reported
