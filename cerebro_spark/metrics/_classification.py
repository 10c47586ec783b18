"""Classification metrics: accuracy, top-k, precision/recall/F1, ROC AUC, log loss.

Outputs are the model's raw scores, one column per class (logits; probabilities are
their softmax). A binary model with a single output column (or a flat output) is read
as the logit of class 1. Labels are class indices ``0 .. num_classes - 1``.

Definitions follow scikit-learn, so that each value equals scikit-learn's on the same
predictions (up to float rounding):

* ``accuracy``: ``accuracy_score(y, argmax)``.
* ``top{k}_accuracy``: ``top_k_accuracy_score(y, scores, k=k)`` (tied scores: the lower
  class index ranks first).
* ``precision_macro`` / ``recall_macro`` / ``f1_macro``: ``average="macro"`` over the
  classes present in the labels or the predictions, ``zero_division=0``;
  ``precision_class_<i>`` (and recall, F1): class ``i`` alone.
* ``roc_auc``: binary, ``roc_auc_score(y, p1)`` on the probability of class 1; with
  more classes, one-vs-rest macro (``multi_class="ovr", average="macro"``) on the
  softmax probabilities. ``nan`` when a class has no positive or no negative row. By
  default *binned*: scikit-learn's AUC of the scores counted on a fine log-odds grid
  (within about ``1e-5`` of the exact value), so that its state is a fixed number of
  counts, not every row's scores; ``RocAuc(n, bins=None)`` is exact. It is not computed
  on training passes.
* ``log_loss``: ``log_loss(y, softmax)``, the mean of ``-log p(label)`` (as
  ``logsumexp(scores) - score of the label`` in float64, so no clipping is needed).

On training passes only ``accuracy`` is computed by default (besides the loss, always):
the others are validation metrics (``on_train=False``), since nothing reads their running
values on training data and, with 10 classes, they cost a training pass of a small model
about 3 % of its time (``benchmarks/unit_overhead.py``). Pass ``on_train=True`` to one to
log its running value on training passes too (in ``unit_end``'s ``metric_sums``).

Metrics of one batch share what they have in common (:class:`~cerebro_spark.metrics.Batch`):
the argmax, the label's score and rank, and the per-class counts are computed once.
"""

from __future__ import annotations

import base64
import math
import zlib
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch

from cerebro_spark.metrics._base import (
    Accumulator,
    Batch,
    Metric,
    Mode,
    State,
    count,
    ratio,
    scalar,
)


def class_scores(outputs: torch.Tensor) -> torch.Tensor:
    """Return ``(N, C)`` class scores; a single output column is class 1's logit."""
    if outputs.dim() == 1 or (outputs.dim() == 2 and outputs.shape[1] == 1):
        logit = outputs.reshape(-1, 1)
        return torch.cat([torch.zeros_like(logit), logit], dim=1)
    if outputs.dim() != 2:
        raise ValueError(
            f"classification outputs must be (rows, classes), got shape {tuple(outputs.shape)}"
        )
    return outputs


def predictions(outputs: torch.Tensor) -> torch.Tensor:
    """Return the predicted class of each row (the first of tied maxima, as argmax)."""
    return class_scores(outputs).argmax(dim=1)


# What the classification metrics of one batch share, each computed once (Batch.shared).


def _scores(batch: Batch) -> torch.Tensor:
    return batch.shared("scores", lambda: class_scores(batch.outputs))


def _labels(batch: Batch) -> torch.Tensor:
    return batch.shared("labels", lambda: batch.labels.reshape(-1).long())


def _predictions(batch: Batch) -> torch.Tensor:
    return batch.shared("predictions", lambda: _scores(batch).argmax(dim=1))


def _own_scores(batch: Batch) -> torch.Tensor:
    """Each row's score of its label, ``(N, 1)``."""
    return batch.shared("own", lambda: _scores(batch).gather(1, _labels(batch).reshape(-1, 1)))


def _scores64(batch: Batch) -> torch.Tensor:
    """The class scores in float64 (what log loss and ROC AUC compute in)."""
    return batch.shared("scores64", lambda: _scores(batch).to(torch.float64))


def _log_normalizer(batch: Batch) -> torch.Tensor:
    """Each row's ``logsumexp`` of its float64 scores, ``(N, 1)``: ``log p = score - it``."""
    return batch.shared(
        "log_normalizer", lambda: torch.logsumexp(_scores64(batch), dim=1, keepdim=True)
    )


def _ahead(batch: Batch) -> torch.Tensor:
    """How many classes rank ahead of each row's label (ties: the lower index first)."""

    def compute() -> torch.Tensor:
        scores, own = _scores(batch), _own_scores(batch)
        index = torch.arange(scores.shape[1], device=scores.device).reshape(1, -1)
        lower = index < _labels(batch).reshape(-1, 1)
        return ((scores > own) | ((scores == own) & lower)).sum(dim=1)

    return batch.shared("ahead", compute)


def _class_counts(batch: Batch, num_classes: int) -> tuple[torch.Tensor, ...]:
    """Per-class ``(true positives, predicted, true)`` counts of the batch's rows.

    Classes outside ``range(num_classes)`` are not counted. On the CPU three
    ``bincount``; elsewhere one-hot comparisons, since ``bincount`` on a GPU reads its
    input's maximum back to the host.
    """

    def compute() -> tuple[torch.Tensor, ...]:
        labels, predicted = _labels(batch), _predictions(batch)
        if labels.device.type == "cpu" and (labels.numel() == 0 or int(labels.min()) >= 0):
            hit = labels[predicted == labels]
            return tuple(
                torch.bincount(values, minlength=num_classes)[:num_classes]
                for values in (hit, predicted, labels)
            )
        return _one_hot_counts(labels, predicted, num_classes)

    return batch.shared(("class_counts", num_classes), compute)


def _one_hot_counts(
    labels: torch.Tensor, predicted: torch.Tensor, num_classes: int
) -> tuple[torch.Tensor, ...]:
    """:func:`_class_counts` by one-hot comparisons (no host sync on any device)."""
    classes = torch.arange(num_classes, device=labels.device).reshape(1, -1)
    is_label = labels.reshape(-1, 1) == classes
    is_predicted = predicted.reshape(-1, 1) == classes
    return (
        (is_label & is_predicted).sum(dim=0),
        is_predicted.sum(dim=0),
        is_label.sum(dim=0),
    )


class Accuracy(Metric):
    """Share of rows whose highest-scoring class is the label."""

    name = "accuracy"
    mode: Mode = "max"

    def init(self, device: torch.device) -> Accumulator:
        """Return zero counts."""
        return {"correct": count(device), "count": count(device)}

    def update(self, acc: Accumulator, outputs: torch.Tensor, labels: torch.Tensor) -> None:
        """Count the batch's correct rows."""
        self.update_batch(acc, Batch(outputs, labels))

    def update_batch(self, acc: Accumulator, batch: Batch) -> None:
        """Count the batch's correct rows (sharing the argmax)."""
        labels = _labels(batch)
        acc["correct"] += (_predictions(batch) == labels).sum()
        acc["count"] += labels.shape[0]

    def value(self, state: State) -> float:
        """Return correct / rows."""
        return ratio(state["correct"], state["count"])


class TopKAccuracy(Metric):
    """Share of rows whose label is among the ``k`` highest-scoring classes.

    Ties are broken toward the lower class index (as ``argmax`` does), so ``k=1`` is
    accuracy and the value does not depend on the order of a sort.
    """

    mode: Mode = "max"

    def __init__(self, k: int, *, on_train: bool = False) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"top-k accuracy needs an int k >= 1, got {k!r}")
        self.k = k
        self.name = f"top{k}_accuracy"
        self.on_train = on_train

    def init(self, device: torch.device) -> Accumulator:
        """Return zero counts."""
        return {"correct": count(device), "count": count(device)}

    def update(self, acc: Accumulator, outputs: torch.Tensor, labels: torch.Tensor) -> None:
        """Count the rows whose label is in the batch's top k."""
        self.update_batch(acc, Batch(outputs, labels))

    def update_batch(self, acc: Accumulator, batch: Batch) -> None:
        """Count the rows whose label is in the top k (sharing the ranks with other k)."""
        acc["correct"] += (_ahead(batch) < self.k).sum()
        acc["count"] += batch.labels.shape[0]

    def value(self, state: State) -> float:
        """Return correct / rows."""
        return ratio(state["correct"], state["count"])


_Kind = Literal["precision", "recall", "f1"]


class _ClassCountMetric(Metric):
    """Precision, recall or F1 from per-class counts (true positives, predicted, true)."""

    mode: Mode = "max"
    kind: _Kind

    def __init__(
        self,
        num_classes: int,
        average: Literal["macro"] | int = "macro",
        *,
        on_train: bool = False,
    ) -> None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes must be an int >= 2, got {num_classes!r}")
        is_index = isinstance(average, int) and not isinstance(average, bool)
        if average != "macro" and not (is_index and 0 <= int(average) < num_classes):
            raise ValueError(
                f"average must be 'macro' or a class index in [0, {num_classes}), got {average!r}"
            )
        self.num_classes = num_classes
        self.average = average
        suffix = "macro" if average == "macro" else f"class_{average}"
        self.name = f"{self.kind}_{suffix}"
        self.on_train = on_train

    def accumulator_key(self) -> tuple[str, int]:
        """Precision, recall and F1 of any class or average share the per-class counts."""
        return ("class_counts", self.num_classes)

    def init(self, device: torch.device) -> Accumulator:
        """Return zero per-class counts."""
        zeros = torch.zeros(self.num_classes, dtype=torch.int64, device=device)
        return {"tp": zeros.clone(), "predicted": zeros.clone(), "true": zeros.clone()}

    def update(self, acc: Accumulator, outputs: torch.Tensor, labels: torch.Tensor) -> None:
        """Add the batch's per-class counts."""
        self.update_batch(acc, Batch(outputs, labels))

    def update_batch(self, acc: Accumulator, batch: Batch) -> None:
        """Add the batch's per-class counts (counted once for every class and average)."""
        tp, predicted, true = _class_counts(batch, self.num_classes)
        acc["tp"] += tp
        acc["predicted"] += predicted
        acc["true"] += true

    def _per_class(self, tp: int, predicted: int, true: int) -> float:
        if self.kind == "precision":
            return tp / predicted if predicted else 0.0
        if self.kind == "recall":
            return tp / true if true else 0.0
        denominator = predicted + true  # 2tp + fp + fn
        return 2 * tp / denominator if denominator else 0.0

    def value(self, state: State) -> float:
        """Return the class's value, or the mean over classes seen in labels or predictions."""
        counts = list(zip(state["tp"], state["predicted"], state["true"], strict=True))
        if self.average != "macro":
            tp, predicted, true = counts[int(self.average)]
            if not sum(state["true"]):
                return math.nan
            return self._per_class(tp, predicted, true)
        seen = [c for c in counts if c[1] + c[2] > 0]
        if not seen:
            return math.nan
        return sum(self._per_class(*c) for c in seen) / len(seen)


class Precision(_ClassCountMetric):
    """Precision of one class, or its macro average (``zero_division=0``)."""

    kind: _Kind = "precision"


class Recall(_ClassCountMetric):
    """Recall of one class, or its macro average (``zero_division=0``)."""

    kind: _Kind = "recall"


class F1(_ClassCountMetric):
    """F1 of one class, or the macro average of per-class F1 (``zero_division=0``)."""

    kind: _Kind = "f1"


_EXACT_FIELDS = ("scores", "labels")
"""The fields of an exact :class:`RocAuc` state: chunks of every row's scores and labels."""
AUC_BINS = 1024
"""Bins of a binned :class:`RocAuc`'s score grid (default)."""
AUC_LIMIT = 16.0
"""A binned :class:`RocAuc`'s grid spans log-odds ``[-AUC_LIMIT, AUC_LIMIT]``; scores beyond
it fall into the end bins (probabilities within about ``1e-7`` of 0 or 1)."""


class RocAuc(Metric):
    """ROC AUC: binary on class 1's probability; one-vs-rest macro for more classes.

    **Binned** (the default, ``bins=AUC_BINS``): each class's scores are counted on a
    fixed grid of ``bins`` equal steps in log-odds (``log p - log(1 - p)`` in float64:
    ``s1 - s0`` for two classes) over ``[-AUC_LIMIT, AUC_LIMIT]``, positives and all rows
    apart; the AUC is that of the binned scores, rows of one bin counted as ties (half),
    as scikit-learn counts tied scores. Its state is ``2 x bins`` counts per class, the
    same size for 100 rows as for 100 million, and merging adds counts (exact, in any
    order). It differs from the exact AUC only through positive and negative rows that
    share a bin, by at most half their share of all positive-negative pairs: about
    ``1e-5`` on 40,000 rows of 10 classes here (the grid's step is 1/32 in log-odds).

    **Exact** (``bins=None``): the state buffers every row's probabilities and label
    (one chunk of little-endian bytes in base64 per unit, the scores in the outputs'
    float dtype, bit for bit; merging concatenates the chunks), so the AUC equals
    scikit-learn's. The state, and so each validation ``unit_end`` event, grows with
    the rows: 10,000 rows of 10 classes are 0.6 MB of event log per unit.

    Either way it is computed on validation passes only. A binned metric merges an
    exact state (older logs) by binning its probabilities; :meth:`value` reads either.

    Args:
        num_classes: Number of classes (at least 2).
        bins: Bins of the score grid (at least 2), or ``None`` for the exact AUC.

    Raises:
        ValueError: ``num_classes`` or ``bins`` breaks the rules above.
    """

    name = "roc_auc"
    mode: Mode = "max"
    on_train = False

    def __init__(self, num_classes: int, *, bins: int | None = AUC_BINS) -> None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes must be an int >= 2, got {num_classes!r}")
        if bins is not None and (isinstance(bins, bool) or not isinstance(bins, int) or bins < 2):
            raise ValueError(f"bins must be an int >= 2 or None (exact), got {bins!r}")
        self.num_classes = num_classes
        self.bins = bins

    @property
    def _columns(self) -> int:
        """Classes with a curve of their own: class 1 alone when binary."""
        return 1 if self.num_classes == 2 else self.num_classes

    def init(self, device: torch.device) -> Accumulator:
        """Return zero counts (binned), or empty buffers (exact)."""
        if self.bins is None:
            return {"scores": [], "labels": []}
        return {
            "counts": torch.zeros(2 * self._columns * self.bins, dtype=torch.int64, device=device)
        }

    def update(self, acc: Accumulator, outputs: torch.Tensor, labels: torch.Tensor) -> None:
        """Count the batch's binned scores (binned), or keep its probabilities (exact)."""
        self.update_batch(acc, Batch(outputs.detach(), labels.detach()))

    def update_batch(self, acc: Accumulator, batch: Batch) -> None:
        """As :meth:`update`; the float64 scores and their normalizer shared with log loss."""
        labels = _labels(batch)
        if self.bins is None:
            probabilities = torch.softmax(_scores(batch), dim=1)
            kept = probabilities[:, 1] if self.num_classes == 2 else probabilities
            acc["scores"].append(kept)
            acc["labels"].append(labels)
            return
        logit = _log_odds(batch)
        if self.num_classes == 2:
            logit = logit[:, 1:]  # class 1's column alone
        acc["counts"] += _bin_counts(logit, labels, self.num_classes, self.bins)

    def state(self, acc: Accumulator) -> State:
        """Return the grid and its counts (binned), or one chunk of each buffer (exact)."""
        if self.bins is not None:
            counts = acc["counts"].cpu().numpy()
            return {"bins": self.bins, "limit": AUC_LIMIT, "counts": _encode_counts(counts)}
        if not acc["labels"]:
            return {"scores": [], "labels": []}
        scores_tensor = torch.cat(acc["scores"]).cpu()
        if scores_tensor.dtype not in (torch.float32, torch.float64):
            scores_tensor = scores_tensor.float()  # half, bfloat16: exact in float32
        scores = scores_tensor.numpy()
        labels = torch.cat(acc["labels"]).cpu().numpy().astype("<i4")
        return {"scores": [_encode(scores)], "labels": [_encode(labels)]}

    def merge(self, a: State, b: State) -> State:
        """Add the counts (an exact state is binned first), or concatenate two exact states.

        Raises:
            ValueError: Two binned states on different grids.
        """
        if "counts" not in a and "counts" not in b:
            return {key: list(a[key]) + list(b[key]) for key in _EXACT_FIELDS}
        grid = a if "counts" in a else b
        counts = self._counts(a, grid) + self._counts(b, grid)
        return {"bins": grid["bins"], "limit": grid["limit"], "counts": _encode_counts(counts)}

    def merge_all(self, states: Sequence[State]) -> State:
        """As :meth:`merge` left to right, each state decoded once and the sum encoded once.

        Pairwise, a trial's P validation units cost P - 1 decodes and encodes of the
        merged counts (at P = 64 with 10 classes, merging and the value took 19 ms on the
        driver, now 3.8 ms); the counts add exactly, so the result is the same. The grid
        is the first binned state's, as pairwise.

        Raises:
            ValueError: ``states`` is empty, or two binned states are on different grids.
        """
        if len(states) < 2:
            return super().merge_all(states)
        grid = next((state for state in states if "counts" in state), None)
        if grid is None:
            return {
                key: [chunk for state in states for chunk in state[key]] for key in _EXACT_FIELDS
            }
        total = self._counts(states[0], grid).astype(np.int64)  # a copy of its own
        for state in states[1:]:
            total += self._counts(state, grid)
        return {"bins": grid["bins"], "limit": grid["limit"], "counts": _encode_counts(total)}

    def _counts(self, state: State, grid: State) -> np.ndarray:
        """``state``'s counts on ``grid``'s bins (an exact state's probabilities binned)."""
        bins, limit = int(grid["bins"]), float(grid["limit"])
        if "counts" in state:
            if (int(state["bins"]), float(state["limit"])) != (bins, limit):
                raise ValueError(
                    f"cannot merge roc_auc states on different grids: bins={state['bins']}, "
                    f"limit={state['limit']} and bins={bins}, limit={limit}"
                )
            return _decode_counts(state["counts"])
        if not state["labels"]:
            return np.zeros(2 * self._columns * bins, dtype=np.int64)
        labels, probabilities = self._exact_rows(state)
        if self.num_classes == 2:  # the class-1 column alone
            probabilities = probabilities.reshape(-1, 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            logit = np.log(probabilities) - np.log1p(-probabilities)
        counts = _bin_counts(
            torch.from_numpy(logit), torch.from_numpy(labels), self.num_classes, bins, limit
        )
        return counts.numpy()

    def _exact_rows(self, state: State) -> tuple[np.ndarray, np.ndarray]:
        """An exact state's labels and float64 probabilities (``(N,)`` binary, else ``(N, C)``)."""
        labels = np.concatenate([_decode(chunk) for chunk in state["labels"]]).astype(np.int64)
        scores = np.concatenate([_decode(chunk) for chunk in state["scores"]])
        scores = scores.astype(np.float64)
        if self.num_classes == 2:
            return labels, scores
        return labels, scores.reshape(labels.size, self.num_classes)

    def value(self, state: State) -> float:
        """Return the AUC (``nan`` when a class has no positive or no negative row)."""
        if "counts" in state:
            counts = _decode_counts(state["counts"]).reshape(2, -1, int(state["bins"]))
            return _binned_auc(counts[0], counts[1])
        if not state["labels"]:
            return math.nan
        labels, scores = self._exact_rows(state)
        if self.num_classes == 2:
            return binary_auc(scores, labels == 1)
        aucs = [binary_auc(scores[:, c], labels == c) for c in range(self.num_classes)]
        return float(np.mean(aucs))


def _log_odds(batch: Batch) -> torch.Tensor:
    """Each column's log-odds ``log p - log(1 - p)`` under the softmax, in float64.

    Two columns: ``s1 - s0`` and its negation, exactly; more, from ``log p = s -
    logsumexp(s)`` (the normalizer log loss shares) and ``log(1 - p)`` as
    ``log(-expm1(log p))``, exact near ``p = 1``.
    """
    scores = _scores64(batch)
    if scores.shape[1] == 2:
        difference = scores[:, 1:] - scores[:, :1]
        return torch.cat([-difference, difference], dim=1)
    log_p = scores - _log_normalizer(batch)
    return log_p - torch.log(-torch.expm1(log_p))


def _bin_counts(
    logit: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    bins: int,
    limit: float = AUC_LIMIT,
) -> torch.Tensor:
    """Counts of ``(N, C)`` log-odds on the grid: positives, then all rows, per class.

    Binary: one ``(N, 1)`` column, class 1's. A ``nan`` score counts in the lowest bin. One
    ``bincount`` a call (on a GPU it reads its input's maximum back: once per group of
    batches, not per batch).
    """
    position = torch.nan_to_num((logit + limit) * (bins / (2 * limit)), nan=0.0)
    index = position.floor().clamp(0, bins - 1).long()
    if num_classes == 2:
        own = index[labels == 1].reshape(-1)
    else:
        index = index + torch.arange(num_classes, device=index.device) * bins
        own = index.gather(1, labels.reshape(-1, 1)).reshape(-1)
    size = index.shape[1] * bins
    positives = torch.bincount(own, minlength=size)
    every = torch.bincount(index.reshape(-1), minlength=size)
    return torch.cat([positives, every])


def _binned_auc(positives: np.ndarray, every: np.ndarray) -> float:
    """Mean over classes of the AUC of binned scores, each bin's rows tied (half).

    ``positives`` and ``every`` are ``(classes, bins)`` counts; ``nan`` when a class has
    no positive or no negative row.
    """
    positives = positives.astype(np.float64)
    negatives = every.astype(np.float64) - positives
    below = np.cumsum(negatives, axis=1) - negatives  # negatives in lower bins
    pairs = positives.sum(axis=1) * negatives.sum(axis=1)
    if np.any(pairs == 0):
        return math.nan
    ahead = (positives * (below + negatives / 2)).sum(axis=1)
    return float(np.mean(ahead / pairs))


def _encode_counts(counts: np.ndarray) -> str:
    """``"<dtype>:zlib:<base64>"`` of flat counts.

    The dtype is the narrowest of ``<u2``, ``<u4`` and ``<i8`` that holds them: a third
    smaller than int64 after compression.
    """
    flat = counts.reshape(-1)
    largest = int(flat.max()) if flat.size else 0
    dtype = "<u2" if largest < 2**16 else "<u4" if largest < 2**32 else "<i8"
    data = np.ascontiguousarray(flat, dtype=dtype).tobytes()
    return f"{dtype}:zlib:" + base64.b64encode(zlib.compress(data, 1)).decode("ascii")


def _decode_counts(text: str) -> np.ndarray:
    dtype, codec, data = text.split(":", 2)
    if codec != "zlib":
        raise ValueError(f"unknown roc_auc counts encoding {codec!r} (expected 'zlib')")
    return np.frombuffer(zlib.decompress(base64.b64decode(data)), dtype=np.dtype(dtype)).astype(
        np.int64
    )


def _encode(array: np.ndarray) -> str:
    """``"<dtype>:<base64 of the little-endian bytes>"`` of a flat array."""
    flat = np.ascontiguousarray(array.reshape(-1))
    little = flat.astype(flat.dtype.newbyteorder("<"), copy=False)
    return f"{little.dtype.str}:{base64.b64encode(little.tobytes()).decode('ascii')}"


def _decode(chunk: str) -> np.ndarray:
    dtype, _, data = chunk.partition(":")
    return np.frombuffer(base64.b64decode(data), dtype=np.dtype(dtype))


def binary_auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """ROC AUC from ranks (Mann-Whitney U), ties counted half; ``nan`` for one class only."""
    positives = int(positive.sum())
    negatives = int(positive.size - positives)
    if positives == 0 or negatives == 0:
        return math.nan
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    average_rank = ends - (counts - 1) / 2.0  # 1-based mean rank of each distinct score
    rank_sum = float(average_rank[inverse][positive].sum())
    return (rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives)


class LogLoss(Metric):
    """Mean negative log-likelihood of the label under the softmax of the outputs."""

    name = "log_loss"
    mode: Mode = "min"

    def __init__(self, *, on_train: bool = False) -> None:
        self.on_train = on_train

    def init(self, device: torch.device) -> Accumulator:
        """Return a zero sum and count."""
        return {"sum": scalar(device), "count": count(device)}

    def update(self, acc: Accumulator, outputs: torch.Tensor, labels: torch.Tensor) -> None:
        """Add the batch's summed ``-log p(label)`` (float64)."""
        self.update_batch(acc, Batch(outputs, labels))

    def update_batch(self, acc: Accumulator, batch: Batch) -> None:
        """Add ``sum(logsumexp(scores) - score of the label)`` in float64."""
        own = _own_scores(batch).reshape(-1).to(torch.float64)
        acc["sum"] += (_log_normalizer(batch).reshape(-1) - own).sum()
        acc["count"] += batch.labels.shape[0]

    def value(self, state: State) -> float:
        """Return the mean."""
        return ratio(state["sum"], state["count"])
