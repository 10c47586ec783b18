"""The default ``roc_auc`` worked out apart from the metric: scikit-learn's AUC of each
score's bin on the grid (numpy, float64), for the tests of the metric and of a run."""

import math

import numpy as np
from sklearn import metrics as skm


def auc_bins(logits: np.ndarray, bins: int = 1024, limit: float = 16.0) -> np.ndarray:
    """Each score's bin on the default roc_auc grid: ``bins`` steps of log-odds in
    ``[-limit, limit]`` (written apart from the metric: numpy, float64)."""
    scores = logits.astype(np.float64)
    if scores.shape[1] == 2:  # class 1's log-odds, exactly (class 0's column: unused)
        logit = np.repeat(scores[:, 1:] - scores[:, :1], 2, axis=1)
    else:
        shifted = scores - scores.max(axis=1, keepdims=True)
        log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        with np.errstate(divide="ignore"):
            logit = log_p - np.log(-np.expm1(log_p))
    return np.clip(np.floor((logit + limit) * bins / (2 * limit)), 0, bins - 1)


def sklearn_auc(labels: np.ndarray, scores: np.ndarray, classes: int) -> float:
    if len(np.unique(labels)) < classes:
        return math.nan
    if classes == 2:
        return skm.roc_auc_score(labels, scores[:, 1])
    per_class = [skm.roc_auc_score(labels == c, scores[:, c]) for c in range(classes)]
    return float(np.mean(per_class))  # multi_class="ovr", average="macro"
