"""Price catalogs: what an instance-second, a gigabyte of ingress and a DBU cost.

A catalog is a YAML file (``conf/prices/aws-us-east-1.yaml``). Billing follows RubberBand
§3 and §4.1: **per instance** (an instance is billed from its request to its release, per
``granularity_seconds``, at least ``minimum_seconds``) or **per function** (only the
worker-seconds a trial trains are billed). Data ingress is charged per GB read into a worker
(RubberBand's *data price*); a Databricks DBU rate, when set, adds ``dbus_per_hour`` of each
instance at that rate. Each instance runs ``executors`` executors (default 1), each one
worker.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from cerebro_spark.errors import ConfigError

BILLING_MODELS = ("per_instance", "per_function")


@dataclasses.dataclass(frozen=True)
class InstancePrice:
    """One instance type of a catalog.

    Attributes:
        instance_type: Its name.
        usd_per_hour: On-demand price per instance-hour, DBUs included when the catalog
            sets a DBU rate.
        executors: Executors (workers) per instance.
        gpus: GPUs per instance (informational).
        recorded: When the price was recorded, and ``source``: where it was published.
        source: See ``recorded``.
    """

    instance_type: str
    usd_per_hour: float
    executors: int = 1
    gpus: int = 0
    recorded: str = ""
    source: str = ""


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
    granularity_seconds: float = 1.0
    minimum_seconds: float = 60.0
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

    def billed_seconds(self, held: float) -> float:
        """Seconds billed for an instance held ``held`` seconds (per-instance billing)."""
        units = math.ceil(held / self.granularity_seconds - 1e-9) * self.granularity_seconds
        return max(self.minimum_seconds, units)


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
    """Check a catalog given as plain data.

    Raises:
        ConfigError: A key is missing or breaks its rule (named in the message).
    """
    if not isinstance(raw, Mapping):
        raise ConfigError(f"a price catalog must be a mapping, got {type(raw).__name__}")
    instances_raw = raw.get("instances")
    if not isinstance(instances_raw, Mapping) or not instances_raw:
        raise ConfigError("key 'instances' must map instance types to their prices")
    billing = _mapping(raw, "billing")
    model = billing.get("model", "per_instance")
    if model not in BILLING_MODELS:
        raise ConfigError(f"billing.model must be one of {list(BILLING_MODELS)}, got {model!r}")
    dbu_rate = _mapping(raw, "databricks").get("dbu_usd_per_hour")
    if dbu_rate is not None:
        dbu_rate = _number(dbu_rate, "databricks.dbu_usd_per_hour")
    instances = {}
    for instance_type, entry in instances_raw.items():
        where = f"instances.{instance_type}"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where} must be a mapping with usd_per_hour")
        if "usd_per_hour" not in entry:
            raise ConfigError(f"{where}.usd_per_hour is required")
        usd = _number(entry["usd_per_hour"], f"{where}.usd_per_hour")
        if dbu_rate is not None and entry.get("dbus_per_hour") is not None:
            usd += dbu_rate * _number(entry["dbus_per_hour"], f"{where}.dbus_per_hour")
        executors = entry.get("executors", 1)
        if isinstance(executors, bool) or not isinstance(executors, int) or executors < 1:
            raise ConfigError(f"{where}.executors must be an integer >= 1, got {executors!r}")
        instances[str(instance_type)] = InstancePrice(
            instance_type=str(instance_type),
            usd_per_hour=usd,
            executors=executors,
            gpus=int(entry.get("gpus", 0) or 0),
            recorded=str(entry.get("recorded", "")),
            source=str(entry.get("source", "")),
        )
    granularity = _number(billing.get("granularity_seconds", 1), "billing.granularity_seconds")
    if granularity == 0:
        raise ConfigError("billing.granularity_seconds must be > 0")
    return PriceCatalog(
        instances=instances,
        billing=model,
        granularity_seconds=granularity,
        minimum_seconds=_number(billing.get("minimum_seconds", 0), "billing.minimum_seconds"),
        ingress_usd_per_gb=_number(
            _mapping(raw, "data").get("ingress_usd_per_gb", 0.0), "data.ingress_usd_per_gb"
        ),
        name=name,
    )


def _mapping(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = raw.get(key) or {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"key {key!r} must be a mapping, got {value!r}")
    return value


def _number(value: Any, key: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ConfigError(f"{key} must be a number >= 0, got {value!r}")
    return float(value)
