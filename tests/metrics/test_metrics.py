"""Every built-in metric equals scikit-learn's on the same predictions, however the rows
are split into batches and units and however the units' states are merged."""

import itertools
import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn import metrics as skm

from cerebro_spark.metrics import (
    F1,
    R2,
    Accuracy,
    Batch,
    BatchMean,
    LogLoss,
    Loss,
    MeanAbsoluteError,
    MeanSquaredError,
    Metric,
    Precision,
    Recall,
    RocAuc,
    TopKAccuracy,
    binary_auc,
    check_metrics,
    default_metric,
    default_metrics,
    merge_states,
    metric_modes,
)
from cerebro_spark.metrics._classification import (
    _class_counts,
    _decode_counts,
    _encode_counts,
    _one_hot_counts,
)
from tests.metrics.auc_reference import auc_bins, sklearn_auc

pytestmark = pytest.mark.torch

CPU = torch.device("cpu")


def split_points(rng: np.random.Generator, n: int, parts: int) -> list[int]:
    cuts = sorted(rng.choice(np.arange(1, n), size=min(parts - 1, n - 1), replace=False))
    return [0, *(int(c) for c in cuts), n]


def unit_states(metric: Metric, outputs, labels, rng: np.random.Generator, units: int):
    """Split rows into units, each into batches; return each unit's JSON state."""
    n = labels.shape[0]
    bounds = split_points(rng, n, units)
    states = []
    for start, end in itertools.pairwise(bounds):
        acc = metric.init(CPU)
        inner = split_points(rng, end - start, int(rng.integers(1, 5)))
        for a, b in itertools.pairwise(inner):
            metric.update(acc, outputs[start + a : start + b], labels[start + a : start + b])
        states.append(json.loads(json.dumps(metric.state(acc))))  # the wire and the log
    return states


def merged_value(metric: Metric, states: list, rng: np.random.Generator) -> float:
    """Merge in a random order and a random tree shape."""
    pool = [states[i] for i in rng.permutation(len(states))]
    while len(pool) > 1:
        i = int(rng.integers(0, len(pool) - 1))
        pool[i : i + 2] = [metric.merge(pool[i], pool[i + 1])]
    return metric.value(pool[0])


def classification_data(seed: int, n: int, classes: int):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, size=n)
    logits = rng.normal(size=(n, classes)).astype(np.float32)
    logits[np.arange(n), labels] += rng.uniform(0, 2)  # better than chance
    if seed % 3 == 0:
        logits = np.round(logits, 1)  # ties in scores and in argmax
    return torch.from_numpy(logits), torch.from_numpy(labels)


def reference(name: str, logits: np.ndarray, labels: np.ndarray, classes: int) -> float:
    proba = torch.softmax(torch.from_numpy(logits), dim=1).numpy()
    predicted = logits.argmax(axis=1)
    present = np.unique(np.concatenate([labels, predicted]))
    if name == "accuracy":
        return skm.accuracy_score(labels, predicted)
    if name.startswith("top"):
        k = int(name[3 : name.index("_")])
        # sklearn breaks ties by an unstable sort; ours ranks the lower class first
        own = logits[np.arange(len(labels)), labels][:, None]
        lower = np.arange(classes)[None, :] < labels[:, None]
        ahead = (logits > own) | ((logits == own) & lower)
        ours = float(np.mean(ahead.sum(axis=1) < k))
        if len(np.unique(logits, axis=None)) == logits.size:  # no ties: sklearn's exactly
            assert ours == pytest.approx(
                skm.top_k_accuracy_score(labels, logits, k=k, labels=range(classes))
            )
        return ours
    kind, _, which = name.partition("_")
    scorer = {"precision": skm.precision_score, "recall": skm.recall_score, "f1": skm.f1_score}
    if kind in scorer and which == "macro":
        return scorer[kind](labels, predicted, average="macro", labels=present, zero_division=0)
    if kind in scorer:
        c = int(which.removeprefix("class_"))
        return scorer[kind](labels, predicted, labels=[c], average=None, zero_division=0)[0]
    if name == "roc_auc":  # the default, binned: sklearn's AUC of the bin of each score
        return sklearn_auc(labels, auc_bins(logits), classes)
    if name == "roc_auc_exact":
        return sklearn_auc(labels, proba, classes)
    if name == "log_loss":
        exact = torch.softmax(torch.from_numpy(logits).double(), dim=1).numpy()
        return skm.log_loss(labels, exact, labels=range(classes))
    raise AssertionError(name)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(2, 300),
    classes=st.integers(2, 7),
    units=st.integers(1, 6),
)
def test_classification_metrics_equal_sklearn(seed, n, classes, units):
    logits, labels = classification_data(seed, n, classes)
    rng = np.random.default_rng(seed + 1)
    exact_auc = RocAuc(classes, bins=None)
    exact_auc.name = "roc_auc_exact"
    for metric in [*default_metrics("classification", classes), exact_auc]:
        states = unit_states(metric, logits, labels, rng, units)
        got = merged_value(metric, states, rng)
        want = reference(metric.name, logits.numpy(), labels.numpy(), classes)
        if math.isnan(want):
            assert math.isnan(got), metric.name
        else:
            assert got == pytest.approx(want, rel=1e-9, abs=1e-12), metric.name


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(0, 200), classes=st.integers(2, 12))
def test_metrics_sharing_one_batch_get_what_each_computes_alone(seed, n, classes):
    """A unit hands every metric one Batch (the argmax, the label's score and rank, the
    class counts computed once): each state is the one the metric computes alone, also
    for metrics whose shared values differ (two k, two numbers of classes)."""
    logits, labels = classification_data(seed, n, classes)
    metrics = [
        *default_metrics("classification", classes),
        TopKAccuracy(1),
        TopKAccuracy(classes),
        Precision(classes + 1),
        F1(classes + 2, classes),
    ]
    shared = Batch(logits, labels)
    for metric in metrics:
        alone, together = metric.init(CPU), metric.init(CPU)
        metric.update(alone, logits, labels)
        metric.update_batch(together, shared)
        assert metric.state(alone) == metric.state(together), metric.name
    # the one-hot counts a GPU computes are the CPU's bincounts
    counts = _class_counts(Batch(logits, labels), classes)
    predicted = logits.argmax(dim=1)
    assert [c.tolist() for c in counts] == [
        c.tolist() for c in _one_hot_counts(labels, predicted, classes)
    ]
    # log loss as before (log_softmax in float64) to the last bits
    acc = LogLoss().init(CPU)
    LogLoss().update_batch(acc, shared)
    before = -torch.log_softmax(logits.double(), dim=1).gather(1, labels.reshape(-1, 1)).sum()
    assert float(acc["sum"]) == pytest.approx(float(before), rel=1e-12, abs=1e-12)


def test_classes_outside_the_range_are_not_counted():
    logits = torch.tensor([[0.0, 1.0, 3.0], [2.0, 0.0, 0.0], [0.0, 5.0, 0.0]])
    labels = torch.tensor([2, 0, 1])
    precision = Precision(2)  # the model has a third output the metric does not know
    acc = precision.init(CPU)
    precision.update(acc, logits, labels)
    assert precision.state(acc) == {"tp": [1, 1], "predicted": [1, 1], "true": [1, 1]}


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n=st.integers(2, 300),
    units=st.integers(1, 6),
    offset=st.sampled_from([0.0, 1e4]),
)
def test_regression_metrics_equal_sklearn(seed, n, units, offset):
    rng = np.random.default_rng(seed)
    labels = (offset + rng.normal(scale=50, size=n)).astype(np.float32)
    outputs = (labels + rng.normal(scale=30, size=n)).astype(np.float32).reshape(n, 1)
    y, p = labels.astype(np.float64), outputs.reshape(-1).astype(np.float64)
    want = {
        "mae": skm.mean_absolute_error(y, p),
        "mse": skm.mean_squared_error(y, p),
        "rmse": math.sqrt(skm.mean_squared_error(y, p)),
        "r2": skm.r2_score(y, p),
    }
    for metric in default_metrics("regression", None):
        predicted, truth = torch.from_numpy(outputs), torch.from_numpy(labels)
        states = unit_states(metric, predicted, truth, rng, units)
        assert merged_value(metric, states, rng) == pytest.approx(want[metric.name], rel=1e-9)


def test_rmse_is_the_root_of_the_whole_split_not_a_mean_of_batch_roots():
    # The symptom: per-batch RMSEs averaged differ from sqrt(MSE) of the split.
    labels = torch.tensor([0.0, 0.0, 0.0, 10.0])
    outputs = torch.tensor([[1.0], [1.0], [1.0], [0.0]])
    metric = MeanSquaredError(root=True)
    acc = metric.init(CPU)
    metric.update(acc, outputs[:2], labels[:2])
    metric.update(acc, outputs[2:], labels[2:])
    assert metric.value(metric.state(acc)) == pytest.approx(math.sqrt(103 / 4))


def test_binary_auc_with_ties_and_one_output_column():
    labels = torch.tensor([0, 0, 1, 1, 1, 0])
    logit = torch.tensor([0.1, 0.4, 0.4, 0.8, -1.0, 0.1])
    metric = RocAuc(2)
    acc = metric.init(CPU)
    metric.update(acc, logit.reshape(-1, 1), labels)
    want = skm.roc_auc_score(labels.numpy(), torch.sigmoid(logit).numpy())
    assert metric.value(metric.state(acc)) == pytest.approx(want)
    accuracy = Accuracy()
    acc = accuracy.init(CPU)
    accuracy.update(acc, logit, labels)
    assert accuracy.value(accuracy.state(acc)) == pytest.approx(
        skm.accuracy_score(labels.numpy(), (logit > 0).long().numpy())
    )


def test_empty_states_are_nan_and_merge_with_nothing_is_identity():
    for metric in [*default_metrics("classification", 3), *default_metrics("regression", None)]:
        empty = json.loads(json.dumps(metric.state(metric.init(CPU))))
        assert math.isnan(metric.value(empty)), metric.name
        logits, labels = classification_data(1, 20, 3)
        if metric.name in ("mae", "mse", "rmse", "r2"):
            logits, labels = logits[:, :1], labels.float()
        acc = metric.init(CPU)
        metric.update(acc, logits, labels)
        full = metric.state(acc)
        assert metric.value(metric.merge(empty, full)) == pytest.approx(metric.value(full))
        assert metric.value(metric.merge(full, empty)) == pytest.approx(metric.value(full))


def test_auc_is_nan_when_a_class_is_missing():
    assert math.isnan(binary_auc(np.array([0.1, 0.2]), np.array([True, True])))


def test_loss_and_batch_mean_weight_batches_by_rows():
    loss = Loss()
    acc = loss.init(CPU)
    loss.add(acc, torch.tensor(1.0), 3)
    loss.add(acc, torch.tensor(3.0), 1)
    assert loss.value(loss.state(acc)) == pytest.approx(1.5)
    legacy = BatchMean("hits")
    acc = legacy.init(CPU)
    legacy.add(acc, 0.5, 2)
    legacy.add(acc, torch.tensor(1.0), 2)
    assert legacy.value(legacy.state(acc)) == pytest.approx(0.75)
    with pytest.raises(TypeError, match=r"Loss\.add"):
        loss.update(acc, torch.zeros(1), torch.zeros(1))


def test_default_sets_names_and_modes():
    names = [m.name for m in default_metrics("classification", 3)]
    assert names[:4] == ["accuracy", "precision_macro", "recall_macro", "f1_macro"]
    assert "f1_class_2" in names and "roc_auc" in names and "log_loss" in names
    assert "top5_accuracy" not in names
    many = [m.name for m in default_metrics("classification", 12)]
    assert "top5_accuracy" in many and "f1_class_0" not in many
    assert "roc_auc" in [m.name for m in default_metrics("classification", 100)]
    assert "roc_auc" not in [m.name for m in default_metrics("classification", 101)]
    modes = metric_modes(default_metrics("regression", None))
    assert modes == {"loss": "min", "mae": "min", "mse": "min", "rmse": "min", "r2": "max"}
    assert default_metric("classification") == "accuracy"
    assert default_metric("regression") == "rmse"
    assert {m.name: m.mode for m in default_metrics("classification", 2)}["log_loss"] == "min"


def test_bad_metrics_are_refused_with_the_rule():
    with pytest.raises(ValueError, match="reserved for the loss"):
        check_metrics([BatchMean("loss")], "build_metrics")
    with pytest.raises(ValueError, match="two metrics are named 'accuracy'"):
        check_metrics([Accuracy(), Accuracy()], "build_metrics")
    with pytest.raises(TypeError, match="must return Metric instances"):
        check_metrics(["accuracy"], "build_metrics")  # type: ignore[list-item]
    with pytest.raises(ValueError, match="mode 'up'"):
        check_metrics([BatchMean("x", "up")], "build_metrics")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k >= 1"):
        TopKAccuracy(0)
    with pytest.raises(ValueError, match="class index"):
        F1(3, 3)
    with pytest.raises(ValueError, match="task must be"):
        default_metrics("ranking", None)
    with pytest.raises(ValueError, match="num_classes must be an int >= 2, got 1"):
        Precision(1)


def test_merge_states_of_many_units_in_order():
    metric = Recall(2)
    states = [{"tp": [1, 0], "predicted": [1, 1], "true": [2, 0]}] * 3
    assert merge_states(metric, states) == {"tp": [3, 0], "predicted": [3, 3], "true": [6, 0]}
    assert merge_states(metric, []) is None
    empty = {"count": 0, "mean": 0.0, "m2": 0.0, "sse": 0.0}
    one = {"count": 1, "mean": 2.0, "m2": 0.0, "sse": 1.0}
    assert R2().merge(empty, one) == one
    assert LogLoss().mode == "min" and MeanAbsoluteError().mode == "min"


def test_auc_of_half_precision_outputs_and_the_compact_state():
    labels = torch.tensor([0, 1, 1, 0, 1])
    logits = torch.tensor([[0.1, 0.3], [0.2, 0.9], [0.5, 0.4], [0.0, -1.0], [1.0, 1.5]])
    metric = RocAuc(2, bins=None)
    acc = metric.init(CPU)
    metric.update(acc, logits.to(torch.bfloat16), labels)
    state = json.loads(json.dumps(metric.state(acc)))
    assert all(isinstance(chunk, str) for chunk in state["scores"] + state["labels"])
    proba = torch.softmax(logits.to(torch.bfloat16), dim=1)[:, 1].float().numpy()
    assert metric.value(state) == pytest.approx(skm.roc_auc_score(labels.numpy(), proba))


def auc_states(metric: RocAuc, logits: torch.Tensor, labels: torch.Tensor, units: int) -> list:
    states = []
    for part in range(units):
        acc = metric.init(CPU)
        metric.update(acc, logits[part::units], labels[part::units])
        states.append(json.loads(json.dumps(metric.state(acc))))
    return states


@pytest.mark.parametrize("classes", [2, 10])
def test_binned_auc_is_within_1e_4_of_the_exact_auc_on_many_rows(classes):
    logits, labels = classification_data(1, 40_000, classes)
    binned, exact = RocAuc(classes), RocAuc(classes, bins=None)
    got = merge_states(binned, auc_states(binned, logits, labels, 4))
    want = merge_states(exact, auc_states(exact, logits, labels, 4))
    assert abs(binned.value(got) - exact.value(want)) < 1e-4
    proba = torch.softmax(logits, dim=1).numpy()
    assert exact.value(want) == pytest.approx(sklearn_auc(labels.numpy(), proba, classes))


def test_binned_auc_state_does_not_grow_with_the_rows():
    metric = RocAuc(10)
    sizes = []
    for rows in (1_000, 200_000):
        logits, labels = classification_data(2, rows, 10)
        (state,) = auc_states(metric, logits, labels, 1)
        sizes.append(len(json.dumps(state)))
    assert sizes[1] < 40_000  # the exact state of 200,000 rows: 11 MB
    exact = RocAuc(10, bins=None)
    (state,) = auc_states(exact, *classification_data(2, 10_000, 10), 1)
    assert len(json.dumps(state)) > 500_000


def test_binned_auc_counts_extreme_and_nan_scores_in_the_end_bins():
    logits = torch.tensor([[0.0, 1e4], [0.0, -1e4], [0.0, float("nan")], [0.0, 0.0]])
    labels = torch.tensor([1, 0, 0, 1])
    metric = RocAuc(2)
    acc = metric.init(CPU)
    metric.update(acc, logits, labels)
    counts = acc["counts"].reshape(2, 1, 1024)
    assert counts[1, 0, 1023] == 1 and counts[1, 0, 0] == 2 and counts[1, 0, 512] == 1
    assert counts[0].sum() == 2
    assert metric.value(metric.state(acc)) == pytest.approx(1.0)


def test_binned_auc_merges_an_exact_state_of_an_older_log():
    logits, labels = classification_data(3, 2_000, 4)
    binned, exact = RocAuc(4), RocAuc(4, bins=None)
    old = auc_states(exact, logits[:1000], labels[:1000], 1)[0]
    new = auc_states(binned, logits[1000:], labels[1000:], 1)[0]
    everything = merge_states(binned, auc_states(binned, logits, labels, 2))
    for merged in (binned.merge(old, new), binned.merge(new, old), exact.merge(old, new)):
        assert "counts" in merged
        assert binned.value(merged) == pytest.approx(binned.value(everything), abs=1e-3)
    assert binned.value(old) == pytest.approx(exact.value(old))  # an exact state stays exact


def test_binned_auc_refuses_bad_bins_and_states_on_other_grids():
    with pytest.raises(ValueError, match=r"bins must be an int >= 2 or None \(exact\), got 1"):
        RocAuc(2, bins=1)
    logits, labels = classification_data(4, 50, 2)
    (coarse,) = auc_states(RocAuc(2, bins=64), logits, labels, 1)
    (fine,) = auc_states(RocAuc(2), logits, labels, 1)
    with pytest.raises(ValueError, match="different grids: bins=64"):
        RocAuc(2).merge(fine, coarse)


def test_binned_auc_counts_travel_in_the_narrowest_integer_type():
    metric = RocAuc(2, bins=4)
    for largest, dtype in ((65_535, "<u2"), (65_536, "<u4"), (2**32, "<i8")):
        counts = np.array([largest, 0, 3, 1, largest, 1, 4, 2], dtype=np.int64)
        state = {"bins": 4, "limit": 16.0, "counts": _encode_counts(counts)}
        assert state["counts"].startswith(f"{dtype}:zlib:")
        merged = metric.merge(state, state)
        assert _decode_counts(merged["counts"]).tolist() == (2 * counts).tolist()


def pairwise(metric: Metric, states: list) -> dict:
    merged = states[0]
    for state in states[1:]:
        merged = metric.merge(merged, state)
    return merged


@pytest.mark.parametrize("classes", [2, 10])
def test_merge_all_returns_what_merging_pairwise_returns(classes):
    logits, labels = classification_data(5, 600, classes)
    rng = np.random.default_rng(5)
    exact = RocAuc(classes, bins=None)
    for metric in [*default_metrics("classification", classes), exact]:
        states = unit_states(metric, logits, labels, rng, 6)
        before = json.dumps(states)
        assert json.dumps(metric.merge_all(states)) == json.dumps(pairwise(metric, states))
        assert json.dumps(states) == before, metric.name  # the states are left as they were
        assert metric.merge_all(states[:1]) is states[0]
    targets = torch.from_numpy(np.random.default_rng(6).normal(size=300))
    outputs = targets + torch.from_numpy(np.random.default_rng(7).normal(size=300))
    for metric in default_metrics("regression", None):
        states = unit_states(metric, outputs, targets, rng, 5)
        assert metric.merge_all(states) == pairwise(metric, states), metric.name


def test_binned_auc_merges_all_in_one_pass_as_pairwise_whatever_the_mix_of_old_states():
    logits, labels = classification_data(8, 1_200, 4)
    binned, exact = RocAuc(4), RocAuc(4, bins=None)
    new = auc_states(binned, logits[:600], labels[:600], 3)
    old = auc_states(exact, logits[600:], labels[600:], 3)
    for states in (new, old, [old[0], new[0], old[1], new[1]], [*old, *new], [*new, *old]):
        assert binned.merge_all(states) == pairwise(binned, states)
    assert "counts" not in binned.merge_all(old)  # exact states stay exact, in order
    (coarse,) = auc_states(RocAuc(4, bins=64), logits, labels, 1)
    with pytest.raises(ValueError, match="different grids: bins=64"):
        binned.merge_all([old[0], new[0], coarse])
    with pytest.raises(ValueError, match="roc_auc: merge_all needs at least one state"):
        binned.merge_all([])
