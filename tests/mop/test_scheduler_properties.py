"""Property tests: the §3.1 invariants of MOP under random churn, and determinism."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cerebro_spark.mop import Assignment, MopScheduler, Unit, WorkAwareRule, seeded_visit_orders
from cerebro_spark.units import UnitKind

TRAIN, VALIDATE = UnitKind.TRAIN, UnitKind.VALIDATE
ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class Case:
    trials: list[str]
    partitions: list[int]
    workers: dict[str, list[int]]
    orders: str  # "none", "seeded" or "random"
    validation: list[int] | None  # None: no validation; else the validation partitions
    resume: bool
    work_aware: bool
    seed: int
    disruptions: int


@st.composite
def cases(draw: st.DrawFn) -> Case:
    partitions = draw(st.lists(st.integers(0, 30), min_size=1, max_size=5, unique=True))
    n_trials = draw(st.integers(0, 6))
    n_workers = draw(st.integers(0, 5))
    workers = {
        f"w{j}": draw(st.lists(st.sampled_from(partitions), max_size=3, unique=True))
        for j in range(n_workers)
    }
    validation = draw(
        st.none()
        | st.just(partitions)
        | st.lists(st.sampled_from(partitions), min_size=1, max_size=3, unique=True)
    )
    return Case(
        trials=[f"trial-{i}" for i in range(n_trials)],
        partitions=partitions,
        workers=workers,
        orders=draw(st.sampled_from(["none", "seeded", "random"])),
        validation=validation,
        resume=draw(st.booleans()),
        work_aware=draw(st.booleans()),
        seed=draw(st.integers(0, 2**32 - 1)),
        disruptions=draw(st.integers(0, 12)),
    )


class Driver:
    """Runs one epoch of ``case``: random completions, failures, joins, leaves, re-homing.

    Checks the invariants after every call; ``log`` records every assignment made.
    """

    def __init__(self, case: Case) -> None:
        self.case = case
        self.act = np.random.default_rng(case.seed)  # the driver's choices
        trials, parts = case.trials, case.partitions
        self.orders: dict[str, list[int]] | None = None
        if case.orders == "seeded":
            self.orders = seeded_visit_orders(trials, parts, self.act)
        elif case.orders == "random":
            self.orders = {t: [parts[i] for i in self.act.permutation(len(parts))] for t in trials}
        self.val_parts = case.validation or []
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
            validate=case.validation is not None,
            validation_partitions=case.validation,
            completed=completed,
        )
        self.log: list[Assignment | str] = []
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
        """Every unit of the epoch; of a removed trial, those it completed."""
        trials = self.case.trials
        every = {Unit(t, p) for t in trials for p in self.case.partitions} | {
            Unit(t, p, VALIDATE) for t in trials for p in self.val_parts
        }
        return {u for u in every if u.trial not in self.removed or self.done[u]}

    def check_assignment(self, a: Assignment) -> None:
        unit, sched = a.unit, self.sched
        assert self.done[unit] == 0, f"{unit} assigned after it completed"
        assert unit.trial not in self.removed, f"{unit} assigned after its trial was removed"
        assert unit.partition in sched.workers[a.worker], f"{a.worker} lacks {unit.partition}"
        if unit.kind is TRAIN:
            assert a.step == self.train_done[unit.trial]
            if self.orders is not None:
                assert unit.partition == self.orders[unit.trial][a.step]
        else:
            assert self.train_done[unit.trial] == len(self.case.partitions), "validate too early"
            assert a.step == self.val_done[unit.trial]

    def check_state(self) -> None:
        sched = self.sched
        running = [a.unit for a in sched.running.values()]
        trials = [u.trial for u in running]
        assert len(set(trials)) == len(trials), f"isolation broken: {running}"
        assert all(w == a.worker for w, a in sched.running.items())
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
        if sched.stalled:  # re-home what nobody holds
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
        choice = act.integers(6) if self.disruptions > 0 else 0
        if choice == 0:
            worker = running[int(act.integers(len(running)))]
            unit = sched.running[worker].unit
            sched.complete(unit, worker=worker)
            self._count(unit)
            self.log.append(f"complete {unit}")
            return
        self.disruptions -= 1
        if choice == 1:
            unit = sched.running[running[int(act.integers(len(running)))]].unit
            sched.fail(unit)
            self.log.append(f"fail {unit}")
        elif choice == 2 and workers:
            worker = workers[int(act.integers(len(workers)))]
            was = sched.running[worker].unit if worker in running else None
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
            new = self.sched.assign()
            for a in new:
                self.check_assignment(a)
            self.log.extend(new)
            self.check_state()
            if self.sched.finished:
                break
            self.step()
        assert self.sched.finished, f"no termination after {limit} steps"
        assert set(self.done) == self.all_units()
        assert all(count == 1 for count in self.done.values())
        assert not self.sched.stalled and not self.sched.running
        assert all(not units for units in self.sched.remaining.values())
        return self.log


@settings(max_examples=300, deadline=None)
@given(cases())
def test_invariants_and_termination_under_churn(case: Case) -> None:
    Driver(case).run()


@settings(max_examples=100, deadline=None)
@given(cases())
def test_equal_inputs_and_seeds_give_equal_schedules(case: Case) -> None:
    assert Driver(case).run() == Driver(case).run()


def test_equal_seeds_give_equal_schedules_across_hash_seeds() -> None:
    """Nothing depends on set or hash order, which changes between processes."""
    script = (
        f"import sys; sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'tests' / 'mop')!r}]\n"
        "from test_scheduler_properties import Case, Driver\n"
        "case = Case([f't{i}' for i in range(6)], [3, 1, 4, 0], "
        "{'a': [3, 1], 'b': [4, 0, 1], 'c': [0, 3], 'd': [4]}, 'none', [1, 0], True, "
        "False, 7, 10)\n"
        "print(Driver(case).run())\n"
    )
    outputs = set()
    for hash_seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        result = subprocess.run(
            [sys.executable, "-c", script],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        outputs.add(result.stdout)
    assert len(outputs) == 1
    assert "Assignment" in outputs.pop()
