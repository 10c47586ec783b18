"""Predicted vs actual time and dollars of elastic runs on a real cluster, and what
elastic execution saves against the best static plan, both run for real.

For each search (successive halving as in ``conf/experiments/digits-elastic.yaml``, and
SEER on the same workload) the benchmark runs, on the local standalone cluster that
cerebro-spark starts on 127.0.0.1 (worker daemons billed as ``conf/prices/local.yaml``'s
``local-core``):

1. the elastic plan (``plan: auto``): per stage, the planned and measured executors,
   seconds and dollars, and the error in percent (RubberBand §6 reports under 3 % between
   its simulator and its cluster);
2. the cheapest static plan the planner found (the same executors for every stage, given
   as a plan file), run for real: its measured dollars against the elastic run's.

Each run starts its own cluster and Spark application, so each pays the start-up the
plan predicts. Re-planning is off (``replan_drift`` very large) so that every stage is
compared with the plan made before the run.

With ``--load F`` (issue 30, part 3) it then runs each search's elastic plan once more,
re-planning on (the config's ``replan_drift``), while ``(F - 1) x cores`` busy processes
started by the benchmark share the machine (F times the CPU demand): the second table
says in which stage the run first re-planned and why, whether the deadline was met, and
the summary's miss line when it was not.

With ``--keep DIR`` each search's store (datasets, experiments and their ``events.jsonl``:
``DIR/<search>/experiments/{elastic,static,loaded}``) is kept there instead of a
temporary folder, to compare the plan's stages with the rounds the runs trained.

    python benchmarks/elastic_execution.py [--searches sha,seer] [--load 2] [--out FILE]
        [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import logging
import multiprocessing
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "conf/experiments/digits-elastic.yaml"


def search_config(search: str, store: str) -> dict[str, Any]:
    """The demo's workload, with successive halving or SEER, never re-planned."""
    config: dict[str, Any] = yaml.safe_load(DEMO.read_text())
    config["store"] = store
    config["elastic"]["replan_drift"] = 1.0e9
    config["elastic"]["prices"] = str(ROOT / config["elastic"]["prices"])
    config["elastic"]["profile"] = str(ROOT / config["elastic"]["profile"])
    if search == "seer":
        config["name"] = "bench-seer"
        config["epochs"] = 8
        # One deadline, SEER's and the run's; its worker_seconds are its resources.
        config["procedure"] = {"name": "seer", "worker_seconds": 80, "eta": 2, "v": 2,
                               "epoch_seconds": 0.65}  # fmt: skip
        config["deadline"] = 45
    else:
        config["name"] = "bench-sha"
    return config


def run(config: dict[str, Any], experiment_id: str) -> list[dict[str, Any]]:
    """Run a config (dict) and return its events."""
    from cerebro_spark.engine import parse_config, read_events, run_experiment
    from cerebro_spark.store import open_store

    run_experiment(parse_config(config), experiment_id=experiment_id)
    return read_events(open_store(config["store"]).child(f"experiments/{experiment_id}"))


def static_plan_file(config: dict[str, Any], path: Path) -> tuple[int, Path]:
    """The cheapest static plan the planner found for ``config``, as a plan file (every
    stage on the same executors, with its predicted times and dollars)."""
    from cerebro_spark.engine import parse_config
    from cerebro_spark.engine._elastic import load_plan_inputs, plan_config

    parsed = parse_config(config)
    profile, catalog = load_plan_inputs(parsed)
    static = plan_config(parsed, profile, catalog).static
    path.write_text(
        json.dumps(
            {
                "feasible": True,
                "instance_type": parsed.elastic.instance_type if parsed.elastic else None,
                "stages": [s.to_dict() for s in static.stages],
            }
        )
    )
    return static.workers[0], path


def prepare(config: dict[str, Any]) -> None:
    """Write the dataset and start the driver's JVM before the runs, so that no run's first
    stage pays for what the other's does not (the JVM outlives a stopped session)."""
    from cerebro_spark.driver._dataset import resolve_dataset
    from cerebro_spark.engine import parse_config
    from cerebro_spark.spark_session import spark_session
    from cerebro_spark.store import open_store

    resolve_dataset(parse_config(config), open_store(config["store"]))
    spark_session("local[1]", "warm-up", {"spark.ui.enabled": "false"}).stop()


def table(search: str, mode: str, events: list[dict[str, Any]]) -> list[str]:
    """Rows of predicted vs actual per stage and in total."""
    rows = []
    for a in (e for e in events if e["event"] == "stage_actual"):
        rows.append(
            f"{search:<5} {mode:<7} {a['stage']:>5} {a['planned_workers']:>4}/{a['workers']:<4} "
            f"{a['planned_seconds']:>8.1f} {a['seconds']:>8.1f} "
            f"{_err(a['seconds'], a['planned_seconds']):>8} "
            f"{a['planned_usd']:>10.6f} {a['usd']:>10.6f} {_err(a['usd'], a['planned_usd']):>8}"
        )
    s = next(e for e in events if e["event"] == "elastic_summary")
    rows.append(
        f"{search:<5} {mode:<7} {'total':>5} {'':>9} "
        f"{s['planned_seconds']:>8.1f} {s['seconds']:>8.1f} "
        f"{_err(s['seconds'], s['planned_seconds']):>8} "
        f"{s['planned_usd']:>10.6f} {s['usd']:>10.6f} {_err(s['usd'], s['planned_usd']):>8}"
    )
    return rows


def _spin(stop: Any) -> None:
    """A busy process: it burns a core until ``stop`` is set."""
    while not stop.is_set():
        sum(i * i for i in range(10_000))


@contextlib.contextmanager
def cpu_load(factor: float) -> Any:
    """``(factor - 1) x cores`` busy processes for the block (``factor`` times the demand)."""
    stop = multiprocessing.Event()
    count = max(0, round((factor - 1) * (os.cpu_count() or 1)))
    spinners = [
        multiprocessing.Process(target=_spin, args=(stop,), daemon=True) for _ in range(count)
    ]
    for spinner in spinners:
        spinner.start()
    try:
        yield count
    finally:
        stop.set()
        for spinner in spinners:
            spinner.join(timeout=10)
            if spinner.is_alive():
                spinner.kill()


def loaded_row(search: str, events: list[dict[str, Any]], failed: str | None = None) -> str:
    """The loaded run in one line: first re-plan, deadline met or the miss line.

    ``failed``: why the run raised (a search that trained nothing by its deadline raises
    ``SearchFailedError`` after its summary: the miss is still reported).
    """
    summary = next((e for e in events if e["event"] == "elastic_summary"), None)
    if summary is None:
        return f"{search:<5} no elastic summary: {failed}"
    replans = summary.get("replans") or []
    first = replans[0] if replans else None
    where = "none" if first is None else f"stage {int(first['stage']) + 1}: {first['reason']}"
    met = summary.get("deadline_met")
    misses = "; ".join(summary.get("misses") or []) or "-"
    return (
        f"{search:<5} {summary['first_plan']['seconds']:>8.1f} {summary['seconds']:>8.1f} "
        f"{summary['deadline']:>8.1f} {len(replans):>7}  {met!s:<5}  first re-plan {where}"
        f"\n      miss: {misses}" + ("" if failed is None else f"\n      then: {failed}")
    )


@contextlib.contextmanager
def _store_dir(keep: str | None, search: str) -> Any:
    """A temporary folder for a search's store, or ``keep/<search>`` (kept, emptied first)."""
    if keep is None:
        with tempfile.TemporaryDirectory(prefix="cerebro-bench-elastic-") as tmp:
            yield tmp
        return
    path = Path(keep) / search
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    yield str(path)


def _err(actual: float, planned: float) -> str:
    return "-" if planned == 0 else f"{100 * (actual - planned) / planned:+.1f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--searches", default="sha,seer")
    parser.add_argument("--out", help="also write the output here")
    parser.add_argument("--load", type=float, default=0.0, help="also run under F x CPU load")
    parser.add_argument("--keep", help="keep each search's store (its event logs) under DIR")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from cerebro_spark.engine import read_events
    from cerebro_spark.errors import SearchFailedError
    from cerebro_spark.store import open_store

    out = io.StringIO()

    def say(line: str = "") -> None:
        print(line, flush=True)
        out.write(line + "\n")

    load = f" --load {args.load:g}" if args.load else ""
    keep = f" --keep {args.keep}" if args.keep else ""
    say(f"# python benchmarks/elastic_execution.py --searches {args.searches}{load}{keep}")
    say(f"# {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}, "
        f"{platform.node()}, {platform.processor() or platform.machine()}")  # fmt: skip
    say()
    head = (
        f"{'search':<5} {'mode':<7} {'stage':>5} {'exec p/a':>9} {'plan s':>8} {'actual s':>8} "
        f"{'err':>8} {'plan $':>10} {'actual $':>10} {'err':>8}"
    )
    totals: dict[str, dict[str, float]] = {}
    lines = [head]
    loaded: list[str] = []
    for search in args.searches.split(","):
        with _store_dir(args.keep, search) as tmp:
            config = search_config(search, tmp)
            prepare(config)
            workers, plan = static_plan_file(config, Path(tmp) / "static.json")
            elastic = run(config, "elastic")
            lines += table(search, "elastic", elastic)
            config["elastic"]["plan"] = str(plan)
            static = run(config, "static")
            lines += table(search, f"static{workers}", static)
            summary = {m: next(e for e in ev if e["event"] == "elastic_summary")
                       for m, ev in (("elastic", elastic), ("static", static))}  # fmt: skip
            plan_event = next(e for e in elastic if e["event"] == "elastic_plan")
            totals[search] = {
                "elastic_planned": plan_event["usd"],
                "static_planned": plan_event["static"]["usd"],
                "elastic_actual": summary["elastic"]["usd"],
                "static_actual": summary["static"]["usd"],
                "failed_tasks": float(
                    (summary["elastic"]["failed_tasks"] or 0)
                    + (summary["static"]["failed_tasks"] or 0)
                ),
            }
            if args.load:
                config = search_config(search, tmp)
                del config["elastic"]["replan_drift"]  # the config's: re-planning on
                failed = None
                with cpu_load(args.load):
                    began = time.monotonic()
                    try:
                        events = run(config, "loaded")
                    except SearchFailedError as error:  # nothing trained: reported as a miss
                        failed = f"SearchFailedError: {str(error).split(' (event log')[0]}"
                        events = read_events(open_store(tmp).child("experiments/loaded"))
                loaded.append(loaded_row(search, events, failed))
                logging.getLogger(__name__).info(
                    "loaded %s: %.0f s", search, time.monotonic() - began
                )
    for line in lines:
        say(line)
    say()
    say(f"{'search':<6} {'elastic $ plan/actual':>24} {'static $ plan/actual':>24} "
        f"{'saving plan':>12} {'saving actual':>14} {'failed tasks':>13}")  # fmt: skip
    for search, t in totals.items():
        say(
            f"{search:<6} {t['elastic_planned']:>11.6f}/{t['elastic_actual']:<12.6f} "
            f"{t['static_planned']:>11.6f}/{t['static_actual']:<12.6f} "
            f"{1 - t['elastic_planned'] / t['static_planned']:>11.1%} "
            f"{1 - t['elastic_actual'] / t['static_actual']:>13.1%} {int(t['failed_tasks']):>13}"
        )
    if loaded:
        say()
        say(f"under {args.load:g}x CPU load, re-planning on:")
        say(f"{'search':<5} {'plan s':>8} {'actual s':>8} {'deadline':>8} {'replans':>7}  met")
        for row in loaded:
            say(row)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(out.getvalue())


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
