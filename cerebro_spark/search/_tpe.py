"""TPE (tree-structured Parzen estimator) through Optuna's ask-and-tell interface.

Optuna is imported when a :class:`TPESearch` is built, not when this module is imported.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from cerebro_spark.errors import ConfigError
from cerebro_spark.search._base import Clock, Decision, EpochReport, SearchProcedure, TrialSpec
from cerebro_spark.search._grid import check_space, positive_int
from cerebro_spark.search._rungs import check_report, check_same_arguments
from cerebro_spark.search._space_tree import quantized_bounds, quantized_value, space_root
from cerebro_spark.search._stages import ExperimentSpec, one_stage
from cerebro_spark.search.space import (
    Choice,
    Distribution,
    Grid,
    IntUniform,
    LogUniform,
    Quantized,
    SearchSpace,
    Uniform,
)

# optuna (optional, ~1 s) is imported inside the methods that sample: a config that
# names no TPE search never loads it.
if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution

_STATES = ("running", "complete", "fail")


class TPESearch(SearchProcedure):
    """TPE with Optuna's ``TPESampler`` (Bergstra et al. 2011), asked and told by trial.

    Rules:

    * :meth:`suggest` asks the study for new configs until ``max_concurrent`` trials are
      live or ``num_trials`` were asked. Each ask uses a fresh ``TPESampler`` seeded from
      the injected generator (``int(rng.integers(2**31))``) with ``n_startup_trials``
      random configs first; Optuna's default constant liar accounts for the live trials.
    * Every trial trains ``epochs`` epochs: ``CONTINUE`` until its ``epochs``-th report,
      then the study is told that report's metric (direction from ``mode``; a non-finite
      metric marks the Optuna trial failed) and the trial gets ``STOP``. No ``PAUSE``.
    * The procedure is finished when ``num_trials`` were asked and none is live.

    The search space becomes Optuna distributions named by the param's dotted path
    (``"optimizer.lr"``): uniform and loguniform become ``FloatDistribution`` (``log``
    for loguniform); int becomes ``IntDistribution`` (with its ``log``); quantized becomes
    an ``IntDistribution`` over the multiplier ``k`` of ``q`` (``log`` when the inner
    distribution is loguniform), so values stay exact multiples; grid and choice become a
    ``CategoricalDistribution`` over option indices (options may be lists or dicts). A
    choice between sub-spaces (branches) is flattened: the choice is a categorical named
    by its path (``"choice"`` at the top level) and branch ``i``'s params are named
    ``"<choice>[i].<param>"``, so each branch has its own params; a distribution option is
    named ``"<choice>[i]"``. Two params whose names coincide raise ``ConfigError``.

    Resume: :meth:`state_dict` keeps every asked trial in ask order (id, Optuna params,
    state and told value); :meth:`load_state_dict` rebuilds the study by adding them back
    with ``optuna.trial.create_trial`` (live ones as ``RUNNING``, so they keep their
    numbers and are told later), and the generator's state restores the sampler seeds.

    Args:
        space: The search space.
        epochs: Epochs each trial trains, ``>= 1``.
        metric: Validation metric told to the study.
        mode: ``"max"`` (maximize) or ``"min"`` (minimize).
        rng: Source of the sampler seeds.
        clock: Monotonic clock in seconds (unused by the decisions).
        num_trials: Configs to ask for, ``>= 1``.
        max_concurrent: Most trials live at once, ``>= 1``; default ``num_workers`` or 4.
        num_workers: The cluster's worker count (the engine fills it in), ``>= 1``.
        n_startup_trials: Random configs before TPE models the results, ``>= 0``.

    Raises:
        ConfigError: An argument breaks its rule, two params share an Optuna name, or
            optuna is not installed.
    """

    def __init__(
        self,
        space: SearchSpace,
        *,
        epochs: int,
        metric: str,
        mode: str,
        rng: np.random.Generator,
        clock: Clock = time.monotonic,
        num_trials: int,
        max_concurrent: int | None = None,
        num_workers: int | None = None,
        n_startup_trials: int = 10,
    ) -> None:
        super().__init__(metric, mode, rng, clock)
        self.space = check_space(space)
        self.epochs = positive_int("epochs", epochs)
        self.num_trials = positive_int("num_trials", num_trials)
        workers = None if num_workers is None else positive_int("num_workers", num_workers)
        if max_concurrent is not None:
            self.max_concurrent = positive_int("max_concurrent", max_concurrent)
        else:
            self.max_concurrent = workers or 4
        if (
            isinstance(n_startup_trials, bool)
            or not isinstance(n_startup_trials, (int, np.integer))
            or n_startup_trials < 0
        ):
            raise ConfigError(f"n_startup_trials must be an integer >= 0, got {n_startup_trials!r}")
        self.n_startup_trials = int(n_startup_trials)
        self.distributions = optuna_distributions(space)
        self._records: list[dict[str, Any]] = []  # asked trials in ask (= Optuna number) order
        self._number: dict[str, int] = {}
        self._live: dict[str, int] = {}  # trial -> epochs reported so far
        self._study: optuna.Study | None = None

    def suggest(self) -> list[TrialSpec]:
        """Ask for configs until ``max_concurrent`` are live or ``num_trials`` were asked."""
        specs = []
        while len(self._live) < self.max_concurrent and len(self._records) < self.num_trials:
            specs.append(self._ask())
        return specs

    def _ask(self) -> TrialSpec:
        from optuna.samplers import TPESampler

        study = self._get_study()
        study.sampler = TPESampler(
            seed=int(self.rng.integers(2**31)), n_startup_trials=self.n_startup_trials
        )
        trial = study.ask()

        def pick(name: str) -> Any:
            return _suggest(trial, name, self.distributions[name])

        params = build_params(space_root(self.space), pick)
        spec = self._new_trial(params)
        self._number[spec.trial_id] = trial.number
        self._records.append(
            {"trial_id": spec.trial_id, "params": dict(trial.params), "state": "running"}
        )
        self._live[spec.trial_id] = 0
        return spec

    def on_epoch_end(self, report: EpochReport) -> Decision:
        """``CONTINUE`` until the ``epochs``-th report, which is told to the study: ``STOP``.

        Raises:
            ValueError: The trial is not live or ``report.epoch`` is out of sequence.
            ConfigError: The report lacks the metric.
        """
        check_report(self._live, report.trial_id, report.epoch, "not live")
        value = self.metric_value(report)
        if report.epoch < self.epochs:
            self._live[report.trial_id] = report.epoch
            return Decision.CONTINUE
        del self._live[report.trial_id]
        self._tell(report.trial_id, value)
        return Decision.STOP

    def on_trial_failed(self, trial_id: str) -> None:
        """The failed trial frees its place and is told to the study as failed."""
        if self._live.pop(trial_id, None) is not None:
            self._tell(trial_id, math.nan)

    def _tell(self, trial_id: str, value: float) -> None:
        from optuna.trial import TrialState

        number = self._number[trial_id]
        record = self._records[number]
        if math.isfinite(value):
            self._get_study().tell(number, value)
            record.update(state="complete", value=value)
        else:
            self._get_study().tell(number, state=TrialState.FAIL)
            record["state"] = "fail"

    def stage_spec(self) -> ExperimentSpec:
        """``num_trials`` trials of ``epochs`` as one asynchronous stage.

        At most ``max_concurrent`` are in flight.
        """
        return ExperimentSpec(
            "tpe",
            one_stage(self.num_trials, self.epochs),
            elastic=False,
            max_workers=self.max_concurrent,
        )

    def is_finished(self) -> bool:
        """Whether ``num_trials`` configs were asked and every trial stopped."""
        return len(self._records) == self.num_trials and not self._live

    def _get_study(self) -> optuna.Study:
        if self._study is None:
            self._study = self._rebuild_study()
        return self._study

    def _rebuild_study(self) -> optuna.Study:
        import optuna
        from optuna.trial import TrialState, create_trial

        study = optuna.create_study(direction="maximize" if self.mode == "max" else "minimize")
        states = {
            "running": TrialState.RUNNING,
            "complete": TrialState.COMPLETE,
            "fail": TrialState.FAIL,
        }
        for record in self._records:
            params = dict(record["params"])
            study.add_trial(
                create_trial(
                    state=states[record["state"]],
                    value=record.get("value"),
                    params=params,
                    distributions={name: self.distributions[name] for name in params},
                )
            )
        return study

    def state_dict(self) -> dict[str, Any]:
        """Return the state as JSON values."""
        state = super().state_dict()
        state.update(
            args={"num_trials": self.num_trials, "epochs": self.epochs},
            trials=copy.deepcopy(self._records),
            live=dict(self._live),
        )
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output saved by a procedure with the same arguments.

        Raises:
            ConfigError: The state was saved with other ``num_trials`` or ``epochs``, or
                names a param this space does not have.
        """
        check_same_arguments(self, state, num_trials=self.num_trials, epochs=self.epochs)
        records = copy.deepcopy(list(state["trials"]))
        for record in records:
            unknown = sorted(set(record["params"]) - set(self.distributions))
            if unknown or record["state"] not in _STATES:
                raise ConfigError(
                    f"cannot resume TPESearch: trial {record['trial_id']} has params "
                    f"{unknown} or state {record['state']!r} that this search space does not"
                )
        super().load_state_dict(state)
        self._records = records
        self._number = {r["trial_id"]: i for i, r in enumerate(records)}
        self._live = {str(k): int(v) for k, v in state["live"].items()}
        self._study = None


def _suggest(trial: optuna.Trial, name: str, dist: BaseDistribution) -> Any:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if isinstance(dist, CategoricalDistribution):
        return trial.suggest_categorical(name, dist.choices)
    if isinstance(dist, IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, log=dist.log)
    if isinstance(dist, FloatDistribution):
        return trial.suggest_float(name, dist.low, dist.high, log=dist.log)
    raise TypeError(f"unexpected Optuna distribution for {name!r}: {dist!r}")


# --- the space as Optuna distributions


def optuna_distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    """Return every Optuna distribution of ``space``'s params by name (class docstring).

    Raises:
        ConfigError: optuna is not installed, or two params share a name.
    """
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise ConfigError("search procedure 'tpe' needs optuna: pip install 'optuna>=4'") from None
    out: dict[str, BaseDistribution] = {}
    _convert(space_root(space), "", out)
    return out


def _convert(node: Any, prefix: str, out: dict[str, BaseDistribution]) -> None:
    from optuna.distributions import (
        CategoricalDistribution,
        FloatDistribution,
        IntDistribution,
    )

    if isinstance(node, dict):
        for key, sub in node.items():
            _convert(sub, f"{prefix}.{key}" if prefix else key, out)
        return
    if not isinstance(node, Distribution):
        return
    name = prefix or node.name
    if name in out:
        raise ConfigError(
            f"space.{name}: TPE names params by their dotted path and two params are named "
            f"{name!r}; rename one of them"
        )
    dist: BaseDistribution
    if isinstance(node, (Choice, Grid)):
        size = len(node.options) if isinstance(node, Choice) else len(node.values)
        dist = CategoricalDistribution(tuple(range(size)))
    elif isinstance(node, (Uniform, LogUniform)):
        dist = FloatDistribution(node.low, node.high, log=isinstance(node, LogUniform))
    elif isinstance(node, IntUniform):
        dist = IntDistribution(node.low, node.high, log=node.log)
    elif isinstance(node, Quantized):
        low, high = quantized_bounds(node)
        dist = IntDistribution(low, high, log=isinstance(node.dist, LogUniform))
    else:
        raise ConfigError(f"space.{name}: TPE does not support {type(node).__name__}")
    out[name] = dist
    if isinstance(node, Choice):
        for i, option in enumerate(node.options):
            _convert(option, f"{name}[{i}]", out)


def build_params(node: Any, pick: Callable[[str], Any], prefix: str = "") -> Any:
    """Return the params that ``pick`` (Optuna name -> value) chooses in ``node``."""
    if isinstance(node, dict):
        return {
            key: build_params(sub, pick, f"{prefix}.{key}" if prefix else key)
            for key, sub in node.items()
        }
    if not isinstance(node, Distribution):
        return copy.deepcopy(node)
    name = prefix or node.name
    if isinstance(node, Choice):
        index = int(pick(name))
        return build_params(node.options[index], pick, f"{name}[{index}]")
    if isinstance(node, Grid):
        return copy.deepcopy(node.values[int(pick(name))])
    if isinstance(node, (Uniform, LogUniform)):
        return min(max(float(pick(name)), node.low), node.high)
    if isinstance(node, IntUniform):
        return int(pick(name))
    if isinstance(node, Quantized):
        return quantized_value(node, int(pick(name)))
    raise ConfigError(f"space.{name}: TPE does not support {type(node).__name__}")
