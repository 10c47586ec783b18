"""The search a config names, built by one code path for ``run``, ``plan`` and pre-flight.

:func:`build_procedure` makes the procedure with its seeded generator, :func:`experiment_spec`
its stage structure for the planner, :func:`trial_seed` each trial's seed. Every stream of
randomness comes from the experiment seed (never global state).
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable

import numpy as np

from cerebro_spark.driver._config import ExperimentConfig
from cerebro_spark.errors import ConfigError
from cerebro_spark.metrics import LOSS
from cerebro_spark.search import (
    ExperimentSpec,
    SearchProcedure,
    make_procedure,
    procedure_options,
)
from cerebro_spark.search._clock import ExperimentClock
from cerebro_spark.search.space import SearchSpace

# Streams of randomness derived from the experiment seed (never global state); 3 is the
# pre-flight's (_preflight._PREFLIGHT_STREAM).
PROCEDURE_STREAM, SCHEDULER_STREAM, TRIAL_STREAM, VISIT_ORDER_STREAM = 0, 1, 2, 4


def build_procedure(config: ExperimentConfig, clock: Callable[[], float]) -> SearchProcedure:
    """Build the search procedure a config names, as ``run`` does (one code path).

    Its generator comes from the experiment seed; ``num_workers``, for procedures that
    take it, defaults to the config's ``workers``, and ``deadline`` is the config's one
    deadline (:attr:`ExperimentConfig.deadline`). ``clock`` is experiment time, 0 at
    ``run``: the procedure's deadline counts from there, start-up included
    (:class:`~cerebro_spark.search._clock.ExperimentClock`). ``plan`` builds the procedure
    here too, so it plans exactly what ``run`` will do.
    """
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, PROCEDURE_STREAM]))
    options = dict(config.procedure_options)
    # A run resolves metric and mode first (pre-flight); planning needs only the stages.
    metric = config.metric if config.metric is not None else LOSS
    mode = config.mode if config.mode is not None else "min"
    accepted = procedure_options(config.procedure)
    if "num_workers" in accepted:
        options.setdefault("num_workers", config.workers)
    if "deadline" in accepted and config.deadline is not None:
        options.setdefault("deadline", config.deadline)  # (None kept: an old stored run)
    return make_procedure(
        config.procedure,
        space=SearchSpace.from_config(config.space),
        epochs=config.epochs,
        metric=metric,
        mode=mode,
        rng=rng,
        clock=ExperimentClock(clock),
        **options,
    )


def experiment_spec(config: ExperimentConfig) -> ExperimentSpec:
    """The stage structure of the search a config runs (for the planner).

    Raises:
        ConfigError: The config is bad, or its procedure gives no stage structure.
    """
    procedure = build_procedure(config, lambda: 0.0)
    spec = procedure.stage_spec()
    if spec is None:
        raise ConfigError(
            f"search procedure {config.procedure!r} gives no stage structure to plan "
            "(SearchProcedure.stage_spec)"
        )
    return dataclasses.replace(spec, procedure=config.procedure)


def trial_seed(experiment_seed: int, trial_id: str) -> int:
    """Derive a trial's seed from the experiment seed and its id."""
    sequence = np.random.SeedSequence(
        [experiment_seed, TRIAL_STREAM, zlib.crc32(trial_id.encode())]
    )
    return int(sequence.generate_state(1, np.uint32)[0])
