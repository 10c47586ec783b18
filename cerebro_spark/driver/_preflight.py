"""Pre-flight: what the driver checks before any worker starts.

A wrong import path, a ``build_model`` that raises or a metric no spec produces would
otherwise surface only after the workers started and loaded their partitions (minutes on
a cluster). Before any of that, :func:`preflight`:

1. resolves the dataset (preparing it if the config names a ``source``);
2. finds every model family of the search space (each ``model`` value a branch or a
   choice can take, and the config's ``model``) and draws one trial's params for each
   from the space (seeded by the experiment seed, on a stream of its own);
3. per family, imports the spec, builds its model, optimizer and LR scheduler with those
   params on the CPU (torch seeded, the driver's RNG state restored), runs its
   ``transform``, forward pass, loss and metrics on a batch of two all-zero rows of the
   dataset's feature shape, and collects its metrics (:func:`family_metrics`);
4. resolves the objective: the config's ``metric`` (default: ``accuracy`` for
   classification, ``rmse`` for regression), which every family must produce, and its
   ``mode`` (default: the metric's own; an explicit mode against it is allowed but logged
   as a warning);
5. with ``pack: auto``, measures how many trials to pack (:func:`choose_pack`; the
   resolved config holds the size);
6. refuses a ``deadline`` in which no trial can be trained (:func:`check_deadline`):
   shorter than start-up plus one training unit.

Failures raise :class:`~cerebro_spark.errors.ConfigError` (import path, params,
metric) or :class:`~cerebro_spark.errors.TrialError` (user code raised), naming the spec
and the params.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from cerebro_spark.data import DatasetInfo, Manifest
from cerebro_spark.data._residence import format_bytes
from cerebro_spark.driver._config import ExperimentConfig, pack_size
from cerebro_spark.driver._dataset import resolve_dataset
from cerebro_spark.driver._device import check_device
from cerebro_spark.driver._pack_choice import PackChoice, choose_pack
from cerebro_spark.driver._procedure import build_procedure
from cerebro_spark.elastic import Profile, load_profile
from cerebro_spark.errors import CerebroError, ConfigError, TrialError
from cerebro_spark.metrics import default_metric, did_you_mean
from cerebro_spark.search.space import SearchSpace
from cerebro_spark.store import Store
from cerebro_spark.training import accepted_hyperparameters, load_spec
from cerebro_spark.training._batches import example_features
from cerebro_spark.training._metrics import family_metrics, overrides_batch_metrics
from cerebro_spark.training._pack import check_packable_columns
from cerebro_spark.training._pack_structure import check_packable_model
from cerebro_spark.training._spec import checked_batch_size

logger = logging.getLogger(__name__)

_PREFLIGHT_STREAM = 3
"""Stream of the experiment seed the pre-flight draws params from (see _experiment)."""
_DRAWS = 512
"""Params drawn from the space at most while looking for every family."""


@dataclasses.dataclass(frozen=True)
class Preflight:
    """What the pre-flight found.

    Attributes:
        config: The config with ``metric`` and ``mode`` resolved.
        dataset_uri: Where the workers read the dataset.
        manifest: The dataset's manifest.
        families: Per spec import path, the metrics its trials report, by name
            (``"loss"`` included): the driver merges validation states with them.
        params: Per spec import path, the params its model was built with.
        pack_size: The most trials in one packed unit (1: ``pack`` off; ``auto``
            measured, :mod:`~cerebro_spark.driver._pack_choice`).
        pack_choice: What ``pack: auto`` measured (``None``: the config gave the size).
    """

    config: ExperimentConfig
    dataset_uri: str
    manifest: Manifest
    families: Mapping[str, Mapping[str, Any]]
    params: Mapping[str, Mapping[str, Any]]
    pack_size: int = 1
    pack_choice: PackChoice | None = None


def preflight(config: ExperimentConfig, store: Store, *, started: float | None = None) -> Preflight:
    """Check the experiment on the driver before any worker starts (module docstring).

    Args:
        config: The experiment (``metric`` and ``mode`` may be ``None``).
        store: The root store (where a ``source`` is prepared).
        started: ``time.monotonic()`` when ``run`` was called: the deadline counts from
            there (:func:`check_deadline`). ``None`` (a ``resume``, whose experiment time
            goes on from earlier sessions): the deadline is not checked here.

    Returns:
        The resolved config, the dataset and every family's metrics.

    Raises:
        ConfigError: A spec cannot be imported or rejects its params, the space gives a
            trial no spec, or the metric is not produced by every family.
        TrialError: A spec's model, loss or metrics raised on the zero batch.
    """
    check_search(config)
    dataset_uri, manifest = resolve_dataset(config, store)
    packed = (pack_size(config) or 1) > 1  # auto measures whether the columns and models pack
    if packed:
        check_packable_columns(manifest.features)
    info = manifest.info
    params = family_params(config)
    families = {spec: _check_family(spec, p, info, packed) for spec, p in params.items()}
    check_worker_memory(config, manifest, params)
    resolved = resolve_objective(config, info, families)
    packing, choice = pack_size(config), None
    if packing is None:  # auto; config.json keeps the measured size: a resume packs the same
        choice = choose_pack(config, dataset_uri, manifest, params)
        packing = choice.pack_size
        resolved = dataclasses.replace(resolved, pack=packing)
    if started is not None:
        check_deadline(config, time.monotonic() - started)
    logger.info(
        "pre-flight: %d model famil%s built on the driver; optimising %s (%s)",
        len(families),
        "y" if len(families) == 1 else "ies",
        resolved.metric,
        resolved.mode,
    )
    return Preflight(resolved, dataset_uri, manifest, families, params, packing, choice)


def check_search(config: ExperimentConfig) -> None:
    """Check the device, the search space, every spec's hyperparameters and the procedure.

    Cheap, and before the dataset is resolved (a ``source`` may take minutes to
    prepare): a local run's ``device`` is one this machine has, the space parses, every
    param the space gives a spec is one the spec declares (:func:`check_hyperparameters`),
    and the procedure builds with its options.

    Raises:
        ConfigError: Naming the param, option or value and the rule.
    """
    _check_local_source(config)
    check_device(config)
    SearchSpace.from_config(config.space)
    check_hyperparameters(config)
    try:
        build_procedure(config, lambda: 0.0)
    except (TypeError, ValueError) as error:  # ConfigError included
        if isinstance(error, ConfigError) and "search procedure" in str(error):
            raise
        raise ConfigError(
            f"search procedure {config.procedure!r} rejects its options "
            f"{dict(config.procedure_options)!r}: {error}"
        ) from error


def _check_local_source(config: ExperimentConfig) -> None:
    """Refuse a ``data.source`` naming a local file or folder that does not exist."""
    source = config.data.source
    if source is None or source.startswith("sklearn:"):
        return
    if "://" in source:
        parts = urllib.parse.urlsplit(source)
        if parts.scheme != "file":
            return  # an object store: read (and reported) when the data is prepared
        source = urllib.parse.unquote(parts.path)
    if not os.path.exists(source):
        raise ConfigError(
            f"data.source {config.data.source!r} does not exist (no file or folder at "
            f"{os.path.abspath(source)})"
        )


def check_hyperparameters(config: ExperimentConfig) -> None:
    """Refuse a param the space gives a spec that does not declare it.

    Each branch of the space (the whole space, or each option of a top-level choice or
    grid of sub-spaces) gives its top-level keys to the specs its ``model`` names (the
    config's ``model`` when it names none). A spec whose
    :attr:`~cerebro_spark.training.ModelSpec.hyperparameters` is ``None`` is not checked.

    Raises:
        ConfigError: ``space.<param>: model spec '<path>' has no hyperparameter ...``
            with the closest declared name (:func:`difflib.get_close_matches`) and the
            declared ones.
    """
    for branch in _branches(config.space):
        names = [str(k) for k in branch if k != "model"]
        specs = _strings(branch["model"]) if "model" in branch else []
        if not specs and config.model is not None:
            specs = [config.model]
        for spec_path in specs:
            try:
                accepted = accepted_hyperparameters(load_spec(spec_path))
            except TypeError as error:
                raise ConfigError(f"model spec {spec_path!r}: {error}") from None
            if accepted is None:
                logger.debug("model spec %s declares no hyperparameters: not checked", spec_path)
                continue
            for name in names:
                if name in accepted:
                    continue
                raise ConfigError(
                    f"space.{name}: model spec {spec_path!r} has no hyperparameter "
                    f"{name!r}{did_you_mean(name, accepted)}; it accepts: "
                    f"{', '.join(sorted(accepted))} (a spec that reads another param "
                    "declares it in its hyperparameters)"
                )


def _branches(space: Any) -> list[Mapping[str, Any]]:
    """The sub-spaces a trial's top-level params come from (see :func:`models_in`)."""
    if not isinstance(space, Mapping):
        return []
    for kind in ("choice", "grid"):
        options = space.get(kind)
        if len(space) == 1 and isinstance(options, list) and options:
            if all(isinstance(option, Mapping) for option in options):
                return [branch for option in options for branch in _branches(option)]
            return []  # the whole space is one distribution of constants
    return [space]


def family_params(config: ExperimentConfig) -> dict[str, dict[str, Any]]:
    """Return one params draw per model family of the space, by spec import path.

    Raises:
        ConfigError: A draw has no spec (no ``model`` param and no config ``model``).
    """
    space = SearchSpace.from_config(config.space)
    wanted = set(models_in(config.space))
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, _PREFLIGHT_STREAM]))
    found: dict[str, dict[str, Any]] = {}
    for _ in range(_DRAWS):
        params = space.sample(rng)
        spec = params.get("model", config.model)
        if not isinstance(spec, str):
            raise ConfigError(
                f"a trial of this space has no model spec: set 'model' in the config or a "
                f"'model' param in the space (import path 'package.module:Class'); params "
                f"{params!r}"
            )
        found.setdefault(spec, params)
        if wanted <= found.keys():
            break
    missing = sorted(wanted - found.keys())
    if missing:
        logger.warning("pre-flight drew no params for model families %s; not checked", missing)
    return found


def models_in(space: Any) -> list[str]:
    """Return every spec a trial of a space (in config form) can get as its ``model``.

    The ``model`` param is read at the top level of the sampled params: a constant, a
    choice or grid of strings, or the ``model`` of each branch of a top-level choice (or
    grid) of sub-spaces. A ``model`` key inside another param's sub-space is not a spec.
    """
    out: list[str] = []
    if isinstance(space, Mapping):
        if "model" in space:
            out += _strings(space["model"])
        for kind in ("choice", "grid"):
            options = space.get(kind)
            if isinstance(options, list):
                for option in options:
                    out += models_in(option)
    return list(dict.fromkeys(out))


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        options = value.get("choice", value.get("grid"))
        if isinstance(options, list):
            return [v for v in options if isinstance(v, str)]
    return []


def _check_family(
    spec_path: str, params: Mapping[str, Any], info: DatasetInfo, packed: bool
) -> dict[str, Any]:
    """Import, build and run one family on a zero batch; return its metrics by name.

    ``packed``: the run packs trials, so the family's model must be one a pack can step.
    """
    spec = load_spec(spec_path)  # ConfigError names the path
    trial_params = {k: v for k, v in params.items() if k != "model"}
    what = "build_model"

    def failed(error: Exception) -> CerebroError:
        text = (
            f"model spec {spec_path!r} failed the pre-flight on the driver: {what} raised "
            f"{type(error).__name__}: {error} (trial params {trial_params!r})"
        )
        return ConfigError(text) if isinstance(error, ConfigError) else TrialError(text)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(np.random.SeedSequence(0).generate_state(1)[0]))
        try:
            model = spec.build_model(trial_params, info)
            if not isinstance(model, torch.nn.Module):
                raise TypeError(f"build_model must return a torch.nn.Module, got {model!r}")
            if packed:
                what = "the pack check"
                check_packable_model(model)
            what = "build_optimizer"
            optimizer = spec.build_optimizer(model, trial_params)
            what = "build_lr_scheduler"
            spec.build_lr_scheduler(optimizer, trial_params)
            what = "batch_size"
            checked_batch_size(spec, trial_params)
            what = "validation_batch_size"
            checked_batch_size(spec, trial_params, validation=True)
            what = "augmentation"
            spec.augmentation(trial_params, info)
            what = "build_metrics"
            metrics = family_metrics(spec, info)
            what = "the forward pass on a zero batch"
            features = example_features(info)
            dtype = torch.int64 if info.task == "classification" else torch.float32
            labels = torch.zeros(2, dtype=dtype)
            model.eval()
            with torch.no_grad():
                features, labels = spec.transform(features, labels)
                outputs = model(features)
                what = "loss"
                spec.loss(outputs, labels, info)
                what = "metrics"
                batch_names: list[str] = []
                if overrides_batch_metrics(spec):
                    batch_names = list(spec.metrics(outputs, labels, info))
                    metrics = family_metrics(spec, info, batch_names)
                    logger.warning(
                        "model spec %r overrides the deprecated per-batch ModelSpec.metrics "
                        "(%s): those values are row-weighted means of batch values, exact "
                        "only for per-row means; return Metric objects from build_metrics",
                        spec_path,
                        ", ".join(batch_names),
                    )
                for name, metric in metrics.items():
                    if name != "loss" and name not in batch_names:
                        metric.update(metric.init(torch.device("cpu")), outputs, labels)
        except Exception as error:
            raise failed(error) from error
    return metrics


def check_worker_memory(
    config: ExperimentConfig, manifest: Manifest, params: Mapping[str, Mapping[str, Any]]
) -> None:
    """Refuse a ``worker_memory`` that cannot hold one batch (issue 25, part 2).

    One batch is estimated from the manifest: the largest training or validation batch
    size of any family (its drawn params, and every value of a top-level ``batch_size``
    choice or grid) times the largest bytes per row of any partition (a partition file's
    bytes / its rows: about what a row takes as stored).

    Raises:
        ConfigError: ``worker_memory`` is below that, naming the value and the rule.
    """
    budget = config.worker_memory
    if budget is None:
        return
    per_row = max(
        (-(-part.bytes // part.rows) for part in manifest.partitions if part.rows), default=0
    )
    options = _ints(config.space.get("batch_size")) if isinstance(config.space, Mapping) else []
    batch = 0
    for spec_path, drawn in params.items():
        spec = load_spec(spec_path)
        for value in [None, *options]:
            trial = {k: v for k, v in drawn.items() if k != "model"}
            if value is not None:
                trial["batch_size"] = value
            batch = max(batch, spec.batch_size(trial), spec.validation_batch_size(trial))
    needed = batch * per_row
    if budget < needed:
        raise ConfigError(
            f"worker_memory {budget} bytes ({format_bytes(budget)}) is smaller than one batch "
            f"of dataset {manifest.dataset_id}: {batch} rows x {per_row} bytes a row (the "
            f"largest partition's bytes / rows) = {needed} bytes ({format_bytes(needed)}); "
            "worker_memory must hold at least one batch"
        )


def _ints(value: Any) -> list[int]:
    """The int options of a space entry: a constant, or a choice or grid of values."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, Mapping):
        options = value.get("choice", value.get("grid"))
        if isinstance(options, list):
            return [v for v in options if isinstance(v, int) and not isinstance(v, bool)]
    return []


def resolve_objective(
    config: ExperimentConfig, info: DatasetInfo, families: Mapping[str, Mapping[str, Any]]
) -> ExperimentConfig:
    """Return ``config`` with ``metric`` and ``mode`` set (see the module docstring).

    Raises:
        ConfigError: The metric is not produced by every family (the message names the
            metric, the spec and what it produces).
    """
    metric = config.metric if config.metric is not None else default_metric(info.task)
    modes: dict[str, str] = {}
    for spec, metrics in sorted(families.items()):
        if metric not in metrics:
            raise ConfigError(
                f"metric {metric!r} is not produced by model spec {spec!r}"
                f"{did_you_mean(metric, metrics)}; it produces {sorted(metrics)} (set "
                "'metric' to one of them, or add it to the spec's build_metrics)"
            )
        modes[spec] = metrics[metric].mode
    natural = next(iter(modes.values()), None)
    if len(set(modes.values())) > 1:
        raise ConfigError(
            f"metric {metric!r} has different modes in different model specs: {modes}"
        )
    mode = config.mode if config.mode is not None else natural or "max"
    if config.mode is not None and natural is not None and config.mode != natural:
        logger.warning(
            "mode %r for metric %r, whose natural mode is %r: the search will prefer %s values",
            config.mode,
            metric,
            natural,
            "larger" if config.mode == "max" else "smaller",
        )
    return config.replace(metric=metric, mode=mode)


def check_deadline(config: ExperimentConfig, elapsed: float) -> None:
    """Refuse a deadline shorter than start-up plus one training unit (issue 30, part 4).

    A deadline counts from ``run``, start-up included (:mod:`cerebro_spark.search._clock`):
    no trial can complete an epoch, so the search could only fail, when the deadline ends
    before the first worker can have trained one unit. What is known at the pre-flight:

    * ``elapsed``: the experiment time the pre-flight itself took (dataset resolved, every
      family built on the driver), measured. A deadline already passed is refused with
      any config.
    * With an elastic section whose ``profile`` is a file: the start-up and unit times the
      planner uses (:mod:`cerebro_spark.elastic._simulator`): SCALE (``scale_seconds``),
      INIT_INSTANCE (``worker_start_seconds`` plus one ``partition_load_seconds``: the
      least a worker loads, on the most workers), then one unit (``unit_seconds`` of the
      config's ``instance_type``, else of the profile's fastest type, plus
      ``hop_seconds``). Each is the most optimistic reading of the profile, so what is
      refused is what the planner could not plan either.

    Without a profile (a fixed cluster, or ``profile: auto``, whose pilot runs after the
    pre-flight) no estimate of a worker's start or a unit exists: only a deadline that
    has already passed is refused, since that one is certainly impossible. A deadline that
    passes later, while the workers start, ends the search with no trial, which the
    driver reports as :class:`~cerebro_spark.errors.SearchFailedError`.

    Args:
        config: The experiment.
        elapsed: Experiment seconds since ``run``, now (the pre-flight's end).

    Raises:
        ConfigError: Naming the deadline, the seconds it must cover and where each comes
            from.
    """
    deadline = config.deadline
    if deadline is None:
        return
    rule = (
        "a deadline counts from run, start-up included, and must leave time for start-up "
        "plus at least one training unit"
    )
    if elapsed >= deadline:
        raise ConfigError(
            f"deadline {deadline:g} s has passed before any worker started: the pre-flight "
            f"(dataset resolved, every model family built on the driver) took {elapsed:.1f} "
            f"s of it, and no trial can be trained in what is left ({rule})"
        )
    needed = _profile_needs(config)
    if needed is None:
        return
    seconds, parts = needed
    if elapsed + seconds > deadline:
        raise ConfigError(
            f"deadline {deadline:g} s is shorter than start-up plus one training unit: "
            f"{elapsed:.1f} s of pre-flight + {parts} = {elapsed + seconds:.1f} s ({rule})"
        )


def _profile_needs(config: ExperimentConfig) -> tuple[float, str] | None:
    """Seconds from the pre-flight's end to one unit trained, by the elastic profile.

    Returns:
        The seconds and how they add up (naming the profile and each of its keys), or
        ``None`` without a profile file.
    """
    elastic = config.elastic
    if elastic is None or elastic.profile == "auto":
        return None
    profile: Profile = load_profile(elastic.profile)
    units = dict(profile.unit_seconds)
    if elastic.instance_type in units:
        kind = elastic.instance_type
    else:
        kind = min(units, key=lambda name: units[name])  # the fastest: the least needed
    start = profile.scale_seconds + profile.worker_start_seconds
    start += profile.partition_load_seconds
    unit = units[kind] + profile.hop_seconds
    parts = (
        f"{start:.1f} s to start a worker (profile {elastic.profile}: scale_seconds "
        f"{profile.scale_seconds:g} + worker_start_seconds {profile.worker_start_seconds:g} "
        f"+ one partition_load_seconds {profile.partition_load_seconds:g}) + {unit:.1f} s for "
        f"one unit (unit_seconds {units[kind]:g} on {kind} + hop_seconds "
        f"{profile.hop_seconds:g})"
    )
    return start + unit, parts
