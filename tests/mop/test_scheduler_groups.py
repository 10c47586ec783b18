"""MopScheduler with group units (Cerebro §5.7): formation, Q/Q' for groups, plans.

The examples pin the policy down; the hypothesis properties check the §3.1 invariants
(completeness, isolation, exclusivity, non-preemption) with random group sizes and plans
under churn (failures of one member, leaves, joins, re-homing, dropped trials), that every
group is exactly as large as the availability map allows, and that a replay imposing the
logged visit order (and, optionally, the logged group sizes) forms the same groups.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cerebro_spark.errors import ConfigError
from cerebro_spark.mop import (
    Assignment,
    MopScheduler,
    Unit,
    WorkAwareRule,
    grouped_visit_orders,
    homogeneous_instance,
    seeded_visit_orders,
    simulate,
)
from cerebro_spark.units import UnitKind

TRAIN, VALIDATE = UnitKind.TRAIN, UnitKind.VALIDATE


def make(
    trials: Sequence[str] = ("a",),
    partitions: Sequence[int] = (0, 1, 2, 3),
    workers: Mapping[str, Collection[int]] | None = None,
    **kwargs: Any,
) -> MopScheduler:
    workers = {f"w{p}": [p] for p in partitions} if workers is None else workers
    return MopScheduler(
        trials=trials,
        partitions=partitions,
        workers=workers,
        rng=np.random.default_rng(0),
        **kwargs,
    )


class Prefer:
    """A rule that picks the first candidate of the first trial in ``order``."""

    def __init__(self, *order: str) -> None:
        self.order = order

    def choose(
        self,
        worker: str,
        candidates: Sequence[Unit],
        remaining: Mapping[str, Sequence[Unit]],
        rng: np.random.Generator,
    ) -> Unit:
        return min(candidates, key=lambda u: self.order.index(u.trial))


# -- Assignment ------------------------------------------------------------------------


def test_an_ordinary_assignment_is_a_group_of_one() -> None:
    a = Assignment(Unit("t", 3), "w1", 2)
    assert a.workers == ("w1",) and a.partitions == (3,) and a.size == 1
    assert a.units == (Unit("t", 3),) and a.unit_of("w1") == Unit("t", 3)
    assert a == Assignment(Unit("t", 3), "w1", 2, workers=("w1",), partitions=(3,))


def test_a_group_assignment_names_every_rank() -> None:
    a = Assignment(Unit("t", 3), "w1", 0, workers=("w1", "w0"), partitions=(3, 0))
    assert a.size == 2 and a.units == (Unit("t", 3), Unit("t", 0))
    assert a.unit_of("w0") == Unit("t", 0)
    with pytest.raises(ConfigError, match="worker 'w9' is not in"):
        a.unit_of("w9")


@pytest.mark.parametrize(
    ("workers", "partitions"),
    [(("w1", "w0"), (3,)), (("w1", "w1"), (3, 0)), (("w0", "w1"), (3, 0)), (("w1", "w0"), (0, 3))],
)
def test_a_malformed_group_assignment_is_refused(
    workers: tuple[str, ...], partitions: tuple[int, ...]
) -> None:
    with pytest.raises(ConfigError, match="must be distinct, of equal length, and start with"):
        Assignment(Unit("t", 3), "w1", 0, workers=workers, partitions=partitions)


def test_a_group_of_validate_units_is_refused() -> None:
    with pytest.raises(ConfigError, match="a group assignment trains"):
        Assignment(Unit("t", 0, VALIDATE), "w0", 0, workers=("w0", "w1"), partitions=(0, 1))


# -- formation -------------------------------------------------------------------------


@pytest.mark.parametrize("ordered", [True, False])
def test_one_trial_with_four_workers_trains_its_epoch_in_one_group(ordered: bool) -> None:
    orders = {"a": [2, 0, 3, 1]} if ordered else None
    sched = make(visit_orders=orders, group_sizes={"a": 4})
    (group,) = sched.assign()
    assert group.size == 4 and group.step == 0
    assert group.partitions == ((2, 0, 3, 1) if ordered else (0, 1, 2, 3))
    assert group.workers == tuple(f"w{p}" for p in group.partitions)
    assert sched.running == {w: group for w in group.workers}
    sched.complete(group.unit, worker="w3")
    validate = sched.assign()  # validate units stay ordinary units, one at a time
    assert [(a.unit.kind, a.size) for a in validate] == [(VALIDATE, 1)]


def test_groups_follow_the_visit_order_in_chunks_of_k() -> None:
    sched = make(visit_orders={"a": [3, 1, 0, 2]}, group_sizes={"a": 2}, validate=False)
    first = sched.assign()
    assert [(a.partitions, a.workers, a.step) for a in first] == [((3, 1), ("w3", "w1"), 0)]
    sched.complete(first[0].unit)
    second = sched.assign()
    assert [(a.partitions, a.step) for a in second] == [((0, 2), 2)]
    sched.complete(second[0].units[1])  # any unit of the group completes the group
    assert sched.finished


def test_a_group_needs_distinct_workers_so_it_shrinks_to_what_can_be_matched() -> None:
    workers = {"w0": [0, 2], "w1": [1, 3]}
    sched = make(workers=workers, visit_orders={"a": [1, 3, 0, 2]}, group_sizes={"a": 2})
    sizes = []
    for _ in range(10):  # bounded: a broken scheduler must fail, not hang
        for a in sched.assign():
            if a.unit.kind is TRAIN:
                sizes.append(a.partitions)
            sched.complete(a.unit)
    assert sched.finished and sizes == [(1,), (3, 0), (2,)]  # 1 and 3 are both only on w1


def test_grouped_visit_orders_make_every_group_feasible() -> None:
    workers = {"w0": [0, 2], "w1": [1, 3]}
    orders = grouped_visit_orders({"a": [1, 3, 0, 2], "b": [1, 3, 0, 2]}, {"a": 2}, workers)
    assert orders == {"a": [1, 0, 3, 2], "b": [1, 3, 0, 2]}  # b trains alone: unchanged
    sched = make(trials=["a"], workers=workers, visit_orders={"a": orders["a"]},
                 group_sizes={"a": 2}, validate=False)  # fmt: skip
    groups = []
    for _ in range(10):
        for a in sched.assign():
            groups.append(a.partitions)
            sched.complete(a.unit)
    assert sched.finished and groups == [(1, 0), (3, 2)]


def test_grouped_visit_orders_keep_an_unheld_partition_in_place() -> None:
    orders = grouped_visit_orders({"a": [5, 0, 1]}, {"a": 3}, {"w0": [0], "w1": [1]})
    assert orders == {"a": [0, 1, 5]}
    assert grouped_visit_orders({"a": [5, 0]}, {"a": 2}, {}) == {"a": [5, 0]}


def test_the_group_size_is_clamped_to_the_live_workers_and_the_units_left() -> None:
    sched = make(partitions=[0, 1, 2], workers={"w0": [0, 1, 2], "w1": [0, 1, 2]},
                 group_sizes={"a": 5}, validate=False)  # fmt: skip
    (first,) = sched.assign()
    assert first.partitions == (0, 1) and first.workers == ("w0", "w1")
    sched.complete(first.unit)
    (last,) = sched.assign()
    assert last.size == 1 and last.partitions == (2,) and last.step == 2


def test_a_group_that_cannot_start_leaves_its_worker_to_other_trials_then_goes_first() -> None:
    everything = [0, 1, 2, 3]
    sched = make(trials=["g", "s"], workers={"w0": everything, "w1": everything},
                 group_sizes={"g": 2}, rule=Prefer("s", "g"), validate=False)  # fmt: skip
    first = sched.assign()
    # w0 takes s; w1 would take g but cannot gather a second worker: it waits, idle.
    assert [(a.unit.trial, a.workers) for a in first] == [("s", ("w0",))]
    assert sched.waiting_group == "g" and set(sched.running) == {"w0"}
    sched.complete(first[0].unit)
    second = sched.assign()  # the waiting group goes before the rule sees w0 or w1
    assert [(a.unit.trial, a.workers) for a in second] == [("g", ("w0", "w1"))]
    assert sched.waiting_group is None


def test_a_waiting_group_is_dropped_when_it_no_longer_needs_a_group() -> None:
    everything = [0, 1]
    sched = make(trials=["g", "s"], partitions=[0, 1],
                 workers={"w0": everything, "w1": everything},
                 group_sizes={"g": 2}, rule=Prefer("s", "g"), validate=False)  # fmt: skip
    (single,) = sched.assign()
    assert sched.waiting_group == "g"
    sched.remove_worker("w1")  # one worker left: g's next group is a group of one
    assert sched.assign() == []
    assert sched.waiting_group is None
    sched.complete(single.unit)
    assert [a.size for a in sched.assign()] == [1]


def test_group_plans_size_each_group() -> None:
    sched = make(visit_orders={"a": [0, 1, 2, 3]}, group_plans={"a": [1, 3]}, validate=False)
    (first,) = sched.assign()
    assert first.partitions == (0,) and first.size == 1
    sched.complete(first.unit)
    (second,) = sched.assign()
    assert second.partitions == (1, 2, 3) and second.step == 1


def test_resume_with_a_completed_prefix_forms_groups_from_there() -> None:
    sched = make(visit_orders={"a": [0, 1, 2, 3]}, group_sizes={"a": 2},
                 completed=[Unit("a", 0)], validate=False)  # fmt: skip
    (first,) = sched.assign()
    assert first.partitions == (1, 2) and first.step == 1
    sched.complete(first.unit)
    (last,) = sched.assign()
    assert last.partitions == (3,) and last.step == 3


def test_set_group_size_applies_from_the_next_group() -> None:
    sched = make(group_sizes={"a": 2}, validate=False)
    (group,) = sched.assign()
    sched.set_group_size("a", 1)
    assert sched.group_sizes == {"a": 1}
    sched.fail(group.unit)
    assert [a.size for a in sched.assign()] == [1]


# -- Q/Q' for groups (§5.6) ----------------------------------------------------------------


def test_one_member_failing_sends_the_whole_group_back_to_q() -> None:
    sched = make(visit_orders={"a": [0, 1, 2, 3]}, group_sizes={"a": 2}, validate=False)
    (group,) = sched.assign()
    sched.fail(Unit("a", 1), worker="w1")
    assert sched.running == {}
    assert sched.remaining["a"] == tuple(Unit("a", p) for p in (0, 1, 2, 3))
    (again,) = sched.assign()
    assert again == group


def test_a_member_leaving_sends_the_group_back_and_frees_the_others() -> None:
    sched = make(partitions=[0, 1], workers={"w0": [0], "w1": [1]}, group_sizes={"a": 2},
                 validate=False)  # fmt: skip
    sched.assign()
    assert sched.remove_worker("w1") == Unit("a", 1)
    assert sched.running == {} and sched.remaining["a"] == (Unit("a", 0), Unit("a", 1))
    (single,) = sched.assign()
    assert single.partitions == (0,) and single.workers == ("w0",)
    sched.complete(single.unit)
    assert sched.stalled and sched.unheld_partitions == {1}


def test_removing_a_grouped_trial_frees_all_its_workers() -> None:
    sched = make(trials=["a", "b"], group_sizes={"a": 4}, rule=Prefer("a", "b"))
    sched.assign()
    sched.remove_trial("a")
    assert sched.running == {}
    assert {a.unit.trial for a in sched.assign()} == {"b"}


def test_a_stale_report_from_outside_the_group_is_refused() -> None:
    sched = make(trials=["a", "b"], group_sizes={"a": 2}, rule=Prefer("a", "b"),
                 visit_orders={"a": [0, 1, 2, 3], "b": [2, 3, 0, 1]})  # fmt: skip
    sched.assign()
    with pytest.raises(ConfigError, match=r"for worker 'w2': it runs on worker 'w0' and 'w1'"):
        sched.complete(Unit("a", 0), worker="w2")
    with pytest.raises(ConfigError, match=r"cannot complete Unit\(trial='a', partition=2.*not run"):
        sched.complete(Unit("a", 2))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"group_sizes": {"zz": 2}}, r"group_sizes names unknown trial 'zz'"),
        ({"group_sizes": {"a": 0}}, r"group size of trial 'a' must be an integer >= 1, got 0"),
        ({"group_sizes": {"a": True}}, r"must be an integer >= 1, got True"),
        ({"group_plans": {"a": [2, 2]}}, r"group_plans need visit_orders"),
        (
            {"group_plans": {"a": [2, 1]}, "visit_orders": {"a": [0, 1, 2, 3]}},
            r"group_plans\['a'\] = \[2, 1\] must be positive group sizes summing to .* 4",
        ),
        (
            {"group_plans": {"a": [0, 4]}, "visit_orders": {"a": [0, 1, 2, 3]}},
            r"must be positive",
        ),
    ],
)
def test_bad_group_arguments_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make(**kwargs)


def test_set_group_size_checks_its_arguments() -> None:
    sched = make()
    with pytest.raises(ConfigError, match="set_group_size names unknown trial 'b'"):
        sched.set_group_size("b", 2)
    with pytest.raises(ConfigError, match="must be an integer >= 1, got -1"):
        sched.set_group_size("a", -1)


# -- simulated makespan ------------------------------------------------------------------


@pytest.mark.parametrize("ordered", [True, False])
def test_one_trial_on_four_workers_takes_a_quarter_of_the_time_with_a_group_of_four(
    ordered: bool,
) -> None:
    """The stage the hybrid is for (§5.7): fewer trials than workers. Alone, the trial
    hops over the 4 workers one unit at a time (P = 4 unit-times, 3 workers idle); as a
    group of 4 it trains the epoch in one group unit (P / 4 = 1 unit-time)."""
    instance = homogeneous_instance(1, 4)
    orders = {"t0": [2, 0, 3, 1]} if ordered else None
    single = simulate(instance, np.random.default_rng(0), visit_orders=orders)
    group = simulate(instance, np.random.default_rng(0), visit_orders=orders, group_sizes={"t0": 4})
    assert single.makespan == 4.0
    assert group.makespan == 1.0 and group.ratio == 1.0
    (only,) = group.schedule
    assert only.assignment.size == 4 and (only.start, only.end) == (0.0, 1.0)


def test_two_trials_on_four_workers_take_half_the_time_with_groups_of_two() -> None:
    instance = homogeneous_instance(2, 4)
    rng = np.random.default_rng(3)
    sizes = {"t0": 2, "t1": 2}
    orders = grouped_visit_orders(
        seeded_visit_orders(instance.trials, instance.partitions, rng),
        sizes,
        {w: [j] for j, w in enumerate(instance.workers)},
    )
    single = simulate(instance, np.random.default_rng(0), visit_orders=orders)
    grouped = simulate(instance, np.random.default_rng(0), visit_orders=orders, group_sizes=sizes)
    assert single.makespan == 4.0 and grouped.makespan == 2.0


def test_a_group_unit_takes_its_slowest_member() -> None:
    from cerebro_spark.mop import ScheduleInstance

    instance = ScheduleInstance([[1.0, 3.0]])
    result = simulate(instance, np.random.default_rng(0), group_sizes={"t0": 2})
    assert result.makespan == 3.0 and result.lower_bound == 3.0


# -- properties ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    trials: list[str]
    partitions: list[int]
    workers: dict[str, list[int]]
    orders: str  # "none", "seeded" or "random"
    validation: bool
    sizes: dict[str, int]
    plans: bool  # with orders: impose random group plans on some trials
    resume: bool
    work_aware: bool
    seed: int
    disruptions: int


@st.composite
def cases(draw: st.DrawFn) -> Case:
    partitions = draw(st.lists(st.integers(0, 30), min_size=1, max_size=5, unique=True))
    trials = [f"trial-{i}" for i in range(draw(st.integers(0, 5)))]
    workers = {
        f"w{j}": draw(st.lists(st.sampled_from(partitions), max_size=4, unique=True))
        for j in range(draw(st.integers(0, 7)))
    }
    return Case(
        trials=trials,
        partitions=partitions,
        workers=workers,
        orders=draw(st.sampled_from(["none", "seeded", "random"])),
        validation=draw(st.booleans()),
        sizes={t: draw(st.integers(1, 5)) for t in trials},
        plans=draw(st.booleans()),
        resume=draw(st.booleans()),
        work_aware=draw(st.booleans()),
        seed=draw(st.integers(0, 2**32 - 1)),
        disruptions=draw(st.integers(0, 12)),
    )


def matchable(partitions: Sequence[int], workers: Mapping[str, Collection[int]]) -> bool:
    """Brute force: can distinct workers hold ``partitions``, one each?"""
    if not partitions:
        return True
    first, rest = partitions[0], partitions[1:]
    return any(
        first in held and matchable(rest, {w: h for w, h in workers.items() if w != worker})
        for worker, held in workers.items()
    )


def max_matching(partitions: Sequence[int], workers: Mapping[str, Collection[int]]) -> int:
    """Brute force: the most of ``partitions`` distinct workers can hold at once."""
    for size in range(len(partitions), 0, -1):
        if any(matchable(c, workers) for c in itertools.combinations(partitions, size)):
            return size
    return 0


class Driver:
    """Runs one epoch of ``case`` with groups under churn, checking after every call."""

    def __init__(self, case: Case, *, orders: Mapping[str, list[int]] | None = None,
                 plans: Mapping[str, list[int]] | None = None) -> None:  # fmt: skip
        self.case = case
        self.act = np.random.default_rng(case.seed)
        trials, parts = case.trials, case.partitions
        self.orders: dict[str, list[int]] | None = None
        if orders is not None:
            self.orders = {t: list(o) for t, o in orders.items()}
        elif case.orders == "seeded":
            self.orders = grouped_visit_orders(
                seeded_visit_orders(trials, parts, self.act), case.sizes, case.workers
            )
        elif case.orders == "random":
            self.orders = {t: [parts[i] for i in self.act.permutation(len(parts))] for t in trials}
        self.plans: dict[str, list[int]] = {}
        if plans is not None:
            self.plans = {t: list(p) for t, p in plans.items()}
        elif self.orders is not None and case.plans:
            for trial in trials[::2]:
                cuts = sorted(set(self.act.integers(1, len(parts) + 1, size=2).tolist()))
                bounds = [0, *[c for c in cuts if c < len(parts)], len(parts)]
                self.plans[trial] = [b - a for a, b in itertools.pairwise(bounds)]
        self.sizes = dict(case.sizes)
        self.val_parts = parts if case.validation else []
        self.done: Counter[Unit] = Counter()
        self.train_done = Counter[str]()
        self.val_done = Counter[str]()
        completed = self._resume_units() if case.resume else []
        for unit in completed:
            self._count(unit)
        rule = None
        if case.work_aware:
            rule = WorkAwareRule(lambda u, w: 1.0 + u.partition + (u.kind is VALIDATE))
        self.sched = MopScheduler(
            trials=trials,
            partitions=parts,
            workers=case.workers,
            rng=np.random.default_rng(case.seed + 1),
            rule=rule,
            visit_orders=self.orders,
            validate=case.validation,
            completed=completed,
            group_sizes=self.sizes,
            group_plans=self.plans or None,
        )
        self.log: list[Assignment | str] = []
        self.groups: dict[str, list[tuple[int, ...]]] = {t: [] for t in trials}
        self.next_worker = len(case.workers)
        self.disruptions = case.disruptions
        self.removed: set[str] = set()

    def _resume_units(self) -> list[Unit]:
        units = []
        parts = self.case.partitions
        for trial in self.case.trials:
            k = int(self.act.integers(len(parts) + 1))
            order = self.orders[trial] if self.orders else list(self.act.permutation(parts))
            units += [Unit(trial, int(p)) for p in order[:k]]
            if k == len(parts) and self.val_parts:
                n = int(self.act.integers(len(self.val_parts) + 1))
                units += [Unit(trial, p, VALIDATE) for p in self.val_parts[:n]]
        return [units[i] for i in self.act.permutation(len(units))]

    def _count(self, unit: Unit) -> None:
        self.done[unit] += 1
        assert self.done[unit] == 1, f"{unit} completed twice"
        (self.train_done if unit.kind is TRAIN else self.val_done)[unit.trial] += 1

    def all_units(self) -> set[Unit]:
        trials = self.case.trials
        every = {Unit(t, p) for t in trials for p in self.case.partitions} | {
            Unit(t, p, VALIDATE) for t in trials for p in self.val_parts
        }
        return {u for u in every if u.trial not in self.removed or self.done[u]}

    def limit(self, trial: str) -> int:
        done = self.train_done[trial]
        left = len(self.case.partitions) - done
        if trial in self.plans:
            end = next(e for e in itertools.accumulate(self.plans[trial]) if e > done)
            return min(end - done, left)
        return min(self.sizes[trial], left)

    def check_assignment(self, a: Assignment, live: Mapping[str, frozenset[int]]) -> None:
        trial = a.unit.trial
        assert trial not in self.removed, f"{a} assigned after its trial was removed"
        for unit, worker in zip(a.units, a.workers, strict=True):
            assert self.done[unit] == 0, f"{unit} assigned after it completed"
            assert unit.partition in live[worker], f"{worker} lacks {unit.partition}"
        if a.unit.kind is VALIDATE:
            assert a.size == 1
            assert self.train_done[trial] == len(self.case.partitions), "validate too early"
            assert a.step == self.val_done[trial]
            return
        assert a.step == self.train_done[trial]
        limit = self.limit(trial)
        left = [p for p in (self.orders or {}).get(trial, self.case.partitions)
                if not self.done[Unit(trial, p)]]  # fmt: skip
        if self.orders is not None:
            assert list(a.partitions) == self.orders[trial][a.step : a.step + a.size]
            longest = max(n for n in range(limit + 1) if matchable(left[:n], live))
            assert a.size == max(longest, 1), (a, longest, live)
        else:
            assert set(a.partitions) <= set(left)
            canonical = [p for p in self.case.partitions if p in a.partitions]
            assert list(a.partitions) == canonical  # ranks in the order of `partitions`
            assert a.size == max(min(limit, max_matching(left, live)), 1), (a, live)
        self.groups[trial].append(a.partitions)

    def check_state(self) -> None:
        sched = self.sched
        assignments = {id(a): a for a in sched.running.values()}.values()
        trials = [a.unit.trial for a in assignments]
        assert len(set(trials)) == len(trials), f"isolation broken: {list(assignments)}"
        members = [w for a in assignments for w in a.workers]
        assert len(members) == len(set(members)) == len(sched.running), "exclusivity broken"
        assert all(w in a.workers for w, a in sched.running.items())
        running = [u for a in assignments for u in a.units]
        queued = [u for units in sched.remaining.values() for u in units]
        parts = queued + running + list(self.done)
        assert len(parts) == len(set(parts)) and set(parts) == self.all_units(), "Q/Q'/done"
        if not sched.running and not sched.finished:
            assert sched.stalled and sched.unheld_partitions, "idle yet not stalled"
        if sched.stalled:
            assert sched.unheld_partitions

    def random_subset(self) -> list[int]:
        parts = self.case.partitions
        return [int(p) for p in self.act.permutation(parts)[: int(self.act.integers(4))]]

    def step(self) -> None:
        sched, act = self.sched, self.act
        if sched.stalled:
            unheld = sorted(sched.unheld_partitions)
            if sched.workers and act.random() < 0.5:
                worker = sorted(sched.workers)[int(act.integers(len(sched.workers)))]
                sched.set_partitions(worker, [*sched.workers[worker], *unheld])
                self.log.append(f"rehome {worker} {unheld}")
            else:
                self.add_worker(unheld)
            return
        workers = sorted(sched.workers)
        running = sorted(sched.running)
        choice = act.integers(7) if self.disruptions > 0 else 0
        if choice == 0:
            worker = running[int(act.integers(len(running)))]
            a = sched.running[worker]
            sched.complete(a.unit_of(worker), worker=worker)
            for unit in a.units:
                self._count(unit)
            self.log.append(f"complete {a}")
            return
        self.disruptions -= 1
        if choice == 1:
            worker = running[int(act.integers(len(running)))]
            unit = sched.running[worker].unit_of(worker)
            sched.fail(unit, worker=worker)  # one member fails: the group goes back
            self.log.append(f"fail {unit}")
        elif choice == 2 and workers:
            worker = workers[int(act.integers(len(workers)))]
            was = sched.running[worker].unit_of(worker) if worker in running else None
            back = sched.remove_worker(worker)
            assert back == was
            self.log.append(f"remove {worker} {back}")
        elif choice == 3:
            self.add_worker(self.random_subset())
        elif choice == 4 and self.case.trials:
            trial = self.case.trials[int(act.integers(len(self.case.trials)))]
            sched.remove_trial(trial)
            self.removed.add(trial)
            self.log.append(f"remove trial {trial}")
        elif choice == 5 and self.case.trials:
            trial = self.case.trials[int(act.integers(len(self.case.trials)))]
            size = int(act.integers(1, 4))
            sched.set_group_size(trial, size)
            self.sizes[trial] = size
            self.plans.pop(trial, None)
            self.log.append(f"size {trial} {size}")
        elif workers:
            worker = workers[int(act.integers(len(workers)))]
            sched.set_partitions(worker, self.random_subset())
            self.log.append(f"set {worker}")

    def add_worker(self, partitions: list[int]) -> None:
        worker = f"w{self.next_worker}"
        self.next_worker += 1
        self.sched.add_worker(worker, partitions)
        self.log.append(f"add {worker} {partitions}")

    def run(self) -> list[Assignment | str]:
        limit = 3 * len(self.all_units()) + 3 * self.case.disruptions + 20
        for _ in range(limit):
            before = dict(self.sched.running)
            live = self.sched.workers
            new = self.sched.assign()
            for a in new:
                self.check_assignment(a, live)
            after = self.sched.running
            assert all(after[w] is a for w, a in before.items()), "a running unit was preempted"
            self.log.extend(new)
            self.check_state()
            if self.sched.finished:
                break
            self.step()
        assert self.sched.finished, f"no termination after {limit} steps"
        assert set(self.done) == self.all_units()
        assert all(count == 1 for count in self.done.values())
        assert not self.sched.stalled and not self.sched.running
        return self.log

    def logged_orders(self) -> dict[str, list[int]]:
        return {t: [p for g in groups for p in g] for t, groups in self.groups.items()}


@settings(max_examples=300, deadline=None)
@given(cases())
def test_invariants_and_termination_with_groups_under_churn(case: Case) -> None:
    Driver(case).run()


@settings(max_examples=100, deadline=None)
@given(cases())
def test_equal_inputs_and_seeds_give_equal_schedules_with_groups(case: Case) -> None:
    assert Driver(case).run() == Driver(case).run()


@settings(max_examples=200, deadline=None)
@given(cases(), st.integers(0, 2**32 - 1), st.booleans())
def test_a_replay_of_the_logged_order_forms_the_same_groups(
    case: Case, other_seed: int, with_plans: bool
) -> None:
    """Without churn, groups depend on the visit order, the sizes and the availability
    map only: replaying the logged order with another rule seed and another completion
    order (and, optionally, imposing the logged group sizes) gives the same groups.
    (Every partition is held, so the map never changes: nothing stalls to be re-homed.)"""
    held = {p for parts in case.workers.values() for p in parts}
    unheld = [p for p in case.partitions if p not in held]
    workers = {**case.workers, "spare": unheld} if unheld else case.workers
    case = dataclasses.replace(case, workers=workers, disruptions=0, resume=False, plans=False)
    original = Driver(case)
    original.run()
    orders = original.logged_orders()
    plans = {t: [len(g) for g in groups] for t, groups in original.groups.items()}
    replay = Driver(
        dataclasses.replace(case, seed=other_seed, orders="given"),
        orders=orders,
        plans=plans if with_plans else None,
    )
    replay.run()
    assert replay.groups == original.groups


def test_equal_seeds_give_equal_group_schedules_across_hash_seeds() -> None:
    """Nothing depends on set or hash order, which changes between processes."""
    root = Path(__file__).resolve().parents[2]
    script = (
        f"import sys; sys.path[:0] = [{str(root)!r}, {str(root / 'tests' / 'mop')!r}]\n"
        "from test_scheduler_groups import Case, Driver\n"
        "case = Case([f't{i}' for i in range(4)], [3, 1, 4, 0], "
        "{'a': [3, 1], 'b': [4, 0, 1], 'c': [0, 3, 4], 'd': [4, 1]}, 'none', True, "
        "{'t0': 2, 't1': 3, 't2': 1, 't3': 4}, False, False, False, 11, 10)\n"
        "print(Driver(case).run())\n"
    )
    outputs = set()
    for hash_seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        result = subprocess.run(
            [sys.executable, "-c", script], env=env, cwd=root, capture_output=True, text=True,
            check=True,
        )  # fmt: skip
        outputs.add(result.stdout)
    assert len(outputs) == 1
    assert "workers=('" in outputs.pop()
