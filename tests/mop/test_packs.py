"""MopScheduler with packed units (issue 27): formation, members, Q/Q' for packs.

The examples pin the policy down (packs form among idle trials of one key whose next
partition coincides, up to ``pack_size``; members complete and fail alone; a lost worker
sends its whole pack back; groups are never packed); the hypothesis properties check the
§3.1 invariants under churn with packs (exclusivity read as "one pack per worker"), that
every pack is as full as the idle trials allowed when it formed, that every trial trains
each partition exactly once per epoch, and that ``pack_size=1`` changes nothing.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import pytest
import test_scheduler_properties
from hypothesis import given, settings
from hypothesis import strategies as st
from test_scheduler_groups import Prefer
from test_scheduler_properties import Driver as UnpackedDriver
from test_scheduler_properties import cases as unpacked_cases

from cerebro_spark.errors import ConfigError
from cerebro_spark.mop import (
    Assignment,
    MopScheduler,
    Unit,
    VisitSlots,
    WorkAwareRule,
    homogeneous_instance,
    seeded_visit_orders,
    simulate,
    trial_visit_order,
)
from cerebro_spark.units import UnitKind

TRAIN, VALIDATE = UnitKind.TRAIN, UnitKind.VALIDATE


def make(
    trials: Sequence[str],
    partitions: Sequence[int] = (0,),
    workers: Mapping[str, Collection[int]] | None = None,
    **kwargs: Any,
) -> MopScheduler:
    workers = {f"w{p}": [p] for p in partitions} if workers is None else workers
    kwargs.setdefault("validate", False)
    return MopScheduler(
        trials=trials,
        partitions=partitions,
        workers=workers,
        rng=np.random.default_rng(0),
        **kwargs,
    )


# -- Assignment ------------------------------------------------------------------------


def test_an_ordinary_assignment_is_a_pack_of_one() -> None:
    a = Assignment(Unit("t", 3), "w1", 2)
    assert a.packed == () and a.pack == (Unit("t", 3),) and a.steps == (2,)
    assert a.trials == ("t",) and a.step_of(Unit("t", 3)) == 2


def test_a_pack_names_every_member_and_its_own_step() -> None:
    a = Assignment(Unit("a", 1), "w0", 0, packed=(Unit("b", 1), Unit("c", 1)), steps=(0, 2, 1))
    assert a.pack == (Unit("a", 1), Unit("b", 1), Unit("c", 1))
    assert a.trials == ("a", "b", "c") and a.size == 1 and a.units == (Unit("a", 1),)
    assert [a.step_of(u) for u in a.pack] == [0, 2, 1]
    assert a.unit_of("w0") == Unit("a", 1)
    with pytest.raises(ConfigError, match="not in"):
        a.step_of(Unit("d", 1))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"workers": ("w0", "w1"), "partitions": (1, 2), "packed": (Unit("b", 1),)},
            "cannot also be a pack",
        ),
        ({"packed": (Unit("b", 2),), "steps": (0, 0)}, "one partition for distinct"),
        ({"packed": (Unit("a", 1),), "steps": (0, 0)}, "one partition for distinct"),
        ({"packed": (Unit("b", 1, VALIDATE),), "steps": (0, 0)}, "one partition for"),
        ({"packed": (Unit("b", 1),)}, "one step per member"),
        ({"packed": (Unit("b", 1),), "steps": (0, 1, 2)}, "one step per member"),
        ({"packed": (Unit("b", 1),), "steps": (1, 0)}, "the first equal to step 0"),
        ({"steps": (3,)}, "must be \\(step,\\)"),
    ],
)
def test_a_malformed_pack_is_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Assignment(Unit("a", 1), "w0", 0, **kwargs)


def test_a_pack_of_validate_units_is_refused() -> None:
    with pytest.raises(ConfigError, match="one partition for distinct trials"):
        Assignment(Unit("a", 1, VALIDATE), "w0", 0, packed=(Unit("b", 1, VALIDATE),), steps=(0, 0))


# -- formation -------------------------------------------------------------------------


KEYS = {"a": "x", "b": "x", "c": "x", "d": "y"}  # "e" has no key
KEYS_AB = {"a": "x", "b": "x"}


def run_one_worker(pack_size: int) -> list[tuple[Unit, ...]]:
    """Every pack of one epoch on one worker holding the one partition."""
    sched = make(
        ["a", "b", "c", "d", "e"],
        rule=Prefer("a", "b", "c", "d", "e"),
        pack_keys=KEYS,
        pack_size=pack_size,
    )
    packs = []
    while not sched.finished:
        (assignment,) = sched.assign()
        packs.append(assignment.pack)
        for unit in assignment.pack:
            sched.complete(unit, worker="w0")
    return packs


def test_packs_form_among_trials_of_one_key_up_to_the_pack_size() -> None:
    u = {t: Unit(t, 0) for t in "abcde"}
    assert run_one_worker(2) == [(u["a"], u["b"]), (u["c"],), (u["d"],), (u["e"],)]
    assert run_one_worker(3) == [(u["a"], u["b"], u["c"]), (u["d"],), (u["e"],)]
    assert run_one_worker(8) == [(u["a"], u["b"], u["c"]), (u["d"],), (u["e"],)]
    assert run_one_worker(1) == [(u[t],) for t in "abcde"]


def test_only_idle_trials_join_and_the_worker_does_not_wait_for_a_fuller_pack() -> None:
    sched = make(
        ["a", "b", "c"],
        workers={"w0": [0], "w1": [0]},
        rule=Prefer("c", "a", "b"),
        pack_keys={"a": "x", "b": "x", "c": "y"},
        pack_size=3,
    )
    sched.set_pack_key("c", "x")
    first = make_one(sched)
    assert first is not None and first.worker == "w0"
    assert first.pack == (Unit("c", 0), Unit("a", 0), Unit("b", 0))  # all idle: one pack
    assert make_one(sched) is None  # w1 is idle, and every trial busy
    sched2 = make(
        ["a", "b", "c"],
        workers={"w0": [0], "w1": [0]},
        rule=Prefer("c", "a", "b"),
        pack_keys={"a": "x", "b": "x"},
        pack_size=3,
    )
    (alone, pair) = sched2.assign()
    assert alone.pack == (Unit("c", 0),) and alone.worker == "w0"
    assert pair.pack == (Unit("a", 0), Unit("b", 0)) and pair.worker == "w1"


def make_one(sched: MopScheduler) -> Assignment | None:
    made = sched.assign()
    assert len(made) <= 1
    return made[0] if made else None


def test_without_visit_orders_a_mate_may_train_any_remaining_partition_there() -> None:
    sched = make(
        ["a", "b"], partitions=(0, 1), rule=Prefer("a", "b"), pack_keys=KEYS_AB, pack_size=2
    )
    (pack,) = sched.assign()  # w0 first: a on 0, and b on 0 with it; w1 finds no idle trial
    assert pack.pack == (Unit("a", 0), Unit("b", 0)) and pack.worker == "w0"


def test_with_visit_orders_a_mate_must_be_due_on_that_partition() -> None:
    orders = {"a": [0, 1], "b": [1, 0], "c": [0, 1]}
    sched = make(
        ["a", "b", "c"],
        partitions=(0, 1),
        rule=Prefer("a", "b", "c"),
        visit_orders=orders,
        pack_keys=dict.fromkeys("abc", "x"),
        pack_size=3,
    )
    first, second = sched.assign()
    assert first.pack == (Unit("a", 0), Unit("c", 0)) and first.worker == "w0"
    assert first.steps == (0, 0)
    assert second.pack == (Unit("b", 1),) and second.worker == "w1"
    sched.complete(Unit("b", 1))
    assert sched.assign() == []  # w1 is idle, but a and c are busy and b is due on 0
    sched.complete(Unit("a", 0))
    sched.complete(Unit("c", 0))
    third, fourth = sched.assign()
    assert third.pack == (Unit("b", 0),) and third.steps == (1,)
    assert fourth.pack == (Unit("a", 1), Unit("c", 1)) and fourth.steps == (1, 1)


def test_members_keep_their_own_steps() -> None:
    sched = make(
        ["a", "b"],
        partitions=(0, 1, 2),
        workers={"w": [0, 1, 2]},
        rule=Prefer("a", "b"),
        visit_orders={"a": [0, 1, 2], "b": [2, 0, 1]},
        completed=[Unit("b", 2)],
        pack_keys=KEYS_AB,
        pack_size=2,
    )
    (pack,) = sched.assign()
    assert pack.pack == (Unit("a", 0), Unit("b", 0)) and pack.steps == (0, 1)


def test_the_rule_chooses_the_mates_when_more_are_due_than_fit() -> None:
    work = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}
    rule = WorkAwareRule(lambda unit, worker: work[unit.trial])
    sched = make(
        ["a", "b", "c", "d"],
        rule=rule,
        pack_keys=dict.fromkeys("abcd", "x"),
        pack_size=2,
    )
    (pack,) = sched.assign()
    assert pack.pack == (Unit("d", 0), Unit("c", 0))  # the most work left first
    for unit in pack.pack:
        sched.complete(unit)
    (pack,) = sched.assign()
    assert pack.pack == (Unit("b", 0), Unit("a", 0))


def test_a_rule_that_picks_a_non_candidate_mate_is_refused() -> None:
    class Stubborn:
        def choose(
            self,
            worker: str,
            candidates: Sequence[Unit],
            remaining: Mapping[str, Sequence[Unit]],
            rng: np.random.Generator,
        ) -> Unit:
            return Unit("a", 0)

    sched = make(["a", "b", "c"], rule=Stubborn(), pack_keys=dict.fromkeys("abc", "x"), pack_size=2)
    with pytest.raises(ConfigError, match="as a pack mate"):
        sched.assign()


def test_validate_units_are_never_packed() -> None:
    sched = make(["a", "b"], validate=True, rule=Prefer("a", "b"), pack_keys=KEYS_AB, pack_size=2)
    (pack,) = sched.assign()
    assert pack.pack == (Unit("a", 0), Unit("b", 0))
    for unit in pack.pack:
        sched.complete(unit)
    first = make_one(sched)
    assert first is not None and first.unit.kind is VALIDATE and first.packed == ()


def test_groups_are_never_packed() -> None:
    sched = make(
        ["a", "b", "c"],
        partitions=(0, 1),
        rule=Prefer("a", "b", "c"),
        group_sizes={"a": 2},
        pack_keys=dict.fromkeys("abc", "x"),
        pack_size=4,
    )
    (group,) = sched.assign()
    assert group.size == 2 and group.packed == () and group.trials == ("a",)
    sched.complete(group.unit)
    (pack,) = sched.assign()  # a's group trained 0 and 1; w1 finds no idle trial
    assert pack.pack == (Unit("b", 0), Unit("c", 0)) and pack.worker == "w0"


@pytest.mark.parametrize("size", [2, 1])
def test_a_trial_with_a_group_size_is_not_packed_even_when_its_group_is_one(size: int) -> None:
    sched = make(
        ["a", "b", "c"],
        rule=Prefer("a", "b", "c"),
        pack_keys=dict.fromkeys("abc", "x"),
        pack_size=3,
    )
    sched.set_group_size("b", size)  # one partition: b's groups have one member anyway
    (first,) = sched.assign()
    if size == 1:
        assert first.pack == (Unit("a", 0), Unit("b", 0), Unit("c", 0))
        return
    assert first.pack == (Unit("a", 0), Unit("c", 0))
    for unit in first.pack:
        sched.complete(unit)
    (alone,) = sched.assign()
    assert alone.pack == (Unit("b", 0),)


def test_set_pack_key_takes_a_trial_out_of_packs_and_puts_it_back() -> None:
    keys = dict.fromkeys("abc", "x")
    sched = make(["a", "b", "c"], rule=Prefer("a", "b", "c"), pack_keys=keys, pack_size=3)
    sched.set_pack_key("b", None)
    assert sched.pack_keys == {"a": "x", "c": "x"}
    (pack,) = sched.assign()
    assert pack.pack == (Unit("a", 0), Unit("c", 0))
    for unit in pack.pack:
        sched.complete(unit)
    (alone,) = sched.assign()
    assert alone.pack == (Unit("b", 0),)


# -- members ---------------------------------------------------------------------------


def three_packed(**kwargs: Any) -> tuple[MopScheduler, Assignment]:
    sched = make(
        ["a", "b", "c"],
        workers={"w0": [0], "w1": [0]},
        rule=Prefer("a", "b", "c"),
        pack_keys=dict.fromkeys("abc", "x"),
        pack_size=3,
        **kwargs,
    )
    (pack,) = sched.assign()
    assert pack.pack == (Unit("a", 0), Unit("b", 0), Unit("c", 0)) and pack.worker == "w0"
    return sched, pack


def test_a_member_completes_alone_and_the_worker_waits_for_the_others() -> None:
    sched, pack = three_packed()
    sched.complete(Unit("b", 0), worker="w0")
    assert sched.running == {"w0": pack}
    with pytest.raises(ConfigError, match="not running"):
        sched.complete(Unit("b", 0))
    sched.complete(Unit("a", 0), worker="w0")
    sched.complete(Unit("c", 0), worker="w0")
    assert sched.running == {} and sched.finished


def test_a_nan_member_fails_alone_and_the_pack_goes_on() -> None:
    sched, pack = three_packed()
    sched.fail(Unit("b", 0), worker="w0")  # its loss turned NaN: a TrialError
    assert sched.running == {"w0": pack}
    assert sched.remaining["b"] == (Unit("b", 0),) and sched.remaining["a"] == ()
    (retry,) = sched.assign()  # w1 is idle, b is idle again
    assert retry.pack == (Unit("b", 0),) and retry.worker == "w1"
    sched.complete(Unit("a", 0), worker="w0")
    sched.complete(Unit("c", 0), worker="w0")
    assert list(sched.running) == ["w1"]


def test_a_removed_member_leaves_its_pack_which_goes_on() -> None:
    sched, pack = three_packed()
    sched.remove_trial("b")
    assert sched.running == {"w0": pack} and sched.remaining["b"] == ()
    with pytest.raises(ConfigError, match="not running"):
        sched.complete(Unit("b", 0))
    sched.complete(Unit("a", 0))
    sched.complete(Unit("c", 0))
    assert sched.finished


def test_a_lost_worker_sends_every_running_member_back_to_q() -> None:
    sched, _ = three_packed()
    sched.complete(Unit("a", 0))
    assert sched.remove_worker("w0") == Unit("b", 0)  # the first member still running
    assert sched.running == {} and "w0" not in sched.workers
    assert sched.remaining["a"] == ()
    assert sched.remaining["b"] == (Unit("b", 0),) and sched.remaining["c"] == (Unit("c", 0),)
    (again,) = sched.assign()
    assert again.pack == (Unit("b", 0), Unit("c", 0)) and again.worker == "w1"


def test_free_worker_frees_the_worker_for_the_whole_pack() -> None:
    sched, _ = three_packed(validate=True)
    sched.free_worker("w0", Unit("c", 0))
    assert sched.running == {}
    assert sched.assign() == []  # the members stay busy (isolation) until they complete
    sched.complete(Unit("a", 0))
    (next_one,) = sched.assign()
    assert next_one.worker == "w0" and next_one.pack == (Unit("a", 0, VALIDATE),)
    sched.complete(Unit("b", 0))
    sched.complete(Unit("c", 0))
    sched.free_worker("w1", Unit("a", 0))  # nothing runs there: nothing happens
    assert list(sched.running) == ["w0"]


def test_a_stale_report_from_another_worker_is_refused() -> None:
    sched, _ = three_packed()
    with pytest.raises(ConfigError, match="runs on worker 'w0'"):
        sched.complete(Unit("b", 0), worker="w1")


# -- bad input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"pack_size": 0}, "pack_size must be an integer >= 1"),
        ({"pack_size": True}, "pack_size must be an integer >= 1"),
        ({"pack_size": 2.0}, "pack_size must be an integer >= 1"),
        ({"pack_keys": {"z": "x"}}, "pack_keys names unknown trial 'z'"),
        ({"pack_keys": {"a": ""}}, "pack key of trial 'a' must be a non-empty string"),
        ({"pack_keys": {"a": 3}}, "pack key of trial 'a' must be a non-empty string"),
    ],
)
def test_bad_pack_arguments_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make(["a", "b"], **kwargs)


def test_set_pack_key_checks_its_arguments() -> None:
    sched = make(["a"])
    with pytest.raises(ConfigError, match="set_pack_key names unknown trial 'z'"):
        sched.set_pack_key("z", "x")
    with pytest.raises(ConfigError, match="pack key of trial 'a' must be a non-empty string"):
        sched.set_pack_key("a", "")
    sched.set_pack_key("a", None)  # a trial without a key: nothing to take away
    assert sched.pack_keys == {}


# -- the simulator ---------------------------------------------------------------------


def test_packs_of_two_at_the_time_of_one_halve_the_makespan() -> None:
    instance = homogeneous_instance(8, 1)
    keys = dict.fromkeys(instance.trials, "x")
    alone = simulate(instance, np.random.default_rng(0))
    packed = simulate(
        instance, np.random.default_rng(0), pack_keys=keys, pack_size=2, pack_factors=[1.0, 1.0]
    )
    assert alone.makespan == 8.0 and packed.makespan == 4.0 and packed.lower_bound == 4.0
    assert all(len(s.assignment.pack) == 2 for s in packed.schedule)
    priced = simulate(
        instance, np.random.default_rng(0), pack_keys=keys, pack_size=2, pack_factors=[1.0, 1.5]
    )
    assert priced.makespan == 6.0 and priced.lower_bound == 6.0
    unpriced = simulate(instance, np.random.default_rng(0), pack_keys=keys, pack_size=2)
    assert unpriced.lower_bound == alone.lower_bound == 8.0  # default: a pack saves nothing


@pytest.mark.parametrize("factors", [[2.0, 2.0], [1.0], [1.0, 0.5], [1.0, float("nan")]])
def test_bad_pack_factors_are_refused(factors: list[float]) -> None:
    instance = homogeneous_instance(2, 2)
    with pytest.raises(ConfigError, match="pack_factors"):
        simulate(
            instance,
            np.random.default_rng(0),
            pack_keys=dict.fromkeys(instance.trials, "x"),
            pack_size=2,
            pack_factors=factors,
        )


# -- pack_size=1 changes nothing -------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(unpacked_cases(), st.sampled_from(["one", "two", "none"]))
def test_pack_size_one_gives_todays_schedules(case: Any, keys: str) -> None:
    """Same inputs and seed: the same assignments and log with keys and pack_size=1."""
    today = UnpackedDriver(case).run()
    names = {"one": ["x"], "two": ["x", "y"], "none": []}[keys]
    pack_keys = {t: names[i % len(names)] for i, t in enumerate(case.trials)} if names else {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            test_scheduler_properties,
            "MopScheduler",
            functools.partial(MopScheduler, pack_keys=pack_keys, pack_size=1),
        )
        assert UnpackedDriver(case).run() == today


# -- invariants under churn ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    trials: list[str]
    partitions: list[int]
    workers: dict[str, list[int]]
    keys: dict[str, str]
    pack_size: int
    groups: dict[str, int]
    orders: str  # "none", "seeded" or "random"
    validation: bool
    resume: bool
    work_aware: bool
    seed: int
    disruptions: int


@st.composite
def cases(draw: st.DrawFn) -> Case:
    partitions = draw(st.lists(st.integers(0, 20), min_size=1, max_size=4, unique=True))
    trials = [f"t{i}" for i in range(draw(st.integers(0, 8)))]
    workers = {
        f"w{j}": draw(st.lists(st.sampled_from(partitions), max_size=3, unique=True))
        for j in range(draw(st.integers(0, 4)))
    }
    keys = {}
    for trial in trials:
        key = draw(st.sampled_from([None, "x", "x", "y"]))
        if key is not None:
            keys[trial] = key
    groups = {t: 2 for t in trials if draw(st.integers(0, 5)) == 0}
    return Case(
        trials=trials,
        partitions=partitions,
        workers=workers,
        keys=keys,
        pack_size=draw(st.integers(1, 4)),
        groups=groups,
        orders=draw(st.sampled_from(["none", "seeded", "random"])),
        validation=draw(st.booleans()),
        resume=draw(st.booleans()),
        work_aware=draw(st.booleans()),
        seed=draw(st.integers(0, 2**32 - 1)),
        disruptions=draw(st.integers(0, 14)),
    )


class PackDriver(UnpackedDriver):
    """Runs one epoch of ``case`` with packs under churn, checking after every call.

    It keeps its own record of what runs (``running``: trial to its assignment and its
    units there) from the assignments and its own calls, and checks the scheduler's Q and
    Q' against it: Q, the members and groups still running, and the units done partition
    the epoch; every trial is in one running assignment at most (isolation); a worker
    runs one assignment, a pack counting as one, until all its members are done or it is
    freed (exclusivity). The resumed units, the count of what completed and the epoch's
    units are the unpacked driver's (its ``__init__`` is not called: this one sets up all
    it reads).
    """

    def __init__(self, case: Case) -> None:
        self.case = case
        self.act = np.random.default_rng(case.seed)
        trials, parts = case.trials, case.partitions
        self.orders: dict[str, list[int]] | None = None
        if case.orders == "seeded":
            self.orders = seeded_visit_orders(trials, parts, self.act)
        elif case.orders == "random":
            self.orders = {t: [parts[i] for i in self.act.permutation(len(parts))] for t in trials}
        self.keys = dict(case.keys)
        self.sizes = {t: case.groups.get(t, 1) for t in trials}
        self.val_parts = parts if case.validation else []
        self.done: Counter[Unit] = Counter()
        self.train_done = Counter[str]()
        self.val_done = Counter[str]()
        completed = self._resume_units() if case.resume else []
        for unit in completed:
            self._count(unit)
        rule = None
        if case.work_aware:
            rule = WorkAwareRule(lambda u, w: 1.0 + u.partition % 3 + (u.kind is VALIDATE))
        self.sched = MopScheduler(
            trials=trials,
            partitions=parts,
            workers=case.workers,
            rng=np.random.default_rng(case.seed + 1),
            rule=rule,
            visit_orders=self.orders,
            validate=case.validation,
            completed=completed,
            group_sizes=case.groups,
            pack_keys=case.keys,
            pack_size=case.pack_size,
        )
        self.running: dict[str, tuple[Assignment, tuple[Unit, ...]]] = {}
        self.freed: list[Assignment] = []  # by identity: assignments whose worker was freed
        self.log: list[Assignment | str] = []
        self.next_worker = len(case.workers)
        self.disruptions = case.disruptions
        self.removed: set[str] = set()
        self.packs_formed = 0

    def due(self, trial: str) -> set[int]:
        """Partitions whose train unit ``trial`` may run next (none if it validates)."""
        train = [u.partition for u in self.sched.remaining[trial] if u.kind is TRAIN]
        if self.orders is not None:
            return set(train[:1])
        return set(train)

    # -- checks

    def idle_due(self) -> dict[str, set[int]]:
        """Every idle trial to the partitions it may train next (taken before a pass)."""
        idle = [t for t in self.case.trials if t not in self.running and t not in self.removed]
        return {t: self.due(t) for t in idle}

    def check_pass(self, made: Sequence[Assignment], due: Mapping[str, set[int]]) -> None:
        """Check a pass of assign(); ``due``: :meth:`idle_due` before it."""
        size = self.case.pack_size
        idle = list(due)
        started: set[str] = set()
        for a in made:
            assert not set(a.trials) & started, f"isolation broken in one pass: {a}"
            for unit, step in zip(a.pack, a.steps, strict=True):
                self.check_unit(a, unit, step)
            pack = a.pack
            trial = a.unit.trial
            assert len(pack) <= max(size, 1), f"pack larger than {size}: {a}"
            packable = (
                a.size == 1
                and a.unit.kind is TRAIN
                and size > 1
                and trial in self.keys
                and self.sizes[trial] == 1
            )
            if len(pack) > 1:
                self.packs_formed += 1
                assert packable, f"{a} may not be packed"
                for unit in pack:
                    assert self.keys.get(unit.trial) == self.keys[trial], f"mixed keys: {a}"
                    assert self.sizes[unit.trial] == 1, f"a group trial packed: {a}"
            started.update(a.trials)
            if packable and len(pack) < size:  # as full as the idle trials allowed
                left_out = [
                    t
                    for t in idle
                    if t not in started
                    and self.keys.get(t) == self.keys[trial]
                    and self.sizes[t] == 1
                    and a.unit.partition in due[t]
                ]
                assert not left_out, f"{left_out} could have joined {a}"

    def check_unit(self, a: Assignment, unit: Unit, step: int) -> None:
        assert self.done[unit] == 0, f"{unit} assigned after it completed"
        assert unit.trial not in self.removed, f"{unit} assigned after its trial was removed"
        assert unit.trial not in self.running, f"isolation broken: {unit.trial} runs twice"
        assert a.step_of(unit) == step
        for u, worker in zip(a.units, a.workers, strict=True):
            assert u.partition in self.sched.workers[worker], f"{worker} lacks {u.partition}"
        if unit.kind is TRAIN:
            assert step == self.train_done[unit.trial]
            if self.orders is not None:
                assert unit.partition == self.orders[unit.trial][step]
        else:
            assert self.train_done[unit.trial] == len(self.case.partitions), "validate too early"
            assert step == self.val_done[unit.trial]

    def check_state(self, *, assigned: bool) -> None:
        """Check Q, Q' and the units done; ``assigned``: just after a pass of assign()."""
        sched = self.sched
        busy: dict[str, Assignment] = {}  # exclusivity: by worker, one assignment each
        for a, _ in self.running.values():
            if any(a is f for f in self.freed):
                continue
            for worker in a.workers:
                assert busy.get(worker, a) is a, f"{worker} runs two assignments"
                busy[worker] = a
        running = sched.running
        assert running.keys() == busy.keys(), f"Q' {running} but running {busy}"
        assert all(running[w] is a for w, a in busy.items())
        queued = [u for units in sched.remaining.values() for u in units]
        in_flight = [u for _, units in self.running.values() for u in units]
        parts = queued + in_flight + list(self.done)
        assert len(parts) == len(set(parts)) and set(parts) == self.all_units(), "Q/Q'/done"
        if assigned and not self.running and not sched.finished:
            assert sched.stalled and sched.unheld_partitions, "idle yet not stalled"
        if sched.stalled:
            assert sched.unheld_partitions

    # -- churn

    def start(self, made: Sequence[Assignment]) -> None:
        for a in made:
            if a.packed:
                for unit in a.pack:
                    self.running[unit.trial] = (a, (unit,))
            else:
                self.running[a.unit.trial] = (a, a.units)

    def pick(self, items: Sequence[str]) -> str:
        return sorted(items)[int(self.act.integers(len(items)))]

    def step(self) -> None:
        sched, act = self.sched, self.act
        if sched.stalled:  # re-home what nobody holds
            unheld = sorted(sched.unheld_partitions)
            if sched.workers and act.random() < 0.5:
                worker = self.pick(list(sched.workers))
                sched.set_partitions(worker, [*sched.workers[worker], *unheld])
                self.log.append(f"rehome {worker} {unheld}")
            else:
                self.add_worker(unheld)
            return
        choice = int(act.integers(8)) if self.disruptions > 0 else 0
        if choice == 0 or not self.running:
            trial = self.pick(list(self.running))
            a, units = self.running.pop(trial)
            sched.complete(units[-1], worker=a.workers[-1])
            for unit in units:
                self._count(unit)
            self.log.append(f"complete {units}")
            return
        self.disruptions -= 1
        if choice == 1:
            trial = self.pick(list(self.running))
            a, units = self.running.pop(trial)
            sched.fail(units[0], worker=a.worker)
            self.log.append(f"fail {units}")
        elif choice == 2 and sched.workers:
            worker = self.pick(list(sched.workers))
            a = sched.running.get(worker)
            expected = None
            if a is not None:
                back = [t for t, (b, _) in self.running.items() if b is a]
                for t in back:
                    del self.running[t]
                expected = (
                    a.unit_of(worker)
                    if not a.packed
                    else next(u for u in a.pack if u.trial in back)
                )
            assert sched.remove_worker(worker) == expected
            self.log.append(f"remove {worker} {expected}")
        elif choice == 3:
            self.add_worker(self.random_subset())
        elif choice == 4 and self.case.trials:
            trial = self.pick(self.case.trials)
            sched.remove_trial(trial)
            self.running.pop(trial, None)
            self.removed.add(trial)
            self.log.append(f"remove trial {trial}")
        elif choice == 5 and sched.workers:
            worker = self.pick(list(sched.workers))
            sched.set_partitions(worker, self.random_subset())
            self.log.append(f"set {worker}")
        elif choice == 6 and sched.running:
            worker = self.pick(list(sched.running))
            a = sched.running[worker]
            member = a.pack[int(act.integers(len(a.pack)))]
            if a.size > 1:
                with pytest.raises(ConfigError, match="group assignment"):
                    sched.free_worker(worker, member)
                return
            sched.free_worker(worker, member)
            self.freed.append(a)
            self.log.append(f"free {worker}")
        elif choice == 7 and self.case.trials:
            trial = self.pick(self.case.trials)
            key = [None, "x", "y"][int(act.integers(3))]
            sched.set_pack_key(trial, key)
            if key is None:
                self.keys.pop(trial, None)
            else:
                self.keys[trial] = key
            self.log.append(f"key {trial} {key}")

    def random_subset(self) -> list[int]:
        parts = self.case.partitions
        return [int(p) for p in self.act.permutation(parts)[: int(self.act.integers(4))]]

    def add_worker(self, partitions: list[int]) -> None:
        worker = f"w{self.next_worker}"
        self.next_worker += 1
        self.sched.add_worker(worker, partitions)
        self.log.append(f"add {worker} {partitions}")

    def run(self) -> list[Assignment | str]:
        limit = 3 * len(self.all_units()) + 3 * self.case.disruptions + 20
        for _ in range(limit):
            due = self.idle_due()
            made = self.sched.assign()
            self.check_pass(made, due)
            self.start(made)
            self.log.extend(made)
            self.check_state(assigned=True)
            if self.sched.finished:
                break
            self.step()
            self.check_state(assigned=False)
        assert self.sched.finished, f"no termination after {limit} steps"
        assert set(self.done) == self.all_units()  # each partition once per trial
        assert all(count == 1 for count in self.done.values())
        assert not self.sched.stalled and not self.sched.running and not self.running
        return self.log


@settings(max_examples=300, deadline=None)
@given(cases())
def test_invariants_and_termination_with_packs_under_churn(case: Case) -> None:
    PackDriver(case).run()


@settings(max_examples=100, deadline=None)
@given(cases())
def test_equal_inputs_and_seeds_give_equal_packs(case: Case) -> None:
    assert PackDriver(case).run() == PackDriver(case).run()


def test_the_churn_driver_forms_packs() -> None:
    """The property above is not vacuous: its driver forms packs, with and without orders."""
    for orders in ("none", "seeded"):
        case = Case(
            trials=[f"t{i}" for i in range(8)],
            partitions=[0, 1, 2],
            workers={"w0": [0], "w1": [1], "w2": [2, 0]},
            keys={f"t{i}": "x" for i in range(8)},
            pack_size=3,
            groups={"t7": 2},
            orders=orders,
            validation=True,
            resume=False,
            work_aware=False,
            seed=3,
            disruptions=10,
        )
        driver = PackDriver(case)
        driver.run()
        assert driver.packs_formed >= 3


# -- visit orders for packs ------------------------------------------------------------


ENTROPY = (5, 4)


def _orders(
    slots: VisitSlots, trials: list[str], parts: int, epoch: int = 0
) -> dict[str, list[int]]:
    return {t: trial_visit_order(range(parts), ENTROPY, epoch, slots[t]) for t in trials}


def test_visit_slots_give_each_chunk_of_a_key_one_order() -> None:
    trials = [f"t{i}" for i in range(10)]
    keys = {t: ("x" if i % 2 == 0 else "y") for i, t in enumerate(trials) if i != 9}
    slots = VisitSlots(2)
    assert [slots.add(t, keys.get(t)) for t in trials] == [0, 1, 0, 1, 2, 3, 2, 3, 4, 5]
    orders = _orders(slots, trials, 4)
    chunks = [["t0", "t2"], ["t1", "t3"], ["t4", "t6"], ["t5", "t7"], ["t8"], ["t9"]]
    for chunk in chunks:
        assert all(orders[t] == orders[chunk[0]] for t in chunk)
    firsts = [orders[chunk[0]] for chunk in chunks]
    assert all(sorted(order) == [0, 1, 2, 3] for order in firsts)
    base = firsts[0]  # all rotations of one permutation, offsets spread evenly
    offsets = Counter(next(k for k in range(4) if base[k:] + base[:k] == o) for o in firsts)
    assert sorted(offsets.values()) == [1, 1, 2, 2]


def test_visit_slots_without_packing_are_the_creation_order() -> None:
    for slots in (VisitSlots(1), VisitSlots(4)):
        keyed = slots.pack_size == 1
        assert [slots.add(f"t{i}", "x" if keyed else None) for i in range(5)] == [0, 1, 2, 3, 4]
        assert len(slots) == 5 and "t4" in slots and "t5" not in slots


def test_with_visit_slots_every_pack_is_full() -> None:
    trials = [f"t{i}" for i in range(12)]
    keys = dict.fromkeys(trials, "x")
    slots = VisitSlots(4)
    for t in trials:
        slots.add(t, keys[t])
    orders = _orders(slots, trials, 3)
    sched = make(trials, partitions=(0, 1, 2), visit_orders=orders, pack_keys=keys, pack_size=4)
    sizes = []
    while not sched.finished:
        made = sched.assign()
        sizes += [len(a.pack) for a in made]
        for a in made:
            for unit in a.pack:
                sched.complete(unit)
    assert sizes == [4] * 9  # 12 trials x 3 partitions in 9 packs of 4


def test_visit_slots_refuse_a_bad_pack_size_and_a_trial_added_twice() -> None:
    with pytest.raises(ConfigError, match="pack_size must be an integer >= 1"):
        VisitSlots(0)
    slots = VisitSlots()
    slots.add("a")
    with pytest.raises(ConfigError, match="trial 'a' already has a visit slot"):
        slots.add("a")
