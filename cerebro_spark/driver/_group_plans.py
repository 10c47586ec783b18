"""The groups a run's trials actually trained in, read back from its log (for ``replay``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cerebro_spark.driver._events import read_events
from cerebro_spark.driver._layout import experiment_prefix
from cerebro_spark.store import Store
from cerebro_spark.units import UnitKind


def group_plans_from_events(events: Iterable[Mapping[str, Any]]) -> dict[int, dict[str, list[int]]]:
    """Return the groups each trial actually trained in, by round (Cerebro §5.7).

    From the ``unit_end`` events of train units: a complete group (all its
    ``group_partitions`` logged) covers its steps, an ordinary unit one step; partial
    groups (a driver killed while logging them) and failed attempts are ignored, and
    where a step was logged twice the later entry wins. Each trial's plan is the sizes of
    its groups along its visit order; only trials that trained at least one group in a
    round are listed (the others trained one unit at a time).

    Args:
        events: An experiment's event log.

    Returns:
        Round to trial to its group sizes, for ``Experiment(group_plans=...)``.
    """
    starts: dict[int, dict[str, dict[int, int]]] = {}
    open_groups: dict[str, dict[int, Mapping[str, Any]]] = {}
    for event in events:
        if event["event"] != "unit_end" or event["kind"] != UnitKind.TRAIN.value:
            continue
        by_step = starts.setdefault(event["round"], {}).setdefault(event["trial"], {})
        group = event.get("group")
        if group is None:
            by_step[event["step"]] = 1
            continue
        ends = open_groups.setdefault(group, {})
        ends[event["step"]] = event
        if len(ends) == len(event["group_partitions"]):
            del open_groups[group]
            by_step[min(ends)] = len(ends)
    plans: dict[int, dict[str, list[int]]] = {}
    for round_, trials in sorted(starts.items()):
        for trial, by_step in sorted(trials.items()):
            sizes: list[int] = []
            position = 0
            while position in by_step:
                sizes.append(by_step[position])
                position += by_step[position]
            if any(size > 1 for size in sizes):
                plans.setdefault(round_, {})[trial] = sizes
    return plans


def logged_group_plans(store: Store, experiment_id: str) -> dict[int, dict[str, list[int]]]:
    """Return the groups an experiment's trials trained in, by round then trial.

    See :func:`group_plans_from_events`; impose them on a replay together with the
    logged visit orders (``Experiment(visit_orders=..., group_plans=...)``).
    """
    return group_plans_from_events(read_events(store.child(experiment_prefix(experiment_id))))
