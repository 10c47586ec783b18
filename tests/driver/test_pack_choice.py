"""``pack: auto`` (issue 27): the pre-flight measures each family's throughput curve and the
resolved config holds the pack size chosen from them."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest

from cerebro_spark.driver import _pack_choice
from cerebro_spark.driver._preflight import preflight
from cerebro_spark.engine import parse_config
from cerebro_spark.errors import ConfigError
from cerebro_spark.store import open_store
from cerebro_spark.training import choose_pack_size
from tests.driver.test_preflight import CUSTOM, MLP, raw_config

pytestmark = pytest.mark.torch

TWO_FAMILIES = {
    "choice": [
        {"model": MLP, "hidden_units": [8], "batch_size": 16},
        {"model": CUSTOM, "hidden_units": [8], "batch_size": 16},
    ]
}


def auto_config(tmp_path: Any, **changes: Any) -> Any:
    raw = raw_config(
        tmp_path,
        **{
            "pack": "auto",
            "space": TWO_FAMILIES,
            "metric": "loss",
            "procedure": {"name": "random", "num_trials": 32},
            **changes,
        },
    )
    del raw["model"]
    return parse_config(raw)


def test_auto_measures_every_family_and_packs_the_smallest_choice(tmp_path: Any) -> None:
    checked = preflight(auto_config(tmp_path), open_store(str(tmp_path)))
    choice = checked.pack_choice
    assert choice is not None and choice.device == "cpu"
    assert set(choice.curves) == {MLP, CUSTOM}
    for curve in choice.curves.values():
        assert sorted(curve) == [1, 2, 4, 8, 16]
        assert all(rate > 0 for rate in curve.values())
    counts = _pack_choice.first_trials(checked.config)
    assert sum(counts.values()) == 32 and set(counts) == {MLP, CUSTOM}
    expected = min(
        choose_pack_size(curve, trials=counts[spec], workers=2)
        for spec, curve in choice.curves.items()
    )
    assert checked.pack_size == choice.pack_size == expected
    assert checked.config.pack == expected  # what config.json holds: a resume packs the same


def fake_curves(curves: dict[str, dict[int, float] | None]) -> Any:
    def pack_throughput(task: Any, data: Any, info: Any, **options: Any) -> dict[int, float]:
        assert options["max_k"] == 16 and options["device"] == "cpu"
        assert data.split == "train" and data.index == 0 and data.rows > 0
        curve = curves[task.spec]
        if curve is None:
            raise ConfigError("sequence columns cannot be packed")
        return curve

    return pack_throughput


def test_a_family_that_cannot_pack_leaves_the_choice_to_the_others(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    curve = {1: 100.0, 2: 190.0, 4: 300.0, 8: 301.0}
    monkeypatch.setattr(_pack_choice, "pack_throughput", fake_curves({MLP: curve, CUSTOM: None}))
    with caplog.at_level(logging.INFO, logger="cerebro_spark.driver._pack_choice"):
        checked = preflight(auto_config(tmp_path), open_store(str(tmp_path)))
    assert checked.pack_size == 4 and checked.config.pack == 4
    assert checked.pack_choice is not None and list(checked.pack_choice.curves) == [MLP]
    assert f"model family {CUSTOM} does not pack" in caplog.text
    # the smallest family choice wins: one that gains nothing past 2 keeps the run at 2
    flat = {1: 100.0, 2: 150.0, 4: 151.0}
    monkeypatch.setattr(_pack_choice, "pack_throughput", fake_curves({MLP: curve, CUSTOM: flat}))
    assert preflight(auto_config(tmp_path), open_store(str(tmp_path))).pack_size == 2
    # nothing packs: off
    monkeypatch.setattr(_pack_choice, "pack_throughput", fake_curves({MLP: None, CUSTOM: None}))
    checked = preflight(auto_config(tmp_path), open_store(str(tmp_path)))
    assert checked.pack_size == 1 and checked.config.pack == 1


def test_auto_keeps_every_worker_busy_when_the_search_has_few_trials(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the peers' small-lrs curve: one pack of 16 is the fastest per trial row, but 16
    # trials in one pack leave one of two workers idle; two packs of 8 keep both busy
    curve = {1: 1392.0, 2: 1576.0, 4: 11222.0, 8: 18984.0, 16: 26329.0}
    monkeypatch.setattr(_pack_choice, "pack_throughput", fake_curves({MLP: curve}))
    space = {
        "model": MLP,
        "hidden_units": [8],
        "batch_size": 16,
        "lr": {"grid": [0.01 * (i + 1) for i in range(16)]},
    }
    config = auto_config(tmp_path, space=space, procedure="grid")
    assert _pack_choice.first_trials(config) == {MLP: 16}
    assert preflight(config, open_store(str(tmp_path))).pack_size == 8
    config = auto_config(tmp_path, space=space, procedure="grid", workers=1)
    assert preflight(config, open_store(str(tmp_path))).pack_size == 16
    few = {**space, "lr": {"grid": [0.1, 0.2, 0.3]}}  # never more than the trials
    assert (
        preflight(
            auto_config(tmp_path, space=few, procedure="grid"), open_store(str(tmp_path))
        ).pack_size
        == 1
    )


def test_a_given_size_is_not_measured(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_pack_choice, "pack_throughput", fake_curves({}))  # KeyError if called
    for pack, size in (("off", 1), (3, 3)):
        checked = preflight(auto_config(tmp_path, pack=pack), open_store(str(tmp_path)))
        assert checked.pack_size == size and checked.pack_choice is None


def test_the_curve_is_measured_where_the_workers_train_when_the_driver_can(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_pack_choice.torch.cuda, "is_available", lambda: False)
    with caplog.at_level(logging.WARNING, logger="cerebro_spark.driver._pack_choice"):
        assert _pack_choice._probe_device("cpu") == "cpu"
        assert _pack_choice._probe_device("auto") == "cpu"
        assert not caplog.records
        assert _pack_choice._probe_device("cuda:1") == "cpu"
    assert "no GPU" in caplog.text and "'cuda:1'" in caplog.text and "pack: N" in caplog.text
    monkeypatch.setattr(_pack_choice.torch.cuda, "is_available", lambda: True)
    assert _pack_choice._probe_device("auto") == "cuda"
    assert _pack_choice._probe_device("cuda:1") == "cuda:1"
    assert _pack_choice._probe_device("cpu") == "cpu"


def test_a_given_size_on_sequence_columns_is_refused_naming_the_column(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cerebro_spark.driver import _preflight

    real = _preflight.resolve_dataset

    def with_a_sequence(config: Any, store: Any) -> Any:
        uri, manifest = real(config, store)
        first = dataclasses.replace(manifest.features[0], name="tokens", kind="sequence")
        return uri, dataclasses.replace(manifest, features=(first, *manifest.features[1:]))

    monkeypatch.setattr(_preflight, "resolve_dataset", with_a_sequence)
    with pytest.raises(ConfigError, match=r"column .tokens. is a sequence.*pack: off"):
        preflight(auto_config(tmp_path, pack=4), open_store(str(tmp_path)))


SPARSE = "tests.training.training_fixtures:SparseTableSpec"


def test_a_given_size_on_a_model_with_sparse_gradients_is_refused(tmp_path: Any) -> None:
    config = auto_config(
        tmp_path, pack=4, space={"model": SPARSE, "hidden_units": [8], "batch_size": 16}
    )
    with pytest.raises(ConfigError, match=r"the pack check raised.*sparse_embeddings: false"):
        preflight(config, open_store(str(tmp_path)))


def test_auto_leaves_a_family_with_sparse_gradients_unpacked(tmp_path: Any) -> None:
    space = {
        "choice": [
            {"model": MLP, "hidden_units": [8], "batch_size": 16},
            {"model": SPARSE, "hidden_units": [8], "batch_size": 16},
        ]
    }
    checked = preflight(auto_config(tmp_path, space=space), open_store(str(tmp_path)))
    assert checked.pack_choice is not None and set(checked.pack_choice.curves) == {MLP}
