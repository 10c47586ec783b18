"""Profiles, catalogs and specs for the elastic tests (hand-checkable numbers)."""

from __future__ import annotations

from typing import Any

from cerebro_spark.elastic import (
    PriceCatalog,
    Profile,
    parse_catalog,
    parse_profile,
    procedure_spec,
)
from cerebro_spark.search import Cohort, ExperimentSpec, StageSpec

TYPE = "t1"


def profile(**changes: Any) -> Profile:
    """P=4, unit 1 s, hop 0.25 s, validation 1 s: a trial-epoch on one worker is 6 s;
    on a group of 2 (speedup 1.5) 4.6667 s. Scale 5 s, worker start 10 s, a partition
    load 0.5 s, a partition 1 GB."""
    raw: dict[str, Any] = {
        "partitions": 4,
        "unit_seconds": {TYPE: 1.0},
        "validation_seconds": {TYPE: 1.0},
        "hop_seconds": 0.25,
        "worker_start_seconds": 10.0,
        "scale_seconds": 5.0,
        "scaling": {1: 1.0, 2: 1.5},
        "partition_load_seconds": 0.5,
        "partition_bytes": 1e9,
    }
    raw.update(changes)
    return parse_profile(raw)


def catalog(**changes: Any) -> PriceCatalog:
    """One type at $3.60 per hour ($0.001 per second), 60 s minimum, $0.01 per GB."""
    raw: dict[str, Any] = {
        "billing": {"model": "per_instance", "granularity_seconds": 1, "minimum_seconds": 60},
        "data": {"ingress_usd_per_gb": 0.01},
        "instances": {TYPE: {"usd_per_hour": 3.6}, "t2": {"usd_per_hour": 7.2}},
    }
    raw.update(changes)
    return parse_catalog(raw)


def two_stages() -> ExperimentSpec:
    """8 trials x 2 epochs, then 2 trials x 4 epochs."""
    return ExperimentSpec(
        "test",
        (StageSpec((Cohort(8, 2),)), StageSpec((Cohort(2, 4),))),
    )


def sha_spec(trials: int, max_epochs: int, min_epochs: int = 1, eta: int = 2) -> ExperimentSpec:
    """SHA's stages, built as ``plan --procedure sha`` builds them."""
    return procedure_spec("sha", max_epochs, num_trials=trials, eta=eta, min_epochs=min_epochs)


def rubberband_like(scaling: Any = None, **changes: Any) -> Profile:
    """ResNet-like units on p3.2xlarge (8 partitions, 4 s units: a 38 s trial-epoch),
    scaling flat beyond 8 unless given (RubberBand §6.3.1's setting)."""
    raw: dict[str, Any] = {
        "partitions": 8,
        "unit_seconds": {"p3.2xlarge": 4.0},
        "validation_seconds": {"p3.2xlarge": 2.0},
        "hop_seconds": 0.5,
        "worker_start_seconds": 15,
        "scale_seconds": 15,
        "scaling": scaling or {1: 1.0, 2: 1.9, 4: 3.5, 8: 6.0},
        "partition_load_seconds": 2,
    }
    raw.update(changes)
    return parse_profile(raw)
