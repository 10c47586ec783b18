"""The planner: the cheapest allocation that meets a deadline and a budget.

RubberBand §4.3 (Alg. 2), on the simulator of :mod:`._simulator`, for each instance type
the profile measured (or the one asked for), then the cheapest type (Cynthia §4, Alg. 1:
the cheapest type and count that meets the deadline):

1. **Bounds** (:func:`worker_bounds`): no stage can use more workers than its
   :meth:`~Simulator.useful_workers` -- the fewest on which it trains as fast as it can:
   beyond them its trials' groups cannot grow (at most ``P`` workers, or SEER's resources)
   or the profile's scaling stops paying -- so no static plan needs more than the largest
   of them, or than ``P`` (up to ``P`` workers, more of them load their partitions
   faster), or than the trials a procedure keeps in flight. Fewer than ``ceil(work /
   deadline)`` workers cannot finish in time, ``work`` being every trial-epoch on one
   worker (a group of ``g`` never does more than ``g`` workers' work: the profile refuses
   superlinear scaling).
2. **Warm start**: the cheapest *static* allocation (the same ``W`` for every stage) that
   meets the deadline, enumerating ``W`` between the bounds (every ``W`` of the first 512,
   then 3 % apart: :func:`static_sizes`; and the ``running`` workers when re-planning).
   The budget is not asked of it: an elastic plan may meet a budget its warm start
   misses. An asynchronous procedure gets that static plan (its stages have no boundary
   to resize at); a deadline-bound one runs on its own ``num_workers``.
3. **Greedy** (Alg. 2): from the current best, candidates lower one stage's ``W`` each;
   the candidate with the largest marginal benefit ``(C* - C_i) / (T_i - T*)`` (eq. 1)
   among those that meet the deadline and lower the cost wins (one that is no slower has
   an infinite benefit; among several such, the largest saving wins); stop when none
   does. Run from 1x, 2x and 3x the static ``W``; keep the cheapest result. The result is
   never worse than the warm start, and the greedy only ever lowers the cost, so the
   budget is asked of its result only: a step over budget may lead under it.
4. **Group sizes** follow from ``W`` (:meth:`Simulator.groups`): when a stage has fewer
   trials than workers, each trial trains on the group that makes the stage shortest.

**Deviation from Alg. 2's candidates.** The paper generates one candidate per stage: its
``W`` lowered by the smallest step to a factor or a multiple of the stage's trials
(:func:`next_lower`). Alone, that step gets stuck where removing one worker forces
re-homing partitions, so each single step raises the cost although a larger one lowers
it (measured: Hyperband under sqrt scaling kept a static 294 workers for $674.73 where
(343, 105, 32, 8) costs $346.15). So each stage also offers larger steps -- every factor
or multiple of its trials down to ``W / 2``, or, where those are many, the largest at most
``W/2, 3W/4, 7W/8, ...`` (a geometric ladder) -- and the stage clipped to its useful
workers. Alg. 2's marginal-benefit rule still chooses among them.

A search procedure with a deadline of its own (``ExperimentSpec.deadline``: SEER's ``T``)
stops then, so the plan must meet the earlier of the two deadlines.

A procedure whose stages end by the clock (``ExperimentSpec.clock``: SEER's) trains less on
an allocation that makes its stages late (:meth:`Simulator.trained`): a plan is no cheaper
for cutting the search short, so every allocation considered must train as many
trial-epochs as the static plans that meet the deadline train at most.

Infeasible deadlines or budgets raise :class:`PlanInfeasible` with the fastest allocation
simulated, and the cheapest one that meets the deadline (else the cheapest), their seconds
and dollars.

Cynthia's analytical model (:mod:`._cynthia`) enters through the profile: where a group
size was not measured, the pilot writes the speedup the model predicts into ``scaling``.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import logging
import math
from collections.abc import Callable
from typing import Any

from cerebro_spark.elastic._prices import InstancePrice, PriceCatalog
from cerebro_spark.elastic._profile import Profile, TypeProfile
from cerebro_spark.elastic._simulator import Outcome, Simulator
from cerebro_spark.errors import CerebroError, ConfigError
from cerebro_spark.search._stages import ExperimentSpec

logger = logging.getLogger(__name__)

FASTEST_SLACK = 0.02
"""Share of the least time within which :class:`PlanInfeasible`'s fastest plan is the
cheapest."""
RESTARTS = (1, 2, 3)
"""Warm starts of the greedy search, as multiples of the cheapest static ``W`` (§4.3)."""
_DELTA = 1e-9
"""Least cost improvement (dollars) the greedy search keeps going for."""
_ALL_STEPS = 16
"""Larger steps offered one by one while a stage has at most this many fair ``W`` in
``[W/2, W)``; beyond, a geometric ladder of them."""
EPOCH_MISMATCH = 0.2
"""Relative difference between a procedure's assumed ``epoch_seconds`` and the profile's
trial-epoch beyond which :func:`plan` warns."""

Allocation = tuple[int, ...]


class PlanInfeasible(CerebroError):
    """No allocation meets the deadline and the budget (the message gives the numbers).

    Attributes:
        fastest: The fastest allocation simulated (type, outcome).
        cheapest: The cheapest allocation simulated that meets the deadline, else the
            cheapest (type, outcome).
    """

    def __init__(
        self, message: str, fastest: tuple[str, Outcome], cheapest: tuple[str, Outcome]
    ) -> None:
        super().__init__(message)
        self.fastest = fastest
        self.cheapest = cheapest

    def to_dict(self) -> dict[str, Any]:
        """Return the failure as JSON values (``plan --format json``)."""

        def found(item: tuple[str, Outcome]) -> dict[str, Any]:
            name, outcome = item
            return {
                "instance_type": name,
                "seconds": outcome.seconds,
                "usd": outcome.usd,
                "workers": list(outcome.workers),
            }

        return {
            "feasible": False,
            "fastest": found(self.fastest),
            "cheapest": found(self.cheapest),
            "message": str(self),
        }


@dataclasses.dataclass(frozen=True)
class Plan:
    """An allocation plan with its predicted time and cost.

    Attributes:
        spec: What it plans.
        instance_type: The instance type.
        deadline: Seconds it had to meet (the earlier of the one asked and the
            procedure's own).
        budget: Dollars it had to stay under (``None``: no limit).
        outcome: The simulated allocation.
        static: The cheapest static allocation that meets the deadline (the warm start;
            it may exceed the budget).
        candidates: Instance types considered, with their best plan's seconds and dollars
            (``None`` when infeasible there).
        price: The instance type's price (its effective date and source).
        running: Workers already running at ``t = 0`` (re-planning).
        pack_size: The most trials in one packed unit it assumed (1: unpacked).
    """

    spec: ExperimentSpec
    instance_type: str
    deadline: float
    budget: float | None
    outcome: Outcome
    static: Outcome
    candidates: dict[str, tuple[float, float] | None]
    price: InstancePrice | None = None
    running: int = 0
    pack_size: int = 1

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
            "price": None if self.price is None else self.price.to_dict(),
            "deadline": self.deadline,
            "budget": self.budget,
            "running": self.running,
            "pack_size": self.pack_size,
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
    running: int = 0,
    pack_size: int = 1,
) -> Plan:
    """Plan the cheapest allocation of ``spec`` that meets ``deadline`` and ``budget``.

    Args:
        spec: The search's stages (``SearchProcedure.stage_spec``).
        profile: The measured workload.
        catalog: Prices and billing.
        deadline: Seconds from ``run`` to the end, start-up included. A procedure with a
            deadline of its own (``spec.deadline``) must also end by that.
        budget: Most dollars (``None``: no limit).
        instance_type: Plan on this type only; default: every type the profile measured
            and the catalog prices, the cheapest plan wins (Cynthia Alg. 1).
        samples: Latency samples per simulation.
        seed: Seed of the samples.
        running: Workers already running and loaded at ``t = 0``, when the rest of a
            search is planned mid-run (re-planning): they pay no scale-up, start or
            partition loads, and their instances' minimum charge is paid
            (:class:`Simulator`). ``spec`` is then the stages still to run.
        pack_size: The most trials in one packed unit (the config's resolved ``pack``; 1:
            off): a pack of ``k`` takes the profile's ``packing`` time for ``k``.

    Raises:
        ConfigError: A bad argument, or the profile and the catalog share no type.
        PlanInfeasible: No allocation meets the deadline and the budget.
    """
    if not deadline > 0 or not math.isfinite(deadline):
        raise ConfigError(f"deadline must be a number of seconds > 0, got {deadline!r}")
    if budget is not None and (not budget > 0 or not math.isfinite(budget)):
        raise ConfigError(f"budget must be a number of dollars > 0, got {budget!r}")
    if isinstance(running, bool) or not isinstance(running, int) or running < 0:
        raise ConfigError(f"running must be a number of workers >= 0, got {running!r}")
    if spec.deadline is not None and spec.deadline < deadline:
        logger.info(
            "%s stops at its own deadline of %g s: planning for that, not %g s",
            spec.procedure,
            spec.deadline,
            deadline,
        )
        deadline = spec.deadline
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
    if pack_size > 1 and profile.packing is None:
        logger.warning(
            "the run packs up to %d trials, but the profile measured no packing: planned as "
            "if packs gained nothing (profile again with the config's pack to measure them)",
            pack_size,
        )
    best: Plan | None = None
    candidates: dict[str, tuple[float, float] | None] = {}
    simulators: dict[str, Simulator] = {}
    for name in types:
        view = profile.for_type(name)
        _check_epoch_seconds(spec, view)
        simulator = simulators[name] = Simulator(
            spec,
            view,
            catalog,
            catalog.price(name),
            samples=samples,
            seed=seed,
            running=running,
            pack_size=pack_size,
        )
        found = _plan_type(simulator, deadline, budget)
        if found.best is None or found.static is None:
            candidates[name] = None
            continue
        candidates[name] = (found.best.seconds, found.best.usd)
        option = Plan(
            spec,
            name,
            deadline,
            budget,
            found.best,
            found.static,
            candidates,
            price=catalog.price(name),
            running=running,
            pack_size=pack_size,
        )
        if best is None or option.usd < best.usd - _DELTA:
            best = option
    if best is None:
        fastest, cheapest = _extremes(simulators, deadline)
        raise PlanInfeasible(_infeasible(deadline, budget, fastest, cheapest), fastest, cheapest)
    return dataclasses.replace(best, candidates=candidates)


def plan_deadline(spec: ExperimentSpec, deadline: float | None) -> float | None:
    """The deadline to plan for: the one given, or the procedure's own when none is.

    A procedure with a deadline of its own (``spec.deadline``: SEER, HyperSched, ASHA with
    a deadline) stops then: planning for another would plan a run that does not happen
    (``plan --deadline``, and an elastic run's deadline, reconcile through this).

    Raises:
        ConfigError: ``deadline`` differs from the procedure's (the message names both).
    """
    own = spec.deadline
    if own is None or deadline is None:
        return deadline if own is None else own
    if not math.isclose(deadline, own, rel_tol=1e-9, abs_tol=1e-9):
        raise ConfigError(
            f"the deadline asked, {deadline:g} s, differs from the deadline {own:g} s of the "
            f"{spec.procedure} search, which stops then: omit it (it defaults to {own:g} s) or "
            "set the config's deadline (its top-level deadline:) to it"
        )
    return own


def _check_epoch_seconds(spec: ExperimentSpec, profile: TypeProfile) -> None:
    """Warn when the procedure shaped its stages with another epoch time than measured."""
    if spec.epoch_seconds is None:
        return
    measured = profile.trial_epoch_seconds(1)
    if abs(spec.epoch_seconds - measured) > EPOCH_MISMATCH * measured:
        logger.warning(
            "%s shaped its stages with epoch_seconds=%g, but a trial-epoch on one %s worker "
            "takes %.3g s by the profile: its stages will train %s epochs than planned; set "
            "epoch_seconds to about %.3g",
            spec.procedure,
            spec.epoch_seconds,
            profile.instance_type,
            measured,
            "fewer" if measured > spec.epoch_seconds else "more",
            measured,
        )


@dataclasses.dataclass
class _Found:
    """What the planner found on one instance type.

    Attributes:
        best: The cheapest allocation that meets the deadline and the budget, if any.
        static: The cheapest static allocation that meets the deadline, if any.
    """

    best: Outcome | None
    static: Outcome | None


def _plan_type(sim: Simulator, deadline: float, budget: float | None) -> _Found:
    """Warm start and greedy search on one instance type (the module docstring)."""
    spec = sim.spec
    stages = len(spec.stages)

    def meets(seconds: float) -> bool:
        return seconds <= deadline + 1e-9

    def affordable(outcome: Outcome) -> bool:
        return budget is None or outcome.usd <= budget + 1e-9

    if spec.fixed_seconds is not None:
        only = sim.run((spec.max_workers or 1,) * stages)
        if not meets(only.seconds):
            return _Found(None, None)
        return _Found(only if affordable(only) else None, only)
    low, high = worker_bounds(sim, deadline)
    sizes = static_sizes(low, high)
    if low <= sim.running <= high and sim.running not in sizes:
        sizes.append(sim.running)
    statics = [(w,) * stages for w in sizes]
    timed = [(sim.evaluate(a), a) for a in statics]
    # Stages the clock closes train less on a slower allocation: none may train less than
    # the static plans that meet the deadline can (the module docstring).
    work = max((sim.trained(a) for (seconds, _), a in timed if meets(seconds)), default=0)

    def keeps(allocation: Allocation, seconds: float) -> bool:
        return meets(seconds) and sim.trained(allocation) >= work

    feasible = [(usd, seconds, a) for (seconds, usd), a in timed if keeps(a, seconds)]
    if not feasible:
        return _Found(None, None)
    static = min(feasible)[2]
    best = static
    if spec.elastic:
        for factor in RESTARTS:
            start = (min(high, static[0] * factor),) * stages
            if not keeps(start, sim.evaluate(start)[0]):
                continue
            result = _greedy(sim, start, keeps)
            if sim.evaluate(result)[1] < sim.evaluate(best)[1] - _DELTA:
                best = result
    outcome = sim.run(best)
    return _Found(outcome if affordable(outcome) else None, sim.run(static))


def worker_bounds(sim: Simulator, deadline: float) -> tuple[int, int]:
    """The range of static worker counts worth simulating (the module docstring, step 1)."""
    spec, profile = sim.spec, sim.profile
    useful = max(sim.useful_workers(i) for i in range(len(spec.stages)))
    widest = max(sim.widest(i) for i in range(len(spec.stages)))
    high = max(useful, min(profile.partitions, widest))
    if spec.max_workers is not None:
        high = min(high, spec.max_workers)
    high = max(1, high)
    work = sum(
        c.trials * c.epochs * sim.epoch_costs(1, sim.pack_of(c, 1))[1]
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


@functools.lru_cache(maxsize=4096)
def _divisors(n: int) -> tuple[int, ...]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(sorted({*small, *(n // d for d in small)}))


def fair_at_most(limit: int, trials: int) -> int | None:
    """The largest ``W <= limit`` that divides ``trials`` or is a multiple of it."""
    if limit < 1:
        return None
    if limit >= trials:
        return limit // trials * trials
    divisors = _divisors(trials)
    return divisors[bisect.bisect_right(divisors, limit) - 1]


def next_lower(workers: int, trials: int) -> int | None:
    """The largest ``W' < workers`` that divides ``trials`` or is a multiple of it."""
    return fair_at_most(workers - 1, trials)


def _fair_between(low: int, high: int, trials: int) -> list[int]:
    """Every ``W`` in ``[low, high]`` that divides ``trials`` or is a multiple of it."""
    if low > high:
        return []
    multiples = range(max(trials, -(-low // trials) * trials), high + 1, trials)
    divisors = [d for d in _divisors(trials) if low <= d <= high]
    return sorted({*multiples, *divisors})


def step_candidates(sim: Simulator, index: int, workers: int) -> list[int]:
    """Lower worker counts the greedy search tries for stage ``index`` (module docstring).

    The smallest step to a factor or a multiple of the stage's trials (Alg. 2), larger
    such steps down to ``workers / 2``, and the stage's useful workers when fewer.
    """
    trials = sim.spec.stages[index].trials
    out: set[int] = set()
    lower = next_lower(workers, trials)
    if lower is not None:
        out.add(lower)
    half = -(-workers // 2)
    if _count_fair(half, workers - 1, trials) <= _ALL_STEPS:
        out.update(_fair_between(half, workers - 1, trials))
    else:
        k = 1
        while (step := -(-workers // 2**k)) > 1:
            value = fair_at_most(workers - step, trials)
            if value is not None and value >= half:
                out.add(value)
            k += 1
    useful = sim.useful_workers(index)
    if useful < workers:
        out.add(useful)
    return sorted(out, reverse=True)


def _count_fair(low: int, high: int, trials: int) -> int:
    if low > high:
        return 0
    first = max(trials, -(-low // trials) * trials)
    multiples = 0 if first > high else (high - first) // trials + 1
    return multiples + sum(1 for d in _divisors(trials) if low <= d <= high and d < trials)


def _greedy(
    sim: Simulator, start: Allocation, meets: Callable[[Allocation, float], bool]
) -> Allocation:
    """RubberBand Alg. 2 from ``start``, with more candidates (the module docstring).

    ``meets(allocation, seconds)``: whether a candidate is acceptable (its deadline, and
    the work a clock-closed procedure must keep).
    """
    best = start
    best_seconds, best_usd = sim.evaluate(best)
    stages = len(best)
    while True:
        choice: tuple[float, float, Allocation, float, float] | None = None
        for i in range(stages):
            for lower in step_candidates(sim, i, best[i]):
                candidate = (*best[:i], lower, *best[i + 1 :])
                seconds, usd = sim.evaluate(candidate)
                saved = best_usd - usd
                if saved <= _DELTA or not meets(candidate, seconds):
                    continue
                slower = seconds - best_seconds
                benefit = math.inf if slower <= 0 else saved / slower
                if choice is None or (benefit, saved) > choice[:2]:
                    choice = (benefit, saved, candidate, seconds, usd)
        if choice is None:
            return best
        _, _, best, best_seconds, best_usd = choice


def _extremes(
    simulators: dict[str, Simulator], deadline: float
) -> tuple[tuple[str, Outcome], tuple[str, Outcome]]:
    """The fastest allocation simulated, and the cheapest meeting the deadline.

    Over every instance type; the cheapest of all when none meets the deadline. "Fastest"
    is the cheapest of those within :data:`FASTEST_SLACK` of the least time: a late run
    re-planned for speed should not keep an idle instance to gain a re-homing's second.
    """
    explored = [
        (seconds, usd, name, key)
        for name, sim in simulators.items()
        for key, (seconds, usd) in sim.explored.items()
    ]
    least = min(e[0] for e in explored)
    fastest = min(
        (e for e in explored if e[0] <= least * (1 + FASTEST_SLACK) + 1e-9),
        key=lambda e: (e[1], e[0]),
    )
    meeting = [e for e in explored if e[0] <= deadline + 1e-9]
    cheapest = min(meeting or explored, key=lambda e: (e[1], e[0]))

    def outcome(entry: tuple[float, float, str, Allocation]) -> tuple[str, Outcome]:
        return entry[2], simulators[entry[2]].run(entry[3])

    return outcome(fastest), outcome(cheapest)


def _infeasible(
    deadline: float,
    budget: float | None,
    fastest: tuple[str, Outcome],
    cheapest: tuple[str, Outcome],
) -> str:
    limit = f"deadline {deadline:g} s" + ("" if budget is None else f" and budget {usd(budget)}")
    within = " within the deadline" if cheapest[1].seconds <= deadline + 1e-9 else ""
    return (
        f"no allocation meets the {limit}: the fastest found takes "
        f"{fastest[1].seconds:.1f} s for {usd(fastest[1].usd)} ({_shape(fastest)}), the "
        f"cheapest found{within} takes {cheapest[1].seconds:.1f} s for "
        f"{usd(cheapest[1].usd)} ({_shape(cheapest)})"
    )


def usd(amount: float) -> str:
    """Dollars for people: cents, or four decimals below a dollar."""
    return f"${amount:.2f}" if amount >= 1 else f"${amount:.4f}"


def _shape(found: tuple[str, Outcome]) -> str:
    name, outcome = found
    workers = sorted(set(outcome.workers))
    size = workers[0] if len(workers) == 1 else f"{min(workers)}-{max(workers)}"
    return f"{size} worker(s) of {name}"
