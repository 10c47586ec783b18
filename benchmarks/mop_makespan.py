"""Makespan of the MOP scheduler against the lower bound (Cerebro §5.4, simulated).

For p workers (one partition each) and |S| configs, homogeneous and heterogeneous unit
times (§5.4: CNN costs from Appendix B over GPU capacities), the randomized rule (Alg. 1)
and the work-aware rule, with fully dynamic visit orders and with seeded rotations, prints
mean and worst makespan / lower bound over N seeds; lower bound = max(max worker load,
max trial total). Each seed's instance is shared by every rule and order.

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
)


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
        instances = [
            heterogeneous_instance(n_trials, p, np.random.default_rng([0, seed]))
            if hetero
            else homogeneous_instance(n_trials, p)
            for seed in range(args.seeds)
        ]
        for order, rule in itertools.product(["dynamic", "seeded"], ["randomized", "work-aware"]):
            ratios = [ratio(inst, rule, order, seed) for seed, inst in enumerate(instances)]
            times = "heterogeneous" if hetero else "homogeneous"
            print(
                f"| {p:>2} | {n_trials:>3} | {times:<13} | {order:<7} | {rule:<10} "
                f"| {np.mean(ratios):.3f} | {max(ratios):.3f} |"
            )
    print(f"\n{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
