"""Where workers train (``ExperimentConfig.device``): the driver's checks and choices.

What torch sees is set per test (``torch.cuda.is_available`` / ``device_count``), so the
rules are checked with 0, 1 and 2 GPUs on any machine; the GPU runs themselves are in
``tests/gpu``.
"""

from __future__ import annotations

import pytest
import torch

from cerebro_spark.driver._device import check_device, check_spark_gpus, local_gpus, pool_device
from cerebro_spark.engine import parse_config
from cerebro_spark.errors import ConfigError

pytestmark = pytest.mark.torch


def config(device: str, backend: str = "local"):
    return parse_config(
        {
            "name": "exp",
            "data": {"source": "sklearn:digits"},
            "model": "cerebro_spark.training:MLPSpec",
            "space": {"lr": 0.01},
            "backend": backend,
            "device": device,
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
