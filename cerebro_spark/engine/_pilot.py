"""The pilot behind ``cerebro-spark profile``: measure a config's workload for the planner.

RubberBand §5 profiles a workload "for a configurable period of time", scaling a trial's
allocation by powers of two; Cynthia §3 profiles one baseline worker. The pilot does both,
on the config's real data, models and backend:

1. One trial per model family (the first sample of the space that uses each family), each
   trained ``epochs`` epochs on every partition in turn, then validated. Units of the last
   epoch count (the first pays for building models and warm-up): ``unit_seconds`` is the
   median unit without its checkpoint I/O, ``hop_seconds`` the median checkpoint read and
   write, ``validation_seconds`` the median validation of a trial after an epoch, each with
   its spread (standard deviation) over all families' units; ``families`` keeps the same
   numbers per model family (informational: the planner reads the pooled ones).
2. ``worker_start_seconds``: the backend's median time from launch to a worker ready,
   without its initial partition loads; ``partition_load_seconds``: reading one partition
   (both splits) on the driver, median over the partitions; ``partition_bytes`` from the
   manifest.
3. Group scaling: for each size ``g`` with ``g`` workers and partitions available, a group
   unit of the first trial on ``g`` partitions, twice; ``scaling[g] = g * unit / group unit``
   (both without I/O; at most ``g``). Sizes that cannot be measured come from Cynthia's model
   (:class:`~._cynthia.GroupModel`) with the measured step time, the model's parameter
   bytes and the bandwidth fitted to a measured group, else the given ``bandwidth``.
4. Packing (issue 27), when the config packs (``pack`` ``N`` or ``auto``): for ``k = 2, 4,
   ...`` up to ``N`` (``auto``: 16, 64 with ``device: cuda``), a pack of ``k`` copies of the
   first trial on partition 0, twice; ``packing[k] = unit / member unit`` (a member's
   compute is its share of the pass, without I/O; at most ``k``). A size that fails (a
   GPU out of memory) ends the table.
5. ``scale_seconds`` is not measurable on a fixed cluster: it is given, as are
   ``scale_seconds_each`` and ``driver_start_seconds`` (both 0 by default).
6. ``measured.load``: the machine's 1-minute load average and cores before the pilot
   started (:func:`~cerebro_spark.elastic.machine_load`); ``run`` warns when today's load
   per core differs by more than :data:`~cerebro_spark.elastic.LOAD_CHANGE`.

``scaling`` holds speedups (a group's throughput relative to one worker), not time
fractions: ``{2: 0.413, 4: 0.203}`` (the demo profile measured on 2 cores) says a group of
2 trains a partition 2.4 times *slower* than one worker, because its ranks share the two
cores with each other and the driver and pay an all-reduce per step; the planner then
never forms groups there. A group larger than the machine's cores measures that
oversubscription, and the pilot says so.

Checkpoints go under ``<store>/profiles/<name>-<time>/`` and are deleted at the end.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import math
import os
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from cerebro_spark.backends import Backend, WorkerJob
from cerebro_spark.data import read_partition
from cerebro_spark.driver._config import ExperimentConfig, pack_size
from cerebro_spark.driver._dataset import resolve_dataset
from cerebro_spark.driver._pack_choice import MAX_PACK
from cerebro_spark.elastic import machine_load
from cerebro_spark.elastic._cynthia import GroupModel, bandwidth_from
from cerebro_spark.elastic._profile import Profile, Scaling
from cerebro_spark.engine._backend import default_backend
from cerebro_spark.errors import CerebroError, ConfigError
from cerebro_spark.search import SearchSpace
from cerebro_spark.store import Store, open_store
from cerebro_spark.training import decode_checkpoint, load_spec
from cerebro_spark.units import UnitKind, UnitResult, UnitTask, group_tasks

logger = logging.getLogger(__name__)

_MAX_DRAWS = 200
"""Samples of the space looked at to find one trial of every model family."""


def pilot_profile(
    config: ExperimentConfig,
    *,
    instance_type: str = "local",
    epochs: int = 2,
    groups: Sequence[int] = (2, 4),
    scale_seconds: float = 0.0,
    scale_seconds_each: float = 0.0,
    driver_start_seconds: float = 0.0,
    bandwidth: float = 1.25e9,
    backend_factory: Callable[[ExperimentConfig], Backend] = default_backend,
) -> Profile:
    """Run the pilot (module docstring) and return the profile.

    Raises:
        ConfigError: A bad argument or config.
    """
    if epochs < 1:
        raise ConfigError(f"--epochs must be >= 1, got {epochs}")
    load = machine_load()  # before the pilot adds its own
    root = open_store(config.store)
    dataset_uri, manifest = resolve_dataset(config, root)
    partitions = manifest.num_partitions
    trials = _family_trials(config)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    prefix = f"profiles/{config.name}-{stamp}"
    workers = min(config.workers, partitions)
    backend = backend_factory(config.replace(workers=workers))
    measured: dict[str, Any] = {}
    try:
        backend.start(WorkerJob(dataset_uri, root, config.torch_threads))
        backend.wait_started()  # the pilot measures on every worker
        pilot = _Pilot(backend, root, prefix, partitions)
        families: dict[str, dict[str, float]] = {}
        units: list[UnitResult] = []
        validations: list[float] = []
        for family, (spec, params) in trials.items():
            trained, validated = pilot.train(family, spec, params, epochs)
            units += trained
            validations += validated
            computed = [_compute(r) for r in trained]
            families[family] = {
                "unit_seconds": statistics.median(computed),
                "unit_seconds_spread": _spread(computed),
                "validation_seconds": statistics.median(validated),
                "validation_seconds_spread": _spread(validated),
                "hop_seconds": statistics.median(r.io_seconds for r in trained),
                "hop_seconds_spread": _spread([r.io_seconds for r in trained]),
            }
        unit = statistics.median(_compute(r) for r in units)
        first, (spec, params) = next(iter(trials.items()))
        first_unit = families[first]["unit_seconds"]  # groups train the first family
        measured_groups = pilot.groups(spec, params, [g for g in groups if g > 1])
        measured_packs = pilot.packs(spec, params, pack_sizes(config))
        start = _worker_start(backend, partitions, workers, root, dataset_uri)
        partition_load = start.pop("load")
        model = _group_model(
            root, pilot, spec, params, first_unit, manifest, bandwidth, measured_groups
        )
    finally:
        backend.close()
        for key in root.list(prefix):
            root.delete(key)
    scaling = {1: 1.0, **{g: _speedup(g, first_unit, t) for g, t in measured_groups.items()}}
    for g in groups:
        if g > 1 and g not in scaling and model is not None:
            scaling[g] = round(model.speedup(g), 6)
    measured.update(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        host=socket.gethostname(),
        config=config.name,
        backend=config.backend,
        workers=workers,
        units=len(units),
        groups_measured=sorted(measured_groups),
        packs_measured=sorted(measured_packs),
        load=load,
        **start,
    )
    spreads = {
        "unit_seconds_spread": {instance_type: _spread([_compute(r) for r in units])},
        "validation_seconds_spread": {instance_type: _spread(validations)},
        "hop_seconds_spread": _spread([r.io_seconds for r in units]),
    }
    extra: dict[str, Any] = {"families": families, "measured": measured}
    if model is not None:
        extra["group"] = {
            "step_seconds": model.step_seconds,
            "param_bytes": model.param_bytes,
            "bandwidth": model.bandwidth,
            "model": "Cynthia eqs. 3-5, ring all-reduce, no overlap",
        }
    return Profile(
        partitions=partitions,
        unit_seconds={instance_type: unit},
        validation_seconds={instance_type: statistics.median(validations)},
        hop_seconds=statistics.median(r.io_seconds for r in units),
        worker_start_seconds=start["worker_start_seconds"],
        scale_seconds=scale_seconds,
        scale_seconds_each=scale_seconds_each,
        driver_start_seconds=driver_start_seconds,
        scaling=Scaling(table=tuple(sorted(scaling.items()))),
        partition_load_seconds=partition_load,
        partition_bytes=sum(p.bytes for p in manifest.partitions) / partitions,
        packing=_packing(first_unit, measured_packs),
        spreads=spreads,
        extra=extra,
    )


def _speedup(group: int, unit: float, group_unit: float, noun: str = "group") -> float:
    """A group's (or pack's) measured speedup, ``g * unit / group unit``, at most ``g``.

    A profile refuses a superlinear speedup (:mod:`._profile`): a pilot's few units can
    measure one by noise or a warm cache; it is written as ``g``, with a warning.
    """
    speedup = group * unit / group_unit
    if speedup > group:
        logger.warning(
            "a %s of %d measured a speedup of %.3f, more than %d: written as %d",
            noun,
            group,
            speedup,
            group,
            group,
        )
        speedup = float(group)
    return round(speedup, 6)


def pack_sizes(config: ExperimentConfig) -> list[int]:
    """The pack sizes the pilot measures: ``2, 4, ...`` up to the config's ``pack``.

    ``auto``: up to :data:`~cerebro_spark.driver._pack_choice.MAX_PACK` of the config's
    device; none when packing is off.
    """
    most = pack_size(config)
    if most is None:
        most = MAX_PACK["cuda" if config.device.startswith("cuda") else "cpu"]
    sizes = [2**i for i in range(1, most.bit_length()) if 2**i < most]
    return [*sizes, most] if most > 1 else []


def _packing(unit: float, measured: dict[int, float]) -> Scaling | None:
    """The profile's ``packing`` from each size's pass seconds (``None``: none measured)."""
    if not measured:
        return None
    table = {k: _speedup(k, unit, seconds, "pack") for k, seconds in measured.items()}
    return Scaling(table=((1, 1.0), *sorted(table.items())))


def _compute(result: UnitResult) -> float:
    return max(0.0, result.seconds - result.io_seconds)


def _spread(values: list[float]) -> float:
    return statistics.pstdev(values) if len(values) > 1 else 0.0


def _family_trials(config: ExperimentConfig) -> dict[str, tuple[str, dict[str, Any]]]:
    """One trial's spec and params per model family of the space."""
    space = SearchSpace.from_config(config.space)
    rng = np.random.default_rng(config.seed)
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for _ in range(_MAX_DRAWS):
        params = dict(space.sample(rng))
        spec = params.pop("model", config.model)
        if not isinstance(spec, str):
            raise ConfigError("profile needs a model spec: set 'model' or a 'model' param")
        found.setdefault(spec.rsplit(":", 1)[-1], (spec, params))
    return found


class _Pilot:
    """Runs the pilot's units on a started backend."""

    def __init__(self, backend: Backend, store: Store, prefix: str, partitions: int) -> None:
        self.backend = backend
        self.store = store
        self.prefix = prefix
        self.partitions = partitions
        self.checkpoints: dict[str, str] = {}

    def _holder(self, partition: int, exclude: set[str] | None = None) -> str:
        for worker, info in self.backend.workers().items():
            if partition in info.partitions and worker not in (exclude or set()):
                return worker
        raise ConfigError(f"no worker holds partition {partition}")

    def _task(self, kind: UnitKind, family: str, spec: str, params: dict[str, Any],
              epoch: int, partition: int, step: int, out: str | None) -> UnitTask:  # fmt: skip
        return UnitTask(
            kind=kind,
            trial_id=f"pilot-{family}",
            spec=spec,
            params=params,
            trial_seed=1,
            epoch=epoch,
            partition=partition,
            step=step,
            epoch_units=self.partitions,
            checkpoint_in=self.checkpoints.get(family),
            checkpoint_out=out,
        )

    def train(
        self, family: str, spec: str, params: dict[str, Any], epochs: int
    ) -> tuple[list[UnitResult], list[float]]:
        """Train ``epochs`` epochs.

        Returns:
            The last epoch's train results, and the validation seconds after each epoch.
        """
        kept: list[UnitResult] = []
        validations: list[float] = []
        for epoch in range(epochs):
            trained = []
            for step in range(self.partitions):
                out = f"{self.prefix}/{family}/e{epoch}-s{step}.pt"
                task = self._task(UnitKind.TRAIN, family, spec, params, epoch, step, step, out)
                trained.append(self.backend.submit(self._holder(step), task).result())
                self.checkpoints[family] = out
            seconds = 0.0
            for p in range(self.partitions):  # a worker runs one unit at a time
                task = self._task(UnitKind.VALIDATE, family, spec, params, epoch, p, 0, None)
                seconds += self.backend.submit(self._holder(p), task).result().seconds
            validations.append(seconds)
            kept = trained
        return kept, validations

    def packs(self, spec: str, params: dict[str, Any], sizes: list[int]) -> dict[int, float]:
        """Median compute seconds of a pack's pass per size (two runs each)."""
        family = next(iter(self.checkpoints))
        worker = self._holder(0)
        measured: dict[int, float] = {}
        for k in sizes:
            runs = []
            for attempt in range(2):
                tasks = [
                    dataclasses.replace(
                        self._task(UnitKind.TRAIN, family, spec, params, 0, 0, 0, None),
                        trial_id=f"pilot-pack{k}-{i}",
                        trial_seed=1 + i,
                        checkpoint_out=f"{self.prefix}/pack{k}-{attempt}-{i}.pt",
                    )
                    for i in range(k)
                ]
                try:
                    results = [f.result() for f in self.backend.submit_pack(worker, tasks)]
                except (CerebroError, NotImplementedError) as error:
                    logger.warning("a pack of %d could not be measured: %s", k, error)
                    return measured
                runs.append(sum(_compute(r) for r in results))
            measured[k] = statistics.median(runs)
        return measured

    def groups(self, spec: str, params: dict[str, Any], sizes: list[int]) -> dict[int, float]:
        """Median group-unit compute seconds per measurable size (two runs each)."""
        family = next(iter(self.checkpoints))
        workers = self.backend.workers()
        measured: dict[int, float] = {}
        for g in sizes:
            if g > len(workers) or g > self.partitions:
                logger.info("group of %d not measurable on %d workers", g, len(workers))
                continue
            cores = os.cpu_count() or 1
            if g > cores:
                logger.warning(
                    "measuring a group of %d on a machine with %d cores: its ranks share "
                    "the cores, so its speedup is this machine's, not a cluster's",
                    g,
                    cores,
                )
            runs = []
            for attempt in range(2):
                chosen: dict[str, int] = {}
                for p in range(self.partitions):
                    holders = [w for w, i in workers.items() if p in i.partitions]
                    free = [w for w in holders if w not in chosen]
                    if free and len(chosen) < g:
                        chosen[free[0]] = p
                if len(chosen) < g:
                    break
                out = f"{self.prefix}/group{g}-{attempt}.pt"
                base = self._task(UnitKind.TRAIN, family, spec, params, 0, 0, 0, out)
                tasks = group_tasks(base, list(chosen.values()), f"pilot-g{g}-{attempt}")
                futures = self.backend.submit_group(dict(zip(chosen, tasks, strict=True)))
                results = [f.result() for f in futures.values()]
                runs.append(max(_compute(r) for r in results))
            if runs:
                measured[g] = statistics.median(runs)
        return measured


def _worker_start(
    backend: Backend, partitions: int, workers: int, store: Store, dataset_uri: str
) -> dict[str, float]:
    """Worker start (without its loads) and one partition's load, in seconds."""
    loads = []
    for index in range(partitions):
        begun = time.perf_counter()
        for split in ("train", "validation"):
            read_partition(dataset_uri, split, index)
        loads.append(time.perf_counter() - begun)
    load = statistics.median(loads)
    stats = getattr(backend, "stats", None)
    ready = list(stats().ready_seconds.values()) if stats is not None else []
    share = math.ceil(partitions / workers)
    start = max(0.0, statistics.median(ready) - share * load) if ready else 0.0
    return {"worker_start_seconds": start, "load": load}


def _group_model(
    store: Store,
    pilot: _Pilot,
    spec: str,
    params: dict[str, Any],
    unit: float,
    manifest: Any,
    bandwidth: float,
    measured: dict[int, float],
) -> GroupModel | None:
    """Cynthia's model from the baseline step time and the model's parameter bytes."""
    family = next(iter(pilot.checkpoints))
    state = decode_checkpoint(store.get(pilot.checkpoints[family]))["model"]
    param_bytes = float(sum(t.numel() * t.element_size() for t in state.values()))
    rows = manifest.rows("train") / pilot.partitions
    steps = max(1, math.ceil(rows / load_spec(spec).batch_size(params)))
    model = GroupModel(step_seconds=unit / steps, param_bytes=param_bytes, bandwidth=bandwidth)
    for g, seconds in sorted(measured.items()):
        try:  # a group unit covers g partitions: g * steps steps
            fitted = bandwidth_from(model, g, seconds / (g * steps))
        except ConfigError:
            continue
        return GroupModel(model.step_seconds, model.param_bytes, fitted)
    return model
