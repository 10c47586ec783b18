"""A trained model ready to score rows: :class:`ScoringModel` and :func:`load_model`."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np
import torch
from torch import nn

from cerebro_spark.data import Manifest, read_manifest
from cerebro_spark.errors import ConfigError
from cerebro_spark.scoring._inputs import to_features
from cerebro_spark.scoring._metadata import ModelMetadata, attach_dataset, dataset_of_experiment
from cerebro_spark.scoring._source import Source, read_source
from cerebro_spark.store import Store
from cerebro_spark.training import (
    Checkpoint,
    ModelSpec,
    decode_checkpoint,
    encode_checkpoint,
    load_spec,
)

logger = logging.getLogger(__name__)

#: Rows per forward pass unless a ``batch_size`` is given.
DEFAULT_BATCH_SIZE = 1024


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None`` or ``"auto"``: the first GPU when torch sees one, else the CPU."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(
            f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}"
        ) from exc


class ScoringModel(nn.Module):
    """A trained model with what it needs to score rows: its spec, data layout and labels.

    Calling it (``forward``) runs the raw network on a feature tensor. :meth:`predict` and
    :meth:`predict_proba` take rows in any of these forms:

    * a pandas DataFrame or a pyarrow Table/RecordBatch holding the feature columns by
      name (:attr:`feature_columns`; other columns are ignored). Array features may be
      lists, numpy arrays of any shape with the right number of values, or Spark ML
      vectors (in pandas);
    * a numpy array or torch tensor of shape ``(rows, *feature_shape)`` or
      ``(rows, n_values)``, the features already concatenated in the model's order.

    The spec's ``transform`` is applied to every batch before the network, as in training
    and validation. Built by :func:`load_model`.

    Attributes:
        network: The trained ``torch.nn.Module`` (in eval mode).
        metadata: What the checkpoint says about the model and its data.
        spec: The model spec instance.
    """

    def __init__(
        self,
        network: nn.Module,
        metadata: ModelMetadata,
        spec: ModelSpec,
        device: torch.device,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> None:
        super().__init__()
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be an int >= 1, got {batch_size!r}")
        self.network = network.to(device).eval()
        self.metadata = metadata
        self.spec = spec
        self.device = device
        self.batch_size = batch_size

    @property
    def task(self) -> str:
        """``"classification"`` or ``"regression"``."""
        return self.metadata.task

    @property
    def classes(self) -> tuple[Any, ...] | None:
        """The original class labels in the order of :meth:`predict_proba`'s columns."""
        return self.metadata.classes

    @property
    def feature_columns(self) -> list[str]:
        """The feature columns the model reads, in order."""
        return [column.name for column in self.metadata.features]

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Return the network's raw outputs for a batch of features."""
        output: torch.Tensor = self.network(features)
        return output

    def features(self, data: Any) -> np.ndarray:
        """Return ``data``'s features as ``(rows, *feature_shape)`` float32, checked."""
        return np.asarray(
            to_features(data, self.metadata.features, self.metadata.feature_shape),
            dtype=np.float32,
        )

    def outputs(self, features: np.ndarray) -> np.ndarray:
        """Run the spec's transform and the network over ``features`` in batches.

        Returns:
            float64: class probabilities ``(rows, num_classes)`` (a softmax of the
            outputs) for classification, predicted values ``(rows,)`` for regression.
        """
        rows = len(features)
        width = len(self.classes) if self.classes is not None else 1
        if rows == 0:
            return np.zeros((0, width) if self.classes is not None else (0,))
        parts: list[np.ndarray] = []
        # placeholder labels for the spec's transform, typed as in training
        label_type = torch.int64 if self.classes is not None else torch.float32
        if not features.flags.writeable:  # e.g. Arrow's buffers: torch wants writable memory
            features = features.copy()
        with torch.no_grad():
            for first in range(0, rows, self.batch_size):
                x = torch.from_numpy(features[first : first + self.batch_size]).to(self.device)
                y = torch.zeros(len(x), dtype=label_type, device=self.device)
                x, _ = self.spec.transform(x, y)
                out = self.network(x)
                if self.classes is not None:
                    if out.ndim != 2 or out.shape[1] != width:
                        raise ConfigError(
                            f"the model outputs shape {tuple(out.shape)} for {len(x)} rows; "
                            f"a classifier of {width} classes must output (rows, {width})"
                        )
                    out = torch.softmax(out.double(), dim=1)
                else:
                    if out.numel() != len(x):
                        raise ConfigError(
                            f"the model outputs shape {tuple(out.shape)} for {len(x)} rows; "
                            "a regression model must output one value per row"
                        )
                    out = out.double().reshape(-1)
                parts.append(out.cpu().numpy())
        return np.concatenate(parts)

    def predict_proba(self, data: Any) -> np.ndarray:
        """Return class probabilities, ``(rows, len(classes))`` float64, columns in ``classes``.

        Raises:
            ConfigError: The model is a regression model.
            DataError: Missing columns, wrong shapes, nulls or non-finite values.
        """
        if self.classes is None:
            raise ConfigError("predict_proba needs a classification model; this is regression")
        return self.outputs(self.features(data))

    def predict(self, data: Any) -> np.ndarray:
        """Return one prediction per row.

        Classification: the original class labels (the most probable class); regression:
        the predicted values (float64).

        Raises:
            DataError: Missing columns, wrong shapes, nulls or non-finite values.
            TypeError: ``data`` is of an unsupported type.
        """
        outputs = self.outputs(self.features(data))
        if self.classes is None:
            return outputs
        return self.labels(outputs.argmax(axis=1))

    def labels(self, indices: np.ndarray) -> np.ndarray:
        """Map class indices to the original class labels."""
        assert self.classes is not None  # ok: callers check the task
        labels: np.ndarray = np.asarray(list(self.classes))[indices]
        return labels


def _build(
    checkpoint: Checkpoint,
    metadata: ModelMetadata,
    device: torch.device,
    batch_size: int,
) -> ScoringModel:
    spec = load_spec(metadata.spec)
    with torch.random.fork_rng(devices=[]):
        network = spec.build_model(metadata.params, metadata.info)
    if not isinstance(network, nn.Module):
        raise ConfigError(f"{metadata.spec}.build_model returned {network!r}, not a torch Module")
    network.load_state_dict(checkpoint["model"])
    return ScoringModel(network, metadata, spec, device, batch_size)


def model_from_bytes(
    data: bytes,
    where: str = "<bytes>",
    *,
    device: str | torch.device | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> ScoringModel:
    """Build a :class:`ScoringModel` from checkpoint bytes that carry their metadata."""
    checkpoint = decode_checkpoint(data)
    return _build(
        checkpoint,
        ModelMetadata.from_checkpoint(checkpoint, where),
        resolve_device(device),
        batch_size,
    )


@dataclasses.dataclass(frozen=True)
class LoadedCheckpoint:
    """A checkpoint read for scoring.

    Attributes:
        data: Its bytes (re-encoded with the dataset metadata when that was attached).
        checkpoint: The decoded checkpoint.
        metadata: Its metadata.
        where: Where it was read from.
    """

    data: bytes
    checkpoint: Checkpoint
    metadata: ModelMetadata
    where: str


def load_checkpoint(
    source: Source,
    *,
    store: str | Store | None = None,
    dataset: str | Manifest | None = None,
) -> LoadedCheckpoint:
    """Read a checkpoint and its metadata (see :func:`load_model` for the arguments).

    A checkpoint without dataset metadata comes back with it attached from ``dataset``
    (or from the dataset its experiment's event log names).
    """
    found = read_source(source, store)
    data = found.data
    checkpoint = decode_checkpoint(found.data)
    if dataset is None and "data" not in checkpoint and found.experiment is not None:
        dataset = dataset_of_experiment(found.experiment)
        if dataset is not None:
            logger.info("checkpoint %s has no dataset metadata; using %s", found.where, dataset)
    if dataset is not None:
        manifest = dataset if isinstance(dataset, Manifest) else read_manifest(dataset)
        if "data" in checkpoint:
            recorded = checkpoint["data"].get("dataset_id")
            if recorded not in (None, manifest.dataset_id):
                raise ConfigError(
                    f"checkpoint {found.where} was trained on dataset {recorded}, not on "
                    f"{manifest.dataset_id}; leave dataset= out to use its own metadata"
                )
        checkpoint = attach_dataset(checkpoint, manifest)
        data = encode_checkpoint(checkpoint)
    metadata = ModelMetadata.from_checkpoint(checkpoint, found.where)
    return LoadedCheckpoint(data, checkpoint, metadata, found.where)


def load_model(
    source: Source,
    *,
    store: str | Store | None = None,
    dataset: str | Manifest | None = None,
    device: str | torch.device | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> ScoringModel:
    """Load a trained model to score rows with (``predict``, ``predict_proba``).

    Args:
        source: One of: a checkpoint file's path or URI (``.../best.pt``, a trial's
            checkpoint; local, ``file://``, ``s3://`` ...); an experiment directory
            (``<store>/experiments/<id>``: its best checkpoint, ``best.pt``); checkpoint
            bytes; with ``store``: an experiment id (or ``experiments/<id>``) or the key
            of a checkpoint in that store.
        store: The store ``source`` is relative to (its root, as in the config's
            ``store``).
        dataset: The dataset (URI or :class:`~cerebro_spark.data.Manifest`) the model was
            trained on, for checkpoints written before checkpoints carried their dataset
            metadata. An experiment directory finds it in its event log by itself.
        device: ``"auto"`` (default: the GPU when torch sees one), ``"cpu"``, ``"cuda:0"``.
        batch_size: Rows per forward pass.

    Returns:
        The model, in eval mode, on ``device``.

    Raises:
        FileNotFoundError: Nothing at ``source`` (or no ``best.pt`` in the experiment).
        CheckpointError: The bytes are not a checkpoint, or it lacks metadata and no
            ``dataset`` was given.
        ConfigError: The model spec cannot be imported, or a bad argument.
    """
    loaded = load_checkpoint(source, store=store, dataset=dataset)
    metadata = loaded.metadata
    model = _build(loaded.checkpoint, metadata, resolve_device(device), batch_size)
    logger.info(
        "loaded model %s (trial %s, epoch %d, dataset %s) from %s",
        metadata.spec,
        metadata.trial_id,
        metadata.epoch,
        metadata.dataset_id,
        loaded.where,
    )
    return model
