"""The simulated cluster: epoch times and the makespan of one round (HyperSched §6.0.1).

A round of Cerebro's template trains every live trial one epoch. A trial given ``k``
workers occupies ``k`` workers for its whole epoch, which takes ``epoch_seconds /
s(k)`` with the scaling ``s`` of HyperSched §6.0.1 (linear: ``k``, sqrt: ``sqrt(k)``,
none: 1), plus ``overhead`` seconds when the trial is new or its worker count changed
(HyperSched §6.2's start-up / resize delay). The round's jobs are list-scheduled on ``N``
workers: longest first, each starting when its ``k`` earliest-free workers are all free;
the round ends with the last job (its makespan). This is the MOP round's makespan when every
trial's epoch is one indivisible job, as it is for Cerebro's data-parallel groups.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from cerebro_spark.errors import ConfigError
from cerebro_spark.search._hypersched import speedup


@dataclasses.dataclass
class VirtualClock:
    """The experiment clock of a simulation: seconds of virtual time, moved by hand."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclasses.dataclass(frozen=True)
class EpochJob:
    """One trial's epoch in a round.

    Attributes:
        trial_id: The trial.
        workers: Workers it occupies (``>= 1``; more than the cluster's are capped).
        seconds: How long it occupies them.
    """

    trial_id: str
    workers: int
    seconds: float


@dataclasses.dataclass(frozen=True)
class RoundSchedule:
    """When each epoch of a round ends (seconds after the round starts) and the makespan."""

    finish: Mapping[str, float]
    makespan: float


def epoch_seconds(
    base: float, workers: int, scaling: str, *, overhead: float = 0.0, changed: bool = False
) -> float:
    """Return the wall seconds of one epoch on ``workers`` workers.

    Args:
        base: Seconds of one epoch on one worker.
        workers: Workers the trial trains on.
        scaling: ``"linear"``, ``"sqrt"`` or ``"none"``.
        overhead: Start-up seconds, paid when ``changed``.
        changed: The trial is new or its worker count changed since its previous epoch.
    """
    return base / speedup(scaling, workers) + (overhead if changed else 0.0)


def schedule_round(jobs: Sequence[EpochJob], num_workers: int) -> RoundSchedule:
    """List-schedule a round's epoch jobs on ``num_workers`` workers (longest first).

    Raises:
        ConfigError: ``num_workers < 1`` or a job with fewer than one worker.
    """
    if num_workers < 1:
        raise ConfigError(f"num_workers must be >= 1, got {num_workers}")
    free = [0.0] * num_workers
    finish: dict[str, float] = {}
    order = sorted(range(len(jobs)), key=lambda i: (-jobs[i].seconds, -jobs[i].workers, i))
    for i in order:
        job = jobs[i]
        if job.workers < 1:
            raise ConfigError(f"trial {job.trial_id} needs >= 1 worker, got {job.workers}")
        width = min(job.workers, num_workers)
        chosen = sorted(range(num_workers), key=lambda w: (free[w], w))[:width]
        start = max(free[w] for w in chosen)
        end = start + job.seconds
        for w in chosen:
            free[w] = end
        finish[job.trial_id] = end
    return RoundSchedule(finish=finish, makespan=max(finish.values(), default=0.0))
