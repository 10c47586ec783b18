"""A search's stage structure, known before it runs (RubberBand §3.1, Fig. 6).

RubberBand separates a declarative specification of an early-stopping search from its
control flow: ``get_stage(i)`` returns the trials and the iterations per trial of stage
``i``, ``num_stages()`` the number of stages, and a collection of such specifications (a
*multi-job*) expresses Hyperband. The elastic planner plans the workers of every stage from
it before anything is spent.

Here a stage is a tuple of :class:`Cohort` s -- trials that train the same number of epochs
on the same number of workers each -- so that one stage can hold every bracket of a
multi-job that runs side by side (Hyperband with ``concurrent``, SEER) and the resources
per trial SEER gives its brackets. :meth:`SearchProcedure.stage_spec
<cerebro_spark.search.SearchProcedure.stage_spec>` returns the spec of a procedure as it is
configured: the plan and the run build the procedure with one code path.

Asynchronous procedures (grid, random, TPE, PBT, ASHA, HyperSched) have no stage boundaries
the cluster could follow: their spec has ``elastic=False`` (one allocation for the whole
run), the work they will do as a single stage (for ASHA, its rungs' expected work), and
``max_workers``, the trials they keep in flight: more workers than that would idle. A
procedure that runs until a deadline whatever the workers do (HyperSched, ASHA without
``num_trials``) also gives ``fixed_seconds``.

A procedure with a deadline of its own (SEER, HyperSched, ASHA with ``deadline``) gives it
as ``deadline``: it stops then, counted like a plan's time from the experiment's start (its
clock starts before the workers do), so a plan must end by it. SEER, which turns stage time
into epochs with an assumed ``epoch_seconds``, gives that too, so that the planner can warn
when the profile disagrees.

SEER's stages also end by the clock (SEER §5): stage ``k`` closes at its planned end, in
experiment time from ``run``, once every member trained at least one epoch, whatever
epochs it was given. Start-up (counted on that clock) and a cluster smaller than the
stage's workers make a run close them early, so the stages' epochs are then not what it
trains: the spec's :class:`StageClock` says how the procedure decides, and
:meth:`StageClock.rounds` replays its rounds for the planner's simulated times (the stages
keep their epochs: the run's rounds are counted into them in order, as the elastic
controller counts them).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from cerebro_spark.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Cohort:
    """Trials of one stage that train alike.

    Attributes:
        trials: How many.
        epochs: Epochs each trains in the stage.
        resources: Workers each trains on (a data-parallel group when ``> 1``); ``1``
            lets the planner choose the group size.
    """

    trials: int
    epochs: int
    resources: int = 1

    def __post_init__(self) -> None:
        for name in ("trials", "epochs", "resources"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"Cohort.{name} must be an integer >= 1, got {value!r}")


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """One stage: the cohorts that train between two synchronisation points."""

    cohorts: tuple[Cohort, ...]

    def __post_init__(self) -> None:
        if not self.cohorts:
            raise ConfigError("a stage needs at least one cohort")

    @property
    def trials(self) -> int:
        """Live trials of the stage."""
        return sum(c.trials for c in self.cohorts)

    @property
    def epochs(self) -> int:
        """The most epochs a trial trains in the stage."""
        return max(c.epochs for c in self.cohorts)

    @property
    def trial_epochs(self) -> int:
        """Trial-epochs of work in the stage."""
        return sum(c.trials * c.epochs for c in self.cohorts)

    def to_dict(self) -> dict[str, Any]:
        """Return the stage as JSON values."""
        return {
            "trials": self.trials,
            "epochs": self.epochs,
            "cohorts": [dataclasses.asdict(c) for c in self.cohorts],
        }


_CLOCK_EPS = 1e-9
"""Tolerance of a stage end's comparison (SEER's)."""


@dataclasses.dataclass(frozen=True)
class StageClock:
    """Stages that the clock closes (SEER §5; the rules of :mod:`~cerebro_spark.search._seer`).

    The procedure's stage ``k`` has ``trials[k][i]`` members in bracket ``i``, each to train
    at most ``epochs[k][i]`` more epochs (a trial's total at most ``max_epochs``) on
    ``resources[i]`` workers, and closes at ``ends[k]`` seconds of experiment time (from
    ``run``, start-up included).

    Attributes:
        ends: When each stage ends.
        trials: Members per bracket, per stage.
        epochs: Most epochs a member of each bracket trains in each stage.
        resources: Workers per trial of each bracket.
        max_epochs: Most epochs a trial trains in all.
        blocks: Epochs (rounds) of each of the spec's stages this clock's rounds are counted
            into (the stages' epochs when no stage end cuts one short). A spec cut to the
            stages left (a re-plan) no longer matches them: its stages keep their epochs.
    """

    ends: tuple[float, ...]
    trials: tuple[tuple[int, ...], ...]
    epochs: tuple[tuple[int, ...], ...]
    resources: tuple[int, ...]
    max_epochs: int
    blocks: tuple[int, ...]

    def __post_init__(self) -> None:
        brackets = len(self.resources)
        shapes = [len(row) for row in (*self.trials, *self.epochs)]
        if (
            not self.ends
            or len(self.trials) != len(self.ends)
            or len(self.epochs) != len(self.ends)
            or any(n != brackets for n in shapes)
            or min(self.resources, default=0) < 1
            or self.max_epochs < 1
            or any(v < 0 for row in (*self.trials, *self.epochs) for v in row)
        ):
            raise ConfigError(f"a StageClock needs one row per stage and per bracket, got {self}")

    def rounds(
        self,
        seconds: Callable[[int, tuple[int, ...]], tuple[float, float]],
        deadline: float | None = None,
    ) -> list[tuple[int, ...]]:
        """The rounds a run trains: in each, the members of every bracket that train.

        SEER's rules, on counts: a stage's members progress in proportion to their epochs
        (after its round ``r`` a member has ``ceil(r * E / M)`` of its ``E``, ``M`` the
        stage's largest); the stage closes when every member has its epochs, or after a
        round when the next one, as long as it, would end after the stage's end (so every
        member trains at least one epoch); the run stops at the first round that ends at or
        after ``deadline``, or that would start then. A bracket's members count as one
        (a promoted trial brings its own epochs; here each bracket keeps its own).

        Args:
            seconds: For round ``r`` (0-based, over the run) training ``trials`` (members
                per bracket): the seconds from the previous round's end (the first: from
                ``run``) to its start, and the seconds it lasts.
            deadline: The procedure's deadline, in the same experiment time.
        """
        now = 0.0
        trained = [0] * len(self.resources)
        out: list[tuple[int, ...]] = []
        for k, end in enumerate(self.ends):
            members = self.trials[k]
            start = list(trained)
            target = [
                min(self.max_epochs, start[i] + self.epochs[k][i]) if members[i] else start[i]
                for i in range(len(members))
            ]
            most = max(t - s for t, s in zip(target, start, strict=True))
            if most <= 0:
                continue  # nothing to train: the stage closes at once
            done = list(start)
            stage_round = 0
            while True:
                stage_round += 1
                due = [
                    s + min(t - s, -(-stage_round * (t - s) // most))
                    for s, t in zip(start, target, strict=True)
                ]
                training = tuple(
                    n if d < u else 0 for n, d, u in zip(members, done, due, strict=True)
                )
                before, during = seconds(len(out), training)
                now += before
                if deadline is not None and now >= deadline:
                    return out
                now += during
                out.append(training)
                done = [d + (1 if n else 0) for d, n in zip(done, training, strict=True)]
                if deadline is not None and now >= deadline:
                    return out
                if now + during > end + _CLOCK_EPS or done == target:
                    break
            trained = done
        return out

    def to_dict(self) -> dict[str, Any]:
        """Return the clock as JSON values."""
        return {
            "ends": list(self.ends),
            "trials": [list(row) for row in self.trials],
            "epochs": [list(row) for row in self.epochs],
            "resources": list(self.resources),
            "max_epochs": self.max_epochs,
            "blocks": list(self.blocks),
        }


@dataclasses.dataclass(frozen=True)
class ExperimentSpec:
    """A search's stages (RubberBand Fig. 6), with what constrains its allocation.

    Attributes:
        procedure: The procedure's registered name.
        stages: The stages, in order.
        elastic: Whether the cluster may be resized between stages (synchronous
            procedures); ``False``: one allocation for the whole run.
        max_workers: Most workers the search can keep busy (trials in flight), if bounded.
        fixed_seconds: The search runs this long from the experiment's start whatever the
            workers do (a deadline-bound procedure: one asynchronous stage); ``None``: it
            ends when its work is done.
        deadline: The procedure's own deadline in seconds from the experiment's start (it
            stops then), if it has one.
        epoch_seconds: Seconds of one trial-epoch on one worker the procedure assumed when
            it shaped its stages (SEER), if any.
        clock: How the clock closes the procedure's stages (SEER), if it does.
    """

    procedure: str
    stages: tuple[StageSpec, ...]
    elastic: bool = True
    max_workers: int | None = None
    fixed_seconds: float | None = None
    deadline: float | None = None
    epoch_seconds: float | None = None
    clock: StageClock | None = None

    def __post_init__(self) -> None:
        if not self.stages:
            raise ConfigError(f"the spec of {self.procedure} has no stage")
        if self.max_workers is not None and self.max_workers < 1:
            raise ConfigError(
                f"the spec of {self.procedure}: max_workers must be >= 1, got {self.max_workers}"
            )
        for name in ("fixed_seconds", "deadline", "epoch_seconds"):
            value = getattr(self, name)
            if value is not None and not (0 < value < math.inf):
                raise ConfigError(
                    f"the spec of {self.procedure}: {name} must be a number of seconds > 0, "
                    f"got {value!r}"
                )
        if self.fixed_seconds is not None and (self.elastic or len(self.stages) != 1):
            raise ConfigError(
                f"the spec of {self.procedure}: fixed_seconds is for one asynchronous stage "
                f"(elastic=False), got {len(self.stages)} stage(s), elastic={self.elastic}"
            )

    def num_stages(self) -> int:
        """Number of stages (RubberBand's ``num_stages``)."""
        return len(self.stages)

    def get_stage(self, index: int) -> tuple[int, int]:
        """Trials and epochs per trial of stage ``index`` (RubberBand's ``get_stage``)."""
        stage = self.stages[index]
        return stage.trials, stage.epochs

    def to_dict(self) -> dict[str, Any]:
        """Return the spec as JSON values."""
        return {
            "procedure": self.procedure,
            "elastic": self.elastic,
            "max_workers": self.max_workers,
            "fixed_seconds": self.fixed_seconds,
            "deadline": self.deadline,
            "epoch_seconds": self.epoch_seconds,
            "clock": None if self.clock is None else self.clock.to_dict(),
            "stages": [stage.to_dict() for stage in self.stages],
        }


def ladder_stages(trials: int, rungs: list[int], eta: int) -> list[StageSpec]:
    """Return the stages of one successive-halving bracket.

    Rung ``k`` keeps ``max(1, n_(k-1) // η)`` trials and trains them from the previous
    rung's epochs to its own.
    """
    stages = []
    alive, done = trials, 0
    for k, rung in enumerate(rungs):
        if k:
            alive = max(1, alive // eta)
        stages.append(StageSpec((Cohort(alive, rung - done),)))
        done = rung
    return stages


def merge_side_by_side(brackets: list[list[StageSpec]]) -> list[StageSpec]:
    """Stages of brackets that run side by side: stage ``i`` holds every bracket's ``i``-th."""
    depth = max(len(b) for b in brackets)
    return [
        StageSpec(tuple(c for b in brackets if i < len(b) for c in b[i].cohorts))
        for i in range(depth)
    ]


def one_stage(trials: int, epochs: int) -> tuple[StageSpec, ...]:
    """The single stage of an asynchronous procedure's work."""
    return (StageSpec((Cohort(trials, epochs),)),)
