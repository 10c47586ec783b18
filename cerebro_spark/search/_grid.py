"""Grid search, and the one-shot procedure it shares with random search (Cerebro §4.2).

Cerebro §4.2: "Grid/random search is a one-shot instance of this template": a fixed set
of configs is created and every config is trained for the same number of epochs; the
per-epoch evaluations never terminate or add a config. Rules of :class:`OneShotSearch`:

* Trials are suggested in a fixed order; at most ``max_concurrent`` are live at once
  (all at the first :meth:`~SearchProcedure.suggest` when it is ``None``), and a new one is
  suggested only when the engine asks after another one stopped.
* Each trial gets ``CONTINUE`` until the report of its epoch ``epochs``, then ``STOP``.
  Reports are checked: the trial must be live, ``report.epoch`` must be one more than its
  previous report (``ValueError`` otherwise, an engine bug), and the report must carry the
  metric (``ConfigError``, a config bug).
* The procedure is finished once every trial was suggested and stopped.
"""

from __future__ import annotations

import abc
import copy
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from cerebro_spark.errors import ConfigError
from cerebro_spark.search._base import Clock, Decision, EpochReport, SearchProcedure, TrialSpec
from cerebro_spark.search._stages import ExperimentSpec, one_stage
from cerebro_spark.search.space import SearchSpace

MAX_GRID_TRIALS = 100_000
"""Largest number of trials :class:`GridSearch` accepts (grid points times repeats)."""


def positive_int(name: str, value: Any) -> int:
    """Return ``value`` if it is an int ``>= 1``, else raise ``ConfigError`` naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def check_space(space: Any) -> SearchSpace:
    """Return ``space`` if it is a :class:`SearchSpace`, else raise ``ConfigError``."""
    if not isinstance(space, SearchSpace):
        raise ConfigError(
            f"space must be a SearchSpace (use SearchSpace.from_config for the dict form), "
            f"got {type(space).__name__}"
        )
    return space


class OneShotSearch(SearchProcedure):
    """A fixed number of trials, each trained ``epochs`` epochs (rules in the module)."""

    def __init__(
        self,
        *,
        total: int,
        epochs: int,
        max_concurrent: int | None,
        metric: str,
        mode: str,
        rng: np.random.Generator,
        clock: Clock,
    ) -> None:
        super().__init__(metric, mode, rng, clock)
        self.epochs = positive_int("epochs", epochs)
        self.max_concurrent = (
            None if max_concurrent is None else positive_int("max_concurrent", max_concurrent)
        )
        self._total = total
        self._suggested = 0
        self._live: dict[str, int] = {}  # trial id -> epochs reported so far
        self._stopped: set[str] = set()

    #: The registered name (for the stage spec).
    name = "one-shot"

    def stage_spec(self) -> ExperimentSpec:
        """All trials, ``epochs`` each, as one asynchronous stage.

        At most ``max_concurrent`` (else all) are in flight.
        """
        return ExperimentSpec(
            self.name,
            one_stage(self._total, self.epochs),
            elastic=False,
            max_workers=self.max_concurrent or self._total,
        )

    @abc.abstractmethod
    def _params(self, index: int) -> dict[str, Any]:
        """Return the params of the ``index``-th trial (called once per index, in order)."""

    def suggest(self) -> list[TrialSpec]:
        """Return the next trials, up to ``max_concurrent`` live ones."""
        room = self._total - self._suggested
        if self.max_concurrent is not None:
            room = min(room, self.max_concurrent - len(self._live))
        specs = []
        for _ in range(max(room, 0)):
            spec = self._new_trial(self._params(self._suggested))
            self._suggested += 1
            self._live[spec.trial_id] = 0
            specs.append(spec)
        return specs

    def on_epoch_end(self, report: EpochReport) -> Decision:
        """Return ``STOP`` after the trial's ``epochs``-th epoch, else ``CONTINUE``.

        Raises:
            ValueError: The trial is not live or ``report.epoch`` is out of sequence.
            ConfigError: The report lacks the metric.
        """
        done = self._live.get(report.trial_id)
        if done is None:
            state = "already stopped" if report.trial_id in self._stopped else "unknown"
            raise ValueError(f"report for trial {report.trial_id!r}, which is {state}")
        if report.epoch != done + 1:
            raise ValueError(
                f"trial {report.trial_id}: report.epoch must be {done + 1} (its completed "
                f"epochs), got {report.epoch}"
            )
        self.metric_value(report)
        if report.epoch < self.epochs:
            self._live[report.trial_id] = report.epoch
            return Decision.CONTINUE
        del self._live[report.trial_id]
        self._stopped.add(report.trial_id)
        return Decision.STOP

    def on_trial_failed(self, trial_id: str) -> None:
        """A failed trial is over: it no longer counts as live (nor against ``max_concurrent``)."""
        if self._live.pop(trial_id, None) is not None:
            self._stopped.add(trial_id)

    def is_finished(self) -> bool:
        """Whether every trial was suggested and has stopped (or failed)."""
        return self._suggested == self._total and not self._live

    def state_dict(self) -> dict[str, Any]:
        """Return the state as JSON values."""
        state = super().state_dict()
        state.update(
            epochs=self.epochs,
            total=self._total,
            suggested=self._suggested,
            live=dict(self._live),
            stopped=sorted(self._stopped),
        )
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output saved by a procedure with the same arguments.

        Raises:
            ConfigError: The state was saved with other ``epochs`` or number of trials.
        """
        for key, mine in (("epochs", self.epochs), ("total", self._total)):
            if state[key] != mine:
                raise ConfigError(
                    f"cannot resume {type(self).__name__}: the state has {key}={state[key]!r} "
                    f"but this procedure has {key}={mine!r}"
                )
        super().load_state_dict(state)
        self._suggested = int(state["suggested"])
        self._live = {str(k): int(v) for k, v in state["live"].items()}
        self._stopped = {str(t) for t in state["stopped"]}


class GridSearch(OneShotSearch):
    """Train every point of ``space.grid()`` for ``epochs`` epochs (Cerebro §4.2).

    Trials follow :meth:`SearchSpace.grid` order; with ``repeats`` the whole grid is
    suggested that many times in a row (grid, grid, ...), e.g. to measure seed variance.
    See the module docstring for the decision rules.

    Args:
        space: A finite search space.
        epochs: Epochs each trial is trained, ``>= 1``.
        metric: Validation metric every report must carry.
        mode: ``"max"`` or ``"min"`` (unused by the decisions; kept for the leaderboard).
        rng: Generator (grid search draws nothing from it).
        clock: Monotonic clock in seconds.
        repeats: Times each grid point is trained, ``>= 1``.
        max_concurrent: Most trials live at once; ``None`` suggests all at once.

    Raises:
        ConfigError: An argument breaks its rule, the space has a continuous distribution
            (the message names its path), or the grid has more than
            :data:`MAX_GRID_TRIALS` trials.
    """

    name = "grid"

    def __init__(
        self,
        space: SearchSpace,
        *,
        epochs: int,
        metric: str,
        mode: str,
        rng: np.random.Generator,
        clock: Clock = time.monotonic,
        repeats: int = 1,
        max_concurrent: int | None = None,
    ) -> None:
        self.space = check_space(space)
        self.repeats = positive_int("repeats", repeats)
        size = space.grid_size()
        if size * self.repeats > MAX_GRID_TRIALS:
            raise ConfigError(
                f"grid search would train {size} grid points x {self.repeats} repeats = "
                f"{size * self.repeats} trials, more than {MAX_GRID_TRIALS}; use random "
                f"search or coarser int/quantized ranges"
            )
        self._grid = space.grid()
        super().__init__(
            total=size * self.repeats,
            epochs=epochs,
            max_concurrent=max_concurrent,
            metric=metric,
            mode=mode,
            rng=rng,
            clock=clock,
        )

    def _params(self, index: int) -> dict[str, Any]:
        return copy.deepcopy(self._grid[index % len(self._grid)])
