"""How many trials to pack: a throughput curve over pack sizes (issue 27's ``pack: auto``).

:func:`pack_throughput` trains packs of ``k = 1, 2, 4, 8, 16, ...`` fresh copies of one
trial (seeds ``trial_seed + i``) for a few batches of a partition and reports the rows
per second each size trains, all its trials counted; :func:`choose_pack_size` picks ``k``
from that curve. A pre-flight or ``profile`` measures the curve once per architecture;
the per-trial costs of a unit that do not depend on ``k`` (checkpoint reads and writes)
are left out, as they are paid once per trial whatever the pack.

Sizes stop at ``max_k``, and on a GPU where the next size would not fit: the peak memory
of a size, doubled, must stay below what the device has free, and a size that runs out
of memory ends the curve.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping

import torch

from cerebro_spark.data import DatasetInfo, PartitionData
from cerebro_spark.errors import ConfigError
from cerebro_spark.training._loading import load_spec
from cerebro_spark.training._pack import PackTrial, check_pack, open_pack, train_pass
from cerebro_spark.training._spec import ModelSpec
from cerebro_spark.training._unit import UNIT_LOCK, UserCode, unit_environment
from cerebro_spark.units import UnitTask

logger = logging.getLogger(__name__)


def pack_throughput(
    task: UnitTask,
    data: PartitionData,
    info: DatasetInfo,
    *,
    max_k: int = 64,
    batches: int = 8,
    device: str = "cpu",
) -> dict[int, float]:
    """Rows per second that packs of ``k = 1, 2, 4, ...`` copies of ``task``'s trial train.

    Args:
        task: A train task (its spec and params; its checkpoints are not read or written).
        data: The partition to sample batches from (its first ``batches`` batches of each
            trial's order).
        info: The dataset.
        max_k: The largest pack size tried.
        batches: Batches timed per size (after one untimed warm-up pass of one batch).
        device: Torch device.

    Returns:
        Trial rows trained per second (``k`` times the rows of one trial) by ``k``.

    Raises:
        ConfigError: ``max_k`` or ``batches`` is not a positive int, or the task cannot
            be packed.
        TrialError: The spec or the trial's params failed.
    """
    for name, value in (("max_k", max_k), ("batches", batches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a positive int, got {value!r}")
    probe = dataclasses.replace(task, checkpoint_in=None, checkpoint_in_sha256=None)
    curve: dict[int, float] = {}
    with UNIT_LOCK, unit_environment(device) as dev:
        with UserCode(task, "loading the spec"):
            spec = load_spec(task.spec)
        _time_pack(spec, probe, data, info, dev, 1, 1)  # warm-up
        k = 1
        while k <= max_k:
            try:
                rows_per_second, peak = _time_pack(spec, probe, data, info, dev, k, batches)
            except torch.OutOfMemoryError:
                logger.info("a pack of %d trials does not fit %s", k, dev)
                break
            curve[k] = rows_per_second
            if dev.type == "cuda" and 2 * peak > torch.cuda.mem_get_info(dev)[0] + peak:
                break
            k *= 2
    return curve


def _time_pack(
    spec: ModelSpec,
    task: UnitTask,
    data: PartitionData,
    info: DatasetInfo,
    dev: torch.device,
    k: int,
    batches: int,
) -> tuple[float, int]:
    """Train a pack of ``k`` copies for ``batches`` batches: (rows per second, peak bytes)."""
    tasks = [
        dataclasses.replace(
            task,
            trial_id=f"{task.trial_id}/probe{i}",
            trial_seed=task.trial_seed + i,
            checkpoint_out=f"{task.checkpoint_out}/probe{i}",
        )
        for i in range(k)
    ]
    check_pack(tasks, data, info)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    trials = [PackTrial(t) for t in tasks]
    start = time.perf_counter()
    open_pack(spec, trials, None, info, dev)
    failed = [t.error for t in trials if t.error is not None]
    if failed:
        raise failed[0]
    train_pass(spec, trials, data, info, dev, max_batches=batches)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    seconds = time.perf_counter() - start
    rows = sum(t.rows for t in trials)
    peak = int(torch.cuda.max_memory_allocated(dev)) if dev.type == "cuda" else 0
    return rows / seconds if seconds > 0 else 0.0, peak


def choose_pack_size(
    curve: Mapping[int, float],
    tolerance: float = 0.05,
    *,
    trials: int | None = None,
    workers: int = 1,
) -> int:
    """The smallest ``k`` whose estimated time is within ``tolerance`` of the best.

    Without ``trials``, a size's time is that of one trial row at its throughput
    (``1 / rate``): the fastest size wins. With ``trials`` (of the family, trained at
    once) and ``workers``, a size also has to keep the workers busy: ``m = ceil(trials /
    k)`` packs each visit every partition, one pack per worker at a time, so an epoch
    takes about ``m * (k / rate) / min(m, workers)`` row-times (a pack of ``k`` trains a
    row of each of its trials in ``k / rate``). Sizes above ``trials`` are not taken.
    Measured here (``benchmarks/peers.py --setting small-lrs``): 16 trials on 2 workers
    in one pack of 16 left one worker idle all run; two packs of 8 keep both busy.

    Smaller packs leave the scheduler more freedom (a pack needs ``k`` trials whose next
    partition coincides), so a size that is barely faster than a smaller one is not taken.

    Raises:
        ConfigError: The curve is empty, ``tolerance`` is not in [0, 1), or ``trials``
            or ``workers`` is not a positive int.
    """
    if not curve:
        raise ConfigError("choose_pack_size needs a measured curve, got none")
    if not 0 <= tolerance < 1:
        raise ConfigError(f"tolerance must be in [0, 1), got {tolerance!r}")
    for name, value in (("trials", 1 if trials is None else trials), ("workers", workers)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a positive int, got {value!r}")
    sizes = {k: rate for k, rate in curve.items() if rate > 0}
    if trials is not None:
        sizes = {k: rate for k, rate in sizes.items() if k <= trials} or {min(curve): 1.0}
    if not sizes:
        return min(curve)

    def cost(k: int) -> float:
        if trials is None:
            return 1.0 / sizes[k]
        packs = -(-trials // k)
        return packs * (k / sizes[k]) / min(packs, workers)

    best = min(cost(k) for k in sizes)
    return min(k for k in sizes if (1 - tolerance) * cost(k) <= best)
