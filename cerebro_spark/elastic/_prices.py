"""Price catalogs: what an instance-second, a gigabyte of ingress and a DBU cost.

A catalog is a YAML file (``conf/prices/aws-us-east-1.yaml``). Billing follows RubberBand
§3 and §4.1: **per instance** (an instance is billed from its request to its release, per
``granularity_seconds``, at least ``minimum_seconds``) or **per function** (only the
worker-seconds a trial trains are billed). Data ingress is charged per GB read into a worker
(RubberBand's *data price*); a Databricks DBU rate, when set, adds ``dbus_per_hour`` of each
instance at that rate. Each instance runs ``executors`` executors (default 1), each one
worker.

Keys (unknown keys are refused, naming the key, as in a profile):

* ``provider``, ``region`` (informational text), ``currency`` (``USD``, the only one the
  planner prices in; default ``USD``).
* ``billing``: ``model`` (``per_instance`` or ``per_function``, default ``per_instance``),
  ``granularity_seconds`` (default 1), ``minimum_seconds`` (default 60: EC2's per-second
  billing with a 60 s minimum).
* ``data``: ``ingress_usd_per_gb`` (default 0).
* ``databricks``: ``dbu_usd_per_hour`` (default none).
* ``instances`` (required): per type, ``usd_per_hour`` (required), ``executors`` (default
  1), ``gpus`` and ``vcpus`` (informational), ``dbus_per_hour`` (with a DBU rate),
  ``effective`` (the date the price took effect, as published) and ``source`` (where).

Numbers may be written as numeric strings (YAML reads ``1e9`` as a string).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, overload

import numpy as np
import yaml

from cerebro_spark.elastic._profile import numeric
from cerebro_spark.errors import ConfigError

BILLING_MODELS = ("per_instance", "per_function")
DEFAULT_GRANULARITY_SECONDS = 1.0
"""Billing unit of time when a catalog does not say (per second)."""
DEFAULT_MINIMUM_SECONDS = 60.0
"""Least time an instance is billed for when a catalog does not say (EC2's 60 s)."""

_TOP_KEYS = ("provider", "region", "currency", "billing", "data", "databricks", "instances")
_BILLING_KEYS = ("model", "granularity_seconds", "minimum_seconds")
_DATA_KEYS = ("ingress_usd_per_gb",)
_DATABRICKS_KEYS = ("dbu_usd_per_hour",)
_INSTANCE_KEYS = (
    "usd_per_hour",
    "executors",
    "gpus",
    "vcpus",
    "dbus_per_hour",
    "effective",
    "source",
)


@dataclasses.dataclass(frozen=True)
class InstancePrice:
    """One instance type of a catalog.

    Attributes:
        instance_type: Its name.
        usd_per_hour: On-demand price per instance-hour, DBUs included when the catalog
            sets a DBU rate.
        executors: Executors (workers) per instance.
        gpus: GPUs per instance (informational).
        effective: The date the price took effect (as published), and ``source``: where
            it was published.
        source: See ``effective``.
    """

    instance_type: str
    usd_per_hour: float
    executors: int = 1
    gpus: int = 0
    effective: str = ""
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Return the price as JSON values (``plan --format json``)."""
        return {
            "instance_type": self.instance_type,
            "usd_per_hour": self.usd_per_hour,
            "executors": self.executors,
            "effective": self.effective,
            "source": self.source,
        }


@dataclasses.dataclass(frozen=True)
class PriceCatalog:
    """A parsed catalog.

    Attributes:
        instances: By type.
        billing: ``per_instance`` or ``per_function``.
        granularity_seconds: Billing unit of time.
        minimum_seconds: Least time an instance is billed for.
        ingress_usd_per_gb: Data price per GB loaded into workers.
        name: Where the catalog came from (for messages).
    """

    instances: Mapping[str, InstancePrice]
    billing: str = "per_instance"
    granularity_seconds: float = DEFAULT_GRANULARITY_SECONDS
    minimum_seconds: float = DEFAULT_MINIMUM_SECONDS
    ingress_usd_per_gb: float = 0.0
    name: str = "catalog"

    def price(self, instance_type: str) -> InstancePrice:
        """The price of ``instance_type``.

        Raises:
            ConfigError: The catalog does not list it (the message lists what it has).
        """
        if instance_type not in self.instances:
            raise ConfigError(
                f"price catalog {self.name} has no instance type {instance_type!r}; it lists "
                f"{sorted(self.instances)}"
            )
        return self.instances[instance_type]

    @overload
    def billed_seconds(self, held: float, *, minimum: bool = True) -> float: ...

    @overload
    def billed_seconds(self, held: np.ndarray, *, minimum: bool = True) -> np.ndarray: ...

    def billed_seconds(
        self, held: float | np.ndarray, *, minimum: bool = True
    ) -> float | np.ndarray:
        """Seconds billed for an instance held ``held`` seconds (per-instance billing).

        ``held`` rounded up to ``granularity_seconds``, at least ``minimum_seconds``. The
        one rule for the planner's simulator and for metering what a run really held.

        Args:
            held: Seconds held: a number, or an array of them (the simulator's samples).
            minimum: Apply the minimum charge; ``False`` for an instance whose minimum was
                paid before the period billed (re-planning a search whose workers run).
        """
        step = self.granularity_seconds
        least = self.minimum_seconds if minimum else 0.0
        if isinstance(held, np.ndarray):
            billed: np.ndarray = np.maximum(least, np.ceil(held / step - 1e-9) * step)
            return billed
        return float(max(least, math.ceil(float(held) / step - 1e-9) * step))


def load_catalog(path: str | Path) -> PriceCatalog:
    """Read and check a price catalog.

    Raises:
        ConfigError: The file is missing or not YAML, or a key breaks its rule.
    """
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"price catalog {path} does not exist") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"price catalog {path} is not valid YAML: {error}") from None
    try:
        return parse_catalog(raw, name=str(path))
    except ConfigError as error:
        raise ConfigError(f"price catalog {path}: {error}") from None


def parse_catalog(raw: Any, *, name: str = "catalog") -> PriceCatalog:
    """Check a catalog given as plain data (see the module docstring for the keys).

    Raises:
        ConfigError: A key is missing, unknown or breaks its rule (named in the message).
    """
    if not isinstance(raw, Mapping):
        raise ConfigError(f"a price catalog must be a mapping, got {type(raw).__name__}")
    _known(raw, _TOP_KEYS, "")
    currency = raw.get("currency", "USD")
    if currency != "USD":
        raise ConfigError(
            f"key 'currency' must be USD (the planner prices in dollars), got {currency!r}"
        )
    instances_raw = raw.get("instances")
    if not isinstance(instances_raw, Mapping) or not instances_raw:
        raise ConfigError("key 'instances' must map instance types to their prices")
    billing = _mapping(raw, "billing")
    _known(billing, _BILLING_KEYS, "billing.")
    model = billing.get("model", "per_instance")
    if model not in BILLING_MODELS:
        raise ConfigError(f"billing.model must be one of {list(BILLING_MODELS)}, got {model!r}")
    databricks = _mapping(raw, "databricks")
    _known(databricks, _DATABRICKS_KEYS, "databricks.")
    dbu_rate = databricks.get("dbu_usd_per_hour")
    if dbu_rate is not None:
        dbu_rate = _number(dbu_rate, "databricks.dbu_usd_per_hour")
    data = _mapping(raw, "data")
    _known(data, _DATA_KEYS, "data.")
    instances = {}
    for instance_type, entry in instances_raw.items():
        where = f"instances.{instance_type}"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where} must be a mapping with usd_per_hour")
        _known(entry, _INSTANCE_KEYS, f"{where}.")
        if "usd_per_hour" not in entry:
            raise ConfigError(f"{where}.usd_per_hour is required")
        usd = _number(entry["usd_per_hour"], f"{where}.usd_per_hour")
        if dbu_rate is not None and entry.get("dbus_per_hour") is not None:
            usd += dbu_rate * _number(entry["dbus_per_hour"], f"{where}.dbus_per_hour")
        executors = entry.get("executors", 1)
        if isinstance(executors, bool) or not isinstance(executors, int) or executors < 1:
            raise ConfigError(f"{where}.executors must be an integer >= 1, got {executors!r}")
        gpus = entry.get("gpus", 0)
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
            raise ConfigError(f"{where}.gpus must be an integer >= 0, got {gpus!r}")
        instances[str(instance_type)] = InstancePrice(
            instance_type=str(instance_type),
            usd_per_hour=usd,
            executors=executors,
            gpus=gpus,
            effective=str(entry.get("effective", "")),
            source=str(entry.get("source", "")),
        )
    granularity = _number(
        billing.get("granularity_seconds", DEFAULT_GRANULARITY_SECONDS),
        "billing.granularity_seconds",
    )
    if granularity == 0:
        raise ConfigError("billing.granularity_seconds must be > 0")
    return PriceCatalog(
        instances=instances,
        billing=model,
        granularity_seconds=granularity,
        minimum_seconds=_number(
            billing.get("minimum_seconds", DEFAULT_MINIMUM_SECONDS), "billing.minimum_seconds"
        ),
        ingress_usd_per_gb=_number(data.get("ingress_usd_per_gb", 0.0), "data.ingress_usd_per_gb"),
        name=name,
    )


def _known(raw: Mapping[str, Any], keys: tuple[str, ...], where: str) -> None:
    unknown = sorted(f"{where}{k}" for k in raw if k not in keys)
    if unknown:
        raise ConfigError(
            f"unknown price catalog key(s) {unknown}; known keys here: {[where + k for k in keys]}"
        )


def _mapping(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = raw.get(key) or {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"key {key!r} must be a mapping, got {value!r}")
    return value


def _number(value: Any, key: str) -> float:
    number = numeric(value)
    if number is None or number < 0:
        raise ConfigError(f"{key} must be a number >= 0, got {value!r}")
    return number
