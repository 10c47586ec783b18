"""MopScheduler: Alg. 1-2, visit orders, validation, resume, Q/Q' and elasticity."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from cerebro_spark.errors import ConfigError
from cerebro_spark.mop import MopScheduler, Unit
from cerebro_spark.units import UnitKind

V = UnitKind.VALIDATE


def make(
    trials: Sequence[str] = ("a", "b"),
    partitions: Sequence[int] = (0, 1),
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


def test_one_partition_per_worker_runs_alg_1_and_2() -> None:
    sched = make(validate=False)
    first = sched.assign()
    assert sorted(a.worker for a in first) == ["w0", "w1"]
    assert {a.unit.trial for a in first} == {"a", "b"}  # isolation: one unit per trial
    assert all(a.unit.partition == int(a.worker[1]) and a.step == 0 for a in first)
    assert sched.assign() == []  # every worker is busy
    for a in first:
        sched.complete(a.unit)
    second = sched.assign()
    assert {(a.unit.trial, a.unit.partition) for a in second} == {
        (a.unit.trial, 1 - a.unit.partition) for a in first
    }
    assert all(a.step == 1 for a in second)
    for a in second:
        sched.complete(a.unit, worker=a.worker)
    assert sched.finished and not sched.stalled and sched.assign() == []


def test_a_trial_never_runs_twice_at_once_even_with_replicas() -> None:
    sched = make(trials=["a"], workers={"w0": [0, 1], "w1": [0, 1]}, validate=False)
    (only,) = sched.assign()
    assert only.worker == "w0" and sched.running == {"w0": only}


def test_replica_aware_worker_takes_any_partition_it_holds() -> None:
    sched = make(trials=["a"], partitions=[0, 1, 2], workers={"w": [2, 0]}, validate=False)
    seen = []
    while not sched.finished:
        (a,) = sched.assign()
        seen.append(a.unit.partition)
        sched.complete(a.unit)
        assert sched.stalled == (not sched.finished and 1 not in seen and len(seen) == 2)
        if sched.stalled:
            assert sched.unheld_partitions == {1}
            sched.set_partitions("w", [1])
    assert sorted(seen) == [0, 1, 2]


def test_visit_orders_are_followed_step_by_step() -> None:
    orders = {"a": [1, 0, 2], "b": [0, 2, 1]}
    sched = make(partitions=[0, 1, 2], visit_orders=orders, validate=False)
    taken: dict[str, list[int]] = {"a": [], "b": []}
    while not sched.finished:
        for a in sched.assign():
            assert a.step == len(taken[a.unit.trial])
            taken[a.unit.trial].append(a.unit.partition)
        worker = sorted(sched.running)[0]
        sched.complete(sched.running[worker].unit)
    assert taken == orders


def test_visit_order_waits_for_the_worker_of_the_next_partition() -> None:
    sched = make(trials=["a"], visit_orders={"a": [1, 0]}, validate=False)
    (a,) = sched.assign()
    assert a.worker == "w1" and a.unit == Unit("a", 1)


def test_upcoming_lists_the_idle_trials_a_worker_may_run_next() -> None:
    """Issue 27: whose checkpoints a busy worker reads ahead; pure, nothing drawn."""
    orders = {"a": [0, 1], "b": [0, 1], "c": [1, 0], "d": [0, 1]}
    sched = make(trials=list(orders), visit_orders=orders)
    first = {a.worker: a.unit for a in sched.assign()}
    assert first["w1"] == Unit("c", 1) and first["w0"].partition == 0
    waiting = [t for t in ("a", "b", "d") if t != first["w0"].trial]  # all wait for w0
    state = sched._rng.bit_generator.state
    assert sched.upcoming(["w0", "w1"], limit=4) == {"w0": waiting, "w1": []}
    assert sched.upcoming(["w0"], limit=1) == {"w0": waiting[:1]}
    assert sched.upcoming(["nobody"], limit=2) == {}
    assert sched._rng.bit_generator.state == state  # nothing is drawn
    assert sched.assign() == [] and len(sched.running) == 2  # nothing changed
    sched.complete(first["w0"])  # its next partition is 1: w1's
    assert sched.upcoming(["w0", "w1"], limit=4) == {"w0": waiting, "w1": [first["w0"].trial]}
    # without visit orders any remaining partition counts; validate units read it too
    free = make(trials=["a"], partitions=[0, 1])
    (only,) = free.assign()
    assert free.upcoming(["w0", "w1"], limit=2) == {"w0": [], "w1": []}  # a is busy
    free.complete(only.unit)
    other = "w1" if only.worker == "w0" else "w0"
    assert free.upcoming([other], limit=2) == {other: ["a"]}
    free.complete(free.assign()[0].unit)  # train done: its validate units on both
    assert free.upcoming(["w0", "w1"], limit=2) == {"w0": ["a"], "w1": ["a"]}
    with pytest.raises(ConfigError, match="limit must be a positive int, got 0"):
        free.upcoming(["w0"], limit=0)


def test_validate_units_follow_all_train_units_and_keep_isolation() -> None:
    sched = make(trials=["a"], partitions=[0, 1], workers={"w0": [0], "w1": [1]})
    kinds = []
    while not sched.finished:
        new = sched.assign()
        assert len(sched.running) == 1
        kinds += [(a.unit.kind, a.step) for a in new]
        sched.complete(next(iter(sched.running.values())).unit)
    train, val = UnitKind.TRAIN, V
    assert kinds == [(train, 0), (train, 1), (val, 0), (val, 1)]


def test_validation_partitions_are_held_by_the_workers_of_the_same_index() -> None:
    sched = make(trials=["a"], partitions=[0, 1], validation_partitions=[1])
    for _ in range(2):
        (a,) = sched.assign()
        sched.complete(a.unit)
    (a,) = sched.assign()
    assert a.unit == Unit("a", 1, V) and a.worker == "w1" and a.step == 0
    sched.complete(a.unit)
    assert sched.finished


def test_remaining_is_q_train_before_validate() -> None:
    sched = make(trials=["a"], visit_orders={"a": [1, 0]})
    assert sched.remaining == {"a": (Unit("a", 1), Unit("a", 0), Unit("a", 0, V), Unit("a", 1, V))}
    sched.assign()
    assert sched.remaining["a"][0] == Unit("a", 0)


def test_completed_units_resume_the_epoch() -> None:
    orders = {"a": [1, 0, 2], "b": [2, 1, 0]}
    done = [Unit("a", 1), Unit("a", 0), Unit("b", 2), Unit("b", 1), Unit("b", 0), Unit("b", 2, V)]
    sched = make(partitions=[0, 1, 2], visit_orders=orders, completed=done)
    new = {a.unit: (a.worker, a.step) for a in sched.assign()}
    assert new == {Unit("b", 0, V): ("w0", 1), Unit("a", 2): ("w2", 2)}
    assert sched.remaining == {
        "a": (Unit("a", 0, V), Unit("a", 1, V), Unit("a", 2, V)),
        "b": (Unit("b", 1, V),),
    }


def test_fail_puts_the_unit_back_with_the_same_step() -> None:
    sched = make(trials=["a"], visit_orders={"a": [0, 1]}, validate=False)
    (a,) = sched.assign()
    sched.complete(a.unit)
    (b,) = sched.assign()
    sched.fail(b.unit)
    assert sched.running == {} and sched.remaining["a"] == (Unit("a", 1),)
    (again,) = sched.assign()
    assert again == b


def test_remove_worker_returns_its_unit_and_add_worker_takes_over() -> None:
    sched = make(trials=["a", "b"], validate=False)
    first = {a.worker: a for a in sched.assign()}
    assert sched.remove_worker("w1") == first["w1"].unit
    assert sched.remove_worker("w0") == first["w0"].unit
    assert sched.stalled and sched.unheld_partitions == {0, 1}
    sched.add_worker("w2", [0, 1])
    assert not sched.stalled
    (a,) = sched.assign()
    assert a.worker == "w2" and a.step == 0
    assert sched.remove_worker("w2") == a.unit
    sched.add_worker("w2", [0, 1])  # a worker id may come back
    assert len(sched.assign()) == 1


def test_remove_idle_worker_returns_none() -> None:
    sched = make(trials=[], validate=False)
    assert sched.finished and sched.assign() == []
    assert sched.remove_worker("w0") is None
    assert sched.workers == {"w1": frozenset({1})}


def test_rehomed_worker_keeps_running_its_unit() -> None:
    sched = make(trials=["a"], workers={"w0": [0], "w1": [1]}, validate=False)
    (a,) = sched.assign()
    sched.set_partitions("w0", [1])
    assert sched.running == {"w0": a}
    sched.complete(a.unit, worker="w0")
    (b,) = sched.assign()
    assert b.unit == Unit("a", 1) and b.worker == "w0"  # the new holdings count
    sched.remove_worker("w1")
    assert sched.unheld_partitions == frozenset()  # partition 0 is no longer needed


def test_a_freed_worker_takes_other_work_while_its_trial_stays_busy() -> None:
    sched = make(trials=["a", "b"], workers={"w0": [0, 1]}, validate=False)
    (first,) = sched.assign()
    sched.free_worker("w0", first.unit)  # its pass is done, its checkpoint being written
    assert sched.running == {} and not sched.finished and not sched.stalled
    (second,) = sched.assign()
    assert second.worker == "w0" and second.unit.trial != first.unit.trial  # isolation
    assert sched.assign() == []  # the first trial is still busy, the worker is not free
    sched.free_worker("w0", first.unit)  # a stale free: w0 runs another unit now
    assert sched.running == {"w0": second}
    sched.complete(first.unit, worker="w0")  # durable: the trial is idle, w0 still busy
    assert sched.running == {"w0": second} and sched.assign() == []
    sched.free_worker("w0", second.unit)
    sched.fail(second.unit, worker="w0")  # its write failed: the unit goes back to Q
    assert second.unit in sched.remaining[second.unit.trial]
    for _ in range(3):
        (nxt,) = sched.assign()
        sched.complete(nxt.unit)
    assert sched.finished


def test_only_an_ordinary_assignment_frees_its_worker_early() -> None:
    sched = make(trials=["a"], partitions=[0, 1], group_sizes={"a": 2}, validate=False)
    (group,) = sched.assign()
    assert group.size == 2
    with pytest.raises(ConfigError, match="runs a group assignment of trial 'a'"):
        sched.free_worker("w0", group.unit)


def test_a_freed_worker_that_leaves_leaves_its_written_unit_in_q_prime() -> None:
    sched = make(trials=["a", "b"], workers={"w0": [0, 1], "w1": [0, 1]}, validate=False)
    first = {a.worker: a for a in sched.assign()}
    sched.free_worker("w0", first["w0"].unit)
    assert sched.remove_worker("w0") is None  # it runs nothing; its unit is still writing
    sched.fail(first["w0"].unit, worker="w0")  # then the write is reported lost
    assert first["w0"].unit in sched.remaining[first["w0"].unit.trial]


def test_remove_trial_drops_its_units_and_frees_its_worker() -> None:
    sched = make(trials=["a", "b"], validate=False)
    first = {a.unit.trial: a for a in sched.assign()}
    sched.remove_trial("a")
    assert first["a"].worker not in sched.running and sched.remaining["a"] == ()
    sched.complete(first["b"].unit)
    (again,) = sched.assign()
    assert again.unit.trial == "b"
    sched.complete(again.unit)
    assert sched.finished
    with pytest.raises(ConfigError, match=r"unknown trial 'c'; trials of this epoch: \['a', 'b'\]"):
        sched.remove_trial("c")


def test_rule_must_return_a_candidate() -> None:
    class Rogue:
        def choose(self, worker: str, candidates: Sequence[Unit], *_: Any) -> Unit:
            return Unit("zzz", 0)

    sched = make(rule=Rogue())
    with pytest.raises(ConfigError, match=r"chose Unit\(trial='zzz'.*not one of its candidates"):
        sched.assign()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"trials": ["a", "a"]}, r"trials \['a', 'a'\] has duplicates"),
        ({"partitions": []}, r"partitions \[\] must be non-empty"),
        ({"partitions": [0, 0]}, r"partitions \[0, 0\] must be non-empty, unique"),
        ({"partitions": [-1]}, r"partitions \[-1\] must be .*non-negative"),
        ({"partitions": [0.5]}, r"partitions \[0.5\] must be integers"),
        ({"workers": {"w": [7]}}, r"worker 'w' holds unknown partitions \[7\]"),
        ({"workers": {"w": ["x"]}}, r"partitions of worker 'w' \['x'\] must be integers"),
        ({"visit_orders": {"a": [0, 1]}}, r"missing \['b'\], unknown \[\]"),
        (
            {"visit_orders": {"a": [0, 1], "b": [1, 0], "c": [0, 1]}},
            r"missing \[\], unknown \['c'\]",
        ),
        (
            {"visit_orders": {"a": [0, 0], "b": [1, 0]}},
            r"visit_orders\['a'\] = \[0, 0\] is not a permutation of the partitions \[0, 1\]",
        ),
        (
            {"validate": False, "validation_partitions": [0]},
            r"validation_partitions=\[0\] given with validate=False",
        ),
        ({"validation_partitions": [3, 3]}, r"validation_partitions \[3, 3\]"),
        ({"completed": [Unit("x", 0)]}, r"unknown trial 'x'"),
        ({"completed": [Unit("a", 5)]}, r"partition 5, which is not a train partition"),
        (
            {"completed": [Unit("a", 1, V)], "validation_partitions": [0]},
            r"partition 1, which is not a validate partition",
        ),
        ({"completed": [Unit("a", 0), Unit("a", 0)]}, r"Unit\(trial='a'.* appears twice"),
        (
            {"completed": [Unit("a", 0)], "visit_orders": {"a": [1, 0], "b": [0, 1]}},
            r"trial 'a' are not the first 1 partitions of its visit order \[1, 0\]",
        ),
        (
            {"completed": [Unit("a", 0), Unit("a", 0, V)]},
            r"validate units of trial 'a' but its train partitions \[1\] are not complete",
        ),
    ],
)
def test_bad_arguments_name_the_value(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make(**kwargs)


def test_bad_calls_name_the_value() -> None:
    sched = make()
    running = {a.worker: a.unit for a in sched.assign()}
    with pytest.raises(ConfigError, match=r"cannot complete Unit\(trial='a', partition=9"):
        sched.complete(Unit("a", 9))
    with pytest.raises(ConfigError, match=r"cannot fail Unit\(trial='zz'.*not running"):
        sched.fail(Unit("zz", 0))
    with pytest.raises(ConfigError, match=r"for worker 'w1': it runs on worker 'w0'"):
        sched.complete(running["w0"], worker="w1")
    with pytest.raises(ConfigError, match=r"unknown worker 'w9'; live workers: \['w0', 'w1'\]"):
        sched.remove_worker("w9")
    with pytest.raises(ConfigError, match=r"unknown worker 'w9'"):
        sched.set_partitions("w9", [0])
    with pytest.raises(ConfigError, match=r"worker 'w0' is already registered"):
        sched.add_worker("w0", [0])
    with pytest.raises(ConfigError, match=r"worker 'w2' holds unknown partitions \[4\]"):
        sched.add_worker("w2", [0, 4])
    sched.fail(running["w0"])
    with pytest.raises(ConfigError, match="not running"):  # a stale report after a failure
        sched.complete(running["w0"])
