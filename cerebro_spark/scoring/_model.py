"""A trained model ready to score rows: :class:`ScoringModel` and :func:`load_model`."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np
import torch
from torch import nn

from cerebro_spark.data import Manifest, PartitionData, read_manifest
from cerebro_spark.errors import ConfigError
from cerebro_spark.scoring._inputs import dense_partition, to_partition
from cerebro_spark.scoring._metadata import ModelMetadata, attach_dataset, dataset_of_experiment
from cerebro_spark.scoring._source import Source, read_source
from cerebro_spark.store import Store
from cerebro_spark.training import (
    Checkpoint,
    ModelSpec,
    decode_checkpoint,
    encode_checkpoint,
    load_spec,
    verify_content,
)
from cerebro_spark.training._batches import BatchMaker, Features

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

    Calling it (``forward``) runs the raw network on what it receives in training: one
    feature tensor, or a dict of tensors by column (:func:`~cerebro_spark.data.
    tensor_input`). :meth:`predict` and :meth:`predict_proba` take raw rows in any of
    these forms:

    * a pandas DataFrame or a pyarrow Table/RecordBatch holding the feature columns by
      name (:attr:`feature_columns`; other columns are ignored), with the values
      ``prepare`` took: numbers and arrays (lists, numpy arrays of any shape with the
      right number of values, Spark ML vectors in pandas); images as JPEG/PNG bytes of
      any size (resized to the trained size and converted to its channels, as
      ``prepare`` did) or Spark's image struct; categories as strings or integers
      (values never seen get their hash bucket, else the unknown id 0); sequences as
      lists of token ids (cut to the trained ``max_length``; an id beyond the
      vocabulary is refused);
    * for a model whose features are all numbers (``number``/``array`` columns): a numpy
      array or torch tensor of shape ``(rows, *feature_shape)`` or ``(rows, n_values)``,
      the features already concatenated in the model's order;
    * a :class:`~cerebro_spark.data.PartitionData` with the model's columns (what
      :meth:`partition` returns, or a prepared partition from
      :func:`~cerebro_spark.data.read_partition`).

    Every form becomes a :class:`~cerebro_spark.data.PartitionData` held as the dataset
    stores it (:meth:`partition`, :mod:`cerebro_spark.scoring._inputs`), whose batches are
    built as for validation (:class:`~cerebro_spark.training._batches.BatchMaker`: images
    decoded and normalized by the column's statistics, sequences padded with a mask, no
    augmentation); the spec's ``transform`` is applied to every batch before the network.
    The Spark Transformer's tasks take the same path. Built by :func:`load_model`.

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

    @property
    def dense(self) -> bool:
        """Whether every feature column holds numbers (the features form one float array)."""
        return all(column.dense for column in self.metadata.features)

    def forward(self, features: Features) -> torch.Tensor:
        """Return the network's raw outputs for a batch (a tensor or a dict by column)."""
        output: torch.Tensor = self.network(features)
        return output

    def partition(self, data: Any) -> PartitionData:
        """Return ``data``'s rows held as the dataset stores them, checked.

        Any form :meth:`predict` takes. Images come back encoded at the trained size and
        channels, categories as ``int32`` ids, sequences cut and ragged, numbers in their
        stored dtype; the labels are placeholders. Pass it to :meth:`outputs` (or back to
        :meth:`predict`) to score it.

        Raises:
            DataError: A missing column or a value that breaks its column's rule (the
                message names the column, the row and the rule).
            TypeError: ``data`` is of an unsupported type.
        """
        return to_partition(
            data, self.metadata.features, classification=self.metadata.classes is not None
        )

    def features(self, data: Any) -> np.ndarray:
        """Return ``data``'s features as ``(rows, *feature_shape)`` float32, checked.

        Only for models whose features are all numbers; otherwise use :meth:`partition`
        (images, categories and sequences reach the network per batch, decoded).

        Raises:
            ConfigError: The model reads image, categorical or sequence columns.
            DataError, TypeError: As :meth:`partition`.
        """
        if not self.dense:
            kinds = sorted({c.feature_kind for c in self.metadata.features if not c.dense})
            raise ConfigError(
                f"the model reads {', '.join(kinds)} columns, which are not one float array: "
                "use ScoringModel.partition(data) for the rows as the dataset holds them"
            )
        return self.partition(data).features

    def outputs(self, features: np.ndarray | PartitionData) -> np.ndarray:
        """Run the spec's transform and the network over rows, in batches.

        Args:
            features: A partition (:meth:`partition`), or, for a dense model, the features
                as one array (:meth:`features`).

        Returns:
            float64: class probabilities ``(rows, num_classes)`` (a softmax of the
            outputs) for classification, predicted values ``(rows,)`` for regression.
        """
        classification = self.classes is not None
        if isinstance(features, PartitionData):
            data = to_partition(features, self.metadata.features)
        else:
            data = dense_partition(
                features, self.metadata.feature_shape, classification=classification
            )
        rows = data.rows
        width = len(self.classes) if self.classes is not None else 1
        if rows == 0:
            return np.zeros((0, width) if classification else (0,))
        info = self.metadata.info
        params = self.metadata.params
        # As validation builds its batches: the spec's augmentation is not applied to
        # unseeded batches, its images are decoded, scaled and normalized.
        maker = BatchMaker(
            data, info, self.device, augmentation=self.spec.augmentation(params, info)
        )
        parts: list[np.ndarray] = []
        order = np.arange(rows, dtype=np.int64)
        with torch.no_grad(), maker.batches(order, self.batch_size) as batches:
            for x, y in batches:
                x, _ = self.spec.transform(x, y)
                out = self.network(x)
                count = len(y)
                if classification:
                    if out.ndim != 2 or out.shape[1] != width:
                        raise ConfigError(
                            f"the model outputs shape {tuple(out.shape)} for {count} rows; "
                            f"a classifier of {width} classes must output (rows, {width})"
                        )
                    out = torch.softmax(out.double(), dim=1)
                else:
                    if out.numel() != count:
                        raise ConfigError(
                            f"the model outputs shape {tuple(out.shape)} for {count} rows; "
                            "a regression model must output one value per row"
                        )
                    out = out.double().reshape(-1)
                parts.append(out.cpu().numpy())
        return np.concatenate(parts)

    def predict_proba(self, data: Any) -> np.ndarray:
        """Return class probabilities, ``(rows, len(classes))`` float64, columns in ``classes``.

        Raises:
            ConfigError: The model is a regression model.
            DataError: Missing columns, wrong shapes, nulls, non-finite values, images
                that do not decode, tokens beyond the vocabulary (column, row and rule).
        """
        if self.classes is None:
            raise ConfigError("predict_proba needs a classification model; this is regression")
        return self.outputs(self.partition(data))

    def predict(self, data: Any) -> np.ndarray:
        """Return one prediction per row.

        Classification: the original class labels (the most probable class); regression:
        the predicted values (float64).

        Raises:
            DataError: Missing columns, wrong shapes, nulls, non-finite values, images
                that do not decode, tokens beyond the vocabulary (column, row and rule).
            TypeError: ``data`` is of an unsupported type.
        """
        outputs = self.outputs(self.partition(data))
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
    """Build a :class:`ScoringModel` from checkpoint bytes that carry their metadata.

    Raises:
        CheckpointError: The bytes are no checkpoint, or its content is not what its own
            digest says (:func:`~cerebro_spark.training.verify_content`).
    """
    checkpoint = decode_checkpoint(data)
    verify_content(checkpoint, where)
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
    verify_content(checkpoint, found.where)
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
