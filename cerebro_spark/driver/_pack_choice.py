"""``pack: auto``: the pre-flight measures how many trials to train together (issue 27).

For every model family of the space whose trials can pack, the driver trains packs of
``k = 1, 2, 4, ...`` fresh copies of the family's pre-flight trial on a few batches of the
dataset's first train partition (:func:`~cerebro_spark.training.pack_throughput`; twice,
each size's best kept) and
takes the smallest ``k`` within 5 % of the best estimated epoch time
(:func:`~cerebro_spark.training.choose_pack_size`): the family's trials that the search
starts at once (its procedure's first ``suggest``) are cut into packs of ``k``, and a
size that leaves workers idle (fewer packs than ``workers``) is charged for it. The run
packs at most the smallest of the families' choices (one pack size per run; a family
measured to gain nothing from packing keeps the others from packing past its best), and
1 (off) when no family can pack.

The curve is measured on the driver, on the device the workers train on when the driver
has it (``device: auto`` or ``cuda`` with a GPU here), else on its CPU, with a warning:
executors' GPUs usually pack more than a CPU, and ``pack: N`` says how many. The resolved
config (``config.json``) holds the chosen ``k``, so that a resumed run packs as the run
it continues did; two fresh runs of one config may choose differently (the choice is a
measurement), which is why ``pack: N`` is the setting for runs that must repeat exactly.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import torch

from cerebro_spark.data import Manifest
from cerebro_spark.data._reader import read_partition
from cerebro_spark.driver._config import ExperimentConfig
from cerebro_spark.driver._procedure import build_procedure
from cerebro_spark.errors import ConfigError
from cerebro_spark.training import choose_pack_size, pack_throughput
from cerebro_spark.units import UnitKind, UnitTask

logger = logging.getLogger(__name__)

MAX_PACK = {"cpu": 16, "cuda": 64}
"""The largest pack measured, by device type (a GPU's curve also stops where memory ends)."""

PROBE_BATCHES = 8
"""Batches each pack size trains while it is timed."""

PROBE_PASSES = 2
"""Times the curve is measured; each size keeps its best (a busy machine only slows one
down, and the first sizes of the first pass pay for warming up allocators and threads)."""


@dataclasses.dataclass(frozen=True)
class PackChoice:
    """What ``pack: auto`` measured.

    Attributes:
        pack_size: The most trials in one packed unit (1: none of the families gains).
        device: The device the curves were measured on.
        curves: Per spec import path, trial rows trained per second by pack size; a
            family that cannot pack is absent.
    """

    pack_size: int
    device: str
    curves: Mapping[str, Mapping[int, float]]


def choose_pack(
    config: ExperimentConfig,
    dataset_uri: str,
    manifest: Manifest,
    params: Mapping[str, Mapping[str, Any]],
    trials: Mapping[str, int] | None = None,
) -> PackChoice:
    """Measure each family's throughput curve and choose the run's pack size.

    Args:
        config: The experiment (its ``device`` and ``seed``).
        dataset_uri: The dataset (its train partition 0 is read).
        manifest: The dataset's manifest.
        params: Per spec import path, the params its pre-flight trial was built with.
        trials: Per spec import path, how many of its trials the search starts at once
            (:func:`first_trials`); ``None``: :func:`first_trials` of ``config``.

    Returns:
        The choice and the curves it was made from.

    Raises:
        TrialError: A family's model, loss or optimizer raised while it trained.
    """
    device = _probe_device(config.device)
    counts = first_trials(config) if trials is None else trials
    data = read_partition(dataset_uri, "train", 0, manifest=manifest)
    curves: dict[str, dict[int, float]] = {}
    choices: list[int] = []
    for spec_path, family_params in sorted(params.items()):
        task = UnitTask(
            kind=UnitKind.TRAIN,
            trial_id=f"pack-probe:{spec_path}",
            spec=spec_path,
            params={k: v for k, v in family_params.items() if k != "model"},
            trial_seed=config.seed,
            epoch=0,
            partition=0,
            checkpoint_out="pack-probe",
        )
        try:
            measured = [
                pack_throughput(
                    task,
                    data,
                    manifest.info,
                    max_k=MAX_PACK[torch.device(device).type],
                    batches=PROBE_BATCHES,
                    device=device,
                )
                for _ in range(PROBE_PASSES)
            ]
        except ConfigError as error:  # the family's models cannot be stacked
            logger.info("pack: auto: model family %s does not pack (%s)", spec_path, error)
            continue
        curve = {k: max(m.get(k, 0.0) for m in measured) for k in measured[0]}
        curves[spec_path] = curve
        started = counts.get(spec_path)
        choices.append(choose_pack_size(curve, trials=started, workers=config.workers))
        logger.info(
            "pack: auto: model family %s trains %s trial rows/s on %s; with %s trials at "
            "once on %d workers it would pack %d",
            spec_path,
            ", ".join(f"{rate:.0f} (k={k})" for k, rate in sorted(curve.items())),
            device,
            "its" if started is None else started,
            config.workers,
            choices[-1],
        )
    size = min(choices, default=1)
    logger.info("pack: auto chose packs of at most %d trial%s", size, "" if size == 1 else "s")
    return PackChoice(size, device, curves)


def first_trials(config: ExperimentConfig) -> dict[str, int]:
    """Per spec import path, the trials the search starts at once (its first ``suggest``).

    The procedure is built as ``run`` builds it (its own generator, from the seed), and
    asked once; its trials are counted by their ``model`` param (else the config's).
    """
    counts: dict[str, int] = {}
    for trial in build_procedure(config, lambda: 0.0).suggest():
        spec = trial.params.get("model", config.model)
        if isinstance(spec, str):
            counts[spec] = counts.get(spec, 0) + 1
    return counts


def _probe_device(device: str) -> str:
    """Where to measure: the workers' device when the driver has it, else its CPU."""
    if device == "cpu":
        return "cpu"
    if torch.cuda.is_available():
        return "cuda" if device == "auto" else device
    if device != "auto":
        logger.warning(
            "pack: auto measures on the driver, which has no GPU: the curve is the CPU's "
            "and may choose fewer trials than device %r packs; give pack: N to choose",
            device,
        )
    return "cpu"
