"""The planner: the cheapest allocation that meets a deadline and a budget.

RubberBand §4.3 (Alg. 2), on the simulator of :mod:`._simulator`, for each instance type
the profile measured (or the one asked for), then the cheapest type (Cynthia §4, Alg. 1):

1. **Bounds** (after Cynthia Thm. 4.1): no stage can use more than ``sum_j n_j * min(P,
   ...)`` workers (more trials' groups than that do not exist), nor more than the trials a
   procedure keeps in flight; fewer than ``ceil(work / deadline)`` workers cannot finish the
   work in time, ``work`` being every trial-epoch on one worker.
2. **Warm start**: the cheapest *static* allocation (the same ``W`` for every stage) that
   is feasible -- it meets the deadline and the budget -- enumerating ``W`` between the
   bounds (every ``W`` of the first 512, then 3 % apart: :func:`static_sizes`). An
   asynchronous procedure gets that static plan (its stages have no boundary to resize
   at); a deadline-bound one runs on its own ``num_workers``.
3. **Greedy** (Alg. 2): from the current best, one candidate per stage lowers that stage's
   ``W`` by the smallest step for which it stays a factor or a multiple of the stage's
   trials (so workers divide fairly); the candidate with the largest marginal benefit
   ``(C* - C_i) / (T_i - T*)`` (eq. 1) among the feasible ones that lower the cost wins;
   stop when none does. Run from 1x, 2x and 3x the static ``W``; keep the cheapest result.
   The result is never worse than the warm start.
4. **Group sizes** follow from ``W`` (:meth:`Simulator.groups`): when a stage has fewer
   trials than workers, each trial trains on the group that makes the stage shortest.

Infeasible deadlines or budgets raise :class:`PlanInfeasible` with the fastest and the
cheapest allocations found, their seconds and dollars.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from cerebro_spark.elastic._prices import PriceCatalog
from cerebro_spark.elastic._profile import Profile
from cerebro_spark.elastic._simulator import Outcome, Simulator
from cerebro_spark.errors import CerebroError, ConfigError
from cerebro_spark.search._stages import ExperimentSpec

RESTARTS = (1, 2, 3)
"""Warm starts of the greedy search, as multiples of the cheapest static ``W`` (§4.3)."""
_DELTA = 1e-9
"""Least cost improvement (dollars) the greedy search keeps going for."""


class PlanInfeasible(CerebroError):
    """No allocation meets the deadline and the budget (the message gives the numbers).

    Attributes:
        fastest: The fastest allocation found (type, outcome).
        cheapest: The cheapest allocation found (type, outcome).
    """

    def __init__(
        self, message: str, fastest: tuple[str, Outcome], cheapest: tuple[str, Outcome]
    ) -> None:
        super().__init__(message)
        self.fastest = fastest
        self.cheapest = cheapest


@dataclasses.dataclass(frozen=True)
class Plan:
    """An allocation plan with its predicted time and cost.

    Attributes:
        spec: What it plans.
        instance_type: The instance type.
        deadline: Seconds it had to meet.
        budget: Dollars it had to stay under (``None``: no limit).
        outcome: The simulated allocation.
        static: The cheapest feasible static allocation (the warm start).
        candidates: Instance types considered, with their best plan's seconds and dollars
            (``None`` when infeasible there).
    """

    spec: ExperimentSpec
    instance_type: str
    deadline: float
    budget: float | None
    outcome: Outcome
    static: Outcome
    candidates: dict[str, tuple[float, float] | None]

    @property
    def seconds(self) -> float:
        """Predicted wall time from ``run`` to the end."""
        return self.outcome.seconds

    @property
    def usd(self) -> float:
        """Predicted dollars."""
        return self.outcome.usd

    @property
    def saving(self) -> float:
        """Share of the cheapest static plan's cost the plan saves."""
        return 0.0 if self.static.usd == 0 else 1.0 - self.usd / self.static.usd

    def to_dict(self) -> dict[str, Any]:
        """Return the plan as JSON values (``plan --format json``)."""
        return {
            "feasible": True,
            "procedure": self.spec.procedure,
            "elastic": self.spec.elastic,
            "instance_type": self.instance_type,
            "deadline": self.deadline,
            "budget": self.budget,
            "seconds": self.seconds,
            "usd": self.usd,
            "compute_usd": self.outcome.compute_usd,
            "data_usd": self.outcome.data_usd,
            "partition_loads": self.outcome.loads,
            "workers": list(self.outcome.workers),
            "stages": [s.to_dict() for s in self.outcome.stages],
            "static": {
                "workers": self.static.workers[0],
                "seconds": self.static.seconds,
                "usd": self.static.usd,
            },
            "saving": self.saving,
            "instance_types": {
                t: None if v is None else {"seconds": v[0], "usd": v[1]}
                for t, v in self.candidates.items()
            },
        }


def plan(
    spec: ExperimentSpec,
    profile: Profile,
    catalog: PriceCatalog,
    *,
    deadline: float,
    budget: float | None = None,
    instance_type: str | None = None,
    samples: int = 32,
    seed: int = 0,
) -> Plan:
    """Plan the cheapest allocation of ``spec`` that meets ``deadline`` and ``budget``.

    Args:
        spec: The search's stages (``SearchProcedure.stage_spec``).
        profile: The measured workload.
        catalog: Prices and billing.
        deadline: Seconds from ``run`` to the end, start-up included.
        budget: Most dollars (``None``: no limit).
        instance_type: Plan on this type only; default: every type the profile measured
            and the catalog prices, the cheapest plan wins (Cynthia Alg. 1).
        samples: Latency samples per simulation.
        seed: Seed of the samples.

    Raises:
        ConfigError: A bad argument, or the profile and the catalog share no type.
        PlanInfeasible: No allocation meets the deadline and the budget.
    """
    if not deadline > 0 or not math.isfinite(deadline):
        raise ConfigError(f"deadline must be a number of seconds > 0, got {deadline!r}")
    if budget is not None and (not budget > 0 or not math.isfinite(budget)):
        raise ConfigError(f"budget must be a number of dollars > 0, got {budget!r}")
    if instance_type is not None:
        types = [instance_type]
        catalog.price(instance_type)  # raises naming the catalog's types
    else:
        types = [t for t in profile.instance_types if t in catalog.instances]
        if not types:
            raise ConfigError(
                f"the profile measured instance types {profile.instance_types}, none of which "
                f"price catalog {catalog.name} lists ({sorted(catalog.instances)}); profile "
                "with --instance-type set to a catalog type"
            )
    best: Plan | None = None
    candidates: dict[str, tuple[float, float] | None] = {}
    fastest: tuple[str, Outcome] | None = None
    cheapest: tuple[str, Outcome] | None = None
    for name in types:
        simulator = Simulator(
            spec, profile.for_type(name), catalog, catalog.price(name), samples=samples, seed=seed
        )
        found = _plan_type(simulator, deadline, budget)
        for outcome in found.extremes:
            if fastest is None or outcome.seconds < fastest[1].seconds:
                fastest = (name, outcome)
            if cheapest is None or outcome.usd < cheapest[1].usd:
                cheapest = (name, outcome)
        if found.best is None:
            candidates[name] = None
            continue
        assert found.static is not None  # ok: a best implies a feasible static
        candidates[name] = (found.best.seconds, found.best.usd)
        option = Plan(spec, name, deadline, budget, found.best, found.static, candidates)
        if best is None or option.usd < best.usd - _DELTA:
            best = option
    if best is None:
        assert fastest is not None and cheapest is not None  # ok: at least one W simulated
        raise PlanInfeasible(_infeasible(deadline, budget, fastest, cheapest), fastest, cheapest)
    return dataclasses.replace(best, candidates=candidates)


@dataclasses.dataclass
class _Found:
    best: Outcome | None
    static: Outcome | None
    extremes: list[Outcome]


def _plan_type(sim: Simulator, deadline: float, budget: float | None) -> _Found:
    """Warm start and greedy search on one instance type."""
    spec = sim.spec
    stages = len(spec.stages)

    def feasible(o: Outcome) -> bool:
        return o.seconds <= deadline + 1e-9 and (budget is None or o.usd <= budget + 1e-9)

    if spec.fixed_seconds is not None:
        w = spec.max_workers or 1
        only = sim.run((w,) * stages)
        ok = feasible(only)
        return _Found(only if ok else None, only if ok else None, [only])
    low, high = worker_bounds(sim, deadline)
    statics = [sim.run((w,) * stages) for w in static_sizes(low, high)]
    extremes = [min(statics, key=lambda o: (o.seconds, o.usd)), min(statics, key=_by_cost)]
    feasible_statics = [o for o in statics if feasible(o)]
    if not feasible_statics:
        return _Found(None, None, extremes)
    static = min(feasible_statics, key=_by_cost)
    if not spec.elastic:
        return _Found(static, static, extremes)
    best = static
    for factor in RESTARTS:
        w0 = min(high, static.workers[0] * factor)
        start = sim.run((w0,) * stages)
        if not feasible(start):
            continue
        result = _greedy(sim, start, feasible)
        if result.usd < best.usd - _DELTA:
            best = result
    return _Found(best, static, extremes)


def _by_cost(outcome: Outcome) -> tuple[float, float]:
    return (outcome.usd, outcome.seconds)


def worker_bounds(sim: Simulator, deadline: float) -> tuple[int, int]:
    """The range of worker counts worth simulating (the module docstring, step 1)."""
    spec, profile = sim.spec, sim.profile
    widest = max(
        sum(c.trials * (c.resources if c.resources > 1 else profile.partitions) for c in s.cohorts)
        for s in spec.stages
    )
    high = max(1, widest if spec.max_workers is None else min(widest, spec.max_workers))
    work = sum(
        c.trials * c.epochs * c.resources * profile.trial_epoch_seconds(c.resources)
        for s in spec.stages
        for c in s.cohorts
    )
    low = max(1, min(high, math.ceil(work / deadline)))
    return low, high


def static_sizes(low: int, high: int, exhaustive: int = 512) -> list[int]:
    """Return the worker counts the warm start tries.

    Every one of the first ``exhaustive`` from ``low``, then 3 % apart up to ``high``
    (static plans that large are rarely cheap).
    """
    sizes = list(range(low, min(high, low + exhaustive - 1) + 1))
    while sizes[-1] < high:
        sizes.append(min(high, max(sizes[-1] + 1, math.ceil(sizes[-1] * 1.03))))
    return sizes


def next_lower(workers: int, trials: int) -> int | None:
    """The largest ``W' < workers`` that divides ``trials`` or is a multiple of it."""
    for candidate in range(workers - 1, 0, -1):
        if trials % candidate == 0 or candidate % trials == 0:
            return candidate
    return None


def _greedy(sim: Simulator, start: Outcome, feasible: Any) -> Outcome:
    """RubberBand Alg. 2 from ``start`` (the module docstring, step 3)."""
    best = start
    while True:
        choice: tuple[float, Outcome] | None = None
        for i, stage in enumerate(sim.spec.stages):
            lower = next_lower(best.workers[i], stage.trials)
            if lower is None:
                continue
            workers = list(best.workers)
            workers[i] = lower
            candidate = sim.run(workers)
            saved = best.usd - candidate.usd
            if saved <= _DELTA or not feasible(candidate):
                continue
            slower = candidate.seconds - best.seconds
            benefit = math.inf if slower <= 0 else saved / slower
            if choice is None or benefit > choice[0]:
                choice = (benefit, candidate)
        if choice is None:
            return best
        best = choice[1]


def _infeasible(
    deadline: float,
    budget: float | None,
    fastest: tuple[str, Outcome],
    cheapest: tuple[str, Outcome],
) -> str:
    limit = f"deadline {deadline:g} s" + ("" if budget is None else f" and budget {usd(budget)}")
    return (
        f"no allocation meets the {limit}: the fastest found takes "
        f"{fastest[1].seconds:.1f} s for {usd(fastest[1].usd)} ({_shape(fastest)}), the "
        f"cheapest found takes {cheapest[1].seconds:.1f} s for {usd(cheapest[1].usd)} "
        f"({_shape(cheapest)})"
    )


def usd(amount: float) -> str:
    """Dollars for people: cents, or four decimals below a dollar."""
    return f"${amount:.2f}" if amount >= 1 else f"${amount:.4f}"


def _shape(found: tuple[str, Outcome]) -> str:
    name, outcome = found
    workers = sorted(set(outcome.workers))
    size = workers[0] if len(workers) == 1 else f"{min(workers)}-{max(workers)}"
    return f"{size} worker(s) of {name}"
