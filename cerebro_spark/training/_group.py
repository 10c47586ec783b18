"""The group unit: one train unit of one trial, trained data-parallel by ``k`` workers.

Cerebro §5.7 and appendix D ("Horovod hybrid"): when a stage has fewer live trials than
workers, MOP under-uses the cluster, so a trial may be given a *group* of workers that
train it with synchronous data-parallel SGD; between group units the model hops through
the store exactly as between ordinary units. Like MOP, synchronous data parallelism is
equivalent to sequential SGD, so the hybrid stays reproducible. (The paper measured the
hybrid to be bottlenecked by Horovod's communication and suggests switching whole stages
to data parallelism below ``p/2`` trials; that is the planner's call, not this module's.)

A *group unit* covers ``k = group.size`` partitions of one trial's epoch at once; rank
``r`` runs on a worker holding ``group.partitions[r]`` (its ``task.partition``):

* **Rendezvous.** Every rank joins a ``torch.distributed`` process group of world size
  ``k`` through the TCP store rank 0 hosts at ``group.address:group.port`` (backend
  ``"gloo"`` on CPU, ``"nccl"`` on CUDA), waiting at most ``group.timeout_s``. The group
  is destroyed when the unit ends, however it ends, so a worker can join another group
  for its next unit; a process runs one unit at a time (the lock of ``run_unit``).
* **Who may join.** Rank 0's store listens on ``group.address`` only (the address it is
  announced at), not on every interface. With a ``group.token`` (``submit_group`` draws
  one per attempt) every key of the rendezvous lives under a prefix derived from the
  token, so a process that connects without it can neither take a rank nor read the
  group's keys; rank 0 publishes only a fingerprint of the token, and a rank whose token
  does not match it fails at once with :class:`~cerebro_spark.units.GroupBrokenError`.
  Rank 0 waits until every peer has announced itself under the prefix.
* **Start.** Every rank reads the same ``checkpoint_in`` (or initialises from the trial
  seed), so all replicas start equal; a handshake exchanges the ranks' row counts and a
  digest of the shared task fields (ranks given different tasks fail with
  :class:`~cerebro_spark.errors.ConfigError`).
* **Batches.** The global mini-batch is ``B = spec.batch_size(params)`` rows: rank ``r``
  takes ``B // k`` rows per step, plus one if ``r < B % k`` (``B >= k`` is required). Rank
  ``r`` visits its partition in the order ``run_unit`` would: a permutation seeded by
  ``(trial_seed, epoch, partition)``; dropout and other torch randomness are reseeded from
  the same triple, so each rank has its own stream.
* **Steps.** Every rank takes the same number of optimizer steps: the *maximum* over
  ranks of ``ceil(rows_r / local_batch_r)``. Every row of every partition is visited
  exactly once; a rank whose partition is used up contributes no rows (and no gradient)
  to the remaining steps, whose global batch is then smaller than ``B``.
* **Gradients.** Per step, rank ``r`` computes the gradient of its batch's mean loss,
  weights it by ``n_r / N`` (its rows over the step's rows on all ranks) and the ranks
  sum the weighted gradients with one ``all_reduce``: the result is the gradient of the
  mean loss over the union of the ranks' batches, i.e. exactly what one worker would
  compute on the concatenated batch (up to float rounding). Every rank then applies the
  same optimizer step to the same gradient, so the replicas stay equal. A parameter
  without a gradient on every rank keeps ``grad=None`` (the optimizer skips it, as it
  would on one worker). A sparse table's gradient (``sparse_embeddings``) travels dense,
  beside one flag per row that says whether any rank's batch looked the row up; the
  ranks then step the sparse gradient of those rows, as one worker would step the
  concatenated batch's (:mod:`._lazy_optim`).
* **End.** The LR scheduler steps when the unit covers the last partition of the epoch:
  ``task.step`` counts the trial's partitions already trained this epoch (``epoch_units``
  stays the number of partitions ``P``), and the scheduler steps when ``step + k ==
  epoch_units``. Rank 0 writes ``checkpoint_out`` with ``counters.step = step + k - 1``
  (the last position covered) and ``samples_seen`` grown by the rows of all ranks; its
  model buffers (BatchNorm running statistics) are saved, as with DDP's default
  ``broadcast_buffers``. BatchNorm's batch statistics are per rank (no SyncBatchNorm), so
  models with BatchNorm are close to, not equal to, one worker with batch ``B``.
* **Results.** Every rank returns a :class:`~cerebro_spark.units.UnitResult` for *its*
  rows: ``rows``, mergeable ``metric_states`` and row-weighted ``metric_sums`` over the
  rows it processed (merging the ``k`` ranks' states gives the unit's metrics); rank 0's
  carries the checkpoint's size and SHA-256, the others
  report ``checkpoint_bytes=0`` and no digest.
* **Failures.** A rank whose user code raises, whose loss is not finite, or whose store
  I/O fails keeps taking part in the collectives with a failure flag, so *every* rank
  fails promptly: the failing rank with its own error, the others with
  :class:`~cerebro_spark.errors.TrialError` (user code) or :class:`OSError` (I/O, the
  unit can be retried) naming the failing rank. A peer that dies or does not answer
  within ``timeout_s`` makes the others fail with
  :class:`~cerebro_spark.units.GroupBrokenError` (a ``WorkerLostError``: the unit goes
  back to the queue, the surviving workers live on). A failed group unit may leave
  ``checkpoint_out`` written (when only the last optimizer step failed on another rank);
  nothing may use it, as for any failed unit.
* **Determinism.** The same group unit (same tasks, same checkpoint, same ``k``) gives a
  bit-identical checkpoint: batch orders and seeds are fixed, and the all-reduce of
  fixed tensors over a fixed world is deterministic (tested for ``k = 2``). A group of
  one is bit-identical to ``run_unit``; a larger group is *not* bit-identical to ``k``
  ordinary units (different updates), nor to a group of another size.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import hashlib
import json
import logging
import math
import socket
import time
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import PrefixStore
from torch.distributed.distributed_c10d import Store as DistStore

from cerebro_spark.data import DatasetInfo, PartitionData
from cerebro_spark.errors import ConfigError, TrialError
from cerebro_spark.metrics import State
from cerebro_spark.store import Store
from cerebro_spark.training._batches import BatchMaker, BatchSeeds, Features
from cerebro_spark.training._checkpoint import encode_checkpoint, with_dataset
from cerebro_spark.training._lazy_optim import sparse_parameters
from cerebro_spark.training._loading import load_spec
from cerebro_spark.training._metrics import PassMetrics
from cerebro_spark.training._spec import ModelSpec
from cerebro_spark.training._unit import (
    TORCH_STREAM,
    UNIT_LOCK,
    LiveTrial,
    UserCode,
    add_batch,
    batch_order,
    check_task,
    open_state,
    pass_metrics,
    read_checkpoint,
    report_metrics,
    required_key,
    snapshot,
    stream_seed,
    unit_batch_size,
    unit_environment,
    unit_label,
    write_checkpoint,
)
from cerebro_spark.units import GroupBrokenError, GroupSpec, UnitKind, UnitResult, UnitTask

logger = logging.getLogger(__name__)

_LOOPBACK = "127.0.0.1"
"""Where rank 0's store listens when a group names no address (a group on one host)."""

# Failure codes exchanged between ranks (0: none).
_USER_FAILURE = 1  # user code, config or data: the trial's fault (TrialError)
_IO_FAILURE = 2  # store I/O: transient (OSError)
_DIGEST_BITS = 62


@dataclasses.dataclass
class _Failure:
    """An exception a rank holds back until the next collective tells its peers."""

    code: int
    error: BaseException

    @classmethod
    def of(cls, error: BaseException) -> _Failure:
        return cls(_IO_FAILURE if isinstance(error, OSError) else _USER_FAILURE, error)


def local_batch_sizes(batch_size: int, size: int) -> tuple[int, ...]:
    """Split the global batch over ``size`` ranks: ``B // k``, plus one for ``r < B % k``.

    Args:
        batch_size: The trial's global mini-batch size ``B``.
        size: The group size ``k``.

    Returns:
        The rows per step of each rank, by rank; they sum to ``batch_size``.

    Raises:
        ConfigError: ``batch_size < size`` (a rank would get no rows).
    """
    if batch_size < size:
        raise ConfigError(
            f"batch_size={batch_size} is smaller than the group size {size}: every rank "
            "needs at least one row per step (use a smaller group or a larger batch)"
        )
    base, extra = divmod(batch_size, size)
    return tuple(base + (1 if rank < extra else 0) for rank in range(size))


def group_steps(rows: Sequence[int], local_batches: Sequence[int]) -> list[tuple[int, ...]]:
    """Return, for every step of a group unit, the rows each rank processes in it.

    The number of steps is the maximum over ranks of ``ceil(rows_r / local_batch_r)``; a
    rank whose partition is used up processes 0 rows in the remaining steps.

    Args:
        rows: Rows of each rank's partition, by rank.
        local_batches: Each rank's rows per step (:func:`local_batch_sizes`).

    Returns:
        One tuple per step with the rows of each rank, by rank.
    """
    steps = max(
        (math.ceil(n / b) for n, b in zip(rows, local_batches, strict=True)),
        default=0,
    )
    return [
        tuple(max(0, min(b, n - step * b)) for n, b in zip(rows, local_batches, strict=True))
        for step in range(steps)
    ]


def run_group_unit(
    task: UnitTask,
    data: PartitionData,
    store: Store,
    info: DatasetInfo,
    *,
    worker_id: str = "",
    device: str = "cpu",
    on_rendezvous: Callable[[int], None] | None = None,
) -> UnitResult:
    """Run this worker's rank of a group unit (see the module docstring).

    Rank 0 may choose the rendezvous port itself: with ``task.group.port == 0`` it opens
    the TCP store on a free port of this host and calls ``on_rendezvous(port)`` before it
    waits for its peers, whose tasks must then carry this host and that port (the
    backend passes them on). Choosing the port where it is bound leaves no window in
    which another process could take it.

    Args:
        task: A train unit with ``task.group`` set; ``task.partition`` must equal
            ``task.group.partitions[task.group.rank]`` and ``task.group.port`` must be
            chosen (not 0), except on rank 0 with ``on_rendezvous``.
        data: The train split of ``task.partition``.
        store: Where checkpoints are read and (by rank 0) written.
        info: The dataset description handed to the spec.
        worker_id: Reported back in the result.
        device: Torch device (``"cpu"`` uses gloo, ``"cuda:N"`` uses NCCL).
        on_rendezvous: Told the port rank 0 bound, when it chose it (see above).

    Returns:
        This rank's result: its rows and the metric states (and row-weighted sums) of
        its rows; on rank 0 also the checkpoint's size and SHA-256.

    Raises:
        ConfigError: The task is malformed, or the ranks were given different tasks.
        DataError: ``data`` does not match ``task`` or ``info``.
        TrialError: User code raised (on this rank or another), a loss was not finite,
            or the checkpoint cannot be restored.
        GroupBrokenError: A peer died, did not join or did not answer within
            ``group.timeout_s``, or the rendezvous failed.
        OSError: The store failed (on this rank or, for the checkpoint, on rank 0).
    """
    group = _check_group_task(task, chooses_port=on_rendezvous is not None)
    with UNIT_LOCK, unit_environment(device) as dev:
        start = time.perf_counter()
        with _process_group(task, group, dev, on_rendezvous) as comm:
            result = _run(task, group, data, store, info, dev, comm, worker_id, start)
    logger.debug(
        "group unit %s rank %d/%d trial=%s epoch=%d partition=%d rows=%d took %.3fs",
        group.group_id,
        group.rank,
        group.size,
        task.trial_id,
        task.epoch,
        task.partition,
        result.rows,
        result.seconds,
    )
    return result


def _check_group_task(task: UnitTask, *, chooses_port: bool = False) -> GroupSpec:
    """Check what must hold before the rendezvous; return the task's group."""
    group = task.group
    if group is None:
        raise ConfigError(f"task of trial {task.trial_id!r} has no group: use run_unit")
    if task.kind is not UnitKind.TRAIN:
        raise ConfigError(
            f"group units train; trial {task.trial_id!r} got a group {task.kind.value} unit"
        )
    if task.partition != group.partitions[group.rank]:
        raise ConfigError(
            f"rank {group.rank} of group {group.group_id!r} must train partition "
            f"{group.partitions[group.rank]}, got task.partition={task.partition}"
        )
    if chooses_port and group.rank == 0 and group.port == 0:
        pass  # rank 0 binds a free port and announces it
    elif group.port == 0 or not group.address:
        raise ConfigError(
            f"group {group.group_id!r} has no rendezvous address/port yet "
            f"({group.address!r}:{group.port}); submit it through Backend.submit_group"
        )
    if task.step < 0 or task.step + group.size > task.epoch_units:
        raise ConfigError(
            f"group unit of size {group.size} at step {task.step} does not fit an epoch of "
            f"epoch_units={task.epoch_units} partitions (needs 0 <= step <= epoch_units - size)"
        )
    if not dist.is_available():
        raise ConfigError("torch.distributed is not available in this torch build")
    return group


class _Comm:
    """The collectives of one group unit; a failed collective is a broken group."""

    def __init__(self, task: UnitTask, group: GroupSpec, device: torch.device) -> None:
        self.task = task
        self.group = group
        self.device = device

    def all_reduce(self, tensor: torch.Tensor, op: dist.ReduceOp.RedOpType, what: str) -> None:
        """All-reduce ``tensor`` in place; raise GroupBrokenError if the group broke."""
        try:
            dist.all_reduce(tensor, op=op)
        except Exception as error:  # gloo/NCCL raise RuntimeError subclasses
            raise GroupBrokenError(
                f"{unit_label(self.task)}: rank {self.group.rank} of group "
                f"{self.group.group_id!r} (size {self.group.size}) lost its peers during "
                f"{what} (a peer died or did not answer within {self.group.timeout_s} s): "
                f"{error}"
            ) from error


@contextlib.contextmanager
def _process_group(
    task: UnitTask,
    group: GroupSpec,
    dev: torch.device,
    on_rendezvous: Callable[[int], None] | None = None,
) -> Iterator[_Comm]:
    """Join the group's process group; destroy it on exit, however the unit ends.

    Rank 0 hosts the TCP store on ``group.address`` only; with ``group.port == 0`` it
    binds a free port there and announces it through ``on_rendezvous`` before it waits for
    its peers. Who may join is decided by the token (see the module docstring).
    """
    if dist.is_initialized():
        raise ConfigError(
            "a torch.distributed process group is already initialised in this process; "
            "a worker runs one group unit at a time"
        )
    backend = "nccl" if dev.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=group.timeout_s)
    host = group.address or _LOOPBACK
    where = f"{host}:{group.port}"
    try:
        listen_fd = None
        port = group.port
        if group.rank == 0:  # the store owns (and closes) the socket bound here
            listener = socket.create_server((host, port), family=_family(host))
            port = int(listener.getsockname()[1])
            listen_fd = listener.detach()
        where = f"{host}:{port}"
        # TCPStore is re-exported without __all__ (mypy: attr-defined)
        rendezvous = dist.TCPStore(  # type: ignore[attr-defined]
            host,
            port,
            group.size,
            is_master=group.rank == 0,
            timeout=timeout,
            wait_for_workers=False,
            master_listen_fd=listen_fd,
        )
        if group.port == 0:
            assert on_rendezvous is not None  # ok: _check_group_task
            on_rendezvous(port)
        dist.init_process_group(
            backend,
            store=_admitted(rendezvous, group),
            rank=group.rank,
            world_size=group.size,
            timeout=timeout,
            device_id=dev if backend == "nccl" else None,
        )
    except Exception as error:
        with contextlib.suppress(Exception):
            if dist.is_initialized():
                dist.destroy_process_group()
        broken = GroupBrokenError(
            f"{unit_label(task)}: rank {group.rank} of group {group.group_id!r} (size "
            f"{group.size}) could not join the rendezvous at {where} within "
            f"{group.timeout_s} s: {type(error).__name__}: {_scrubbed(error, group)}"
        )
        if group.token:  # torch's message names the store's keys: keep their prefix out
            raise broken from None
        raise broken from error
    logger.debug("rank %d joined group %s at %s", group.rank, group.group_id, where)
    try:
        yield _Comm(task, group, dev)
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            logger.warning("destroying group %s failed", group.group_id, exc_info=True)
        del rendezvous


def _family(host: str) -> socket.AddressFamily:
    """The address family ``host`` resolves to first (IPv4 or IPv6)."""
    return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][0]


def _admitted(store: DistStore, group: GroupSpec) -> DistStore:
    """The group's view of rank 0's store, once this rank (rank 0: every rank) is admitted.

    Without a token (a group built by hand) the store itself. Otherwise rank 0 publishes
    the token's fingerprint, a peer refuses to go on when its token does not match it,
    every rank announces itself under the token's prefix, and rank 0 waits for all.
    """
    if not group.token:
        return store
    fingerprint = _token_hash("fingerprint", group.token)
    key = f"cerebro/{group.group_id}/fingerprint"
    if group.rank == 0:
        store.set(key, fingerprint)
    else:
        store.wait([key])
        if store.get(key).decode() != fingerprint:
            raise GroupBrokenError(
                f"rank {group.rank} of group {group.group_id!r} presented a token that is not "
                "the group's: it is not one of the group's ranks"
            )
    prefix = _token_hash("prefix", group.token)
    prefixed: DistStore = PrefixStore(prefix, store)
    prefixed.set(f"rank/{group.rank}", "1")
    if group.rank == 0:
        prefixed.wait([f"rank/{r}" for r in range(1, group.size)])
    return prefixed


def _scrubbed(error: BaseException, group: GroupSpec) -> str:
    """The error's text without the group's token or key prefix."""
    text = str(error)
    if group.token:
        text = text.replace(_token_hash("prefix", group.token), "<group key prefix>")
        text = text.replace(group.token, "<group token>")
    return text


def _token_hash(purpose: str, token: str) -> str:
    """A digest of the token for one purpose (neither reveals the token nor the other)."""
    return hashlib.sha256(f"cerebro-group-{purpose}:{token}".encode()).hexdigest()


def _task_digest(task: UnitTask) -> int:
    """A 62-bit digest of the fields every rank of a group unit shares.

    The rendezvous address and port are left out: ranks that met there share them, and
    rank 0 may have chosen the port after its task was written.
    """
    shared = task.to_json()
    shared.pop("partition")
    for field in ("rank", "address", "port"):
        shared["group"].pop(field)
    text = json.dumps(shared, sort_keys=True, default=str)
    digest = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    return digest >> (64 - _DIGEST_BITS)


def _describe_rank(group: GroupSpec, rank: int) -> str:
    return f"rank {rank} (partition {group.partitions[rank]}) of group {group.group_id!r}"


def _raise_failures(
    task: UnitTask, group: GroupSpec, codes: Sequence[int], own: _Failure | None, when: str
) -> None:
    """Raise if any rank failed: this rank's own error, else one naming the failed rank."""
    if own is not None:
        raise own.error
    failed = [rank for rank, code in enumerate(codes) if code]
    if not failed:
        return
    first = failed[0]
    message = (
        f"{unit_label(task)}: {_describe_rank(group, first)} failed {when}; see that worker's error"
    )
    if codes[first] == _IO_FAILURE:
        raise OSError(message)
    raise TrialError(message)


@dataclasses.dataclass
class _Opened:
    """What a rank has after the start phase."""

    spec: ModelSpec
    state: LiveTrial
    local_batches: tuple[int, ...]
    io_seconds: float
    metrics: PassMetrics


def _open(
    task: UnitTask,
    group: GroupSpec,
    data: PartitionData,
    store: Store,
    info: DatasetInfo,
    dev: torch.device,
) -> _Opened:
    check_task(task, data, info)
    with UserCode(task, "loading the spec"):
        spec = load_spec(task.spec)
    local_batches = local_batch_sizes(unit_batch_size(spec, task), group.size)
    checkpoint = None
    io_seconds = 0.0
    if task.checkpoint_in is not None:
        checkpoint, _, io_seconds = read_checkpoint(store, task, task.checkpoint_in)
    state = open_state(spec, task, info, dev, checkpoint)
    metrics = pass_metrics(spec, task, info, dev, training=True)
    return _Opened(spec, state, local_batches, io_seconds, metrics)


def _handshake(
    task: UnitTask, group: GroupSpec, comm: _Comm, rows: int, failure: _Failure | None
) -> list[int]:
    """Exchange failures, row counts and task digests; return every rank's rows."""
    k = group.size
    digest = _task_digest(task)
    # MAX over ranks of [codes (k), rows (k), digest, -digest]: each rank fills its slots.
    shake = torch.zeros(2 * k + 2, dtype=torch.int64)
    shake[group.rank] = failure.code if failure else 0
    shake[k + group.rank] = rows
    shake[2 * k] = digest
    shake[2 * k + 1] = -digest
    shake = shake.to(comm.device)
    comm.all_reduce(shake, dist.ReduceOp.MAX, "the start handshake")
    values = [int(v) for v in shake.cpu().tolist()]
    if values[2 * k] != digest or values[2 * k + 1] != -digest:
        raise ConfigError(
            f"{unit_label(task)}: the ranks of group {group.group_id!r} were given different "
            "tasks (they must differ only in partition and rank; see check_group)"
        )
    _raise_failures(task, group, values[:k], failure, "while starting the unit")
    return values[k : 2 * k]


def _train_pass(
    task: UnitTask,
    group: GroupSpec,
    opened: _Opened,
    data: PartitionData,
    info: DatasetInfo,
    dev: torch.device,
    comm: _Comm,
    steps: Sequence[tuple[int, ...]],
) -> int:
    """Train this rank's share of every step (into ``opened.metrics``); return its rows."""
    spec, state = opened.spec, opened.state
    local = opened.local_batches[group.rank]
    order = batch_order(task, data.rows)
    with UserCode(task, "augmentation"):
        augmentation = spec.augmentation(task.params, info)
    seeds = BatchSeeds(task.trial_seed, task.epoch, task.partition)
    maker = BatchMaker(data, info, dev, augmentation=augmentation, seeds=seeds)
    torch.manual_seed(stream_seed((task.trial_seed, task.epoch, task.partition), TORCH_STREAM))
    state.model.train()
    params = [p for p in state.model.parameters() if p.requires_grad]
    # Gradients are summed in one buffer, in the widest parameter dtype (float32 at least);
    # after them one looked-up flag per row of each sparse table, one has-gradient flag
    # per parameter and one failure code per rank.
    dtype = functools.reduce(torch.promote_types, (p.dtype for p in params), torch.float32)
    numels = [p.numel() for p in params]
    sparse = sparse_parameters(state.model)
    table_rows = [p.shape[0] if id(p) in sparse else 0 for p in params]
    looked_up = sum(numels)
    flags = looked_up + sum(table_rows)
    codes = flags + len(params)
    rows = 0
    failure: _Failure | None = None
    for step, step_rows in enumerate(steps):
        mine = step_rows[group.rank]
        state.optimizer.zero_grad(set_to_none=True)
        if failure is None and mine > 0:
            try:
                x, y = maker(order[step * local : step * local + mine], step)
                rows += _local_batch(spec, state, task, info, x, y, opened.metrics)
            except Exception as error:
                failure = _Failure.of(error)
        buffer = torch.zeros(codes + group.size, dtype=dtype, device=dev)
        if failure is None:
            weight = mine / sum(step_rows)
            offset, row = 0, looked_up
            for index, (param, numel) in enumerate(zip(params, numels, strict=True)):
                grad = param.grad
                if grad is not None:
                    if grad.is_sparse:
                        grad = grad.coalesce()
                        buffer[row : row + table_rows[index]][grad.indices()[0]] = 1
                        grad = grad.to_dense()
                    part = buffer[offset : offset + numel]
                    part.copy_(grad.reshape(-1))
                    part.mul_(weight)
                    buffer[flags + index] = 1
                offset += numel
                row += table_rows[index]
        else:
            buffer[codes + group.rank] = failure.code
        comm.all_reduce(buffer, dist.ReduceOp.SUM, f"the gradient all-reduce of step {step}")
        step_codes = [int(code) for code in buffer[codes:].cpu().tolist()]
        _raise_failures(task, group, step_codes, failure, f"in step {step} of {len(steps)}")
        present = buffer[flags:codes].cpu().tolist()
        offset, row = 0, looked_up
        for param, numel, has_grad, table in zip(params, numels, present, table_rows, strict=True):
            grad = buffer[offset : offset + numel].view(param.shape).to(param.dtype)
            if table:
                used = buffer[row : row + table].nonzero().reshape(1, -1)
                grad = torch.sparse_coo_tensor(used, grad[used[0]], param.shape).coalesce()
            param.grad = grad if has_grad > 0 else None
            offset += numel
            row += table
        try:
            with UserCode(task, "the optimizer step"):
                state.optimizer.step()
        except Exception as error:
            failure = _Failure.of(error)  # told to the peers at the next collective
    if failure is not None:
        # The last step's optimizer failed: _run's end collective reports it.
        raise _Deferred(failure)
    return rows


def _local_batch(
    spec: ModelSpec,
    state: LiveTrial,
    task: UnitTask,
    info: DatasetInfo,
    x: Features,
    y: torch.Tensor,
    metrics: PassMetrics,
) -> int:
    """Forward and backward one local batch (gradient of its mean loss); return its rows."""
    with UserCode(task, "transform"):
        x, y = spec.transform(x, y)
    with UserCode(task, "the forward pass or loss"):
        outputs = state.model(x)
        loss = spec.loss(outputs, y, info)
        value = float(loss.detach())
    if not math.isfinite(value):
        raise TrialError(
            f"{unit_label(task)}: training loss is {value} (not finite) in a batch of "
            f"partition {task.partition}"
        )
    with UserCode(task, "the backward pass"):
        torch.autograd.backward(loss)
    add_batch(metrics, task, outputs, y, loss)
    return int(y.shape[0])


class _Deferred(Exception):
    """A rank's failure after the last collective of the pass, for the end collective."""

    def __init__(self, failure: _Failure) -> None:
        super().__init__(str(failure.error))
        self.failure = failure


def _run(
    task: UnitTask,
    group: GroupSpec,
    data: PartitionData,
    store: Store,
    info: DatasetInfo,
    dev: torch.device,
    comm: _Comm,
    worker_id: str,
    start: float,
) -> UnitResult:
    failure: _Failure | None = None
    opened: _Opened | None = None
    try:
        opened = _open(task, group, data, store, info, dev)
    except Exception as error:
        failure = _Failure.of(error)
    rows_by_rank = _handshake(task, group, comm, data.rows, failure)
    assert opened is not None  # ok: _handshake raised otherwise
    steps = group_steps(rows_by_rank, opened.local_batches)
    states: dict[str, State] = {}
    sums: dict[str, float] = {}
    rows = 0
    try:
        rows = _train_pass(task, group, opened, data, info, dev, comm, steps)
    except _Deferred as deferred:
        failure = deferred.failure
    if failure is None:
        try:
            states, sums = report_metrics(opened.metrics, task)
        except Exception as error:
            failure = _Failure.of(error)  # told to the peers at the end collective
    state = opened.state
    state.samples_seen += sum(rows_by_rank)
    ends_epoch = task.step + group.size == task.epoch_units
    blob: bytes | None = None
    sha256: str | None = None
    io_seconds = opened.io_seconds
    if failure is None:
        try:
            if ends_epoch and state.scheduler is not None:
                with UserCode(task, "lr_scheduler.step"):
                    state.scheduler.step()
            if group.rank == 0:
                written = time.perf_counter()
                last = dataclasses.replace(task, step=task.step + group.size - 1)
                blob = encode_checkpoint(with_dataset(snapshot(state, last), info))
                key = required_key(task, task.checkpoint_out, "checkpoint_out")
                sha256 = write_checkpoint(store, key, blob)
                io_seconds += time.perf_counter() - written
        except Exception as error:
            failure = _Failure.of(error)
    codes = torch.zeros(group.size, dtype=torch.int64)
    codes[group.rank] = failure.code if failure else 0
    codes = codes.to(dev)
    comm.all_reduce(codes, dist.ReduceOp.MAX, "the end of the unit")
    _raise_failures(
        task, group, [int(c) for c in codes.cpu().tolist()], failure, "at the end of the unit"
    )
    return UnitResult(
        task=task,
        worker_id=worker_id,
        rows=rows,
        seconds=time.perf_counter() - start,
        metric_sums=sums,
        metric_states=states,
        checkpoint_bytes=len(blob) if blob is not None else 0,
        checkpoint_sha256=sha256,
        io_seconds=io_seconds,
        checkpoint_bytes_written=len(blob) if blob is not None else 0,
    )
