"""Population based training (Jaderberg et al. 2017, §3) on Cerebro's epoch template."""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cerebro_spark.errors import ConfigError
from cerebro_spark.search._base import Clock, Decision, EpochReport, SearchProcedure, TrialSpec
from cerebro_spark.search._grid import check_space, positive_int
from cerebro_spark.search._rungs import Score, check_same_arguments, rank, to_score
from cerebro_spark.search._space_tree import (
    DISTRIBUTION_NAMES,
    quantized_bounds,
    quantized_value,
    space_root,
)
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

Mutation = tuple[tuple[str, ...], Distribution]
"""A mutable hyperparameter: its path in the params (nested keys) and its distribution."""


class PBT(SearchProcedure):
    """Population Based Training, Jaderberg et al. 2017, §3 (truncation selection).

    ``population`` configs are sampled from ``space`` (a mutable param the sample lacks is
    drawn from its mutation distribution) and trained together. Every
    ``perturbation_interval`` epochs of a *lineage* (a member's epochs plus those of the
    checkpoints it was cloned from) is a perturbation point, unless the lineage has
    reached ``epochs``, where the member stops. At a perturbation point:

    * **Exploit** (truncation selection): the members are ranked by the metric; each of
      the bottom ``k = min(⌈quantile·n⌉, ⌊n/2⌋)`` is stopped and replaced by a new trial
      that starts from the checkpoint of a member drawn uniformly from the top ``k``
      (``TrialSpec.clone_from``) and trains the lineage's remaining epochs.
    * **Explore**: the new trial's params are a copy of the donor's with every mutable
      param changed: with probability ``resample_probability`` it is resampled from its
      distribution; otherwise a number is multiplied by a factor drawn from
      ``perturb_factors`` (kept in the distribution's range, ints rounded and moved at
      least one step, quantized values kept on their grid) and a list/choice value moves
      to a neighbouring value (clamped at the ends).

    Mapping onto the epoch template: the population trains in lockstep, so all members
    reach a perturbation point in the same round. A member at the point gets ``PAUSE``,
    except the round's last one to report there, whose report triggers the selection:
    it gets ``STOP`` if it is in the bottom ``k``, else ``CONTINUE``. Paused survivors come
    back through :meth:`resumed` and the replacements through :meth:`suggest` at the next
    round, so every decision compares scores after the same number of epochs and no
    worker waits longer than the end of that round. Paused members that were replaced are
    never resumed (the engine should show them as stopped). Other reports get
    ``CONTINUE``. Ties rank the older trial first; a non-finite metric ranks last.

    The engine copies the donor's latest checkpoint for the new trial (``clone_from``);
    the new params take effect because the training unit rebuilds the model's optimizer
    from the trial's params. Known limit: optimizer state restored from the cloned
    checkpoint (e.g. Adam moments) is kept, but its param-group hyperparameters (learning
    rate, momentum, weight decay, ...) must come from the new trial's params, not from the
    checkpoint — the training unit is responsible for overriding them. A clone's reports
    count its own epochs from 1, as for any trial; this procedure adds the donor's
    lineage epochs itself.

    Args:
        space: The search space of the initial population.
        epochs: Epochs of every lineage, ``>= 1``.
        metric: Validation metric that ranks the members.
        mode: ``"max"`` or ``"min"``.
        rng: Source of every random choice (samples, donors, perturbations).
        clock: Monotonic clock in seconds (unused by the decisions).
        population: Members trained at once, ``>= 2``.
        hyperparam_mutations: Param name to a distribution (config form, e.g.
            ``{"loguniform": [1e-4, 1e-1]}``) or a list of values; nested dicts address
            nested params. At least one.
        perturbation_interval: Epochs between perturbation points, ``>= 1``.
        quantile: Fraction of the population replaced at a point, in ``(0, 0.5]``.
        resample_probability: Chance that a mutable param is resampled, in ``[0, 1]``.
        perturb_factors: Factors a number is multiplied by, each finite and ``> 0``.

    Raises:
        ConfigError: An argument breaks its rule (the message names it).
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
        population: int,
        hyperparam_mutations: Mapping[str, Any],
        perturbation_interval: int = 1,
        quantile: float = 0.25,
        resample_probability: float = 0.25,
        perturb_factors: Sequence[float] = (0.8, 1.2),
    ) -> None:
        super().__init__(metric, mode, rng, clock)
        self.space = check_space(space)
        self.epochs = positive_int("epochs", epochs)
        self.population = positive_int("population", population)
        if self.population < 2:
            raise ConfigError(
                f"population must be >= 2 (truncation selection compares members), got "
                f"{population!r}"
            )
        self.perturbation_interval = positive_int("perturbation_interval", perturbation_interval)
        self.quantile = _number("quantile", quantile)
        if not 0 < self.quantile <= 0.5:
            raise ConfigError(f"quantile must be in (0, 0.5], got {quantile!r}")
        self.resample_probability = _number("resample_probability", resample_probability)
        if not 0 <= self.resample_probability <= 1:
            raise ConfigError(
                f"resample_probability must be in [0, 1], got {resample_probability!r}"
            )
        self.perturb_factors = _factors(perturb_factors)
        self.mutations = parse_mutations(hyperparam_mutations)
        self._started = False
        self._members: dict[str, dict[str, Any]] = {}  # id -> base, epochs, params
        self._training: set[str] = set()
        self._waiting: dict[str, Score] = {}
        self._to_resume: list[str] = []
        self._to_start: list[TrialSpec] = []

    def suggest(self) -> list[TrialSpec]:
        """Return the initial population at the first call, later the replacements."""
        if not self._started:
            self._started = True
            for _ in range(self.population):
                params = self.space.sample(self.rng)
                for path, dist in self.mutations:
                    parent = _parent(params, path)
                    if path[-1] not in parent:
                        parent[path[-1]] = dist.sample(self.rng)
                spec = self._new_trial(params)
                self._join(spec, base=0)
                self._to_start.append(spec)
        specs, self._to_start = self._to_start, []
        return specs

    def resumed(self) -> list[str]:
        """Return the paused members that survived the last selection, in id order."""
        resumed, self._to_resume = sorted(self._to_resume), []
        return resumed

    def on_epoch_end(self, report: EpochReport) -> Decision:
        """Apply the rules of the class docstring.

        Raises:
            ValueError: The trial is not training or ``report.epoch`` is out of sequence.
            ConfigError: The report lacks the metric.
        """
        trial_id = report.trial_id
        member = self._members.get(trial_id)
        if member is None or trial_id not in self._training:
            raise ValueError(f"report for trial {trial_id!r}, which is not training")
        if report.epoch != member["epochs"] + 1:
            raise ValueError(
                f"trial {trial_id}: report.epoch must be {member['epochs'] + 1} (its "
                f"completed epochs), got {report.epoch}"
            )
        score = to_score(self.metric_value(report), self.mode)
        member["epochs"] = report.epoch
        lineage = member["base"] + report.epoch
        if lineage >= self.epochs:
            self._training.discard(trial_id)
            del self._members[trial_id]
            return Decision.STOP
        if lineage % self.perturbation_interval:
            return Decision.CONTINUE
        self._training.discard(trial_id)
        self._waiting[trial_id] = score
        if self._training:
            return Decision.PAUSE
        return self._select(trial_id)

    def on_trial_failed(self, trial_id: str) -> None:
        """The failed member leaves the population, which shrinks by one.

        A perturbation point it alone held open selects among the members waiting there.
        """
        if trial_id not in self._training:
            return
        self._training.discard(trial_id)
        del self._members[trial_id]
        if not self._training and self._waiting:
            self._select(None)

    def _select(self, last: str | None) -> Decision:
        ranked = rank(self._waiting)
        self._waiting = {}
        n = len(ranked)
        k = min(math.ceil(self.quantile * n), n // 2)
        top, keep, losers = ranked[:k], ranked[: n - k], ranked[n - k :]
        for loser in losers:
            donor_id = top[int(self.rng.integers(k))]
            donor = self._members[donor_id]
            params = explore(
                donor["params"],
                self.mutations,
                self.rng,
                self.resample_probability,
                self.perturb_factors,
            )
            spec = self._new_trial(params, clone_from=donor_id)
            del self._members[loser]
            self._join(spec, base=donor["base"] + donor["epochs"])
            self._to_start.append(spec)
        for trial_id in keep:
            self._training.add(trial_id)
            if trial_id != last:
                self._to_resume.append(trial_id)
        return Decision.STOP if last in losers else Decision.CONTINUE

    def _join(self, spec: TrialSpec, base: int) -> None:
        params = copy.deepcopy(dict(spec.params))
        self._members[spec.trial_id] = {"base": base, "epochs": 0, "params": params}
        self._training.add(spec.trial_id)

    def stage_spec(self) -> ExperimentSpec:
        """The population's ``epochs`` epochs as one asynchronous stage.

        Exploits replace members and add no work; ``population`` trials are in flight.
        """
        return ExperimentSpec(
            "pbt",
            one_stage(self.population, self.epochs),
            elastic=False,
            max_workers=self.population,
        )

    def is_finished(self) -> bool:
        """Whether every lineage has trained ``epochs`` epochs."""
        return self._started and not self._members

    def state_dict(self) -> dict[str, Any]:
        """Return the state as JSON values."""
        state = super().state_dict()
        state.update(
            args=self._args(),
            started=self._started,
            members=copy.deepcopy(self._members),
            training=sorted(self._training),
            waiting=dict(self._waiting),
            to_resume=list(self._to_resume),
            to_start=[
                {"trial_id": s.trial_id, "params": dict(s.params), "clone_from": s.clone_from}
                for s in self._to_start
            ],
        )
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output saved by a procedure with the same arguments.

        Raises:
            ConfigError: The state was saved with other ``epochs``, ``population`` or
                ``perturbation_interval``.
        """
        check_same_arguments(self, state, **self._args())
        super().load_state_dict(state)
        self._started = bool(state["started"])
        self._members = copy.deepcopy(dict(state["members"]))
        self._training = {str(t) for t in state["training"]}
        self._waiting = {
            str(t): None if s is None else float(s) for t, s in state["waiting"].items()
        }
        self._to_resume = [str(t) for t in state["to_resume"]]
        self._to_start = [
            TrialSpec(s["trial_id"], s["params"], s["clone_from"]) for s in state["to_start"]
        ]

    def _args(self) -> dict[str, int]:
        return {
            "epochs": self.epochs,
            "population": self.population,
            "perturbation_interval": self.perturbation_interval,
        }


# --- hyperparam_mutations and explore


def parse_mutations(config: Any) -> list[Mutation]:
    """Parse ``hyperparam_mutations`` into ``(path, distribution)`` pairs, in order.

    A list (or tuple) of values becomes a :class:`Grid` of literal values; a dict is
    parsed as in :meth:`SearchSpace.from_config` (a distribution, or a sub-space of nested
    params). Constants cannot be mutated and choices must be between constants.

    Raises:
        ConfigError: The mapping is empty or a value breaks a rule (named by its path).
    """
    if not isinstance(config, Mapping) or not config:
        raise ConfigError(
            "hyperparam_mutations must be a non-empty mapping from param name to a "
            f"distribution or a list of values, got {config!r}"
        )
    root = space_root(SearchSpace.from_config(_lists_to_grid(config), name="hyperparam_mutations"))
    if not isinstance(root, dict):
        raise ConfigError(
            f"hyperparam_mutations must map param names to distributions, got {config!r}"
        )
    mutations: list[Mutation] = []
    _collect(root, (), mutations)
    return mutations


def _lists_to_grid(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return {"grid": list(value)}
    if isinstance(value, Mapping) and not DISTRIBUTION_NAMES & set(value):
        return {key: _lists_to_grid(sub) for key, sub in value.items()}
    return value


def _collect(node: Any, path: tuple[str, ...], out: list[Mutation]) -> None:
    where = ".".join(("hyperparam_mutations", *path))
    if isinstance(node, dict):
        for key, sub in node.items():
            _collect(sub, (*path, key), out)
    elif isinstance(node, Choice) and any(
        isinstance(o, (Distribution, dict)) for o in node.options
    ):
        raise ConfigError(f"{where}: a mutated choice must list constant values")
    elif isinstance(node, Distribution):
        out.append((path, node))
    else:
        raise ConfigError(
            f"{where}: a constant ({node!r}) cannot be mutated; give a distribution or a list "
            f"of values"
        )


def explore(
    params: Mapping[str, Any],
    mutations: Sequence[Mutation],
    rng: np.random.Generator,
    resample_probability: float,
    factors: Sequence[float],
) -> dict[str, Any]:
    """Return a copy of ``params`` with every mutable param resampled or perturbed.

    See :class:`PBT` for the rules. Draws from ``rng`` in the order of ``mutations``.
    """
    new = copy.deepcopy(dict(params))
    for path, dist in mutations:
        parent = _parent(new, path)
        if rng.random() < resample_probability or path[-1] not in parent:
            parent[path[-1]] = dist.sample(rng)
        else:
            parent[path[-1]] = perturb(dist, parent[path[-1]], rng, factors)
    return new


def perturb(
    dist: Distribution, value: Any, rng: np.random.Generator, factors: Sequence[float]
) -> Any:
    """Return ``value`` perturbed within ``dist`` (resampled if it does not fit ``dist``)."""
    if isinstance(dist, (Choice, Grid)):
        options = list(dist.options if isinstance(dist, Choice) else dist.values)
        keys = [json.dumps(o, sort_keys=True) for o in options]
        key = json.dumps(value, sort_keys=True)
        if key not in keys:
            return dist.sample(rng)
        step = 1 if rng.integers(2) else -1
        index = min(max(keys.index(key) + step, 0), len(options) - 1)
        return copy.deepcopy(options[index])
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return dist.sample(rng)
    factor = float(factors[int(rng.integers(len(factors)))])
    if isinstance(dist, (Uniform, LogUniform)):
        return min(max(value * factor, dist.low), dist.high)
    if isinstance(dist, IntUniform):
        return _step_int(round(value), value * factor, factor, dist.low, dist.high)
    if isinstance(dist, Quantized):
        low, high = quantized_bounds(dist)
        k = _step_int(round(value / dist.q), value * factor / dist.q, factor, low, high)
        return quantized_value(dist, k)
    return dist.sample(rng)


def _step_int(old: int, target: float, factor: float, low: int, high: int) -> int:
    """Round ``target``; move at least one step from ``old`` when ``factor != 1``; clip."""
    new = round(target)
    if new == old and factor != 1:
        new += 1 if factor > 1 else -1
    return min(max(new, low), high)


def _parent(params: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    node = params
    for i, key in enumerate(path[:-1]):
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(
                f"hyperparam_mutations.{'.'.join(path)}: param {'.'.join(path[: i + 1])} "
                f"is {child!r}, not a dict of params"
            )
        node = child
    return node


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    return float(value)


def _factors(value: Any) -> tuple[float, ...]:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence) or not value:
        raise ConfigError(f"perturb_factors must be a non-empty list of numbers, got {value!r}")
    factors = tuple(_number("perturb_factors", v) for v in value)
    if not all(math.isfinite(f) and f > 0 for f in factors):
        raise ConfigError(f"perturb_factors must be finite numbers > 0, got {value!r}")
    return factors
