"""Using a trained model: load it in Python, or score Spark DataFrames with it.

* :func:`load_model` (also ``cerebro_spark.load_model``): a checkpoint, an experiment's
  best checkpoint or checkpoint bytes → a :class:`ScoringModel` (a ``torch.nn.Module``
  with ``predict`` and ``predict_proba`` on raw pandas or Arrow rows: image bytes of any
  size, category values, token lists, numbers; numpy or torch arrays for all-numeric
  models). Raw values are encoded with ``prepare``'s own encoders and batched as training
  batched them (:class:`~cerebro_spark.training._batches.BatchMaker`).
* :class:`ModelTransformer`: the same model as a Spark ML Transformer that scores on the
  executors (``ModelTransformer.from_checkpoint(uri)``), saved and loaded with Spark ML's
  ``write().save(path)`` / ``ModelTransformer.load(path)``.
* :func:`best_checkpoint_uri`: where an experiment's best checkpoint is.

Checkpoints carry what scoring needs (:mod:`cerebro_spark.training._checkpoint`'s ``data``
entry): feature columns (kind, shape, vocabulary, image size and statistics), label, task,
class labels, the spec and its params, the feature statistics. ``ModelTransformer`` needs
pyspark; it is imported on first use, so this package imports without pyspark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cerebro_spark.scoring._metadata import ModelMetadata
from cerebro_spark.scoring._model import (
    DEFAULT_BATCH_SIZE,
    LoadedCheckpoint,
    ScoringModel,
    load_checkpoint,
    load_model,
)
from cerebro_spark.scoring._source import BEST_CHECKPOINT, best_checkpoint_uri

if TYPE_CHECKING:
    from cerebro_spark.scoring._transformer import ModelTransformer

__all__ = [
    "BEST_CHECKPOINT",
    "DEFAULT_BATCH_SIZE",
    "LoadedCheckpoint",
    "ModelMetadata",
    "ModelTransformer",
    "ScoringModel",
    "best_checkpoint_uri",
    "load_checkpoint",
    "load_model",
]


def __getattr__(name: str) -> Any:
    if name == "ModelTransformer":
        from cerebro_spark.scoring._transformer import ModelTransformer

        return ModelTransformer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
