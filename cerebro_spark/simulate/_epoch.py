"""Predicted makespan and driver load of one MOP epoch at any scale (issue 13, part 6).

:func:`predict_epoch` runs the engine's own :class:`~cerebro_spark.mop.MopScheduler`
(work-aware rule, validation units, the pool's placement of partitions on workers) on a
virtual clock, with every unit's time made of the measured parts of
:class:`~cerebro_spark.simulate.UnitOverheads`:

* a unit occupies its worker for its compute plus its hop (checkpoint read and write);
  workers are unequal as measured (``worker_spread``): worker speeds are the quantiles of
  a normal of that relative spread, dealt to the workers in a seeded order, and a unit's
  compute is scaled by its worker's factor;
* its result then reaches the driver, which spends ``driver_cpu_seconds`` on it (event log,
  state fold, scheduler, next task); the driver is one core, so results queue for it
  when they arrive faster than it handles them;
* the worker takes its next unit ``dispatch_seconds`` after the unit ended (what a real
  worker waits between units, the driver's own handling included), or once the driver
  has handled the result, if that is later;
* worker ``i`` is ready ``ready_at[i]`` seconds after the epoch starts (start-up: the
  first epoch of a run on workers still starting, 0 for later epochs);
* the epoch ends ``round_seconds`` after its last unit (the procedure's decisions); the
  next one starts ``between_rounds_seconds`` later (:attr:`EpochPrediction.period`).

With packs (``pack_size > 1``, issue 27) the scheduler packs trials due on one partition,
as the driver does (every simulated trial has one architecture): a pack of ``k`` occupies
its worker for ``k * compute / packing(k)`` (its slowest member's compute) plus ``k``
hops, and the driver handles its ``k`` results; ``packing`` is the profile's table of a
pack's throughput relative to one trial (default: packs gain nothing).

Worker ``k`` of ``p`` holds partitions ``k, k + p, ...`` when ``p <= P`` and partition
``k mod P`` (a replica) when ``p > P``, as the worker pool places them. The driver load is
its CPU over the epoch, as a fraction of one core: ``units * driver_cpu / makespan``.

:func:`epoch_bound` is the closed form the simulation is checked against: no epoch is
shorter than the total worker time over ``p``, nor than one trial's units in sequence, nor
than the driver's CPU for all units (with packs, train compute is priced at the best
share of a pack of up to ``pack_size``).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import statistics
from collections.abc import Mapping, Sequence

import numpy as np

from cerebro_spark.backends._placement import initial_shares
from cerebro_spark.elastic._profile import Scaling, parse_scaling
from cerebro_spark.errors import ConfigError
from cerebro_spark.mop import MopScheduler, WorkAwareRule
from cerebro_spark.simulate._overheads import UnitOverheads
from cerebro_spark.units import UnitKind


@dataclasses.dataclass(frozen=True)
class EpochPrediction:
    """One predicted epoch.

    Attributes:
        workers: ``p``.
        trials: ``|S|``.
        partitions: ``P``.
        units: Units of the epoch (``2 |S| P``: train and validation).
        makespan: Seconds from the epoch's start to its end.
        bound: :func:`epoch_bound` (seconds).
        driver_cpu: Driver CPU seconds the epoch costs.
        worker_busy: Share of the workers' time (from ready to the last unit) spent in units.
        between_rounds: Seconds from the epoch's end to the next one's start.
    """

    workers: int
    trials: int
    partitions: int
    units: int
    makespan: float
    bound: float
    driver_cpu: float
    worker_busy: float
    between_rounds: float = 0.0

    @property
    def period(self) -> float:
        """Seconds per epoch in a run of many: the makespan and the gap to the next."""
        return self.makespan + self.between_rounds

    @property
    def driver_load(self) -> float:
        """Driver CPU over the epoch, as a fraction of one core."""
        return self.driver_cpu / self.makespan if self.makespan > 0 else 0.0


def placement(workers: int, partitions: int) -> dict[str, tuple[int, ...]]:
    """Partitions each worker holds: ``k, k + p, ...`` (``p <= P``), else ``k mod P``."""
    _check_count("workers", workers)
    _check_count("partitions", partitions)
    if workers <= partitions:
        shares = initial_shares(workers, partitions)  # as the worker pool starts them
        return {f"w{k}": tuple(share) for k, share in enumerate(shares)}
    return {f"w{k}": (k % partitions,) for k in range(workers)}


def epoch_bound(
    overheads: UnitOverheads,
    *,
    trials: int,
    partitions: int,
    workers: int,
    driver_cpu_seconds: float = 0.0,
    pack_size: int = 1,
    packing: Mapping[int, float] | None = None,
) -> float:
    """The least makespan any schedule of the epoch can have (seconds).

    ``max(total worker time / p, one trial's units in sequence, driver CPU of all units)``
    plus the round's own overhead, where a unit's worker time is its compute, hop and
    dispatch (the last unit's dispatch is not waited for). With packs of up to
    ``pack_size``, a train unit's compute counts at its cheapest share of a pack,
    ``1 / max packing(k)``, and its dispatch at ``1 / pack_size``, in the worker time
    (:func:`predict_epoch`).
    """
    _check_count("trials", trials)
    _check_count("pack_size", pack_size)
    gain = _gain(packing)
    best = max(gain(k) for k in range(1, pack_size + 1))
    dispatch = overheads.dispatch_seconds
    train = overheads.unit_seconds("train") + dispatch
    validate = overheads.unit_seconds("validate") + dispatch
    per_trial = partitions * (train + validate)
    # a pack's members share its compute (at best 1 / best each) and its one dispatch
    packed = overheads.train_seconds / best + overheads.hop_seconds + dispatch / pack_size
    shared = partitions * (packed + validate)
    units = 2 * trials * partitions
    work = max(trials * shared / workers, per_trial) - dispatch
    return max(work, units * driver_cpu_seconds) + overheads.round_seconds


def predict_epoch(
    overheads: UnitOverheads,
    *,
    trials: int,
    partitions: int,
    workers: int,
    driver_cpu_seconds: float = 0.0,
    ready_at: Sequence[float] | None = None,
    trial_scale: Sequence[float] | None = None,
    seed: int = 0,
    pack_size: int = 1,
    packing: Mapping[int, float] | None = None,
) -> EpochPrediction:
    """Simulate one epoch of ``trials`` trials on ``workers`` workers (module docstring).

    Args:
        overheads: Measured unit times and overheads.
        trials: ``|S|``.
        partitions: ``P``.
        workers: ``p``.
        driver_cpu_seconds: Driver CPU per unit (``benchmarks/driver_scale.py``).
        ready_at: Seconds after the epoch's start each worker is ready (default: all at 0).
        trial_scale: Per trial, a factor on its compute (heterogeneous trials; default 1).
        seed: Seed of the scheduler's generator.
        pack_size: Most trials in one packed unit (1: off).
        packing: A pack of ``k``'s throughput relative to one trial, by ``k`` (the
            profile's ``packing`` table; interpolated, flat past its largest size);
            default: no gain.

    Raises:
        ConfigError: A count below 1, a negative time or factor, ``ready_at`` /
            ``trial_scale`` of the wrong length, or a bad ``packing`` table.
    """
    _check_count("trials", trials)
    _check_count("pack_size", pack_size)
    gain = _gain(packing)
    held = placement(workers, partitions)
    if driver_cpu_seconds < 0 or not math.isfinite(driver_cpu_seconds):
        raise ConfigError(f"driver_cpu_seconds must be finite and >= 0, got {driver_cpu_seconds}")
    ready = [0.0] * workers if ready_at is None else [float(r) for r in ready_at]
    scale = [1.0] * trials if trial_scale is None else [float(s) for s in trial_scale]
    for name, values, count in (("ready_at", ready, workers), ("trial_scale", scale, trials)):
        if len(values) != count or any(not (v >= 0 and math.isfinite(v)) for v in values):
            raise ConfigError(
                f"{name} must hold {count} finite numbers >= 0, got {len(values)} values"
            )
    speeds = _worker_factors(workers, overheads.worker_spread, np.random.default_rng([seed, 1]))
    names = [f"t{i:05d}" for i in range(trials)]
    factor = dict(zip(names, scale, strict=True))
    compute = {
        UnitKind.TRAIN: (overheads.train_seconds, overheads.hop_seconds),
        UnitKind.VALIDATE: (overheads.validate_seconds, overheads.validate_hop_seconds),
    }

    def seconds(trial: str, kind: UnitKind) -> float:
        work, hop = compute[kind]
        return work * factor[trial] + hop

    scheduler = MopScheduler(
        trials=names,
        partitions=range(partitions),
        workers={},
        rng=np.random.default_rng(seed),
        rule=WorkAwareRule.per_trial(seconds),
        validate=True,
        pack_keys=dict.fromkeys(names, "one") if pack_size > 1 else None,
        pack_size=pack_size,
    )
    order = sorted(range(workers), key=lambda k: (ready[k], k))
    joins = [(ready[k], f"w{k}") for k in order]
    free: list[tuple[float, str]] = []  # (when the worker takes its next unit, worker)
    driver = 0.0  # when the driver is next free
    busy = 0.0
    now = 0.0
    last = 0.0
    while True:
        while joins and joins[0][0] <= now:
            _, worker = joins.pop(0)
            scheduler.add_worker(worker, held[worker])
        for assignment in scheduler.assign():
            members = assignment.pack
            work, hop = compute[assignment.unit.kind]
            k = len(members)
            slowest = max(factor[unit.trial] for unit in members)
            took = k * work * slowest * speeds[assignment.worker] / gain(k) + k * hop
            busy += took
            end = now + took
            handled = max(end, driver) + k * driver_cpu_seconds
            driver = handled
            last = max(last, end)
            heapq.heappush(
                free, (max(end + overheads.dispatch_seconds, handled), assignment.worker)
            )
        if scheduler.finished:
            break
        times = [q[0][0] for q in (free, joins) if q]
        if not times:
            raise ConfigError(
                f"no worker can run the remaining units of {trials} trials on "
                f"{partitions} partitions with {workers} workers"
            )
        now = min(times)
        while free and free[0][0] <= now:
            _, worker = heapq.heappop(free)
            for unit in scheduler.running[worker].pack:
                scheduler.complete(unit, worker=worker)
    units = 2 * trials * partitions
    window = sum(max(0.0, last - r) for r in ready)
    return EpochPrediction(
        workers=workers,
        trials=trials,
        partitions=partitions,
        units=units,
        makespan=max(last, driver) + overheads.round_seconds,
        bound=epoch_bound(
            overheads,
            trials=trials,
            partitions=partitions,
            workers=workers,
            driver_cpu_seconds=driver_cpu_seconds,
            pack_size=pack_size,
            packing=packing,
        ),
        driver_cpu=units * driver_cpu_seconds,
        worker_busy=busy / window if window > 0 else 0.0,
        between_rounds=overheads.between_rounds_seconds,
    )


def _gain(packing: Mapping[int, float] | None) -> Scaling:
    """``packing`` as a profile's table (checked by its rules); none: no gain."""
    return Scaling(name="none") if packing is None else parse_scaling(dict(packing), "packing")


def _worker_factors(workers: int, spread: float, rng: np.random.Generator) -> dict[str, float]:
    """Each worker's compute factor: normal quantiles of relative ``spread``, shuffled."""
    if spread <= 0:
        return {f"w{k}": 1.0 for k in range(workers)}
    normal = statistics.NormalDist(1.0, spread)
    factors = [max(0.1, normal.inv_cdf((k + 0.5) / workers)) for k in range(workers)]
    order = rng.permutation(workers)
    return {f"w{k}": factors[int(order[k])] for k in range(workers)}


def _check_count(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
