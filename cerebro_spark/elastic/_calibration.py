"""Early calibration: when a run's first measurements contradict its profile, say so.

A plan is only as good as its profile. An elastic run measures two things early (its
controller, :mod:`cerebro_spark.engine._elastic`): its *start-up* (from ``run`` to its
first round: planning, the cluster, the first worker ready with its partitions) against
the first stage's planned lead, and its *first units* (the median train unit's compute and
checkpoint I/O, the median validation of a trial after an epoch) against the profile's
trial-epoch (:func:`~._profile.trial_epoch`). When either differs from the profile by more
than ``replan_drift`` (a share, as for a stage's seconds; :meth:`Calibration.off`), the
profile values the measurement implies (:func:`startup_calibration`,
:func:`units_calibration`) replace the profile's (:func:`calibrated`) and the run
re-plans from them at once, rather than at the next stage boundary with the same wrong
profile. RubberBand's planner is "parameterized by profiling ... prior to execution"
(RubberBand §1, §5 "Planning"); its predictions hold only while the machine behaves as
it did when profiled, which a shared machine does not promise.

The machine's load is part of a measurement: :func:`machine_load` is recorded with a
profile (``measured.load``) and :func:`load_change` says when today's differs a lot.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from cerebro_spark.elastic._profile import Profile, TypeProfile, trial_epoch

LOAD_CHANGE = 0.5
"""How much the load per core (1-minute load average / cores) may differ from the
profile's before ``run`` warns: half a busy core per core. On a 2-core machine that is one
more (or fewer) busy process than when the profile was measured, which changes unit
seconds by up to half (two processes share a core)."""


@dataclasses.dataclass(frozen=True)
class Calibration:
    """What a measurement says the profile should be.

    Attributes:
        what: ``"start-up"`` or ``"units"``.
        measured: The measured seconds (start-up, or a trial-epoch on one worker).
        planned: What the profile predicted for the same.
        values: The profile keys the measurement sets (per-type keys as plain numbers).
    """

    what: str
    measured: float
    planned: float
    values: Mapping[str, float]

    @property
    def ratio(self) -> float:
        """``measured / planned``: the pace of what is left of a stage (1 with no plan)."""
        return self.measured / self.planned if self.planned > 0 else 1.0

    def off(self, replan_drift: float) -> bool:
        """Whether the measurement is off the profile by more than ``replan_drift``."""
        return drift(self.measured, self.planned) > replan_drift

    @property
    def reason(self) -> str:
        """Why the run re-plans, for the log and the summary."""
        name = "start-up" if self.what == "start-up" else "a trial-epoch of its first units"
        return (
            f"measured {name} {self.measured:.2f} s against {self.planned:.2f} s in the "
            f"profile ({drift(self.measured, self.planned):.0%} off)"
        )

    def to_event(self, replan_drift: float) -> dict[str, Any]:
        """The ``calibration`` event's fields."""
        return {
            "what": self.what,
            "off": self.off(replan_drift),
            "measured": round(self.measured, 4),
            "planned": round(self.planned, 4),
            "values": {k: round(v, 6) for k, v in self.values.items()},
        }


def drift(measured: float, planned: float) -> float:
    """``|measured - planned| / planned`` (infinite when only the plan is 0)."""
    if planned <= 0:
        return 0.0 if measured <= 0 else float("inf")
    return abs(measured - planned) / planned


def startup_calibration(typed: TypeProfile, measured: float, planned: float) -> Calibration:
    """The worker start the measured start-up implies.

    Args:
        typed: The profile in force.
        measured: Seconds from ``run`` to the first round.
        planned: The first stage's planned lead (scale, worker start, partition loads).
    """
    worker_start = max(0.0, typed.worker_start.mean + (measured - planned))
    return Calibration("start-up", measured, planned, {"worker_start_seconds": worker_start})


def units_calibration(
    typed: TypeProfile,
    units: Sequence[float],
    hops: Sequence[float],
    validations: Sequence[float],
) -> Calibration | None:
    """The unit, hop and validation seconds the first units imply.

    Needs a trial-epoch's worth of train units (``P``) and one trial's whole validation;
    before that it returns ``None``.

    Args:
        typed: The profile in force.
        units: Compute seconds of the train units measured so far (no checkpoint I/O).
        hops: Checkpoint I/O seconds of the same units.
        validations: Seconds of each trial's validation after an epoch.
    """
    if len(units) < typed.partitions or not validations:
        return None
    unit, hop = statistics.median(units), statistics.median(hops)
    validation = statistics.median(validations)
    measured = trial_epoch(typed.partitions, unit, hop, validation, 1.0)
    planned = typed.trial_epoch_seconds(1)
    values = {"unit_seconds": unit, "hop_seconds": hop, "validation_seconds": validation}
    return Calibration("units", measured, planned, values)


def calibrated(profile: Profile, instance_type: str, values: Mapping[str, float]) -> Profile:
    """``profile`` with ``values`` set (per-type keys for ``instance_type`` only)."""
    changes: dict[str, Any] = {}
    for key, value in values.items():
        current = getattr(profile, key)
        if isinstance(current, Mapping):
            changes[key] = {**current, instance_type: value}
        else:
            changes[key] = value
    return dataclasses.replace(profile, **changes)


def machine_load() -> dict[str, float]:
    """The machine's 1-minute load average and its cores, as a profile records them."""
    cores = os.cpu_count() or 1
    return {"loadavg_1m": round(os.getloadavg()[0], 2), "cpus": cores}


def load_change(recorded: Mapping[str, Any] | None, now: Mapping[str, float]) -> str | None:
    """Why today's load makes the profile doubtful, or ``None`` (:data:`LOAD_CHANGE`).

    Args:
        recorded: The profile's ``measured.load`` (``None``: it recorded none).
        now: :func:`machine_load` today.
    """
    if not recorded:
        return None
    try:
        then = float(recorded["loadavg_1m"]) / max(1.0, float(recorded["cpus"]))
    except (KeyError, TypeError, ValueError):
        return None
    today = float(now["loadavg_1m"]) / max(1.0, float(now["cpus"]))
    if abs(today - then) <= LOAD_CHANGE:
        return None
    return (
        f"the machine's load per core is {today:.2f} now ({now['loadavg_1m']:g} on "
        f"{now['cpus']:g} cores) but was {then:.2f} when the profile was measured "
        f"({recorded['loadavg_1m']} on {recorded['cpus']} cores), more than {LOAD_CHANGE:g} "
        "apart: unit and start-up times will differ from the plan (re-measure with "
        "`cerebro-spark profile`); the run calibrates from its first units"
    )
