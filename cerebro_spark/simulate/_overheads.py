"""Per-unit overheads of a measured run, read from its event log (issue 13, part 6).

What the MOP epoch model (:mod:`cerebro_spark.simulate._epoch`) needs to predict a run at
a scale no one can afford to measure, each measured on a real run's ``events.jsonl``:

* **compute**: a unit's training (or validation) time without its checkpoint I/O, mean of
  ``seconds - io_seconds`` over the train (validation) units;
* **hop**: moving the trial to the unit's worker and back, the checkpoint read and write
  around a train unit, as far as they keep the worker from its next unit (mean
  ``io_seconds``; a validation unit's read is ``validate_hop``). A train unit whose
  worker was freed before its checkpoint was durable (``trained_at``, issue 13 part 3)
  wrote it while the worker ran its next unit: its write, taken as the time from
  ``trained_at`` to its ``unit_end`` (at most its ``io_seconds``), is left out of its hop
  and of its worker's time, and its worker's span ends at ``trained_at``;
* **dispatch**: what a worker spends per unit outside the unit's own ``seconds`` -- the
  task and result crossing the control protocol, the driver handling the result (event
  log, state fold, scheduler) and handing out the next unit: the mean over units of
  ``unit_end - unit_start - seconds`` plus the median over a worker's consecutive units
  in a round of ``next unit_start - unit_end`` (a median there, so that waits for a free
  trial, which the scheduler model itself reproduces, are not counted as overhead);
* **start-up**: from the backend's start (the ``dataset`` event, logged just before it) to
  a worker ready (its ``worker_ready``: Python, torch, partitions loaded), median over the
  first session's workers;
* **round**: per round, from ``round_start`` to its first ``unit_start`` plus from its last
  ``unit_end`` to ``round_end`` (the procedure's decisions), median over rounds; **between
  rounds**: from a ``round_end`` to the next ``round_start`` (the leaderboard, the report's
  refresh, the procedure's next suggestions), median;
* **worker spread**: per round, the standard deviation of the workers' mean train
  compute over their mean, averaged over rounds (a worker on a busier core or a slower
  device; with partitions placed, the slowest worker sets the epoch's end);
* **re-homing**: from a worker's ``worker_lost``/``worker_retired`` to the next
  ``worker_partitions`` that hands its partitions to a survivor, median (``None`` when the
  run lost no worker).

Driver CPU per unit is not in a log (it is the driver process's CPU time, see
``benchmarks/driver_scale.py``); it is given to the model apart.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from cerebro_spark.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class UnitOverheads:
    """Measured per-unit times of one run (seconds; see the module docstring).

    Attributes:
        train_seconds: Mean compute of a train unit (no checkpoint I/O).
        validate_seconds: Mean compute of a validation unit.
        hop_seconds: Mean checkpoint read and write of a train unit.
        validate_hop_seconds: Mean checkpoint read of a validation unit.
        dispatch_seconds: Time a worker spends per unit outside the unit.
        startup_seconds: Median from the backend's start to a worker ready.
        round_seconds: Median per round outside its units (its start and its end).
        between_rounds_seconds: Median from a round's end to the next round's start.
        worker_spread: How unequal the workers are: the standard deviation of the
            workers' mean train compute over its mean (0: all alike).
        rehome_seconds: Median from a worker's loss to its partitions served again, or
            ``None`` when the run lost none.
        units: Units measured.
    """

    train_seconds: float
    validate_seconds: float
    hop_seconds: float
    validate_hop_seconds: float
    dispatch_seconds: float
    startup_seconds: float
    round_seconds: float = 0.0
    between_rounds_seconds: float = 0.0
    worker_spread: float = 0.0
    rehome_seconds: float | None = None
    units: int = 0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "units" or (value is None and field.name == "rehome_seconds"):
                continue
            if not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
                raise ConfigError(f"{field.name} must be a finite number >= 0, got {value!r}")

    def unit_seconds(self, kind: str) -> float:
        """Worker time of one unit of ``kind`` (``"train"``/``"validate"``): compute and hop."""
        if kind == "train":
            return self.train_seconds + self.hop_seconds
        if kind == "validate":
            return self.validate_seconds + self.validate_hop_seconds
        raise ConfigError(f"kind must be 'train' or 'validate', got {kind!r}")

    def with_compute(self, train_seconds: float, validate_seconds: float) -> UnitOverheads:
        """The same overheads around units of another compute time (a bigger model)."""
        return dataclasses.replace(
            self, train_seconds=train_seconds, validate_seconds=validate_seconds
        )

    def slower(self, factor: float) -> UnitOverheads:
        """The same run on a machine ``factor`` times slower: every per-unit time scaled.

        Start-up and re-homing are kept (they are paid once, not per unit).

        Raises:
            ConfigError: ``factor`` is not a finite number > 0.
        """
        if not (isinstance(factor, (int, float)) and 0 < factor < float("inf")):
            raise ConfigError(f"factor must be a finite number > 0, got {factor!r}")
        fields = (
            "train_seconds",
            "validate_seconds",
            "hop_seconds",
            "validate_hop_seconds",
            "dispatch_seconds",
            "round_seconds",
            "between_rounds_seconds",
        )
        return dataclasses.replace(self, **{f: getattr(self, f) * factor for f in fields})

    def describe(self) -> str:
        """One line: every overhead in milliseconds (re-homing in seconds)."""
        rehome = "n/a" if self.rehome_seconds is None else f"{self.rehome_seconds:.2f} s"
        return (
            f"train {self.train_seconds * 1e3:.1f} ms + hop {self.hop_seconds * 1e3:.1f} ms, "
            f"validate {self.validate_seconds * 1e3:.1f} ms + "
            f"{self.validate_hop_seconds * 1e3:.1f} ms, dispatch "
            f"{self.dispatch_seconds * 1e3:.1f} ms, start-up {self.startup_seconds:.2f} s, "
            f"round {self.round_seconds * 1e3:.0f} ms + {self.between_rounds_seconds * 1e3:.0f} ms "
            f"between, worker spread {self.worker_spread:.1%}, re-homing {rehome} "
            f"({self.units} units)"
        )


def measure_overheads(
    events: Sequence[Mapping[str, Any]], *, rounds: Sequence[int] | None = None
) -> UnitOverheads:
    """Derive a run's :class:`UnitOverheads` from its event log.

    Args:
        events: The run's events in order (:func:`~cerebro_spark.engine.read_events`).
        rounds: Measure only the units and rounds of these rounds (default: all); the
            start-up and re-homing come from the whole log.

    Raises:
        ConfigError: The log (or the rounds chosen) has no finished train or validation
            unit, or no worker became ready.
    """
    chosen = None if rounds is None else frozenset(rounds)
    ends: list[Mapping[str, Any]] = []
    starts: dict[tuple[Any, ...], float] = {}
    by_worker: dict[tuple[int, str], list[tuple[float, float, float]]] = {}
    first_start: dict[int, float] = {}
    last_end: dict[int, float] = {}
    round_open: dict[int, float] = {}
    round_close: dict[int, float] = {}
    backend_start: float | None = None
    ready: dict[str, float] = {}
    left: list[float] = []
    rehome: list[float] = []
    sessions = 0
    for event in events:
        kind = event.get("event")
        when = float(event.get("time", 0.0))
        if kind == "experiment_start":
            sessions += 1
        elif kind == "dataset" and sessions <= 1 and backend_start is None:
            backend_start = when
        elif kind == "worker_ready" and sessions <= 1:
            ready.setdefault(str(event["worker"]), when)
        elif kind in ("worker_lost", "worker_retired"):
            left.append(when)
        elif kind == "worker_partitions" and left:
            rehome.append(when - left.pop(0))
        elif kind == "round_start":
            round_open[int(event["round"])] = when
        elif kind == "round_end":
            round_close[int(event["round"])] = when
        number = event.get("round")
        if kind not in ("unit_start", "unit_end") or event.get("group") is not None:
            continue
        number = int(number)  # type: ignore[arg-type]
        if chosen is not None and number not in chosen:
            continue
        key = (number, event["trial"], event["kind"], event["partition"], event["worker"])
        if kind == "unit_start":
            starts[key] = when
            first_start.setdefault(number, when)
            continue
        ends.append(event)
        last_end[number] = when
        start = starts.pop(key, None)
        if start is not None:
            worker = (number, str(event["worker"]))
            freed = float(event.get("trained_at", when))
            span = (start, freed, float(event["seconds"]) - _overlapped(event))
            by_worker.setdefault(worker, []).append(span)
    train = [e for e in ends if e["kind"] == "train"]
    validate = [e for e in ends if e["kind"] == "validate"]
    if not train or not validate:
        raise ConfigError(
            f"the event log has {len(train)} finished train and {len(validate)} validation "
            f"units{'' if chosen is None else f' in rounds {sorted(chosen)}'}: the "
            "overheads need both"
        )
    if backend_start is None or not ready:
        raise ConfigError("the event log has no 'dataset' event or no worker_ready: no start-up")
    outside: list[float] = []
    gaps_between: list[float] = []
    by_round_worker: dict[tuple[int, str], list[float]] = {}
    for e in train:
        compute = float(e["seconds"]) - float(e.get("io_seconds", 0.0))
        by_round_worker.setdefault((int(e["round"]), str(e["worker"])), []).append(compute)
    per_round: dict[int, list[float]] = {}
    for (number, _), values in by_round_worker.items():
        per_round.setdefault(number, []).append(_mean(values))
    spreads = [
        statistics.pstdev(means) / statistics.fmean(means)
        for means in per_round.values()
        if len(means) > 1 and statistics.fmean(means) > 0
    ]
    for spans in by_worker.values():
        spans.sort()
        outside += [max(0.0, end - start - seconds) for start, end, seconds in spans]
        for (_, end, _), (following, _, _) in itertools.pairwise(spans):
            gaps_between.append(max(0.0, following - end))
    dispatch = _mean(outside) + (statistics.median(gaps_between) if gaps_between else 0.0)
    gaps = [
        round_open[n + 1] - round_close[n]
        for n in sorted(round_close)
        if n + 1 in round_open and (chosen is None or n in chosen)
    ]
    overhead = [
        (first_start[n] - round_open[n]) + (round_close[n] - last_end[n])
        for n in sorted(first_start)
        if n in round_open and n in round_close and n in last_end
    ]
    return UnitOverheads(
        train_seconds=_mean(float(e["seconds"]) - float(e.get("io_seconds", 0.0)) for e in train),
        validate_seconds=_mean(
            float(e["seconds"]) - float(e.get("io_seconds", 0.0)) for e in validate
        ),
        hop_seconds=_mean(float(e.get("io_seconds", 0.0)) - _overlapped(e) for e in train),
        validate_hop_seconds=_mean(float(e.get("io_seconds", 0.0)) for e in validate),
        dispatch_seconds=dispatch,
        startup_seconds=max(0.0, statistics.median(ready.values()) - backend_start),
        round_seconds=max(0.0, statistics.median(overhead)) if overhead else 0.0,
        between_rounds_seconds=max(0.0, statistics.median(gaps)) if gaps else 0.0,
        worker_spread=statistics.fmean(spreads) if spreads else 0.0,
        rehome_seconds=max(0.0, statistics.median(rehome)) if rehome else None,
        units=len(ends),
    )


def round_makespans(events: Sequence[Mapping[str, Any]]) -> dict[int, float]:
    """Each closed round's makespan (``round_end - round_start``, seconds), by round."""
    opened: dict[int, float] = {}
    spans: dict[int, float] = {}
    for event in events:
        kind = event.get("event")
        if kind == "round_start":
            opened[int(event["round"])] = float(event["time"])
        elif kind == "round_end" and int(event["round"]) in opened:
            spans[int(event["round"])] = float(event["time"]) - opened[int(event["round"])]
    return spans


def _overlapped(end: Mapping[str, Any]) -> float:
    """Seconds of a unit's checkpoint write done after its worker was freed (else 0)."""
    if "trained_at" not in end:
        return 0.0
    after = float(end["time"]) - float(end["trained_at"])
    return min(max(0.0, after), float(end.get("io_seconds", 0.0)))


def _mean(values: Any) -> float:
    found = [max(0.0, v) for v in values]
    return statistics.fmean(found) if found else 0.0
