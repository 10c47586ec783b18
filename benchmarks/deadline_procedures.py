"""Best score at a tight deadline: HyperSched and SEER against ASHA (simulated).

The direction of HyperSched Fig. 5/8 and SEER Table 2: under a deadline, a procedure that
stops exploring in time and gives the best trials more workers (HyperSched §4, SEER §3)
ends with a better model than deadline-unaware ASHA (HyperSched §3.3.1). Every procedure
runs on Cerebro's round template in virtual time (``cerebro_spark.simulate``) on
HyperSched §6's parametric score model (HyperSched Table 2's space, ``R`` = 50 epochs of
10 steps, 1 s per epoch on one worker); all procedures see the same landscapes (one per
seed). Prints, per deadline, each procedure's best score at the deadline, mean ± std over
the seeds, and the mean number of trials it started.

    python benchmarks/deadline_procedures.py [--seeds 20] [--workers 32] [--deadlines 10,20,30]
        [--scaling linear] [--overhead 0] [--procedures asha,hypersched,seer,random]
"""

from __future__ import annotations

import argparse
import time

from cerebro_spark.simulate import SimulationSettings, compare_procedures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20, help="seeds per cell (default 20)")
    parser.add_argument("--workers", type=int, default=32, help="cluster size (default 32)")
    parser.add_argument("--deadlines", default="10,20,30", help="seconds (default 10,20,30)")
    parser.add_argument("--scaling", default="linear", choices=("linear", "sqrt", "none"))
    parser.add_argument("--overhead", type=float, default=0.0, help="start-up/resize seconds")
    parser.add_argument("--procedures", default="asha,hypersched,seer,random")
    args = parser.parse_args()
    procedures = args.procedures.split(",")
    deadlines = [float(d) for d in args.deadlines.split(",")]
    print(
        f"best score at the deadline, mean ± std over {args.seeds} seeds; "
        f"N = {args.workers} workers, scaling {args.scaling}, overhead {args.overhead:g} s\n"
    )
    print("| deadline (s) | procedure | best score | trials |")
    print("|--:|:--|--:|--:|")
    start = time.perf_counter()
    for deadline in deadlines:
        settings = SimulationSettings(
            deadline=deadline,
            num_workers=args.workers,
            scaling=args.scaling,
            overhead=args.overhead,
        )
        for summary in compare_procedures(procedures, settings, seeds=args.seeds):
            print(
                f"| {deadline:g} | {summary.procedure} | {summary.mean:.3f} ± {summary.std:.3f} "
                f"| {summary.mean_trials:.1f} |"
            )
    print(f"\n{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
