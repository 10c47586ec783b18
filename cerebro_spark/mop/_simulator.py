"""Discrete-event simulation of a MOP schedule over known unit times (Cerebro §5.4).

An instance has ``p`` workers, worker ``j`` holding partition ``j`` only, and a unit-time
matrix ``T[i, j]``: the time of trial ``i``'s train unit on worker ``j``. The simulator runs
a :class:`~cerebro_spark.mop.MopScheduler` on it, completing units as simulated time
passes, and compares the makespan with the lower bound ``max(max worker load, max trial
total)``: no schedule beats the busiest worker's total work nor the longest trial's
sequential chain of units.

With group sizes (Cerebro §5.7), a trial with ``k > 1`` trains up to ``k`` partitions at
once on as many workers; a group unit takes the longest of its members' unit times
(data-parallel ranks wait for each other at every step), and the trial-total term of the
bound becomes ``total / k`` (each group's time is at least the mean of its members').

With packs (issue 27), trials with the same pack key train one partition together, up to
``pack_size`` at once on one worker; a pack of ``k`` takes ``pack_factors[k - 1]`` times
its longest member's unit time (a profile's measured time for ``k`` over that for one).
The worker-load term of the bound then prices every unit at the cheapest share of a pack,
``min_k pack_factors[k - 1] / k``; the trial-total term stands, since a pack takes at
least its members' unit times (``pack_factors`` starts at 1 and never decreases).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from cerebro_spark.errors import ConfigError
from cerebro_spark.mop._base import Assignment, SchedulingRule, Unit
from cerebro_spark.mop._scheduler import MopScheduler

CNN_MFLOPS: Mapping[str, float] = {
    "AlexNet": 727,
    "CaffeNet": 724,
    "SqueezeNet1-0": 837,
    "SqueezeNet1-1": 360,
    "VGG-f": 727,
    "VGG-m": 2000,
    "VGG-s": 3000,
    "VGG-m-2048": 2000,
    "VGG-m-1024": 2000,
    "VGG-m-128": 2000,
    "VGG-vd-16-atrous": 16000,
    "VGG-vd-16": 16000,
    "VGG-vd-19": 20000,
    "GoogleNet": 2000,
    "ResNet18": 2000,
    "ResNet34": 4000,
    "ResNet50": 4000,
    "ResNet101": 8000,
    "ResNet152": 11000,
    "ResNext-50-32x4d": 4000,
    "ResNext-101-32x4d": 8000,
    "ResNext-101-64x4d": 16000,
    "Inception-V3": 6000,
    "SE-ResNet-50": 4000,
    "SE-ResNet-101": 8000,
    "SE-ResNet-152": 11000,
    "SE-ResNeXt-50-32x4d": 4000,
    "SE-ResNeXt-101-32x4d": 8000,
    "SENet": 21000,
    "SE-BN-Inception": 2000,
    "DenseNet121": 3000,
    "DenseNet161": 8000,
    "DenseNet169": 3000,
    "DenseNet201": 4000,
    "MobileNet": 579,
}
"""Compute cost of the 35 CNNs of Cerebro's Appendix B, Table 7 (MFLOPs, as printed)."""

GPU_TFLOPS: Mapping[str, float] = {"K80": 5.6, "GTX 1080": 11.3, "Titan Xp": 12.1, "P100": 18.7}
"""Compute capacity of the four GPUs of Cerebro §5.4 (TFLOPS)."""


class ScheduleInstance:
    """Unit times of ``|S|`` trials on ``p`` workers; worker ``j`` holds partition ``j``.

    Trials are named ``"t0" ..``, workers ``"w0" ..``.

    Args:
        unit_times: ``T[i, j]``, time of trial ``i``'s unit on worker ``j`` (positive).

    Raises:
        ConfigError: ``unit_times`` is not a 2-d array of positive finite numbers with at
            least one worker.
    """

    def __init__(self, unit_times: NDArray[np.float64] | Sequence[Sequence[float]]) -> None:
        times = np.array(unit_times, dtype=np.float64)
        if times.ndim != 2 or times.shape[1] == 0 or not np.all(np.isfinite(times) & (times > 0)):
            raise ConfigError(
                f"unit_times {times.tolist()!r} must be a trials x workers matrix of positive "
                "finite times with at least one worker"
            )
        times.flags.writeable = False
        self.unit_times = times
        self.trials = tuple(f"t{i}" for i in range(times.shape[0]))
        self.workers = tuple(f"w{j}" for j in range(times.shape[1]))
        self._rows = times.tolist()  # plain floats: fast to index in estimate()
        self._trial_index = {t: i for i, t in enumerate(self.trials)}
        self._worker_index = {w: j for j, w in enumerate(self.workers)}

    @property
    def partitions(self) -> tuple[int, ...]:
        """Partition indices ``0 .. p-1``."""
        return tuple(range(len(self.workers)))

    @property
    def lower_bound(self) -> float:
        """``max(max worker load, max trial total)``, a lower bound on any makespan."""
        if not self.trials:
            return 0.0
        return float(max(self.unit_times.sum(axis=0).max(), self.unit_times.sum(axis=1).max()))

    def estimate(self, unit: Unit, worker: str) -> float:
        """Return the time of ``unit``'s trial on ``worker`` (for :class:`WorkAwareRule`)."""
        return float(self._rows[self._trial_index[unit.trial]][self._worker_index[worker]])


def homogeneous_instance(n_trials: int, n_workers: int, unit_time: float = 1.0) -> ScheduleInstance:
    """Return an instance where every unit takes ``unit_time`` (§5.4, homogeneous)."""
    return ScheduleInstance(np.full((n_trials, n_workers), unit_time))


def heterogeneous_instance(
    n_trials: int, n_workers: int, rng: np.random.Generator
) -> ScheduleInstance:
    """Return an instance with heterogeneous trials and workers as in §5.4.

    Each trial's cost is drawn with replacement from :data:`CNN_MFLOPS`, each worker's
    capacity from :data:`GPU_TFLOPS`; ``T[i, j] = cost_i / capacity_j`` (microseconds).
    """
    costs = rng.choice(np.array(list(CNN_MFLOPS.values())), size=n_trials)
    capacities = rng.choice(np.array(list(GPU_TFLOPS.values())), size=n_workers)
    return ScheduleInstance(costs[:, None] / capacities[None, :])


@dataclasses.dataclass(frozen=True)
class ScheduledUnit:
    """An assignment with its simulated start and end times."""

    assignment: Assignment
    start: float
    end: float


@dataclasses.dataclass(frozen=True)
class SimulationResult:
    """Outcome of :func:`simulate`.

    Attributes:
        makespan: Time the last unit ended.
        lower_bound: The instance's :attr:`ScheduleInstance.lower_bound`.
        schedule: Every unit run, in start order.
    """

    makespan: float
    lower_bound: float
    schedule: tuple[ScheduledUnit, ...]

    @property
    def ratio(self) -> float:
        """``makespan / lower_bound`` (1.0 is optimal; 1.0 for an empty instance)."""
        return self.makespan / self.lower_bound if self.lower_bound else 1.0


def simulate(
    instance: ScheduleInstance,
    rng: np.random.Generator,
    *,
    rule: SchedulingRule | None = None,
    visit_orders: Mapping[str, Sequence[int]] | None = None,
    group_sizes: Mapping[str, int] | None = None,
    pack_keys: Mapping[str, str] | None = None,
    pack_size: int = 1,
    pack_factors: Sequence[float] | None = None,
) -> SimulationResult:
    """Run one epoch of train units of ``instance`` through a :class:`MopScheduler`.

    Units that end at the same time all complete before idle workers are served again,
    as in Alg. 1's polling loop.

    Args:
        instance: Unit times.
        rng: Randomness for the scheduler's rule.
        rule: Scheduling rule; :class:`~cerebro_spark.mop.RandomizedRule` if None.
        visit_orders: Per-trial partition orders (see :class:`MopScheduler`); None for the
            fully dynamic rule.
        group_sizes: Trial id to its group size ``k`` (§5.7; missing: 1). A group unit
            takes the longest of its members' unit times.
        pack_keys: Trial id to its pack key (see :class:`MopScheduler`, "Packs").
        pack_size: Most trials in one pack (1: packing off).
        pack_factors: ``pack_factors[k - 1]``: the time of a pack of ``k`` over its
            longest member's unit time, for ``k = 1 .. pack_size``; starts at 1.0 and
            never decreases. Default ``1, 2, .., pack_size`` (a pack saves nothing).

    Returns:
        Makespan, lower bound and the schedule (one :class:`ScheduledUnit` per
        assignment; a group's under its rank-0 worker, a pack as one).

    Raises:
        ConfigError: ``pack_factors`` breaks the rules above.
    """
    scheduler = MopScheduler(
        trials=instance.trials,
        partitions=instance.partitions,
        workers={w: (j,) for j, w in enumerate(instance.workers)},
        rng=rng,
        rule=rule,
        visit_orders=visit_orders,
        validate=False,
        group_sizes=group_sizes,
        pack_keys=pack_keys,
        pack_size=pack_size,
    )
    factors = _pack_factors(pack_factors, scheduler.pack_size)
    starts: dict[str, float] = {}
    events: list[tuple[float, str]] = []
    schedule: list[ScheduledUnit] = []
    now = 0.0
    while True:
        for assignment in scheduler.assign():
            if assignment.packed:
                longest = max(instance.estimate(u, assignment.worker) for u in assignment.pack)
                end = now + factors[len(assignment.pack) - 1] * longest
            else:
                end = now + max(
                    instance.estimate(unit, worker)
                    for unit, worker in zip(assignment.units, assignment.workers, strict=True)
                )
            starts[assignment.worker] = now
            heapq.heappush(events, (end, assignment.worker))
        if not events:
            break
        now = events[0][0]
        while events and events[0][0] == now:
            _, worker = heapq.heappop(events)
            assignment = scheduler.running[worker]
            for unit in assignment.pack:
                scheduler.complete(unit)
            schedule.append(ScheduledUnit(assignment, starts[worker], now))
    schedule.sort(key=lambda s: (s.start, s.assignment.worker))
    bound = instance.lower_bound
    if instance.trials and (group_sizes or (pack_keys and pack_size > 1)):
        workers = len(instance.workers)
        sizes = np.ones(len(instance.trials))
        if group_sizes:
            sizes = np.array([min(max(1, group_sizes.get(t, 1)), workers) for t in instance.trials])
        share = np.ones(len(instance.trials))  # the cheapest time per unit, relative
        if pack_keys and pack_size > 1:
            cheapest = min(f / k for k, f in enumerate(factors[:pack_size], start=1))
            share = np.array(
                [
                    cheapest if t in pack_keys and sizes[i] == 1 else 1.0
                    for i, t in enumerate(instance.trials)
                ]
            )
        times = instance.unit_times
        load = (times * share[:, None]).sum(axis=0).max()
        bound = float(max(load, (times.sum(axis=1) / sizes).max()))
    return SimulationResult(now, bound, tuple(schedule))


def _pack_factors(factors: Sequence[float] | None, pack_size: int) -> tuple[float, ...]:
    """Validate the pack factors (see :func:`simulate`); default: no saving."""
    if factors is None:
        return tuple(float(k) for k in range(1, pack_size + 1))
    values = tuple(float(f) for f in factors)
    if (
        len(values) < pack_size
        or not values
        or values[0] != 1.0
        or not all(np.isfinite(values))
        or any(b < a for a, b in itertools.pairwise(values))
    ):
        raise ConfigError(
            f"pack_factors {list(values)!r} must give the time of a pack of k = 1 .. "
            f"pack_size={pack_size} over one unit's: finite, starting at 1.0, never "
            "decreasing"
        )
    return values
