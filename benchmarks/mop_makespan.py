"""Makespan of the MOP scheduler against the lower bound (Cerebro §5.4, simulated).

For p workers (one partition each) and |S| configs, homogeneous and heterogeneous unit
times (§5.4: CNN costs from Appendix B over GPU capacities), the randomized rule (Alg. 1)
and the work-aware rule, with fully dynamic visit orders and with seeded rotations, prints
mean and worst makespan / lower bound over N seeds; lower bound = max(max worker load,
max trial total). Each seed's instance is shared by every rule and order.

A second table compares the two ways of seeding visit orders (issue 29), with the
work-aware rule: ``round`` draws the round's orders for its live trials together
(:func:`seeded_visit_orders`, before), ``trial`` gives each trial its own stream
(:func:`trial_visit_order` of its slot and epoch, after), so that no trial's fate
changes another's weights. Scenarios: ``all`` (the search's trials, slots ``0..n-1``, at
one epoch), ``survivors`` (``n`` trials left of ``3n``, e.g. a successive-halving rung:
slots drawn from ``0..3n-1``) and ``mixed`` (slots ``0..n-1`` at epochs drawn from 0..3,
as in an asynchronous procedure's rounds).

    python benchmarks/mop_makespan.py [--seeds 20]
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

from cerebro_spark.mop import (
    RandomizedRule,
    ScheduleInstance,
    SchedulingRule,
    WorkAwareRule,
    heterogeneous_instance,
    homogeneous_instance,
    seeded_visit_orders,
    simulate,
    trial_visit_order,
)


def seeded_instances(n_trials: int, p: int, hetero: bool, seeds: int) -> list[ScheduleInstance]:
    """One instance per seed (seed ``s``'s is the same in every table)."""
    return [
        heterogeneous_instance(n_trials, p, np.random.default_rng([0, seed]))
        if hetero
        else homogeneous_instance(n_trials, p)
        for seed in range(seeds)
    ]


def ratio(instance: ScheduleInstance, rule: str, order: str, seed: int) -> float:
    rng = np.random.default_rng([1, seed])
    chosen: SchedulingRule = (
        WorkAwareRule(instance.estimate) if rule == "work-aware" else RandomizedRule()
    )
    orders = (
        seeded_visit_orders(instance.trials, instance.partitions, rng)
        if order == "seeded"
        else None
    )
    return simulate(instance, rng, rule=chosen, visit_orders=orders).ratio


def streams_ratio(instance: ScheduleInstance, scheme: str, scenario: str, seed: int) -> float:
    """Makespan / bound of one epoch of ``instance`` with ``scheme``'s orders."""
    rng = np.random.default_rng([2, seed])
    n = len(instance.trials)
    if scenario == "survivors":
        slots = sorted(int(s) for s in rng.choice(3 * n, size=n, replace=False))
    else:
        slots = list(range(n))
    epochs = [int(e) for e in rng.integers(0, 4, size=n)] if scenario == "mixed" else [0] * n
    if scheme == "round":
        orders = seeded_visit_orders(instance.trials, instance.partitions, rng)
    else:
        orders = {
            trial: trial_visit_order(instance.partitions, (seed, 4), epoch, slot)
            for trial, slot, epoch in zip(instance.trials, slots, epochs, strict=True)
        }
    return simulate(instance, rng, rule=WorkAwareRule(instance.estimate), visit_orders=orders).ratio


def streams_table(seeds: int) -> None:
    print("\nvisit-order streams, work-aware rule: makespan / lower bound (mean, worst)\n")
    head = f"| {'scenario':<9} | {'p':>2} | {'|S|':>3} | {'times':<13} "
    print(head + "| round (before) | trial (after) |")
    print("|:----------|---:|----:|:--------------|---------------:|--------------:|")
    for scenario in ("all", "survivors", "mixed"):
        for p, k, hetero in itertools.product([4, 8, 16], [1, 2, 4], [False, True]):
            n_trials = k * p
            instances = seeded_instances(n_trials, p, hetero, seeds)
            cells = []
            for scheme in ("round", "trial"):
                ratios = [
                    streams_ratio(inst, scheme, scenario, s) for s, inst in enumerate(instances)
                ]
                cells.append(f"{np.mean(ratios):.3f}, {max(ratios):.3f}")
            times = "heterogeneous" if hetero else "homogeneous"
            print(
                f"| {scenario:<9} | {p:>2} | {n_trials:>3} | {times:<13} "
                f"| {cells[0]:>14} | {cells[1]:>13} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20, help="instances per row (default 20)")
    args = parser.parse_args()
    print(f"makespan / lower bound over {args.seeds} seeds (mean, worst)\n")
    print(
        f"| {'p':>2} | {'|S|':>3} | {'times':<13} | {'order':<7} | {'rule':<10} | mean  | worst |"
    )
    print("|---:|----:|:--------------|:--------|:-----------|------:|------:|")
    start = time.perf_counter()
    for p, k, hetero in itertools.product([4, 8, 16], [1, 2, 4], [False, True]):
        n_trials = k * p
        instances = seeded_instances(n_trials, p, hetero, args.seeds)
        for order, rule in itertools.product(["dynamic", "seeded"], ["randomized", "work-aware"]):
            ratios = [ratio(inst, rule, order, seed) for seed, inst in enumerate(instances)]
            times = "heterogeneous" if hetero else "homogeneous"
            print(
                f"| {p:>2} | {n_trials:>3} | {times:<13} | {order:<7} | {rule:<10} "
                f"| {np.mean(ratios):.3f} | {max(ratios):.3f} |"
            )
    streams_table(args.seeds)
    print(f"\n{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
