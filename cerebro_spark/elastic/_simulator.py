"""The execution model and simulator (RubberBand §4.2, Alg. 1), adapted to MOP.

An *allocation* gives every stage of an :class:`~cerebro_spark.search.ExperimentSpec` its
workers ``W_i``. :meth:`Simulator.to_dag` turns spec and allocation into a DAG of tasks,
stage by stage from the frontier (RubberBand §4.2, "DAG construction"):

* **DRIVER_START** (``driver_start_seconds``): a fresh run's driver, from ``run`` to its
  first request for instances; not billed (a re-plan has none).
* **SCALE** (``scale_seconds + (n - 1) * scale_seconds_each`` for ``n`` new instances):
  the stage needs more workers than are held: a blocking request to the provider, billed
  from its start (every instance of it: where a provider starts them one after another,
  the later ones may start billing a little later, which the plan does not count).
* **INIT_INSTANCE** (``worker_start_seconds + share * partition_load_seconds``): the new
  workers start and load their partitions in parallel, after SCALE. Starting from none,
  worker ``k`` of ``W`` loads partitions ``i = k mod W`` (the pool's placement) and, past
  ``P`` workers, one replica each: ``share = ceil(P / W)``, ``max(P, W)`` loads in all.
  Joining held workers, each new one loads ``ceil(P / W)`` replicas (the pool's
  ``replica_share``). :func:`partition_moves` is the one place this is counted, for the
  time and for the data ingress alike.
* **REHOME** (``ceil(L / W_i) * partition_load_seconds``): the stage needs fewer workers:
  the leaving workers' ``L = min(P, ceil((W_(i-1) - W_i) * P / W_(i-1)))`` partitions are
  read again by the survivors; the leaving instances are released at the stage boundary.
* **TRAIN**: the stage's units under model hopper parallelism. A trial-epoch on a group of
  ``g`` workers takes ``T(g) = P * (unit / scaling(g) + hop) + validation``
  (:func:`~._profile.trial_epoch`); a stage whose cohorts ``j`` have ``n_j`` trials of
  ``e_j`` epochs on groups of ``g_j`` takes ``max(sum_j n_j g_j e_j T(g_j) / W_i, max_j
  e_j T(g_j))``: MOP keeps all ``W_i`` workers busy while there is work, and no trial can
  go faster than its own epochs in sequence (``e * max(n T / W, T)`` for one cohort). Per
  unit nodes would be meaningless: with MOP any worker runs any trial's next unit, so the
  stage is one node.

  **Packs** (``pack_size`` ``k > 1``, issue 27): trials of a cohort trained one worker
  each pack ``k_j = min(k, n_j)`` at a time; a pack trains a partition in ``k_j * unit /
  packing(k_j)`` and hops its ``k_j`` checkpoints. A trial-epoch then takes ``T = P * k_j
  * (unit / packing(k_j) + hop) + validation`` (its pack's passes in sequence;
  validation units are not packed), but costs the workers only ``P * (unit /
  packing(k_j) + hop) + validation`` per trial: the work term sums the latter, the
  longest-trial term takes the former. ``k = 1`` is the formula above.
* **SYNC**: the end of the stage (zero latency).

**Stages the clock closes** (``spec.clock``: SEER §5): the procedure closes its stage ``k``
at its planned end (experiment time from ``run``) once every member trained one epoch,
whatever epochs the stage was given; a run whose start-up or workers make the stage late
trains fewer, and the trials it leaves untrained are trained in later stages (SEER's
``epochs`` cap). Then the run's rounds are replayed (:meth:`StageClock.rounds
<cerebro_spark.search.StageClock.rounds>`) on the allocation's mean times -- a round of
``n_j`` trials per bracket on ``W`` workers takes the TRAIN formula for one epoch each,
a stage's first round starts after its SCALE, INIT_INSTANCE or REHOME -- and counted into
the spec's stages in order (stage ``i`` is its ``e_i`` rounds, as the elastic controller
counts them): a stage's TRAIN is the sum of its rounds (with the sampled latencies), and a
stage the run never reaches (it ended before) takes no time, no resize and no money. A
re-plan's stages left (or ``running`` workers) are priced by their epochs.

Every node's only predecessor is the frontier, so the DAG is a chain and its critical path
(Alg. 1 ``sample_duration``) is the running sum of the latencies: :meth:`Simulator.run`
sums the same per-stage pieces :meth:`Simulator.to_dag` shows (memoized per stage, worker
count and predecessor), without building nodes.

Latencies are sampled from normal distributions with the profile's means and spreads
(truncated at 0), from a seeded ``numpy.random.Generator``; the critical path is averaged
over the samples. Every allocation a :class:`Simulator` sees uses the same samples (common
random numbers), so allocations compare fairly and results repeat. A profile without
spreads is simulated once, on plain floats (the fast path: the same code, on numbers).

**Cost** (RubberBand §4.2): per-instance billing charges every instance from its request
(the start of its SCALE) to its release (the end of the last stage that needs it, or the
end of the search), by :meth:`PriceCatalog.billed_seconds` (granularity and minimum);
per-function billing charges only the worker-seconds of INIT_INSTANCE and TRAIN. Data
ingress adds every partition load at the catalog's price per GB. Instances are
``ceil(W_i / executors per instance)``; the newest are released first. The **time** is
wall time from ``run`` to the last SYNC, start-up included.

**Re-planning** (``running``): when a search is planned again mid-run, ``running`` workers
are up and loaded at ``t = 0``. Keeping them costs no SCALE, worker start or partition
load; growing beyond them pays those as usual for the new workers (which load replicas);
shrinking below them re-homes and releases them at ``t = 0``. Their instances' minimum
charge was paid when they started: they are billed only for the seconds they are held
from ``t = 0`` (rounded to the granularity), and released last.

A spec with ``fixed_seconds`` (a deadline-bound procedure: ASHA or HyperSched with a
deadline) runs until ``fixed_seconds`` after ``t = 0`` -- the procedure's clock starts
when the experiment is built, before any worker -- or until its start-up ends, if later:
it ends at ``max(start-up, fixed_seconds)``.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from cerebro_spark.elastic._prices import InstancePrice, PriceCatalog
from cerebro_spark.elastic._profile import Latency, TypeProfile, trial_epoch
from cerebro_spark.errors import ConfigError
from cerebro_spark.search._stages import Cohort, ExperimentSpec, StageClock, StageSpec


class NodeKind(str, enum.Enum):
    """Task types of the DAG (RubberBand §4.2)."""

    DRIVER_START = "driver_start"
    SCALE = "scale"
    INIT_INSTANCE = "init_instance"
    REHOME = "rehome"
    TRAIN = "train"
    SYNC = "sync"


@dataclasses.dataclass(frozen=True)
class Node:
    """One task: its kind, stage, sampled latencies and predecessors (indices)."""

    kind: NodeKind
    stage: int
    latency: np.ndarray
    preds: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class StageOutcome:
    """One stage of a simulated allocation (means over the samples).

    Attributes:
        trials: Live trials.
        epochs: Most epochs a trial trains in the stage.
        workers: ``W_i``.
        instances: Instances held during the stage.
        groups: Group size of each cohort.
        start: When its training starts (after SCALE, INIT_INSTANCE or REHOME).
        end: When it ends (its SYNC).
        usd: Dollars charged to it (the compute of its time window, the minimum charge of
            instances released after it, the data it loaded).
        loads: Partition loads it made (initial, replicas, re-homing).
    """

    trials: int
    epochs: int
    workers: int
    instances: int
    groups: tuple[int, ...]
    start: float
    end: float
    usd: float
    loads: int = 0

    @property
    def seconds(self) -> float:
        """Training seconds of the stage."""
        return self.end - self.start

    def to_dict(self) -> dict[str, Any]:
        """Return the stage as JSON values."""
        return {
            "trials": self.trials,
            "epochs": self.epochs,
            "workers": self.workers,
            "instances": self.instances,
            "group": max(self.groups),
            "groups": list(self.groups),
            "start": self.start,
            "end": self.end,
            "seconds": self.seconds,
            "usd": self.usd,
            "partition_loads": self.loads,
        }


@dataclasses.dataclass(frozen=True)
class Outcome:
    """A simulated allocation: mean time and cost, and the stages.

    Attributes:
        workers: The allocation.
        seconds: Mean wall time from ``run`` to the last SYNC.
        usd: Mean total cost.
        compute_usd: Of which instances (or functions).
        data_usd: Of which data ingress.
        loads: Partition loads (initial, replicas, re-homing).
        stages: Per stage.
    """

    workers: tuple[int, ...]
    seconds: float
    usd: float
    compute_usd: float
    data_usd: float
    loads: int
    stages: tuple[StageOutcome, ...]


def partition_moves(partitions: int, held: int, workers: int) -> tuple[int, int]:
    """Partition loads of going from ``held`` workers to ``workers`` (module docstring).

    Returns:
        The loads of the busiest worker (they are the critical path: workers load in
        parallel) and the loads in all (the data ingress).
    """
    p = partitions
    if workers > held:
        share = math.ceil(p / workers)
        if held == 0:  # placement i mod W, then one replica each past P workers
            return share, max(p, workers)
        return share, (workers - held) * share  # replicas of a fair share each
    if workers < held:
        moved = min(p, math.ceil((held - workers) * p / held))
        return math.ceil(moved / workers), moved
    return 0, 0


Samples = Any
"""Sampled seconds or dollars: a float when a simulation has one sample (a profile without
spreads: the fast path), else an array of the samples."""


class _Piece(NamedTuple):
    """A stage's part of the chain, given the workers before it and its own (sampled)."""

    kind: NodeKind | None  # what precedes training: INIT_INSTANCE (after SCALE), REHOME, none
    scale: Samples  # SCALE's latency
    latency: Samples  # INIT_INSTANCE's or REHOME's latency
    before: Samples  # scale + latency: from the previous SYNC to the start of training
    train: Samples  # TRAIN's latency (unused for fixed_seconds)
    busy: Samples  # worker-seconds of training (unused for fixed_seconds)
    new_workers: int
    loads: int


class _Trace(NamedTuple):
    """A simulated allocation before the means, per stage."""

    starts: list[Samples]
    ends: list[Samples]
    compute: list[Samples]
    loads: list[int]
    data_usd: list[float]


class Simulator:
    """Simulates allocations of one spec on one instance type (see the module docstring).

    Args:
        spec: The search's stages.
        profile: The workload on the instance type.
        catalog: Billing rules.
        price: The instance type's price.
        samples: Latency samples per simulation (1 when the profile has no spread).
        seed: Seed of the samples.
        running: Workers up and loaded at ``t = 0`` (re-planning a running search; module
            docstring).
        pack_size: The most trials in one packed unit (the config's ``pack``; 1: off).

    Raises:
        ConfigError: ``samples < 1``, ``running < 0`` or ``pack_size < 1``.
    """

    def __init__(
        self,
        spec: ExperimentSpec,
        profile: TypeProfile,
        catalog: PriceCatalog,
        price: InstancePrice,
        *,
        samples: int = 32,
        seed: int = 0,
        running: int = 0,
        pack_size: int = 1,
    ) -> None:
        if isinstance(pack_size, bool) or not isinstance(pack_size, int) or pack_size < 1:
            raise ConfigError(f"pack_size must be an integer >= 1, got {pack_size!r}")
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
            raise ConfigError(f"samples must be an integer >= 1, got {samples!r}")
        if isinstance(running, bool) or not isinstance(running, int) or running < 0:
            raise ConfigError(f"running must be a number of workers >= 0, got {running!r}")
        self.spec = spec
        self.profile = profile
        self.catalog = catalog
        self.price = price
        self.running = running
        self.pack_size = pack_size
        spreads = [
            profile.unit.spread,
            profile.hop.spread,
            profile.validation.spread,
            profile.worker_start.spread,
            profile.scale.spread,
            profile.load.spread,
            profile.driver_start.spread,
        ]
        self.samples = samples if any(s > 0 for s in spreads) else 1
        rng = np.random.default_rng(seed)
        self._clock = self._clock_of(spec, running)
        widest = max(len(stage.cohorts) for stage in spec.stages)
        if self._clock is not None:
            widest = max(widest, len(self._clock.resources))
        # Standard normals, by stage: [scale, start, load, then unit, hop, validation per cohort].
        self._z = rng.standard_normal((len(spec.stages), 3 + 3 * widest, self.samples))
        driver_z = rng.standard_normal(self.samples)  # drawn last: earlier samples unchanged
        self._epoch: dict[tuple[int, int], tuple[float, float]] = {}
        self._groups: dict[tuple[int, int], tuple[int, ...]] = {}
        self._useful: dict[int, int] = {}
        self._tables: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._trains: dict[tuple[int, int], tuple[Samples, Samples]] = {}
        self._scalar = self.samples == 1
        self._driver: Samples = 0.0  # a fresh run's DRIVER_START (a re-plan has none)
        if running == 0:
            self._driver = self._sample(profile.driver_start, driver_z)
        self._pieces: dict[tuple[int, int, int], _Piece] = {}
        self._evaluated: dict[tuple[int, ...], tuple[float, float]] = {}
        self._memo: dict[tuple[int, ...], Outcome] = {}
        self._replayed: dict[tuple[int, ...], list[list[tuple[int, ...]]]] = {}
        self._clocked_trains: dict[tuple[int, ...], list[tuple[Samples, Samples] | None]] = {}

    # -- the model --------------------------------------------------------------------------

    def epoch_seconds(self, group: int) -> float:
        """Mean seconds of one trial-epoch on a group of ``group`` workers, unpacked."""
        return self.epoch_costs(group, 1)[0]

    def epoch_costs(self, group: int, pack: int) -> tuple[float, float]:
        """Mean trial-epoch seconds and worker-seconds per trial, in packs of ``pack``.

        On a group of ``group`` workers (``pack`` 1) or in packs of ``pack`` trials on one
        worker each (``group`` 1); memoized.
        """
        costs = self._epoch.get((group, pack))
        if costs is None:
            p = self.profile
            costs = self._epoch[(group, pack)] = self._costs(
                p.unit.mean, p.hop.mean, p.validation.mean, group, pack
            )
        return costs

    def pack_of(self, cohort: Cohort, group: int) -> int:
        """How many of ``cohort``'s trials train in one pack on groups of ``group``."""
        if group > 1 or cohort.resources > 1:
            return 1  # a group unit is never packed
        return min(self.pack_size, cohort.trials)

    def _costs(
        self, unit: Samples, hop: Samples, validation: Samples, group: int, pack: int
    ) -> tuple[Samples, Samples]:
        """A trial-epoch's seconds and its worker-seconds (the module docstring)."""
        p = self.profile
        share = unit / p.packing(pack)  # a member's part of its pack's pass
        latency = trial_epoch(p.partitions, pack * share, pack * hop, validation, p.scaling(group))
        if pack == 1:
            return latency, latency
        return latency, trial_epoch(p.partitions, share, hop, validation, 1.0)

    def groups(self, index: int, workers: int) -> tuple[int, ...]:
        """The group size of each cohort of stage ``index`` on ``workers`` workers.

        A cohort with ``resources > 1`` (SEER) trains on ``min(resources, W)``. Cohorts
        with ``resources == 1`` share the smallest group size ``g <= floor(W / trials)``
        (a fair share, at most ``P``) that makes the stage shortest: larger groups only
        help while the stage has fewer trials than workers and the scaling keeps paying.
        """
        cached = self._groups.get((index, workers))
        if cached is not None:
            return cached
        stage = self._stage(index)
        fixed = [min(c.resources, workers) if c.resources > 1 else 0 for c in stage.cohorts]
        fair = max(1, min(workers // max(1, stage.trials), self.profile.partitions))
        g = 1
        if fair > 1 and not all(fixed):
            base = tuple(f or 1 for f in fixed)
            fixed_work, fixed_longest = self._work(stage.cohorts, base, free=False)
            work, longest = self._free_table(index)
            times = np.maximum(
                (fixed_work + work[:fair]) / workers, np.maximum(fixed_longest, longest[:fair])
            )
            g = int(np.argmax(times <= times.min() * (1 + 1e-9))) + 1
        best = tuple(f or g for f in fixed)
        self._groups[(index, workers)] = best
        return best

    def _free_table(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Worker-seconds and longest trial of the cohorts without fixed resources.

        For every group size ``g = 1..P`` (means), as arrays indexed by ``g - 1``.
        """
        cached = self._tables.get(index)
        if cached is None:
            cohorts = self._stage(index).cohorts
            work, longest = np.zeros(self.profile.partitions), np.zeros(self.profile.partitions)
            for g in range(1, self.profile.partitions + 1):
                work[g - 1], longest[g - 1] = self._work(cohorts, (g,) * len(cohorts), free=True)
            cached = self._tables[index] = (work, longest)
        return cached

    def _work(
        self, cohorts: Sequence[Cohort], groups: Sequence[int], *, free: bool | None = None
    ) -> tuple[float, float]:
        """Mean worker-seconds and longest trial of ``cohorts`` on ``groups``.

        Of all of them, or only those with (``free=False``) or without (``free=True``)
        fixed resources.
        """
        work, longest = 0.0, 0.0
        for cohort, g in zip(cohorts, groups, strict=True):
            if free is not None and (cohort.resources == 1) != free:
                continue
            t, per_trial = self.epoch_costs(g, self.pack_of(cohort, g))
            work += cohort.trials * g * cohort.epochs * per_trial
            longest = max(longest, cohort.epochs * t)
        return work, longest

    def stage_seconds(self, index: int, workers: int, groups: Sequence[int] | None = None) -> float:
        """Mean training seconds of stage ``index`` on ``workers`` (groups: the best)."""
        if groups is None:
            groups = self.groups(index, workers)
        work, longest = self._work(self._stage(index).cohorts, groups)
        return max(work / workers, longest)

    def widest(self, index: int) -> int:
        """Workers stage ``index`` could ever give work to: every trial's largest group."""
        p = self.profile.partitions
        return sum(
            c.trials * (c.resources if c.resources > 1 else p) for c in self._stage(index).cohorts
        )

    def useful_workers(self, index: int) -> int:
        """The fewest workers on which stage ``index`` trains as fast as it can.

        More workers than that leave the stage no shorter (its trials' groups cannot
        grow, or no longer pay), only dearer. Found by bisection where the stage's time
        cannot grow with its workers -- every group size possible on ``W`` is possible on
        ``W + 1`` -- else (a cohort's group is forced to ``min(resources, W)``, which a
        scaling below 1 makes slower) by trying every ``W``.
        """
        cached = self._useful.get(index)
        if cached is not None:
            return cached
        low, high = 1, self.widest(index)
        if any(c.resources > 1 for c in self._stage(index).cohorts):
            times = [self.stage_seconds(index, w) for w in range(1, high + 1)]
            fastest = min(times)
            high = next(w for w, t in enumerate(times, 1) if t <= fastest * (1 + 1e-9))
        else:
            fastest = self.stage_seconds(index, high)
            while low < high:
                middle = (low + high) // 2
                if self.stage_seconds(index, middle) <= fastest * (1 + 1e-9):
                    high = middle
                else:
                    low = middle + 1
        self._useful[index] = high
        return high

    def _stage(self, index: int) -> StageSpec:
        return self.spec.stages[index]

    def _sample(self, latency: Latency, z: np.ndarray) -> Samples:
        if self._scalar:
            if latency.spread == 0:
                return latency.mean
            return max(0.0, latency.mean + latency.spread * float(z[0]))
        if latency.spread == 0:
            return np.full(z.shape, latency.mean)
        return np.maximum(0.0, latency.mean + latency.spread * z)

    def _maximum(self, a: Samples, b: Samples) -> Samples:
        return max(a, b) if self._scalar else np.maximum(a, b)

    def _mean(self, value: Samples) -> float:
        return float(value) if self._scalar else float(np.mean(value))

    def _train(self, index: int, workers: int) -> tuple[Samples, Samples]:
        """Stage ``index`` on ``workers``: its training seconds and busy worker-seconds."""
        cached = self._trains.get((index, workers))
        if cached is not None:
            return cached
        profile, z = self.profile, self._z[index]
        work: Samples = 0.0
        longest: Samples = 0.0
        for j, (cohort, g) in enumerate(
            zip(self._stage(index).cohorts, self.groups(index, workers), strict=True)
        ):
            t, per_trial = self._costs(
                self._sample(profile.unit, z[3 + 3 * j]),
                self._sample(profile.hop, z[4 + 3 * j]),
                self._sample(profile.validation, z[5 + 3 * j]),
                g,
                self.pack_of(cohort, g),
            )
            work = work + cohort.trials * g * cohort.epochs * per_trial
            longest = self._maximum(longest, cohort.epochs * t)
        result = (self._maximum(work / workers, longest), work)
        self._trains[(index, workers)] = result
        return result

    def _piece(self, index: int, held: int, workers: int) -> _Piece:
        """Stage ``index`` on ``workers`` after ``held``: its part of the chain (memoized)."""
        key = (index, held, workers)
        cached = self._pieces.get(key)
        if cached is not None:
            return cached
        profile, z = self.profile, self._z[index]
        share, loads = partition_moves(profile.partitions, held, workers)
        kind: NodeKind | None = None
        scale: Samples = 0.0
        latency: Samples = 0.0
        if workers > held:
            kind = NodeKind.INIT_INSTANCE
            more = self._instances(workers) - self._instances(held)
            scale = self._sample(profile.scale, z[0]) + max(0, more - 1) * profile.scale_each
            latency = self._sample(profile.worker_start, z[1]) + share * self._sample(
                profile.load, z[2]
            )
        elif workers < held:
            kind = NodeKind.REHOME
            latency = share * self._sample(profile.load, z[2])
        train: Samples = 0.0
        busy: Samples = 0.0
        if self.spec.fixed_seconds is None:
            train, busy = self._train(index, workers)
        piece = _Piece(
            kind,
            scale,
            latency,
            scale + latency,
            train,
            busy,
            max(0, workers - held),
            loads,
        )
        self._pieces[key] = piece
        return piece

    # -- stages the clock closes -----------------------------------------------------------

    @staticmethod
    def _clock_of(spec: ExperimentSpec, running: int) -> StageClock | None:
        """The spec's clock where its rounds count into these stages (module docstring).

        Not for a re-plan's stages left, nor with workers running: priced by their epochs.
        """
        clock = spec.clock
        if clock is None or running or spec.fixed_seconds is not None:
            return None
        if clock.blocks != tuple(stage.epochs for stage in spec.stages):
            return None
        return clock

    def _bracket_groups(self, index: int, workers: int, clock: StageClock) -> list[int]:
        """Each bracket's group size in stage ``index`` on ``workers``.

        Its resources (at most ``workers``), or the group the stage's cohorts without
        resources get.
        """
        cohorts = self._stage(index).cohorts
        groups = self.groups(index, workers)
        free = next((g for c, g in zip(cohorts, groups, strict=True) if c.resources == 1), 1)
        return [min(p, workers) if p > 1 else free for p in clock.resources]

    def _replay(self, key: tuple[int, ...], clock: StageClock) -> list[list[tuple[int, ...]]]:
        """The rounds the run trains on allocation ``key``, per stage of the spec.

        In each, the trials of every bracket that train (memoized; the module docstring).
        """
        cached = self._replayed.get(key)
        if cached is not None:
            return cached
        firsts = [0]
        for rounds in clock.blocks[:-1]:
            firsts.append(firsts[-1] + rounds)

        def stage_of(round_index: int) -> int:
            return max(i for i, first in enumerate(firsts) if first <= round_index)

        def seconds(round_index: int, training: tuple[int, ...]) -> tuple[float, float]:
            index = stage_of(round_index)
            before = 0.0
            if round_index == firsts[index]:
                held = self.running if index == 0 else key[index - 1]
                before = self._mean(self._piece(index, held, key[index]).before)
            if round_index == 0:
                before += self._mean(self._driver)
            groups = self._bracket_groups(index, key[index], clock)
            kept = [j for j, n in enumerate(training) if n]
            work, longest = self._work(
                [Cohort(training[j], 1, clock.resources[j]) for j in kept],
                [groups[j] for j in kept],
            )
            return before, max(work / key[index], longest)

        per_stage: list[list[tuple[int, ...]]] = [[] for _ in key]
        for round_index, training in enumerate(clock.rounds(seconds, self.spec.deadline)):
            per_stage[stage_of(round_index)].append(training)
        self._replayed[key] = per_stage
        return per_stage

    def _clocked(self, key: tuple[int, ...]) -> list[tuple[Samples, Samples] | None] | None:
        """Per stage of ``key``, its training seconds and busy worker-seconds by the clock.

        Where the clock closes the procedure's stages: ``None`` for a stage the run ended
        before. ``None`` when the spec has no clock that applies (memoized).
        """
        clock = self._clock
        if clock is None:
            return None
        cached = self._clocked_trains.get(key)
        if cached is None:
            cached = self._clocked_trains[key] = [
                self._rounds_train(i, key[i], rounds, clock) if rounds else None
                for i, rounds in enumerate(self._replay(key, clock))
            ]
        return cached

    def trained(self, workers: Sequence[int]) -> int:
        """Trial-epochs the run trains on an allocation.

        The spec's, or, where the clock closes the procedure's stages, those of the rounds
        it replays (fewer on an allocation that makes the stages late).

        Raises:
            ConfigError: The allocation does not give every stage at least one worker.
        """
        key = self._check(workers)
        if self._clock is None:
            return sum(stage.trial_epochs for stage in self.spec.stages)
        replayed = self._replay(key, self._clock)
        return sum(sum(training) for rounds in replayed for training in rounds)

    def _rounds_train(
        self, index: int, workers: int, rounds: list[tuple[int, ...]], clock: StageClock
    ) -> tuple[Samples, Samples]:
        """Training seconds and busy worker-seconds of ``rounds`` in stage ``index``.

        Each round is the TRAIN formula for one epoch of its trials, on the stage's sampled
        latencies (bracket ``j`` samples as the stage's cohort ``j`` does).
        """
        profile, z = self.profile, self._z[index]
        groups = self._bracket_groups(index, workers, clock)
        costs: dict[tuple[int, int], tuple[Samples, Samples]] = {}

        def cost(j: int, trials: int) -> tuple[Samples, Samples]:
            grouped = groups[j] > 1 or clock.resources[j] > 1
            pack = 1 if grouped else min(self.pack_size, trials)
            found = costs.get((j, pack))
            if found is None:
                found = costs[(j, pack)] = self._costs(
                    self._sample(profile.unit, z[3 + 3 * j]),
                    self._sample(profile.hop, z[4 + 3 * j]),
                    self._sample(profile.validation, z[5 + 3 * j]),
                    groups[j],
                    pack,
                )
            return found

        train: Samples = 0.0
        busy: Samples = 0.0
        for training in rounds:
            work: Samples = 0.0
            longest: Samples = 0.0
            for j, trials in enumerate(training):
                if trials:
                    t, per_trial = cost(j, trials)
                    work = work + trials * groups[j] * per_trial
                    longest = self._maximum(longest, t)
            train = train + self._maximum(work / workers, longest)
            busy = busy + work
        return train, busy

    # -- the DAG ----------------------------------------------------------------------------

    def to_dag(self, workers: Sequence[int]) -> list[Node]:
        """Build the DAG of an allocation (RubberBand §4.2, adapted; module docstring).

        Built from the same per-stage pieces :meth:`run` sums; a chain (every node's
        predecessor is the frontier).
        """
        key = self._check(workers)
        clocked = self._clocked(key)
        nodes: list[Node] = []
        frontier: tuple[int, ...] = ()
        held = self.running
        now = np.zeros(self.samples)

        def add(kind: NodeKind, stage: int, latency: Samples) -> None:
            nonlocal frontier, now
            samples = np.broadcast_to(np.asarray(latency, dtype=float), now.shape).copy()
            nodes.append(Node(kind, stage, samples, frontier))
            frontier = (len(nodes) - 1,)
            now = now + samples

        if self.running == 0 and (
            self.profile.driver_start.mean or self.profile.driver_start.spread
        ):
            add(NodeKind.DRIVER_START, 0, self._driver)
        for i, w in enumerate(key):
            train = None if clocked is None else clocked[i]
            if clocked is not None and train is None:
                w = held  # the run ended before this stage: nothing changes
            piece = self._piece(i, held, w)
            if piece.kind is NodeKind.INIT_INSTANCE:
                add(NodeKind.SCALE, i, piece.scale)
            if piece.kind is not None:
                add(piece.kind, i, piece.latency)
            if self.spec.fixed_seconds is not None:
                add(NodeKind.TRAIN, i, np.maximum(0.0, self.spec.fixed_seconds - now))
            elif clocked is not None:
                add(NodeKind.TRAIN, i, 0.0 if train is None else train[0])
            else:
                add(NodeKind.TRAIN, i, piece.train)
            add(NodeKind.SYNC, i, 0.0)
            held = w
        return nodes

    @staticmethod
    def critical_path(nodes: Sequence[Node]) -> list[np.ndarray]:
        """Finish times of every node per sample (Alg. 1 ``sample_duration``)."""
        finish: list[np.ndarray] = []
        for node in nodes:  # built in topological order
            start = np.max([finish[j] for j in node.preds], axis=0) if node.preds else 0.0
            finish.append(start + node.latency)
        return finish

    # -- a simulation -----------------------------------------------------------------------

    def _check(self, workers: Sequence[int]) -> tuple[int, ...]:
        key = tuple(int(w) for w in workers)
        if len(key) != len(self.spec.stages) or min(key) < 1:
            raise ConfigError(
                f"an allocation gives each of the {len(self.spec.stages)} stages >= 1 worker, "
                f"got {list(key)}"
            )
        return key

    def evaluate(self, workers: Sequence[int]) -> tuple[float, float]:
        """Mean seconds and dollars of an allocation (memoized; what :meth:`run` gives).

        The planner's inner loop: no per-stage breakdown is built.

        Raises:
            ConfigError: The allocation does not give every stage at least one worker.
        """
        key = tuple(workers)
        cached = self._evaluated.get(key)
        if cached is None:
            key = self._check(key)
            trace = self._trace(key)
            usd = self._mean(sum(trace.compute)) + sum(trace.data_usd)
            cached = self._evaluated[key] = (self._mean(trace.ends[-1]), usd)
        return cached

    @property
    def explored(self) -> Mapping[tuple[int, ...], tuple[float, float]]:
        """Every allocation simulated so far, with its mean seconds and dollars."""
        return self._evaluated

    def run(self, workers: Sequence[int]) -> Outcome:
        """Simulate an allocation: mean time and cost over the samples (memoized).

        Raises:
            ConfigError: The allocation does not give every stage at least one worker.
        """
        key = self._check(workers)
        cached = self._memo.get(key)
        if cached is None:
            cached = self._memo[key] = self._outcome(key)
        return cached

    def _outcome(self, key: tuple[int, ...]) -> Outcome:
        trace = self._trace(key)
        stages = tuple(
            StageOutcome(
                trials=stage.trials,
                epochs=stage.epochs,
                workers=w,
                instances=self._instances(w),
                groups=self.groups(i, w),
                start=self._mean(trace.starts[i]),
                end=self._mean(trace.ends[i]),
                usd=self._mean(trace.compute[i]) + trace.data_usd[i],
                loads=trace.loads[i],
            )
            for i, (stage, w) in enumerate(zip(self.spec.stages, key, strict=True))
        )
        compute_usd = self._mean(sum(trace.compute))
        data_usd = float(sum(trace.data_usd))
        outcome = Outcome(
            workers=key,
            seconds=self._mean(trace.ends[-1]),
            usd=compute_usd + data_usd,
            compute_usd=compute_usd,
            data_usd=data_usd,
            loads=sum(trace.loads),
            stages=stages,
        )
        self._evaluated.setdefault(key, (outcome.seconds, outcome.usd))
        return outcome

    def _instances(self, workers: int) -> int:
        return -(-workers // self.price.executors)

    def _trace(self, key: tuple[int, ...]) -> _Trace:
        """Simulate an allocation: per stage its start, end, compute dollars and loads.

        The chain of the DAG summed stage by stage (pieces memoized per stage, worker
        count and predecessor), and the bill alongside: under per-instance billing
        instances change only at stage boundaries (SCALE starts at the previous SYNC;
        released instances leave there), so a stage's window holds a constant number of
        instances; the minimum charge (and the rounding to the billing granularity) of
        the instances released after a stage is charged to that stage.
        """
        catalog = self.catalog
        fixed = self.spec.fixed_seconds
        per_instance = catalog.billing == "per_instance"
        instance_rate = self.price.usd_per_hour / 3600.0
        worker_rate = instance_rate / self.price.executors
        starts: list[Samples] = []
        ends: list[Samples] = []
        compute: list[Samples] = []
        loads: list[int] = []
        held = self.running
        current = self._instances(held)
        # Instances held, oldest first: [count, requested at, minimum paid before t = 0].
        stack: list[list[Any]] = [[current, 0.0, True]] if current else []

        def release(count: int, at: Samples, stage: int) -> None:
            while count > 0:
                piece = stack[-1]
                taken = min(piece[0], count)
                held_for = at - piece[1]
                billed = catalog.billed_seconds(held_for, minimum=not piece[2])
                compute[stage] = compute[stage] + taken * instance_rate * (billed - held_for)
                count -= taken
                piece[0] -= taken
                if piece[0] == 0:
                    stack.pop()

        clocked = self._clocked(key)
        now: Samples = self._driver
        for i, w in enumerate(key):
            train = None if clocked is None else clocked[i]
            if clocked is not None and train is None:
                w = held  # the run ended before this stage: nothing changes
            piece = self._piece(i, held, w)
            start = now + piece.before
            if clocked is not None:
                end = start + (0.0 if train is None else train[0])
                busy = 0.0 if train is None else train[1]
            elif fixed is None:
                end = start + piece.train
                busy = piece.busy
            else:  # one stage (ExperimentSpec checks): it ends at max(start-up, fixed)
                end = self._maximum(start, fixed)
                busy = w * (end - start)
            starts.append(start)
            ends.append(end)
            loads.append(piece.loads)
            if per_instance:
                need = self._instances(w)
                compute.append(need * instance_rate * (end - now))
                if need > current:
                    stack.append([need - current, now, False])
                elif need < current:
                    release(current - need, now, max(0, i - 1))
                current = need
            else:
                compute.append(worker_rate * (piece.new_workers * piece.latency + busy))
            held = w
            now = end
        if per_instance:  # at the end of the last stage the run reaches
            reached = len(key) if clocked is None else sum(t is not None for t in clocked)
            release(current, now, max(0, reached - 1))
        gb_usd = self.profile.partition_bytes / 1e9 * catalog.ingress_usd_per_gb
        return _Trace(starts, ends, compute, loads, [n * gb_usd for n in loads])
