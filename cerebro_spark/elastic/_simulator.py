"""The execution model and simulator (RubberBand §4.2, Alg. 1), adapted to MOP.

An *allocation* gives every stage of an :class:`~cerebro_spark.search.ExperimentSpec` its
workers ``W_i``. :func:`to_dag` turns spec and allocation into a DAG of tasks, stage by
stage from the frontier (RubberBand §4.2, "DAG construction"):

* **SCALE** (``scale_seconds``): the stage needs more workers than the last one held: a
  blocking request to the provider, billed from its start.
* **INIT_INSTANCE** (``worker_start_seconds + ceil(P / W_i) * partition_load_seconds``):
  the new workers start and load their share of the partitions (as replicas: MOP holds each
  partition on some worker; ``P`` loads for the first stage, ``ceil(P / W_i)`` per new
  worker later), in parallel, after SCALE.
* **REHOME** (``ceil(L / W_i) * partition_load_seconds``): the stage needs fewer workers:
  the leaving workers' ``L = min(P, ceil((W_(i-1) - W_i) * P / W_(i-1)))`` partitions are
  read again by the survivors; the leaving instances are released at the stage boundary.
* **TRAIN**: the stage's units under model hopper parallelism. A trial-epoch on a group of
  ``g`` workers takes ``T(g) = P * (unit / scaling(g) + hop) + validation`` (a trial never
  runs two units at once); a stage whose cohorts ``j`` have ``n_j`` trials of ``e_j``
  epochs on groups of ``g_j`` takes ``max(sum_j n_j g_j e_j T(g_j) / W_i, max_j e_j
  T(g_j))``: MOP keeps all ``W_i`` workers busy while there is work, and no trial can go
  faster than its own epochs in sequence (``e * max(n T / W, T)`` for one cohort). Per
  unit nodes would be meaningless: with MOP any worker runs any trial's next unit, so the
  stage is one node.
* **SYNC**: the end of the stage (zero latency).

Latencies are sampled from normal distributions with the profile's means and spreads
(truncated at 0), from a seeded ``numpy.random.Generator``; the critical path (Alg. 1
``sample_duration``: a node finishes at its latency plus the latest finish of its
predecessors) is averaged over the samples. Every allocation a :class:`Simulator` sees uses
the same samples (common random numbers), so allocations compare fairly and results repeat.

**Cost** (RubberBand §4.2): per-instance billing charges every instance from its request
(the start of its SCALE) to its release (the end of the last stage that needs it, or the
end of the search), per the catalog's granularity and minimum; per-function billing charges
only the worker-seconds of INIT_INSTANCE and TRAIN. Data ingress adds every partition load
at the catalog's price per GB. Instances are ``ceil(W_i / executors per instance)``; the
newest are released first. The **time** is wall time from ``run`` to the last SYNC,
start-up included.

A spec with ``fixed_seconds`` (a deadline-bound procedure) trains for exactly that long.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from cerebro_spark.elastic._prices import InstancePrice, PriceCatalog
from cerebro_spark.elastic._profile import Latency, TypeProfile
from cerebro_spark.errors import ConfigError
from cerebro_spark.search._stages import ExperimentSpec, StageSpec


class NodeKind(str, enum.Enum):
    """Task types of the DAG (RubberBand §4.2)."""

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
    """

    trials: int
    epochs: int
    workers: int
    instances: int
    groups: tuple[int, ...]
    start: float
    end: float
    usd: float

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


class Simulator:
    """Simulates allocations of one spec on one instance type (see the module docstring).

    Args:
        spec: The search's stages.
        profile: The workload on the instance type.
        catalog: Billing rules.
        price: The instance type's price.
        samples: Latency samples per simulation (1 when the profile has no spread).
        seed: Seed of the samples.

    Raises:
        ConfigError: ``samples < 1``.
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
    ) -> None:
        if samples < 1:
            raise ConfigError(f"samples must be >= 1, got {samples}")
        self.spec = spec
        self.profile = profile
        self.catalog = catalog
        self.price = price
        spreads = [
            profile.unit.spread,
            profile.hop.spread,
            profile.validation.spread,
            profile.worker_start.spread,
            profile.scale.spread,
            profile.load.spread,
        ]
        self.samples = samples if any(s > 0 for s in spreads) else 1
        rng = np.random.default_rng(seed)
        widest = max(len(stage.cohorts) for stage in spec.stages)
        # Standard normals, by stage: [scale, start, load, then unit, hop, validation per cohort].
        self._z = rng.standard_normal((len(spec.stages), 3 + 3 * widest, self.samples))
        self._memo: dict[tuple[int, ...], Outcome] = {}
        self._groups: dict[tuple[int, int], tuple[int, ...]] = {}

    # -- the model --------------------------------------------------------------------------

    def groups(self, index: int, workers: int) -> tuple[int, ...]:
        """The group size of each cohort of stage ``index`` on ``workers`` workers.

        A cohort with ``resources > 1`` (SEER) trains on ``min(resources, W)``. Cohorts
        with ``resources == 1`` get the group size ``g <= floor(W / trials)`` (a fair share,
        at most ``P``) that makes the stage shortest: larger groups only help while the
        stage has fewer trials than workers and the scaling keeps paying.
        """
        cached = self._groups.get((index, workers))
        if cached is not None:
            return cached
        stage = self.spec.stages[index]
        fixed = [min(c.resources, workers) if c.resources > 1 else 0 for c in stage.cohorts]
        fair = max(1, min(workers // max(1, stage.trials), self.profile.partitions))
        best: tuple[int, ...] = tuple(g or 1 for g in fixed)
        best_seconds = self._stage_seconds(stage, workers, best)
        for g in range(2, fair + 1):
            option = tuple(f or g for f in fixed)
            seconds = self._stage_seconds(stage, workers, option)
            if seconds < best_seconds - 1e-12:
                best, best_seconds = option, seconds
        self._groups[(index, workers)] = best
        return best

    def _stage_seconds(self, stage: StageSpec, workers: int, groups: Sequence[int]) -> float:
        profile = self.profile
        work, longest = 0.0, 0.0
        for cohort, g in zip(stage.cohorts, groups, strict=True):
            t = profile.trial_epoch_seconds(g)
            work += cohort.trials * g * cohort.epochs * t
            longest = max(longest, cohort.epochs * t)
        return max(work / workers, longest)

    # -- the DAG ----------------------------------------------------------------------------

    def to_dag(self, workers: Sequence[int]) -> list[Node]:
        """Build the DAG of an allocation (RubberBand §4.2, adapted; module docstring)."""
        spec, profile = self.spec, self.profile
        p = profile.partitions
        nodes: list[Node] = []
        frontier: tuple[int, ...] = ()
        held = 0
        for i, (stage, w) in enumerate(zip(spec.stages, workers, strict=True)):
            z = self._z[i]
            if w > held:
                nodes.append(Node(NodeKind.SCALE, i, self._sample(profile.scale, z[0]), frontier))
                share = math.ceil(p / w)
                init = self._sample(profile.worker_start, z[1]) + share * self._sample(
                    profile.load, z[2]
                )
                nodes.append(Node(NodeKind.INIT_INSTANCE, i, init, (len(nodes) - 1,)))
                frontier = (len(nodes) - 1,)
            elif w < held:
                moved = min(p, math.ceil((held - w) * p / held))
                rehome = math.ceil(moved / w) * self._sample(profile.load, z[2])
                nodes.append(Node(NodeKind.REHOME, i, rehome, frontier))
                frontier = (len(nodes) - 1,)
            held = w
            nodes.append(Node(NodeKind.TRAIN, i, self._train(i, stage, w), frontier))
            nodes.append(Node(NodeKind.SYNC, i, np.zeros(self.samples), (len(nodes) - 1,)))
            frontier = (len(nodes) - 1,)
        return nodes

    def _cohort_work(self, index: int, workers: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per cohort of stage ``index``: its worker-seconds and its longest trial, sampled."""
        profile, stage, z = self.profile, self.spec.stages[index], self._z[index]
        out = []
        for j, (cohort, g) in enumerate(
            zip(stage.cohorts, self.groups(index, workers), strict=True)
        ):
            unit = self._sample(profile.unit, z[3 + 3 * j])
            hop = self._sample(profile.hop, z[4 + 3 * j])
            validation = self._sample(profile.validation, z[5 + 3 * j])
            t = profile.partitions * (unit / profile.scaling(g) + hop) + validation
            out.append((cohort.trials * g * cohort.epochs * t, cohort.epochs * t))
        return out

    def _train(self, index: int, stage: StageSpec, workers: int) -> np.ndarray:
        if self.spec.fixed_seconds is not None:
            return np.full(self.samples, float(self.spec.fixed_seconds))
        cohorts = self._cohort_work(index, workers)
        work = np.sum([w for w, _ in cohorts], axis=0)
        longest = np.max([t for _, t in cohorts], axis=0)
        result: np.ndarray = np.maximum(work / workers, longest)
        return result

    @staticmethod
    def _sample(latency: Latency, z: np.ndarray) -> np.ndarray:
        if latency.spread == 0:
            return np.full(z.shape, latency.mean)
        values: np.ndarray = np.maximum(0.0, latency.mean + latency.spread * z)
        return values

    @staticmethod
    def critical_path(nodes: Sequence[Node]) -> list[np.ndarray]:
        """Finish times of every node per sample (Alg. 1 ``sample_duration``)."""
        finish: list[np.ndarray] = []
        for node in nodes:  # built in topological order
            start = np.max([finish[j] for j in node.preds], axis=0) if node.preds else 0.0
            finish.append(start + node.latency)
        return finish

    # -- a simulation -----------------------------------------------------------------------

    def run(self, workers: Sequence[int]) -> Outcome:
        """Simulate an allocation: mean time and cost over the samples (memoized).

        Raises:
            ConfigError: The allocation does not give every stage at least one worker.
        """
        key = tuple(int(w) for w in workers)
        if len(key) != len(self.spec.stages) or min(key) < 1:
            raise ConfigError(
                f"an allocation gives each of the {len(self.spec.stages)} stages >= 1 worker, "
                f"got {list(key)}"
            )
        cached = self._memo.get(key)
        if cached is None:
            cached = self._memo[key] = self._simulate(key)
        return cached

    def _simulate(self, workers: tuple[int, ...]) -> Outcome:
        nodes = self.to_dag(workers)
        finish = self.critical_path(nodes)
        stages = self.spec.stages
        ends = [finish[k] for k, n in enumerate(nodes) if n.kind is NodeKind.SYNC]
        starts = [finish[k] - n.latency for k, n in enumerate(nodes) if n.kind is NodeKind.TRAIN]
        scale_starts = {
            n.stage: finish[k] - n.latency for k, n in enumerate(nodes) if n.kind is NodeKind.SCALE
        }
        loads, stage_loads = self._loads(workers)
        data_usd = [
            n * self.profile.partition_bytes / 1e9 * self.catalog.ingress_usd_per_gb
            for n in stage_loads
        ]
        if self.catalog.billing == "per_function":
            compute = self._per_function(nodes, finish, workers)
        else:
            compute = self._per_instance(workers, ends, scale_starts)
        stage_usd = [float(np.mean(c)) + d for c, d in zip(compute, data_usd, strict=True)]
        outcomes = tuple(
            StageOutcome(
                trials=stage.trials,
                epochs=stage.epochs,
                workers=w,
                instances=self._instances(w),
                groups=self.groups(i, w),
                start=float(np.mean(start)),
                end=float(np.mean(end)),
                usd=usd,
            )
            for i, (stage, w, start, end, usd) in enumerate(
                zip(stages, workers, starts, ends, stage_usd, strict=True)
            )
        )
        compute_usd = float(sum(np.mean(c) for c in compute))
        return Outcome(
            workers=workers,
            seconds=float(np.mean(ends[-1])),
            usd=compute_usd + sum(data_usd),
            compute_usd=compute_usd,
            data_usd=float(sum(data_usd)),
            loads=loads,
            stages=outcomes,
        )

    def _instances(self, workers: int) -> int:
        return math.ceil(workers / self.price.executors)

    def _loads(self, workers: tuple[int, ...]) -> tuple[int, list[int]]:
        p = self.profile.partitions
        per_stage = []
        held = 0
        for w in workers:
            if held == 0:
                n = p
            elif w > held:
                n = (w - held) * math.ceil(p / w)
            elif w < held:
                n = min(p, math.ceil((held - w) * p / held))
            else:
                n = 0
            per_stage.append(n)
            held = w
        return sum(per_stage), per_stage

    def _per_instance(
        self,
        workers: tuple[int, ...],
        ends: list[np.ndarray],
        scale_starts: dict[int, np.ndarray],
    ) -> list[np.ndarray]:
        """Compute dollars per stage under per-instance billing.

        A stage pays the instance-seconds of its time window, plus the minimum-charge
        surplus of the instances released after it.
        """
        rate = self.price.usd_per_hour / 3600.0
        windows = [(np.zeros(self.samples) if i == 0 else ends[i - 1], ends[i])
                   for i in range(len(workers))]  # fmt: skip
        usd = [np.zeros(self.samples) for _ in workers]
        held: list[tuple[int, np.ndarray]] = []  # (instances, acquired at), oldest first

        def release(count: int, at: np.ndarray, stage: int) -> None:
            nonlocal held
            while count > 0:
                n, acquired = held[-1]
                taken = min(n, count)
                for k, (lo, hi) in enumerate(windows):
                    overlap = np.clip(np.minimum(hi, at) - np.maximum(lo, acquired), 0.0, None)
                    usd[k] += taken * rate * overlap
                held_for = at - acquired
                usd[stage] += taken * rate * (self._billed(held_for) - held_for)
                count -= taken
                held[-1] = (n - taken, acquired)
                if held[-1][0] == 0:
                    held.pop()

        current = 0
        for i, w in enumerate(workers):
            need = self._instances(w)
            if need > current:
                held.append((need - current, scale_starts[i]))
            elif need < current:
                release(current - need, windows[i][0], max(0, i - 1))
            current = need
        release(current, ends[-1], len(workers) - 1)
        return usd

    def _billed(self, held: np.ndarray) -> np.ndarray:
        """Seconds billed for instances held ``held`` seconds (granularity, minimum)."""
        step = self.catalog.granularity_seconds
        units = np.ceil(held / step - 1e-9) * step
        billed: np.ndarray = np.maximum(self.catalog.minimum_seconds, units)
        return billed

    def _per_function(
        self, nodes: list[Node], finish: list[np.ndarray], workers: tuple[int, ...]
    ) -> list[np.ndarray]:
        """Compute dollars per stage: only the worker-seconds that start or train."""
        rate = self.price.usd_per_hour / self.price.executors / 3600.0
        usd = [np.zeros(self.samples) for _ in workers]
        held = 0
        for node in nodes:
            w = workers[node.stage]
            if node.kind is NodeKind.INIT_INSTANCE:
                usd[node.stage] += (w - held) * rate * node.latency
            elif node.kind is NodeKind.TRAIN:
                busy = self._busy_worker_seconds(node.stage, w)
                usd[node.stage] += rate * busy
            if node.kind is NodeKind.SYNC:
                held = w
        return usd

    def _busy_worker_seconds(self, index: int, workers: int) -> np.ndarray:
        if self.spec.fixed_seconds is not None:
            return np.full(self.samples, workers * float(self.spec.fixed_seconds))
        busy: np.ndarray = np.sum([w for w, _ in self._cohort_work(index, workers)], axis=0)
        return busy
