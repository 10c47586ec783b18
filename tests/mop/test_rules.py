"""Scheduling rules: the randomized rule of Alg. 1 and the work-aware rule."""

from __future__ import annotations

from collections import Counter

import numpy as np

from cerebro_spark.mop import RandomizedRule, Unit, WorkAwareRule
from cerebro_spark.units import UnitKind

CANDIDATES = [Unit("a", 0), Unit("b", 0), Unit("c", 0)]
REMAINING = {
    "a": (Unit("a", 0), Unit("a", 1)),
    "b": (Unit("b", 0), Unit("b", 1), Unit("b", 2)),
    "c": (Unit("c", 0), Unit("c", 1), Unit("c", 0, UnitKind.VALIDATE)),
}


def test_randomized_rule_is_uniform_over_candidates() -> None:
    rng = np.random.default_rng(1)
    counts = Counter(RandomizedRule().choose("w", CANDIDATES, REMAINING, rng) for _ in range(3000))
    assert set(counts) == set(CANDIDATES)
    assert all(900 < n < 1100 for n in counts.values()), counts


def test_randomized_rule_is_deterministic_for_equal_seeds() -> None:
    def draws(seed: int) -> list[Unit]:
        rng = np.random.default_rng(seed)
        return [RandomizedRule().choose("w", CANDIDATES, REMAINING, rng) for _ in range(50)]

    assert draws(3) == draws(3) != draws(4)


def test_work_aware_rule_prefers_the_trial_with_most_work_left() -> None:
    calls = []

    def estimate(unit: Unit, worker: str) -> float:
        calls.append(worker)
        return {"a": 5.0, "b": 1.0, "c": 2.0}[unit.trial]

    rule = WorkAwareRule(estimate)
    rng = np.random.default_rng(0)
    # work left: a = 2 * 5, b = 3 * 1, c = 3 * 2 (its validate unit counts too)
    assert rule.choose("w7", CANDIDATES, REMAINING, rng) == Unit("a", 0)
    assert set(calls) == {"w7"}
    assert rule.choose("w7", CANDIDATES[1:], REMAINING, rng) == Unit("c", 0)


def test_work_aware_rule_breaks_ties_with_the_rng() -> None:
    rule = WorkAwareRule(lambda unit, worker: 1.0)
    rng = np.random.default_rng(0)
    tied = [Unit("b", 0), Unit("c", 0)]  # 3 units left each; "a" has 2
    picks = Counter(rule.choose("w", CANDIDATES, REMAINING, rng) for _ in range(400))
    assert set(picks) == set(tied) and min(picks.values()) > 150
