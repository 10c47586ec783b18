"""The mergeable-metric protocol: accumulate on the device, merge as JSON, value at the end.

A metric is computed over a whole validation split that is spread over partitions,
workers and batches. To report exactly the value computed at once over the split, each
metric keeps a *state* that can be updated batch by batch and merged across units:

* On a worker, :meth:`Metric.init` makes an *accumulator* (a dict of tensors on the
  unit's device) and :meth:`Metric.update` adds a batch to it in place with tensor
  operations only (no host sync per batch). A unit adds its rows in groups through
  :meth:`Metric.update_batch`, whose :class:`Batch` computes what several metrics need
  (the argmax, the label's score ...) once for all of them.
* At the end of the unit, :meth:`Metric.state` turns the accumulator into a *state*:
  JSON values (numbers and lists), which travel in the unit's result and the event log.
* On the driver, :meth:`Metric.merge_all` combines the states of the split's units (in
  partition order, so the reported value is the same in every run; by default with
  :meth:`Metric.merge`, pairwise) and :meth:`Metric.value` gives the number.

Rules for a metric (built-in or a ``ModelSpec``'s own):

* ``name`` is its key in the metrics dict (``"loss"`` is reserved for the loss); ``mode``
  says whether larger (``"max"``) or smaller (``"min"``) is better.
* ``merge`` must be associative and commutative up to float rounding, and ``merge(init,
  s) == s``: the engine merges units in any grouping. The default merge adds states
  field by field (numbers, and lists element by element), which is right for sums and
  counts; a state that is not a sum (a buffer, a running mean) overrides it. ``merge``
  returns a new state and leaves ``a`` and ``b`` as they are: metrics that share an
  accumulator share their states' objects on the driver. A metric whose state is costly
  to decode and encode overrides ``merge_all`` to do each once; it must return what
  merging pairwise, left to right, returns.
* ``value`` of a state with no rows returns ``nan``; it never raises for lack of data.
* Keep states small: counts and sums where they are exact; score/label buffers only where
  nothing smaller is exact (ROC AUC). ``on_train = False`` keeps a costly metric off the
  training passes (the engine reports validation metrics only).
* Accumulate in ``float64`` or ``int64`` so that merging many units loses no precision.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, Literal, TypeVar

import torch

State = dict[str, Any]
"""A metric's state: JSON values (numbers and lists of them), mergeable across units."""
Accumulator = dict[str, Any]
"""A metric's state on the device while a unit runs: tensors (or lists of them, buffers)."""
Mode = Literal["max", "min"]

LOSS = "loss"
"""The name under which the mean per-row loss is reported."""

_T = TypeVar("_T")


class Batch:
    """Rows added to several metrics at once, with what they share computed once.

    A unit hands each metric of a pass the same :class:`Batch` (:meth:`Metric.update_batch`);
    a metric asks it for an intermediate with :meth:`shared`, so that, for instance, the
    argmax of the outputs is computed once for accuracy, precision, recall and F1. Values
    are cached by key for the life of the batch: a key must name one computation of
    :attr:`outputs` and :attr:`labels` alone (``"predictions"``, ``("class_counts", 10)``).

    Args:
        outputs: The model's outputs for the rows (no gradient).
        labels: The rows' labels (after the spec's ``transform``).
    """

    __slots__ = ("_cache", "labels", "outputs")

    def __init__(self, outputs: torch.Tensor, labels: torch.Tensor) -> None:
        self.outputs = outputs
        self.labels = labels
        self._cache: dict[Hashable, Any] = {}

    def shared(self, key: Hashable, compute: Callable[[], _T]) -> _T:
        """Return the value cached under ``key``, computing it with ``compute()`` the first time."""
        try:
            value: _T = self._cache[key]
        except KeyError:
            value = self._cache[key] = compute()
        return value


class Metric(abc.ABC):
    """A validation metric computed exactly over a split from mergeable states.

    Subclasses set :attr:`name` and :attr:`mode` (class attributes or in ``__init__``)
    and implement :meth:`init`, :meth:`update` and :meth:`value`; :meth:`state` and
    :meth:`merge` have defaults for additive states (see the module docstring).

    Example, the mean squared error::

        class MeanSquaredError(Metric):
            name, mode = "mse", "min"

            def init(self, device):
                return {"sq": torch.zeros((), dtype=torch.float64, device=device),
                        "count": torch.zeros((), dtype=torch.int64, device=device)}

            def update(self, acc, outputs, labels):
                error = outputs.reshape(labels.shape).double() - labels.double()
                acc["sq"] += error.square().sum()
                acc["count"] += labels.shape[0]

            def value(self, state):
                return state["sq"] / state["count"] if state["count"] else math.nan
    """

    name: str
    mode: Mode
    on_train: bool = True
    """Whether training passes compute it too (their running value is logged in the train
    unit's ``metric_sums``). Built-ins other than accuracy and the regression metrics are
    validation only unless made with ``on_train=True``."""

    @abc.abstractmethod
    def init(self, device: torch.device) -> Accumulator:
        """Return an empty accumulator on ``device``."""

    @abc.abstractmethod
    def update(self, acc: Accumulator, outputs: torch.Tensor, labels: torch.Tensor) -> None:
        """Add one batch to ``acc`` in place (tensor operations only, no host sync).

        Args:
            acc: The accumulator from :meth:`init`.
            outputs: The model's outputs for the batch (no gradient).
            labels: The batch's labels (after the spec's ``transform``).
        """

    def update_batch(self, acc: Accumulator, batch: Batch) -> None:
        """Add ``batch``'s rows to ``acc`` (default: :meth:`update` on its outputs and labels).

        What a unit calls. Built-in metrics override it to share intermediates with the
        other metrics of the batch (:meth:`Batch.shared`); the result is the same as
        :meth:`update`'s.
        """
        self.update(acc, batch.outputs, batch.labels)

    def accumulator_key(self) -> Hashable | None:
        """Return a key shared by metrics whose accumulators are identical, else ``None``.

        Metrics of one pass with the same (non-``None``) key share one accumulator, made
        and updated once per batch by the first of them (e.g. precision, recall and F1
        all count per-class true positives, predictions and labels). Default ``None``:
        the metric keeps its own accumulator.
        """
        return None

    def state(self, acc: Accumulator) -> State:
        """Return the JSON state of an accumulator (default: each tensor's ``tolist()``)."""
        return {key: tensor.detach().cpu().tolist() for key, tensor in acc.items()}

    def merge(self, a: State, b: State) -> State:
        """Combine two states (default: add them field by field)."""
        return {key: _add(a[key], b[key], key) for key in a}

    def merge_all(self, states: Sequence[State]) -> State:
        """Combine one or more states, left to right (default: :meth:`merge`, pairwise).

        What the driver calls on a trial's validation units. Override it where each
        pairwise merge would decode and re-encode the state; it must return what the
        pairwise merge returns. A single state is returned as it is.

        Raises:
            ValueError: ``states`` is empty.
        """
        if not states:
            raise ValueError(f"{self.name}: merge_all needs at least one state")
        merged = states[0]
        for state in states[1:]:
            merged = self.merge(merged, state)
        return merged

    @abc.abstractmethod
    def value(self, state: State) -> float:
        """Return the metric of a (merged) state; ``nan`` when it has no rows."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, mode={self.mode!r})"


def _add(a: Any, b: Any, key: str) -> Any:
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            raise ValueError(f"cannot add state field {key!r}: lengths {len(a)} and {len(b)}")
        return [_add(x, y, key) for x, y in zip(a, b, strict=True)]
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a + b
    raise ValueError(f"cannot add state field {key!r}: {type(a).__name__} and {type(b).__name__}")


def merge_states(metric: Metric, states: list[State]) -> State | None:
    """Merge ``states`` left to right (:meth:`Metric.merge_all`); ``None`` if there are none."""
    return metric.merge_all(states) if states else None


def ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``, or ``nan`` when the denominator is 0."""
    return numerator / denominator if denominator else math.nan


def scalar(device: torch.device, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """A zero scalar tensor on ``device`` (``float64`` by default)."""
    return torch.zeros((), dtype=dtype, device=device)


def count(device: torch.device) -> torch.Tensor:
    """A zero ``int64`` scalar tensor on ``device``."""
    return torch.zeros((), dtype=torch.int64, device=device)


class Loss(Metric):
    """The mean per-row loss: the sum of batch-mean losses times their rows, over rows.

    Exact for losses that are means over the batch's rows (the spec's ``loss`` returns a
    batch mean). Updated by the unit with :meth:`add` (it needs the loss, not outputs).
    """

    name = LOSS
    mode: Mode = "min"

    def init(self, device: torch.device) -> Accumulator:
        """Return a zero sum and count."""
        return {"sum": scalar(device), "count": count(device)}

    def update(self, acc: Accumulator, outputs: torch.Tensor, labels: torch.Tensor) -> None:
        """Not used: the loss comes from the spec's ``loss``; see :meth:`add`."""
        raise TypeError("Loss is updated with Loss.add(acc, batch_mean_loss, rows)")

    def add(self, acc: Accumulator, batch_mean: torch.Tensor, rows: int) -> None:
        """Add a batch whose mean loss is ``batch_mean`` over ``rows`` rows."""
        acc["sum"] += batch_mean.detach().to(torch.float64) * rows
        acc["count"] += rows

    def add_batches(self, acc: Accumulator, batch_means: torch.Tensor, rows: list[int]) -> None:
        """Add several batches at once: their mean losses (1-D) and their row counts."""
        weights = torch.tensor(rows, dtype=torch.float64, device=batch_means.device)
        acc["sum"] += (batch_means.detach().to(torch.float64) * weights).sum()
        acc["count"] += sum(rows)

    def value(self, state: State) -> float:
        """Return the mean per-row loss."""
        return ratio(state["sum"], state["count"])


class BatchMean(Metric):
    """A legacy per-batch mean metric (``ModelSpec.metrics``), weighted by batch rows.

    Exact only where the value is itself a mean over rows (accuracy, MAE); kept so that
    specs written before :meth:`ModelSpec.build_metrics` keep working.
    """

    def __init__(self, name: str, mode: Mode = "max") -> None:
        self.name = name
        self.mode = mode

    def init(self, device: torch.device) -> Accumulator:
        """Return a zero sum and count."""
        return {"sum": scalar(device), "count": count(device)}

    def update(self, acc: Accumulator, outputs: torch.Tensor, labels: torch.Tensor) -> None:
        """Not used: legacy values come per batch; see :meth:`add`."""
        raise TypeError("BatchMean is updated with BatchMean.add(acc, batch_value, rows)")

    def add(self, acc: Accumulator, batch_value: Any, rows: int) -> None:
        """Add a batch whose mean is ``batch_value`` over ``rows`` rows."""
        value = torch.as_tensor(batch_value).detach().to(acc["sum"].device, torch.float64)
        acc["sum"] += value.reshape(()) * rows
        acc["count"] += rows

    def value(self, state: State) -> float:
        """Return the row-weighted mean of the batch values."""
        return ratio(state["sum"], state["count"])


def check_metrics(metrics: Mapping[str, Metric] | list[Metric], where: str) -> dict[str, Metric]:
    """Return the metrics by name, checking names, modes and types.

    Raises:
        TypeError: An entry is not a :class:`Metric`.
        ValueError: A name is empty, ``"loss"`` or taken twice, or a mode is not min/max.
    """
    listed = list(metrics.values()) if isinstance(metrics, Mapping) else list(metrics)
    out: dict[str, Metric] = {}
    for metric in listed:
        if not isinstance(metric, Metric):
            raise TypeError(f"{where} must return Metric instances, got {metric!r}")
        name = getattr(metric, "name", None)
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: {metric!r} has no name (a non-empty str)")
        if name == LOSS:
            raise ValueError(f"{where}: {name!r} is reserved for the loss, which is reported")
        if name in out:
            raise ValueError(f"{where}: two metrics are named {name!r}")
        if getattr(metric, "mode", None) not in ("max", "min"):
            raise ValueError(f"{where}: {name!r} has mode {metric.mode!r}; must be max or min")
        out[name] = metric
    return out
