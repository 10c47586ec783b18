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
"""

from __future__ import annotations

import dataclasses
import math
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
    """

    procedure: str
    stages: tuple[StageSpec, ...]
    elastic: bool = True
    max_workers: int | None = None
    fixed_seconds: float | None = None
    deadline: float | None = None
    epoch_seconds: float | None = None

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
