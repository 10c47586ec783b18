"""Profiles: what a pilot measured (or a user wrote) about one workload on the cloud.

A profile is a small YAML file the planner reads (RubberBand §4.1's modeling variables,
§5's profiling step; Cynthia §3's baseline profile). ``cerebro-spark profile CONFIG`` writes
one from a short pilot on the real data and models; it can also be written by hand.

Keys (times in seconds; ``<type>`` is an instance type of the price catalog, or the name
the pilot was run under):

* ``partitions`` (required): partitions ``P`` of the dataset.
* ``unit_seconds: {<type>: s}`` (required): one train unit -- one trial, one partition, one
  worker -- median over the pilot's units.
* ``validation_seconds: {<type>: s}`` (required): validating one trial after an epoch (all
  its validation units).
* ``hop_seconds`` (required): a hop, the checkpoint read and write around a unit.
* ``worker_start_seconds`` (required): from an executor granted to its worker ready
  (Python worker, ``import torch``, the first partition loads excepted).
* ``scale_seconds`` (required): provider latency from a request to an executor granted.
* ``scale_seconds_each`` (default 0): what each further instance of one request adds to
  ``scale_seconds``: a request for ``n`` instances is granted after ``scale_seconds + (n -
  1) * scale_seconds_each`` (a provider that starts instances one after another, as the
  local standalone cluster starts its worker daemons, each one's script waiting for its
  JVM; 0 where they start at once, as a cloud's instances do). All of them are billed
  from the request.
* ``driver_start_seconds`` (default 0): from ``run`` to the first request for instances
  (the configuration, the dataset, the pre-flight, the plan, and whatever the manager
  starts before any instance: a standalone master). Not billed: the driver is not an
  instance of the plan. A re-plan (its workers already running) pays none.
* ``scaling`` (required): a trial's throughput on ``g`` workers relative to one, ``{1:
  1.0, 2: ..., 4: ...}`` (``1`` must map to ``1.0``, and no ``g`` to more than ``g``), or
  ``linear`` / ``sqrt`` / ``none``. Between listed sizes it is interpolated linearly;
  beyond the largest it stays at the largest's value (no gain is assumed that was not
  measured). A superlinear speedup is refused: the execution model divides only the
  training time of a unit among a group's workers, and the planner's least worker count
  (all the work on one worker each, divided by the deadline) holds only if a group of
  ``g`` does at most ``g`` workers' work; a measurement above ``g`` is noise or a cache
  effect of the pilot's small data that would not last.
* ``packing`` (optional): a pack of ``k`` trials' throughput relative to one trial trained
  alone (issue 27's packed units, ``pack`` in the config), ``{1: 1.0, 2: ..., 4: ...}`` or
  a name, with ``scaling``'s rules (interpolated, flat past the largest size, never more
  than ``k``): a pack of ``k`` trains a partition in ``k * unit_seconds / packing(k)``.
  Absent: not measured; a plan for a run that packs then assumes packs gain nothing.
* ``partition_load_seconds`` (default 0): reading one partition (both splits) into a worker.
* ``partition_bytes`` (default 0): bytes of one partition (both splits): data ingress.
* Optional spreads (standard deviations, same shape as their key): ``unit_seconds_spread``,
  ``validation_seconds_spread``, ``hop_seconds_spread``, ``worker_start_seconds_spread``,
  ``scale_seconds_spread``, ``driver_start_seconds_spread``,
  ``partition_load_seconds_spread``.
* Optional, not read by the planner: ``families`` (per model family measurements),
  ``group`` (what Cynthia's model was given), ``measured`` (provenance).

Numbers may be written as numeric strings (YAML reads ``1e9`` as a string, ``1.0e9`` as a
number). Missing, unknown or inconsistent keys raise
:class:`~cerebro_spark.errors.ConfigError` naming the key and the rule.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import yaml

from cerebro_spark.errors import ConfigError

SCALING_NAMES = ("linear", "sqrt", "none")
_SPREADS = (
    "unit_seconds_spread",
    "validation_seconds_spread",
    "hop_seconds_spread",
    "worker_start_seconds_spread",
    "scale_seconds_spread",
    "driver_start_seconds_spread",
    "partition_load_seconds_spread",
)
_INFORMATIONAL = ("families", "group", "measured")

T = TypeVar("T", float, np.ndarray)


@dataclasses.dataclass(frozen=True)
class Latency:
    """A latency: its mean and standard deviation (0: deterministic)."""

    mean: float
    spread: float = 0.0


@dataclasses.dataclass(frozen=True)
class TypeProfile:
    """The profile seen from one instance type: what the simulator needs.

    Attributes:
        instance_type: The type.
        partitions: ``P``.
        unit: One train unit on one worker.
        validation: Validating one trial after an epoch.
        hop: Checkpoint read and write around a unit.
        worker_start: Executor granted to worker ready.
        scale: Request to executor granted.
        scale_each: What each further instance of one request adds to ``scale``.
        driver_start: ``run`` to the first request for instances (not billed).
        load: One partition into a worker.
        partition_bytes: Bytes of one partition.
        scaling: Throughput of a trial on ``g`` workers relative to one.
        packing: Throughput of a pack of ``k`` trials relative to one trial alone.
    """

    instance_type: str
    partitions: int
    unit: Latency
    validation: Latency
    hop: Latency
    worker_start: Latency
    scale: Latency
    load: Latency
    partition_bytes: float
    scaling: Scaling
    packing: Scaling = dataclasses.field(default_factory=lambda: Scaling(name="none"))
    scale_each: float = 0.0
    driver_start: Latency = Latency(0.0)

    def scale_seconds(self, instances: int) -> float:
        """Mean seconds from a request for ``instances`` instances to the last one granted."""
        return self.scale.mean + max(0, instances - 1) * self.scale_each

    def trial_epoch_seconds(self, group: int = 1) -> float:
        """Mean seconds of one trial-epoch on a group of ``group`` workers (:func:`trial_epoch`)."""
        return trial_epoch(
            self.partitions,
            self.unit.mean,
            self.hop.mean,
            self.validation.mean,
            self.scaling(group),
        )


def trial_epoch(partitions: int, unit: T, hop: T, validation: T, speedup: float) -> T:
    """Seconds of one trial-epoch: ``P * (unit / speedup + hop) + validation``.

    A trial never runs two units at once, so its ``P`` units and their hops follow one
    another; a group of ``g`` workers divides the training time by its ``scaling(g)``, not
    the hops (the checkpoint is read and written once per unit). The latencies may be
    numbers or arrays of samples (the simulator's): this is the one place the formula is.
    """
    return partitions * (unit / speedup + hop) + validation  # type: ignore[no-any-return]


@dataclasses.dataclass(frozen=True)
class Scaling:
    """A trial's throughput on ``g`` workers relative to one (see the module docstring)."""

    table: tuple[tuple[int, float], ...] = ()
    name: str | None = None

    def __call__(self, group: int) -> float:
        """Return the speedup of a group of ``group`` workers (``>= 1``)."""
        if group < 1:
            raise ValueError(f"group size must be >= 1, got {group}")
        if self.name == "linear":
            return float(group)
        if self.name == "sqrt":
            return math.sqrt(group)
        if self.name == "none":
            return 1.0
        sizes = [g for g, _ in self.table]
        if group >= sizes[-1]:
            return self.table[-1][1]
        for (g0, s0), (g1, s1) in zip(self.table, self.table[1:], strict=False):
            if g0 <= group <= g1:
                return s0 + (s1 - s0) * (group - g0) / (g1 - g0)
        raise AssertionError("unreachable: the table starts at 1")  # pragma: no cover

    def to_yaml(self) -> Any:
        """The ``scaling`` value of a profile file."""
        return self.name if self.name else {g: s for g, s in self.table}


@dataclasses.dataclass(frozen=True)
class Profile:
    """A parsed profile (all instance types it measured).

    Attributes:
        partitions: ``P``.
        unit_seconds: Per type.
        validation_seconds: Per type.
        hop_seconds: One hop.
        worker_start_seconds: Executor granted to worker ready.
        scale_seconds: Request to executor granted.
        scaling: Group speedups.
        partition_load_seconds: One partition into a worker.
        partition_bytes: Bytes of one partition.
        packing: Pack speedups (``None``: not measured).
        scale_seconds_each: What each further instance of a request adds.
        driver_start_seconds: ``run`` to the first request for instances (not billed).
        spreads: Standard deviations, by key (per type for the per-type keys).
        extra: The informational keys, as written.
    """

    partitions: int
    unit_seconds: Mapping[str, float]
    validation_seconds: Mapping[str, float]
    hop_seconds: float
    worker_start_seconds: float
    scale_seconds: float
    scaling: Scaling
    partition_load_seconds: float = 0.0
    partition_bytes: float = 0.0
    packing: Scaling | None = None
    scale_seconds_each: float = 0.0
    driver_start_seconds: float = 0.0
    spreads: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def instance_types(self) -> list[str]:
        """The types the profile has numbers for, sorted."""
        return sorted(self.unit_seconds)

    def for_type(self, instance_type: str) -> TypeProfile:
        """The profile as the simulator sees it on ``instance_type``.

        Raises:
            ConfigError: The profile has no numbers for that type.
        """
        if instance_type not in self.unit_seconds:
            raise ConfigError(
                f"the profile has no unit_seconds for instance type {instance_type!r}; it "
                f"measured {self.instance_types} (profile again with --instance-type, or add it)"
            )

        def spread(key: str) -> float:
            value = self.spreads.get(f"{key}_spread", 0.0)
            return float(value.get(instance_type, 0.0) if isinstance(value, Mapping) else value)

        return TypeProfile(
            instance_type=instance_type,
            partitions=self.partitions,
            unit=Latency(self.unit_seconds[instance_type], spread("unit_seconds")),
            validation=Latency(
                self.validation_seconds[instance_type], spread("validation_seconds")
            ),
            hop=Latency(self.hop_seconds, spread("hop_seconds")),
            worker_start=Latency(self.worker_start_seconds, spread("worker_start_seconds")),
            scale=Latency(self.scale_seconds, spread("scale_seconds")),
            load=Latency(self.partition_load_seconds, spread("partition_load_seconds")),
            partition_bytes=self.partition_bytes,
            scaling=self.scaling,
            packing=self.packing if self.packing is not None else Scaling(name="none"),
            scale_each=self.scale_seconds_each,
            driver_start=Latency(self.driver_start_seconds, spread("driver_start_seconds")),
        )

    def to_dict(self) -> dict[str, Any]:
        """Return the profile as the YAML file's values."""
        out: dict[str, Any] = {
            "partitions": self.partitions,
            "unit_seconds": dict(self.unit_seconds),
            "validation_seconds": dict(self.validation_seconds),
            "hop_seconds": self.hop_seconds,
            "worker_start_seconds": self.worker_start_seconds,
            "scale_seconds": self.scale_seconds,
            "scale_seconds_each": self.scale_seconds_each,
            "driver_start_seconds": self.driver_start_seconds,
            "scaling": self.scaling.to_yaml(),
            "partition_load_seconds": self.partition_load_seconds,
            "partition_bytes": self.partition_bytes,
        }
        if self.packing is not None:
            out["packing"] = self.packing.to_yaml()
        out.update({k: v for k, v in self.spreads.items()})
        out.update({k: v for k, v in self.extra.items()})
        return out

    def dump(self, path: str | Path) -> None:
        """Write the profile as YAML."""
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


def load_profile(path: str | Path) -> Profile:
    """Read and check a profile YAML file.

    Raises:
        ConfigError: The file is missing or not YAML, or a key breaks its rule (the message
            names the file and the key).
    """
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"profile {path} does not exist") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"profile {path} is not valid YAML: {error}") from None
    try:
        return parse_profile(raw)
    except ConfigError as error:
        raise ConfigError(f"profile {path}: {error}") from None


def parse_profile(raw: Any) -> Profile:
    """Check a profile given as plain data (see the module docstring for the keys).

    Raises:
        ConfigError: A key is missing, unknown or breaks its rule (named in the message).
    """
    if not isinstance(raw, Mapping):
        raise ConfigError(f"a profile must be a mapping of keys, got {type(raw).__name__}")
    known = {
        "partitions",
        "unit_seconds",
        "validation_seconds",
        "hop_seconds",
        "worker_start_seconds",
        "scale_seconds",
        "scale_seconds_each",
        "driver_start_seconds",
        "scaling",
        "partition_load_seconds",
        "partition_bytes",
        "packing",
        *_SPREADS,
        *_INFORMATIONAL,
    }
    unknown = sorted(str(k) for k in raw if k not in known)
    if unknown:
        raise ConfigError(f"unknown profile key(s) {unknown}; known keys: {sorted(known)}")
    for key in (
        "partitions",
        "unit_seconds",
        "validation_seconds",
        "hop_seconds",
        "worker_start_seconds",
        "scale_seconds",
        "scaling",
    ):
        if key not in raw or raw[key] is None:
            raise ConfigError(f"profile key {key!r} is required")
    partitions = raw["partitions"]
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise ConfigError(f"profile key 'partitions' must be an integer >= 1, got {partitions!r}")
    unit = _per_type(raw, "unit_seconds", positive=True)
    validation = _per_type(raw, "validation_seconds", positive=False)
    if set(unit) != set(validation):
        raise ConfigError(
            "profile keys 'unit_seconds' and 'validation_seconds' must name the same instance "
            f"types, got {sorted(unit)} and {sorted(validation)}"
        )
    spreads: dict[str, Any] = {}
    for key in _SPREADS:
        if raw.get(key) is None:
            continue
        base = key.removesuffix("_spread")
        if isinstance(raw[base], Mapping):
            value = _per_type(raw, key, positive=False)
            extra_types = sorted(set(value) - set(raw[base]))
            if extra_types:
                raise ConfigError(
                    f"profile key {key!r} names instance types {extra_types} that {base!r} does not"
                )
            spreads[key] = value
        else:
            spreads[key] = _number(raw, key, positive=False)
    return Profile(
        partitions=partitions,
        unit_seconds=unit,
        validation_seconds=validation,
        hop_seconds=_number(raw, "hop_seconds", positive=False),
        worker_start_seconds=_number(raw, "worker_start_seconds", positive=False),
        scale_seconds=_number(raw, "scale_seconds", positive=False),
        scaling=parse_scaling(raw["scaling"]),
        scale_seconds_each=_number(raw, "scale_seconds_each", positive=False, default=0.0),
        driver_start_seconds=_number(raw, "driver_start_seconds", positive=False, default=0.0),
        partition_load_seconds=_number(raw, "partition_load_seconds", positive=False, default=0.0),
        partition_bytes=_number(raw, "partition_bytes", positive=False, default=0.0),
        packing=None if raw.get("packing") is None else parse_scaling(raw["packing"], "packing"),
        spreads=spreads,
        extra={k: raw[k] for k in _INFORMATIONAL if k in raw},
    )


_SIZES = {
    "scaling": ("group", "workers", "workers' work"),
    "packing": ("pack", "trials", "times one trial's work"),
}


def parse_scaling(value: Any, key: str = "scaling") -> Scaling:
    """Check a ``scaling`` (or ``packing``) value: a name, or ``{size: speedup}`` with ``1: 1.0``.

    Raises:
        ConfigError: It breaks the rules (named in the message).
    """
    noun, members, work = _SIZES[key]
    if isinstance(value, str):
        if value not in SCALING_NAMES:
            raise ConfigError(
                f"profile key {key!r} must be one of {list(SCALING_NAMES)} or a mapping of "
                f"{noun} sizes to speedups, got {value!r}"
            )
        return Scaling(name=value)
    if not isinstance(value, Mapping) or not value:
        raise ConfigError(
            f"profile key {key!r} must map {noun} sizes to speedups, e.g. {{1: 1.0, 2: 1.8}}, "
            f"got {value!r}"
        )
    table: list[tuple[int, float]] = []
    for size, speedup in value.items():
        try:
            g = int(size)
        except (TypeError, ValueError):
            g = 0
        if g < 1 or str(size).strip() != str(g):
            raise ConfigError(f"profile key {key!r}: {noun} size {size!r} is not an integer >= 1")
        value = _number({f"{key}.{g}": speedup}, f"{key}.{g}", positive=True)
        if value > g * (1 + 1e-9):
            raise ConfigError(
                f"profile key '{key}.{g}' must be at most {g} (a {noun} of {g} {members} does at "
                f"most {g} {work}; superlinear speedups are refused), got {speedup!r}"
            )
        table.append((g, value))
    table.sort()
    if table[0] != (1, 1.0) and not (table[0][0] == 1 and math.isclose(table[0][1], 1.0)):
        raise ConfigError(
            f"profile key {key!r} must give 1 {members[:-1]} the speedup 1.0, got {dict(table)}"
        )
    return Scaling(table=((1, 1.0), *table[1:]))


def _number(raw: Mapping[str, Any], key: str, *, positive: bool, default: Any = None) -> float:
    """The number at ``raw[key]``, checked ``>= 0`` or ``> 0``; the error names the key.

    A numeric string is read as a number (YAML reads ``1e9`` as a string).
    """
    value = raw.get(key, default)
    if value is None:
        raise ConfigError(f"profile key {key!r} is required")
    number = numeric(value)
    if number is None or number < 0 or (positive and number == 0):
        rule = "> 0" if positive else ">= 0"
        raise ConfigError(f"profile key {key!r} must be a number {rule}, got {value!r}")
    return number


def numeric(value: Any) -> float | None:
    """``value`` as a finite float: an int, a float or a numeric string; else ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _per_type(raw: Mapping[str, Any], key: str, *, positive: bool) -> dict[str, float]:
    value = raw[key]
    if not isinstance(value, Mapping) or not value:
        raise ConfigError(
            f"profile key {key!r} must map instance types to seconds, e.g. "
            f"{{p3.2xlarge: 1.5}}, got {value!r}"
        )
    return {
        str(t): _number({f"{key}.{t}": v}, f"{key}.{t}", positive=positive)
        for t, v in value.items()
    }
