"""The indexed scheduler decides exactly as the scheduler before the index (issue 13).

:class:`~tests.mop.reference_scheduler.ReferenceScheduler` is the scheduler as it was
(every candidate listed on every decision). Both are driven in lockstep through random
epochs -- completions, failures, workers joining, leaving and re-homed, trials removed,
resumes, and work-aware estimates that change after every completion as the engine's
measured means do -- and must make the same assignments with the same draws from their
generators. Estimates come from a small set of values whose sums round (0.1, 1/3, ...),
so equal and nearly equal work left is common: ties and maxima must agree bit for bit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_scheduler import ReferenceScheduler

from cerebro_spark.mop import MopScheduler, RandomizedRule, Unit, WorkAwareRule, seeded_visit_orders
from cerebro_spark.mop._base import SchedulingRule
from cerebro_spark.units import UnitKind

TRAIN, VALIDATE = UnitKind.TRAIN, UnitKind.VALIDATE
SECONDS = (0.1, 0.2, 0.3, 1 / 3, 0.7, 1.0, 2.5, 1e-3, 7.0)


@dataclasses.dataclass(frozen=True)
class Case:
    trials: list[str]
    partitions: list[int]
    workers: dict[str, list[int]]
    orders: str  # "none", "seeded" or "random"
    validation: list[int] | None
    resume: bool
    rule: str  # "randomized", "per-trial" or "per-unit"
    seed: int
    disruptions: int


@st.composite
def cases(draw: st.DrawFn) -> Case:
    partitions = draw(st.lists(st.integers(0, 12), min_size=1, max_size=10, unique=True))
    if draw(st.booleans()):
        partitions.sort()  # the engine's case (the index is used only then)
    n_trials = draw(st.integers(0, 9))
    n_workers = draw(st.integers(0, 5))
    workers = {
        f"w{j}": draw(st.lists(st.sampled_from(partitions), max_size=4, unique=True))
        for j in range(n_workers)
    }
    validation = draw(
        st.none()
        | st.just(sorted(partitions))
        | st.lists(st.sampled_from(partitions), min_size=1, max_size=4, unique=True).map(sorted)
    )
    return Case(
        trials=[f"trial-{i}" for i in range(n_trials)],
        partitions=partitions,
        workers=workers,
        orders=draw(st.sampled_from(["none", "seeded", "random"])),
        validation=validation,
        resume=draw(st.booleans()),
        rule=draw(st.sampled_from(["randomized", "per-trial", "per-unit"])),
        seed=draw(st.integers(0, 2**32 - 1)),
        disruptions=draw(st.integers(0, 12)),
    )


class Lockstep:
    """One epoch of ``case`` on both schedulers; every call goes to both and must agree."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self.act = np.random.default_rng(case.seed)
        trials, parts = case.trials, case.partitions
        orders: dict[str, list[int]] | None = None
        if case.orders == "seeded":
            orders = seeded_visit_orders(trials, parts, self.act)
        elif case.orders == "random":
            orders = {t: [parts[i] for i in self.act.permutation(len(parts))] for t in trials}
        # The engine's estimates: a running mean of measured seconds per trial and kind.
        self.means: dict[tuple[str, UnitKind], float] = {}
        self.counts: dict[tuple[str, UnitKind], int] = {}
        completed = self._resume_units(orders) if case.resume else []
        arguments = dict(
            trials=trials,
            partitions=parts,
            workers=case.workers,
            visit_orders=orders,
            validate=case.validation is not None,
            validation_partitions=case.validation,
            completed=completed,
        )
        self.new = MopScheduler(
            rng=np.random.default_rng(case.seed + 1), rule=self._rule(), **arguments
        )
        self.old = ReferenceScheduler(
            rng=np.random.default_rng(case.seed + 1), rule=self._rule(), **arguments
        )
        self.rngs = (self.new._rng, self.old._rng)
        self.next_worker = len(case.workers)
        self.disruptions = case.disruptions
        self.assignments = 0

    def _estimate(self, trial: str, kind: UnitKind) -> float:
        return self.means.get((trial, kind), 1.0)

    def _rule(self) -> SchedulingRule:
        if self.case.rule == "randomized":
            return RandomizedRule()
        if self.case.rule == "per-trial":
            return WorkAwareRule.per_trial(self._estimate)
        estimate: Callable[[Unit, str], float] = lambda u, w: (  # noqa: E731
            SECONDS[(u.partition + len(w)) % len(SECONDS)] * (2 if u.kind is VALIDATE else 1)
        )
        return WorkAwareRule(estimate)

    def _resume_units(self, orders: dict[str, list[int]] | None) -> list[Unit]:
        units = []
        parts, val = self.case.partitions, self.case.validation or []
        for trial in self.case.trials:
            k = int(self.act.integers(len(parts) + 1))
            shuffled = [parts[i] for i in self.act.permutation(len(parts))]
            order = orders[trial] if orders else shuffled
            units += [Unit(trial, int(p)) for p in order[:k]]
            if k == len(parts) and val:
                n = int(self.act.integers(len(val) + 1))
                units += [Unit(trial, p, VALIDATE) for p in val[:n]]
        return [units[i] for i in self.act.permutation(len(units))]

    def both(self, method: str, *args: object, **kwargs: object) -> object:
        new = getattr(self.new, method)(*args, **kwargs)
        old = getattr(self.old, method)(*args, **kwargs)
        assert new == old, f"{method}{args}: {new!r} != {old!r}"
        return new

    def check(self) -> None:
        new, old = self.new, self.old
        assert new.running == old.running
        assert new.remaining == old.remaining
        assert new.finished == old.finished
        assert new.stalled == old.stalled
        assert new.unheld_partitions == old.unheld_partitions
        states = [rng.bit_generator.state for rng in self.rngs]
        assert states[0] == states[1], "the schedulers drew differently from their generators"

    def measure(self, unit: Unit) -> None:
        """What the engine does after a completion: the trial's mean seconds move."""
        key = (unit.trial, unit.kind)
        count, mean = self.counts.get(key, 0), self.means.get(key, 0.0)
        seconds = SECONDS[int(self.act.integers(len(SECONDS)))]
        self.counts[key] = count + 1
        if self.act.random() < 0.5:
            self.means[key] = mean + (seconds - mean) / (count + 1)
        else:  # a value from the set: many trials share it, their sums round alike
            self.means[key] = seconds

    def subset(self) -> list[int]:
        parts = self.case.partitions
        return [int(p) for p in self.act.permutation(parts)[: int(self.act.integers(5))]]

    def step(self) -> None:
        sched, act = self.new, self.act
        if sched.stalled:
            unheld = sorted(sched.unheld_partitions)
            if sched.workers and act.random() < 0.5:
                worker = sorted(sched.workers)[int(act.integers(len(sched.workers)))]
                self.both("set_partitions", worker, [*sched.workers[worker], *unheld])
            else:
                self.add_worker(unheld)
            return
        workers, running = sorted(sched.workers), sorted(sched.running)
        choice = act.integers(6) if self.disruptions > 0 else 0
        if choice == 0:
            worker = running[int(act.integers(len(running)))]
            unit = sched.running[worker].unit
            self.both("complete", unit, worker=worker)
            self.measure(unit)
            return
        self.disruptions -= 1
        if choice == 1:
            self.both("fail", sched.running[running[int(act.integers(len(running)))]].unit)
        elif choice == 2 and workers:
            self.both("remove_worker", workers[int(act.integers(len(workers)))])
        elif choice == 3:
            self.add_worker(self.subset())
        elif choice == 4 and self.case.trials:
            self.both("remove_trial", self.case.trials[int(act.integers(len(self.case.trials)))])
        elif workers:
            self.both("set_partitions", workers[int(act.integers(len(workers)))], self.subset())

    def add_worker(self, partitions: list[int]) -> None:
        self.both("add_worker", f"w{self.next_worker}", partitions)
        self.next_worker += 1

    def run(self) -> None:
        case = self.case
        units = len(case.trials) * (len(case.partitions) + len(case.validation or []))
        for _ in range(3 * units + 3 * self.case.disruptions + 20):
            self.assignments += len(self.both("assign"))  # type: ignore[arg-type]
            self.check()
            if self.new.finished:
                break
            self.step()
        assert self.new.finished


def indexed(case: Case) -> bool:
    return (
        case.rule != "per-unit"
        and case.partitions == sorted(case.partitions)
        and (case.validation or []) == sorted(case.validation or [])
    )


@settings(max_examples=600, deadline=None)
@given(cases())
def test_the_indexed_scheduler_decides_as_the_reference(case: Case) -> None:
    run = Lockstep(case)
    assert (run.new._offers is not None) == indexed(case)
    run.run()


def test_ties_and_rounded_sums_agree_on_a_large_epoch() -> None:
    """Hundreds of trials on few partitions: long tie classes, sums that round."""
    for seed, rule in enumerate(["randomized", "per-trial"] * 3):
        case = Case(
            trials=[f"t{i:03d}" for i in range(120)],
            partitions=[0, 1, 2, 3, 4, 5],
            workers={"a": [0], "b": [1, 2], "c": [3, 4, 5], "d": [0, 3], "e": [5]},
            orders=["seeded", "none", "random"][seed % 3],
            validation=[0, 1, 2, 3, 4, 5],
            resume=seed % 2 == 1,
            rule=rule,
            seed=seed,
            disruptions=30,
        )
        run = Lockstep(case)
        assert run.new._offers is not None
        run.run()
        assert run.assignments >= 120 * 12 // 2


def test_work_left_is_summed_unit_by_unit_as_before() -> None:
    """Ten units of 0.1 sum to 0.9999999999999999 one by one, to 1.0 as 10 * 0.1: the
    trial with one unit of 1.0 left has strictly more work, and always goes first."""
    estimates = {("a", TRAIN): 0.1, ("b", TRAIN): 1.0}
    parts = list(range(10))
    for seed in range(20):
        firsts = []
        for scheduler in (MopScheduler, ReferenceScheduler):
            sched = scheduler(
                trials=["a", "b"],
                partitions=parts,
                workers={"w": parts},
                rng=np.random.default_rng(seed),
                rule=WorkAwareRule.per_trial(lambda t, k: estimates[t, k]),
                visit_orders={"a": parts, "b": parts},
                validate=False,
                completed=[Unit("b", p) for p in parts[:9]],
            )
            firsts.append(sched.assign())
        assert firsts[0] == firsts[1]
        assert [a.unit for a in firsts[0]] == [Unit("b", 9)]


def test_a_trial_given_a_group_mid_epoch_falls_back_to_listing() -> None:
    case = Case(
        trials=["a", "b", "c"],
        partitions=[0, 1, 2],
        workers={"x": [0, 1, 2], "y": [0, 1, 2], "z": [0, 1, 2]},
        orders="seeded",
        validation=[0, 1, 2],
        resume=False,
        rule="per-trial",
        seed=5,
        disruptions=0,
    )
    run = Lockstep(case)
    run.both("assign")
    running = sorted(run.new.running.values(), key=lambda a: a.worker)
    run.both("complete", running[0].unit)
    run.both("set_group_size", running[0].unit.trial, 2)
    assert run.new._offers is None
    run.run()


def test_a_draw_among_one_candidate_leaves_the_generator_as_it_was() -> None:
    """The index skips ``rng.integers(1)`` (one candidate): numpy draws nothing for it.

    If a numpy version ever drew there, the index's generator would fall out of step
    with the rule's; this test would say so before the lockstep tests above do.
    """
    rng = np.random.default_rng(2026)
    rng.integers(5)  # a state that is not the initial one
    state = rng.bit_generator.state
    for _ in range(3):
        assert rng.integers(1) == 0
    assert rng.bit_generator.state == state
