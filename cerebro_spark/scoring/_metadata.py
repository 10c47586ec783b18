"""What a checkpoint says about its model and data: :class:`ModelMetadata`."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from cerebro_spark.data import ColumnInfo, DatasetInfo, FeatureStatistics, Manifest, tensor_input
from cerebro_spark.data._format import Task
from cerebro_spark.store import Store
from cerebro_spark.training import Checkpoint, CheckpointError, dataset_metadata

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ModelMetadata:
    """Everything scoring needs besides the weights, read from a checkpoint.

    Attributes:
        spec: The model spec's import path (``"package.module:Class"``).
        params: The trial's params (what ``build_model`` was called with).
        trial_id: The trial the weights belong to.
        epoch: The epoch the weights were trained through, counted from 1 as the
            leaderboard and the report count it (the checkpoint's ``counters.epoch``, the
            0-based index of the unit's epoch, plus 1).
        dataset_id: The dataset the model was trained on.
        task: ``"classification"`` or ``"regression"``.
        classes: Classification: the original label values, in class-index order.
        features: The feature columns the model reads, in order, with their shapes.
        feature_shape: The shape of one example's feature tensor.
        label: The label column's name (what ``prediction`` stands for).
        statistics: The dataset's per-feature statistics (also inside the weights when the
            spec standardizes with them).
    """

    spec: str
    params: Mapping[str, Any]
    trial_id: str | None
    epoch: int
    dataset_id: str | None
    task: Task
    classes: tuple[Any, ...] | None
    features: tuple[ColumnInfo, ...]
    feature_shape: tuple[int, ...]
    label: str | None
    statistics: FeatureStatistics | None = dataclasses.field(repr=False)

    @property
    def num_classes(self) -> int | None:
        """Number of classes (classification), else ``None``."""
        return None if self.classes is None else len(self.classes)

    @property
    def info(self) -> DatasetInfo:
        """The :class:`DatasetInfo` the model was built with."""
        return DatasetInfo(
            self.feature_shape,
            self.task,
            self.num_classes,
            statistics=self.statistics,
            dataset_id=self.dataset_id,
            features=self.features,
            label=self.label,
            classes=self.classes,
        )

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, where: str) -> ModelMetadata:
        """Read the metadata of a decoded checkpoint.

        Args:
            checkpoint: The decoded checkpoint.
            where: Where it was read from (for messages).

        Raises:
            CheckpointError: The checkpoint lacks what scoring needs; the message names
                the missing entries and how to supply them.
        """
        trial = checkpoint.get("trial")
        if not isinstance(trial, Mapping) or not isinstance(trial.get("spec"), str):
            raise CheckpointError(
                f"checkpoint {where} names no model spec (its 'trial' entry is missing): "
                "it was not written by a cerebro-spark training unit"
            )
        data = checkpoint.get("data")
        if not isinstance(data, Mapping):
            raise CheckpointError(
                f"checkpoint {where} carries no dataset metadata (it was written before "
                "cerebro-spark recorded it): pass dataset=<the dataset's URI> (the "
                "experiment's events.jsonl names it in its 'dataset' event)"
            )
        missing = [
            name
            for name, ok in (
                ("features", bool(data.get("features"))),
                ("feature_shape", _has_feature_shape(data)),
                ("task", data.get("task") in ("classification", "regression")),
                (
                    "classes or num_classes",
                    data.get("task") != "classification"
                    or data.get("classes") is not None
                    or isinstance(data.get("num_classes"), int),
                ),
            )
            if not ok
        ]
        if missing:
            raise CheckpointError(
                f"checkpoint {where} lacks dataset metadata {missing} (its model was trained "
                "on a hand-built DatasetInfo?): pass dataset=<the dataset's URI>"
            )
        task: Task = data["task"]
        classes: tuple[Any, ...] | None = None
        if task == "classification":
            raw = data.get("classes")
            classes = tuple(raw) if raw is not None else tuple(range(int(data["num_classes"])))
        statistics = data.get("statistics")
        return cls(
            spec=trial["spec"],
            params=dict(trial.get("params", {})),
            trial_id=trial.get("trial_id"),
            epoch=int(checkpoint["counters"]["epoch"]) + 1,  # shown from 1
            dataset_id=data.get("dataset_id"),
            task=task,
            classes=classes,
            features=tuple(ColumnInfo.from_dict(c) for c in data["features"]),
            feature_shape=tuple(int(d) for d in data["feature_shape"]),
            label=data.get("label"),
            statistics=None if statistics is None else FeatureStatistics.from_dict(statistics),
        )


def _has_feature_shape(data: Mapping[str, Any]) -> bool:
    """Whether checkpoint metadata has the feature shape its columns need.

    ``()`` is the shape of features that reach the model as a dict by column
    (:func:`~cerebro_spark.data.tensor_input`); any other model needs a shape.
    """
    shape, columns = data.get("feature_shape"), data.get("features")
    if shape:
        return True
    if shape != [] or not columns:
        return False
    return not tensor_input([ColumnInfo.from_dict(raw) for raw in columns])


def attach_dataset(checkpoint: Checkpoint, manifest: Manifest) -> Checkpoint:
    """Return ``checkpoint`` with dataset metadata from ``manifest`` (for old checkpoints)."""
    patched: Checkpoint = dict(checkpoint)  # type: ignore[assignment]
    patched["data"] = dataset_metadata(manifest.info)
    return patched


def dataset_of_experiment(experiment: Store) -> str | None:
    """The dataset URI an experiment's event log names (its ``dataset`` event), if any."""
    from cerebro_spark.driver._events import read_events  # as in _source: the driver is heavy

    uris: Sequence[Any] = [
        event.get("uri") for event in read_events(experiment) if event.get("event") == "dataset"
    ]
    found = [uri for uri in uris if isinstance(uri, str)]
    return found[-1] if found else None
