"""Where workers train (``ExperimentConfig.device``): the driver's checks and choices.

What torch sees is set per test (``torch.cuda.is_available`` / ``device_count``), so the
rules are checked with 0, 1 and 2 GPUs on any machine; the GPU runs themselves are in
``tests/gpu``.
"""

from __future__ import annotations

import logging

import pytest
import torch

from cerebro_spark.backends._local import LocalTransport, spread_gpu
from cerebro_spark.driver._device import (
    check_device,
    check_spark_gpus,
    local_gpus,
    pool_device,
    spark_gpu_settings,
)
from cerebro_spark.engine import parse_config
from cerebro_spark.errors import ConfigError

pytestmark = pytest.mark.torch


def config(device: str, backend: str = "local", **changes):
    return parse_config(
        {
            "name": "exp",
            "data": {"source": "sklearn:digits"},
            "model": "cerebro_spark.training:MLPSpec",
            "space": {"lr": 0.01},
            "backend": backend,
            "device": device,
            **changes,
        }
    )


@pytest.fixture
def gpus(monkeypatch):
    """Set how many GPUs torch sees: ``gpus(n)``."""

    def see(count: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)

    return see


def test_auto_spreads_local_workers_over_every_gpu_or_none(gpus):
    gpus(0)
    assert local_gpus(config("auto")) == ()
    gpus(2)
    assert local_gpus(config("auto")) == (0, 1)
    assert local_gpus(config("cuda")) == (0, 1)
    assert local_gpus(config("cpu")) == ()
    assert local_gpus(config("cuda:1")) == ()  # one GPU for all: the pool's device says it
    assert [pool_device(config(d)) for d in ("auto", "cuda", "cpu", "cuda:1")] == [
        None,
        "cuda",
        "cpu",
        "cuda:1",
    ]


def test_a_local_gpu_that_is_not_there_is_refused_by_name(gpus):
    gpus(0)
    with pytest.raises(ConfigError, match=r"device 'cuda' needs a GPU, but torch .* sees 0 GPUs"):
        check_device(config("cuda"))
    gpus(1)
    with pytest.raises(
        ConfigError, match=r"device 'cuda:1' names GPU 1, but torch .* sees 1 GPU here \(cuda:0"
    ):
        check_device(config("cuda:1"))
    check_device(config("cuda:0"))
    check_device(config("cuda", backend="spark"))  # the executors' GPUs are not the driver's


class FakeSession:
    """What check_spark_gpus reads of a SparkSession: its context's conf."""

    def __init__(self, conf: dict[str, str]) -> None:
        self.sparkContext = self
        self.conf = conf

    def getConf(self):
        return self

    def get(self, key, default=None):
        return self.conf.get(key, default)


def test_cuda_on_spark_needs_a_gpu_per_task():
    check_spark_gpus(config("cuda", "spark"), FakeSession({"spark.task.resource.gpu.amount": "1"}))
    check_spark_gpus(config("auto", "spark"), FakeSession({}))
    for conf in ({}, {"spark.task.resource.gpu.amount": "0"}):
        with pytest.raises(ConfigError, match=r"spark\.task\.resource\.gpu\.amount is"):
            check_spark_gpus(config("cuda", "spark"), FakeSession(conf))


# -- workers_per_device (issue 27): several workers share one GPU --------------------------


def test_workers_per_device_caps_the_local_workers_on_each_gpu(gpus, caplog):
    gpus(2)
    shared = config("auto", workers=8, workers_per_device=4)
    assert shared.workers_per_device == 4 and parse_config(shared.to_dict()) == shared
    assert "workers_per_device" not in config("auto").to_dict()
    assert local_gpus(shared) == (0, 1)
    with pytest.raises(
        ConfigError, match=r"workers 9 do not fit workers_per_device 4 on the 2 GPUs"
    ):
        check_device(config("auto", workers=9, workers_per_device=4))
    with pytest.raises(ConfigError, match=r"workers_per_device 2 shares GPUs, but device is 'cpu'"):
        check_device(config("cpu", workers_per_device=2))
    for bad in (0, -1, True, "4"):
        with pytest.raises(ConfigError, match="workers_per_device must"):
            config("auto", workers_per_device=bad)
    gpus(0)  # nothing to share here: the CPU, said
    with caplog.at_level(logging.WARNING, logger="cerebro_spark.driver._device"):
        assert local_gpus(config("auto", workers=8, workers_per_device=4)) == ()
    assert "workers_per_device 4 shares GPUs, but torch" in caplog.text


def test_the_local_transport_never_puts_more_workers_on_a_gpu():
    live: list[int] = []
    for _ in range(6):
        live.append(spread_gpu((0, 1, 2), live, per_gpu=2))
    assert sorted(live) == [0, 0, 1, 1, 2, 2]
    with pytest.raises(
        RuntimeError, match=r"every GPU \[0, 1, 2\] already has workers_per_device=2"
    ):
        spread_gpu((0, 1, 2), live, per_gpu=2)
    assert spread_gpu((0, 1, 2), live) == 0  # no cap: evenly, lowest first
    live.remove(1)  # a worker on GPU 1 ended: its place is free again
    assert spread_gpu((0, 1, 2), live, per_gpu=2) == 1
    with pytest.raises(ConfigError, match="workers_per_gpu must be an int >= 1, got 0"):
        LocalTransport(gpus=(0,), workers_per_gpu=0)


def test_workers_per_device_on_spark_takes_a_share_of_a_gpu_per_task():
    shared = config("auto", "spark", workers_per_device=4)
    assert spark_gpu_settings(shared)["spark.task.resource.gpu.amount"] == "0.25"
    given = config(
        "auto",
        "spark",
        workers_per_device=4,
        spark={"conf": {"spark.task.resource.gpu.amount": "0.5"}},
    )
    assert spark_gpu_settings(given)["spark.task.resource.gpu.amount"] == "0.5"  # checked below
    assert "spark.task.resource.gpu.amount" not in spark_gpu_settings(config("auto", "spark"))
    check_spark_gpus(shared, FakeSession({"spark.task.resource.gpu.amount": "0.25"}))
    three = config("cuda", "spark", workers_per_device=3)
    check_spark_gpus(
        three,
        FakeSession(
            {
                "spark.task.resource.gpu.amount": spark_gpu_settings(three)[
                    "spark.task.resource.gpu.amount"
                ]
            }
        ),
    )
    for conf in (
        {},
        {"spark.task.resource.gpu.amount": "0.5"},
        {"spark.task.resource.gpu.amount": "x"},
    ):
        with pytest.raises(
            ConfigError,
            match=r"workers_per_device 4 runs 4 Spark tasks on each GPU.*set it to 0\.25",
        ):
            check_spark_gpus(shared, FakeSession(conf))
