"""A family's metrics, and their accumulation over one pass of a unit.

:func:`family_metrics` is the one place that says which metrics a ``ModelSpec``
produces: the validated :meth:`ModelSpec.build_metrics`, plus, for a spec that still
overrides the deprecated per-batch :meth:`ModelSpec.metrics`, a row-weighted
:class:`~cerebro_spark.metrics.BatchMean` for each name it returns (those replace
built-ins of the same name). Workers accumulate with it (:class:`PassMetrics`) and the
driver merges the units' states with it, so both sides agree on every state's meaning.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import torch

from cerebro_spark.data import DatasetInfo
from cerebro_spark.errors import ConfigError
from cerebro_spark.metrics import (
    LOSS,
    Accumulator,
    Batch,
    BatchMean,
    Loss,
    Metric,
    State,
    check_metrics,
)
from cerebro_spark.training._spec import ModelSpec

logger = logging.getLogger(__name__)


def overrides_batch_metrics(spec: ModelSpec) -> bool:
    """Whether ``spec`` overrides the deprecated per-batch :meth:`ModelSpec.metrics`."""
    return type(spec).metrics is not ModelSpec.metrics


def family_metrics(
    spec: ModelSpec, info: DatasetInfo, batch_metric_names: Iterable[str] = ()
) -> dict[str, Metric]:
    """Return the metrics a spec's trials report, by name, ``"loss"`` first.

    Args:
        spec: The family's spec.
        info: The dataset.
        batch_metric_names: Names the spec's deprecated ``metrics`` returns (each becomes a
            row-weighted :class:`~cerebro_spark.metrics.BatchMean`, replacing a built-in
            of the same name, whose mode it keeps).

    Raises:
        ConfigError: ``build_metrics`` returned something that is not a list of metrics
            with distinct names and modes ``max``/``min``, or named one ``"loss"``.
    """
    where = f"{type(spec).__module__}.{type(spec).__qualname__}.build_metrics"
    built = spec.build_metrics(info)
    try:
        metrics = check_metrics(list(built), where)
    except (TypeError, ValueError) as error:
        raise ConfigError(str(error)) from error
    out: dict[str, Metric] = {LOSS: Loss()}
    out.update(metrics)
    for name in batch_metric_names:
        if name == LOSS:
            raise ConfigError(f"{type(spec).__name__}.metrics must not return {LOSS!r}")
        known = metrics.get(name)
        out[name] = BatchMean(name, known.mode if known is not None else "max")
    return out


#: A pass adds its buffered batches to the metrics once this many output values (rows
#: times output width) or :data:`GROUP_BATCHES` batches are waiting, and at its end.
GROUP_ELEMENTS = 1 << 20
GROUP_BATCHES = 256


class PassMetrics:
    """The loss and metrics of one pass over a partition, accumulated on the device.

    Training passes skip metrics with ``on_train = False`` (buffers such as ROC AUC).
    Nothing here reads a value back to the host before :meth:`report`.

    Batches are buffered (their detached outputs, labels and mean loss) and added to the
    metrics in groups (:data:`GROUP_ELEMENTS`, :data:`GROUP_BATCHES`): one update per
    metric per group instead of per batch, since per-operation overhead, not arithmetic,
    is what small batches cost. The metrics of a group share one
    :class:`~cerebro_spark.metrics.Batch`, so what several need (the argmax, the
    label's score, per-class counts) is computed once. A metric's state is exact over
    any grouping of rows (the :class:`~cerebro_spark.metrics.Metric` protocol), so the
    counts are the same as batch by batch; float sums may differ in the last bits.
    Metrics with the same :meth:`~cerebro_spark.metrics.Metric.accumulator_key` share
    one accumulator, updated once and read once.

    Args:
        spec: The trial's spec.
        info: The dataset.
        device: Where the accumulators live (the unit's device).
        training: Whether this is a training pass.
    """

    def __init__(
        self, spec: ModelSpec, info: DatasetInfo, device: torch.device, *, training: bool
    ) -> None:
        self.spec = spec
        self.info = info
        self.device = device
        self.batch_metrics = overrides_batch_metrics(spec)
        metrics = family_metrics(spec, info)
        self.loss = metrics.pop(LOSS)
        self.metrics = {n: m for n, m in metrics.items() if m.on_train or not training}
        self.accumulators: dict[str, Accumulator] = {}
        shared: dict[Hashable, Accumulator] = {}
        for name, metric in self.metrics.items():
            key = metric.accumulator_key()
            if key is None:
                self.accumulators[name] = metric.init(device)
            else:
                if key not in shared:
                    shared[key] = metric.init(device)
                self.accumulators[name] = shared[key]
        self.loss_accumulator = self.loss.init(device)
        self.rows = 0
        self._outputs: list[torch.Tensor] = []
        self._labels: list[torch.Tensor] = []
        self._losses: list[torch.Tensor] = []
        self._batch_rows: list[int] = []
        self._elements = 0
        # BatchMean values come per batch (add); only the others read outputs and labels
        self._keep_outputs = any(not isinstance(m, BatchMean) for m in self.metrics.values())

    def add(self, outputs: torch.Tensor, labels: torch.Tensor, loss: torch.Tensor) -> None:
        """Add one batch: its outputs, labels and mean loss (no gradient is kept).

        A training step costs a few microseconds per tensor operation on a small model,
        so this adds none it can avoid: a tensor is detached only if it needs a gradient,
        and outputs and labels are kept only if a metric reads them.

        Raises:
            ConfigError: The spec's deprecated ``metrics`` returned ``"loss"``.
        """
        rows = int(labels.shape[0])
        if loss.requires_grad:
            loss = loss.detach()
        self._losses.append(loss if loss.dim() == 0 else loss.reshape(()))
        self._batch_rows.append(rows)
        if self._keep_outputs or self.batch_metrics:
            outputs = outputs.detach() if outputs.requires_grad else outputs
            labels = labels.detach() if labels.requires_grad else labels
        if self._keep_outputs:
            self._outputs.append(outputs)
            self._labels.append(labels)
            self._elements += outputs.numel()
        if self.batch_metrics:
            with torch.no_grad():
                self._add_batch_values(self.spec.metrics(outputs, labels, self.info), rows)
        self.rows += rows
        if self._elements >= GROUP_ELEMENTS or len(self._losses) >= GROUP_BATCHES:
            self.flush()

    def flush(self) -> None:
        """Add the buffered batches to the loss and the metrics (done by :meth:`report`)."""
        if self._losses:
            with torch.no_grad():
                self._flush()

    def _flush(self) -> None:
        assert isinstance(self.loss, Loss)  # ok: family_metrics puts Loss under "loss"
        self.loss.add_batches(self.loss_accumulator, torch.stack(self._losses), self._batch_rows)
        updated: set[int] = set()  # a shared accumulator is updated once
        batch = None
        for name, metric in self.metrics.items():
            accumulator = self.accumulators[name]
            if isinstance(metric, BatchMean) or id(accumulator) in updated:
                continue
            if batch is None:  # one for all metrics: they share its intermediates
                one = len(self._outputs) == 1
                outputs = self._outputs[0] if one else torch.cat(self._outputs)
                labels = self._labels[0] if one else torch.cat(self._labels)
                batch = Batch(outputs, labels)
            updated.add(id(accumulator))
            metric.update_batch(accumulator, batch)
        self._outputs, self._labels, self._losses, self._batch_rows = [], [], [], []
        self._elements = 0

    def _add_batch_values(self, values: Mapping[str, Any], rows: int) -> None:
        for name, value in values.items():
            if name == LOSS:
                raise ConfigError(f"metrics must not return {LOSS!r} (the loss is reported)")
            metric = self.metrics.get(name)
            if not isinstance(metric, BatchMean):
                known = self.metrics.get(name)
                metric = BatchMean(name, known.mode if known is not None else "max")
                self.metrics[name] = metric
                self.accumulators[name] = metric.init(self.device)
            metric.add(self.accumulators[name], value, rows)

    def report(self) -> tuple[dict[str, State], dict[str, float]]:
        """Return ``(states, sums)``: each metric's JSON state, and its value times rows.

        The sums are the row-weighted form that logs written before mergeable states
        carried (``UnitResult.metric_sums``); the engine uses the states.
        """
        self.flush()
        states = {LOSS: self.loss.state(self.loss_accumulator)}
        metrics: dict[str, Metric] = {LOSS: self.loss}
        read: dict[tuple[int, object], State] = {}  # a shared accumulator is read once
        for name, metric in self.metrics.items():
            accumulator = self.accumulators[name]
            key = (id(accumulator), type(metric).state)
            if key not in read:
                read[key] = metric.state(accumulator)
                states[name] = read[key]
            else:
                states[name] = _copy_state(read[key])
            metrics[name] = metric
        sums: dict[str, float] = {}
        for name, state in states.items():
            value = metrics[name].value(state)
            sums[name] = value * self.rows if self.rows else 0.0
        return states, sums


def _copy_state(state: State) -> State:
    """A copy of a JSON state, for a metric sharing another's accumulator.

    Nested dicts and lists are copied, numbers shared: ``copy.deepcopy`` did the same
    at several times the cost.
    """
    return {key: _copy_json(value) for key, value in state.items()}


def _copy_json(value: Any) -> Any:
    if isinstance(value, list):
        return [_copy_json(item) if isinstance(item, (list, dict)) else item for item in value]
    if isinstance(value, dict):
        return {key: _copy_json(item) for key, item in value.items()}
    return value
