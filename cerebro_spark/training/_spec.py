"""The ModelSpec seam: the user's model, optimizer, loss and metrics.

This is Cerebro §4.1's ``model_fn``/``train_fn``, as one class.

A spec is instantiated on workers from its import path with no arguments; everything
that varies between trials comes in ``params``. Rules:

* ``build_model`` must be deterministic given torch's RNG state (the unit seeds it from
  the trial seed before calling), so a trial's initial weights depend only on its seed.
* ``build_metrics`` returns the family's validation metrics as
  :class:`~cerebro_spark.metrics.Metric` objects (default: the built-in set of the
  dataset's task, :func:`~cerebro_spark.metrics.default_metrics`). Each keeps a mergeable
  state, so every reported value equals the metric computed at once over the whole
  validation split. The mean per-row loss is always reported as ``"loss"``; no metric may
  take that name. To add a metric, subclass ``Metric`` (``name``, ``mode``, ``init``,
  ``update``, ``value``; ``merge`` when the state is not a sum; the rules are in
  :mod:`cerebro_spark.metrics._base`) and return it with the built-ins::

      def build_metrics(self, info):
          return [*super().build_metrics(info), MyMetric()]

* ``build_metrics`` depends on ``info`` only, not on a trial's params: every trial of a
  family reports the same metrics (the engine checks the experiment's metric against
  them before any worker starts).
* ``metrics`` (deprecated) returns per-batch means, averaged weighted by batch rows:
  exact only for metrics that are means over rows. A spec that overrides it still works;
  its names replace built-ins of the same name.
* ``transform`` runs on every batch (train and validation) before the model.
* ``validation_batch_size`` sizes validation batches (default: the
  ``validation_batch_size`` param, else ``batch_size``). Validation keeps no gradient, so
  a larger batch than training's usually fits, and it runs the same rows in fewer, larger
  operations (the result is the same up to float rounding).
* ``hyperparameters`` declares the params a spec reads (besides ``lr``,
  ``weight_decay``, ``batch_size`` and ``validation_batch_size``, which the base class
  reads and every spec accepts). When it is set, the driver refuses, before anything is
  written, a search space that gives the spec a param it does not declare (a
  ``hiden_units`` typo), naming the param and the closest declared one. A spec that
  leaves it ``None`` (the default) is not checked: it may read any param; so is a
  subclass that does not declare its own (it may read more than its parent). The
  built-in specs declare theirs.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from cerebro_spark.data import DatasetInfo
from cerebro_spark.errors import ConfigError
from cerebro_spark.metrics import Metric, default_metrics
from cerebro_spark.training._images import Augmentation

BASE_HYPERPARAMETERS = frozenset({"lr", "weight_decay", "batch_size", "validation_batch_size"})
"""Params the base :class:`ModelSpec` reads: every spec accepts them."""


def accepted_hyperparameters(spec: ModelSpec | type[ModelSpec]) -> frozenset[str] | None:
    """The params ``spec`` declares it reads (base ones included), or ``None`` if undeclared.

    Only a declaration in the spec's own class counts: a subclass may read params its
    parent does not (``class Mine(MLPSpec)`` reading ``lr_jump``), so it inherits no
    declaration; it declares its own to be checked
    (``hyperparameters = MLPSpec.hyperparameters | {"lr_jump"}``).

    Raises:
        TypeError: ``hyperparameters`` is set to something other than a collection of
            strings.
    """
    cls = spec if isinstance(spec, type) else type(spec)
    declared = cls.__dict__.get("hyperparameters")
    if declared is None:
        return None
    if isinstance(declared, str) or not all(isinstance(name, str) for name in declared):
        raise TypeError(
            f"{getattr(spec, '__name__', type(spec).__name__)}.hyperparameters must be a "
            f"collection of param names, got {declared!r}"
        )
    return BASE_HYPERPARAMETERS | frozenset(declared)


class ModelSpec(abc.ABC):
    """What the user implements to put a model family under model selection.

    Attributes:
        hyperparameters: Names of the params this spec reads, or ``None`` (default): not
            declared, any param is accepted. :data:`BASE_HYPERPARAMETERS` always count.
            Declared per class: a subclass inherits no declaration.
    """

    hyperparameters: ClassVar[frozenset[str] | None] = None

    @abc.abstractmethod
    def build_model(self, params: Mapping[str, Any], info: DatasetInfo) -> nn.Module:
        """Return a fresh model for ``params`` and data described by ``info``."""

    def build_optimizer(self, model: nn.Module, params: Mapping[str, Any]) -> torch.optim.Optimizer:
        """Return the optimizer (default: Adam with ``lr`` and ``weight_decay`` params)."""
        return torch.optim.Adam(
            model.parameters(),
            lr=float(params.get("lr", 1e-3)),
            weight_decay=float(params.get("weight_decay", 0.0)),
        )

    def build_lr_scheduler(
        self, optimizer: torch.optim.Optimizer, params: Mapping[str, Any]
    ) -> torch.optim.lr_scheduler.LRScheduler | None:
        """Return an LR scheduler stepped once per epoch, or ``None`` (default)."""
        return None

    def batch_size(self, params: Mapping[str, Any]) -> int:
        """Return the mini-batch size (default: the ``batch_size`` param, else 64)."""
        return int(params.get("batch_size", 64))

    def validation_batch_size(self, params: Mapping[str, Any]) -> int:
        """Return the rows per validation batch (default: its param, else the batch size)."""
        if "validation_batch_size" in params:
            return int(params["validation_batch_size"])
        return self.batch_size(params)

    def loss(self, outputs: torch.Tensor, labels: torch.Tensor, info: DatasetInfo) -> torch.Tensor:
        """Return the mean loss of a batch (default: cross-entropy or MSE by task)."""
        if info.task == "classification":
            return nn.functional.cross_entropy(outputs, labels)
        return nn.functional.mse_loss(outputs.reshape(labels.shape), labels)

    def build_metrics(self, info: DatasetInfo) -> Sequence[Metric]:
        """Return the metrics every trial of this family reports besides ``"loss"``.

        Default: the built-in set of the dataset's task
        (:func:`~cerebro_spark.metrics.default_metrics`): accuracy, top-5 accuracy (more
        than 5 classes), precision, recall and F1 (macro, and per class up to 10
        classes), ROC AUC (up to 100 classes) and log loss for classification; MAE, MSE,
        RMSE and R² for
        regression.
        """
        return default_metrics(info.task, info.num_classes)

    def metrics(
        self, outputs: torch.Tensor, labels: torch.Tensor, info: DatasetInfo
    ) -> Mapping[str, torch.Tensor | float]:
        """Deprecated: per-batch mean metrics, averaged weighted by rows (default: none).

        Prefer :meth:`build_metrics`, whose values are exact over the split.
        """
        return {}

    def augmentation(self, params: Mapping[str, Any], info: DatasetInfo) -> Augmentation | None:
        """How image columns are augmented in training batches (default: not at all).

        Images are decoded per batch, scaled to [0, 1] and normalized by the train split's
        per-channel mean and std whatever this returns (``Augmentation(normalize=False)``
        keeps them in [0, 1]); a random crop with padding and a horizontal flip are drawn
        from a generator seeded by (trial, epoch, partition, batch), so a replay is
        bit-exact. Validation batches are never augmented. For an augmentation of your
        own, use :meth:`transform` (it runs in the training thread with torch seeded per
        unit).
        """
        return None

    def transform(self, features: Any, labels: torch.Tensor) -> tuple[Any, torch.Tensor]:
        """Transform a batch before the model sees it (default: identity).

        ``features`` is a tensor or a dict of tensors by column
        (:func:`~cerebro_spark.data.tensor_input`).
        """
        return features, labels


def checked_batch_size(
    spec: ModelSpec, params: Mapping[str, Any], *, validation: bool = False
) -> int:
    """``spec``'s training (or validation) batch size for ``params``, checked.

    Raises:
        ConfigError: It is not a positive int (the message names which size).
    """
    name = "validation_batch_size" if validation else "batch_size"
    size = spec.validation_batch_size(params) if validation else spec.batch_size(params)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"{name} must be a positive int, got {size!r}")
    return size
