"""Search procedures by name, for configs and the CLI.

Every registered class takes the search space as its first argument and the keywords
``epochs``, ``metric``, ``mode``, ``rng`` and ``clock``; its other keyword arguments are the
procedure's *options*, passed through :func:`make_procedure`'s ``**options``. To add a
procedure, add it to :data:`PROCEDURES`.

A class may rename an option and keep reading the old name: its ``renamed_options``
(``{old: new}``, e.g. SEER's ``budget`` -> ``worker_seconds``) is applied by
:func:`upgrade_options`, which logs a warning naming the new key and refuses both given.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from cerebro_spark.errors import ConfigError
from cerebro_spark.search._base import Clock, SearchProcedure
from cerebro_spark.search._grid import GridSearch
from cerebro_spark.search._random import RandomSearch
from cerebro_spark.search.space import SearchSpace

PROCEDURES: dict[str, type[SearchProcedure] | str] = {
    "grid": GridSearch,
    "random": RandomSearch,
    "sha": "cerebro_spark.search._sha:SuccessiveHalving",
    "hyperband": "cerebro_spark.search._hyperband:Hyperband",
    "asha": "cerebro_spark.search._asha:ASHA",
    "pbt": "cerebro_spark.search._pbt:PBT",
    "tpe": "cerebro_spark.search._tpe:TPESearch",
    "hypersched": "cerebro_spark.search._hypersched:HyperSched",
    "seer": "cerebro_spark.search._seer:SEER",
}
"""Registered procedures: config name -> class, or ``"module:Class"`` imported on first use
(keeps optional dependencies such as optuna off the import path of the others)."""

_COMMON = frozenset({"self", "space", "epochs", "metric", "mode", "rng", "clock"})

logger = logging.getLogger(__name__)


def renamed_options(name: str) -> Mapping[str, str]:
    """Return ``{old name: new name}`` of the options procedure ``name`` renamed.

    Raises:
        ConfigError: ``name`` is not registered.
    """
    renamed: Mapping[str, str] = getattr(_lookup(name), "renamed_options", {})
    return renamed


def upgrade_options(
    name: str, options: Mapping[str, Any], *, where: str = "procedure", warn: bool = True
) -> dict[str, Any]:
    """Return ``options`` with every renamed option under its new name.

    Args:
        name: A registered procedure.
        options: Its options as given (a config's ``procedure:`` section, ``--option``).
        where: How the message names the section (``procedure`` -> ``procedure.budget``).
        warn: Log a warning naming the new key for each old one (``False``: a stored
            config written by an earlier version, which the user does not edit).

    Raises:
        ConfigError: Unknown name, or an option given under both its old and new names
            (the message names both).
    """
    renamed = renamed_options(name)
    for old, new in renamed.items():
        if old in options and new in options:
            raise ConfigError(
                f"{where}.{old} and {where}.{new} are both given: {name}'s {old!r} is the "
                f"old name of {new!r} (got {options[old]!r} and {options[new]!r}); keep "
                f"only {where}.{new}"
            )
    out: dict[str, Any] = {}
    for key, value in options.items():  # the given order (a space's order matters)
        renamed_to = renamed.get(key)
        if renamed_to is not None and warn:
            logger.warning(
                "%s.%s is the old name of %s's option %r: read as %s.%s: %r; rename it",
                where,
                key,
                name,
                renamed_to,
                where,
                renamed_to,
                value,
            )
        out[renamed_to or key] = value
    return out


def procedure_options(name: str) -> dict[str, bool]:
    """Return the options procedure ``name`` accepts, each mapped to whether it is required.

    Raises:
        ConfigError: ``name`` is not registered (the message lists the known names).
    """
    cls = _lookup(name)
    params = inspect.signature(cls.__init__).parameters.values()
    return {
        p.name: p.default is inspect.Parameter.empty
        for p in params
        if p.name not in _COMMON and p.kind is inspect.Parameter.KEYWORD_ONLY
    }


CONFIG_OPTIONS = frozenset({"deadline", "num_workers"})
"""Options a config gives outside the procedure's section: the driver passes the config's
one ``deadline`` and its ``workers`` (as ``num_workers``) to every procedure that takes
them (``driver._procedure.build_procedure``)."""


def check_procedure_options(
    name: str, options: Mapping[str, Any], *, from_config: bool = True
) -> None:
    """Check ``options`` against what procedure ``name`` accepts.

    An option's old name (:func:`upgrade_options`) counts as its new one. A required
    option of :data:`CONFIG_OPTIONS` may be missing (the config gives it) unless
    ``from_config`` is false (:func:`make_procedure`: every argument is here).

    Raises:
        ConfigError: Unknown name, or an unknown or missing option (the message lists the
            accepted ones).
    """
    supplied = CONFIG_OPTIONS if from_config else frozenset()
    options = upgrade_options(name, options, warn=False)
    accepted = procedure_options(name)
    listing = ", ".join(sorted(accepted)) or "none"
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ConfigError(
            f"search procedure {name!r} has no option {unknown[0]!r}; accepted options: {listing}"
        )
    missing = sorted(
        o for o, required in accepted.items() if required and o not in options and o not in supplied
    )
    if missing:
        raise ConfigError(
            f"search procedure {name!r} needs option {missing[0]!r}; accepted options: {listing}"
        )


def make_procedure(
    name: str,
    *,
    space: SearchSpace,
    epochs: int,
    metric: str,
    mode: str,
    rng: np.random.Generator,
    clock: Clock = time.monotonic,
    **options: Any,
) -> SearchProcedure:
    """Build the registered procedure ``name``.

    Args:
        name: A key of :data:`PROCEDURES`, e.g. ``"grid"`` or ``"random"``.
        space: The search space.
        epochs: Epoch budget per trial (each procedure documents its exact meaning).
        metric: Validation metric to optimise.
        mode: ``"max"`` or ``"min"``.
        rng: Source of all randomness.
        clock: Monotonic clock in seconds.
        **options: The procedure's own options, e.g. ``num_trials`` for ``"random"``.

    An option given under its old name is read under its new one, with a warning
    (:func:`upgrade_options`).

    Raises:
        ConfigError: Unknown name, unknown or missing option (the message lists the
            accepted ones), an option given under its old and new names, or an argument
            the procedure rejects.
    """
    options = upgrade_options(name, options)
    check_procedure_options(name, options, from_config=False)
    cls: Any = _lookup(name)
    procedure: SearchProcedure = cls(
        space, epochs=epochs, metric=metric, mode=mode, rng=rng, clock=clock, **options
    )
    return procedure


def _lookup(name: str) -> type[SearchProcedure]:
    if name not in PROCEDURES:
        raise ConfigError(
            f"unknown search procedure {name!r}; known procedures: {', '.join(sorted(PROCEDURES))}"
        )
    entry = PROCEDURES[name]
    if isinstance(entry, str):
        module_name, _, class_name = entry.partition(":")
        cls: type[SearchProcedure] = getattr(importlib.import_module(module_name), class_name)
        PROCEDURES[name] = entry = cls
    return entry
