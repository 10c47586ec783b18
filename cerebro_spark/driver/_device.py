"""Where a config's workers train: :attr:`ExperimentConfig.device` made concrete.

``auto`` takes a GPU where the backend can give one (``local``: the GPUs torch sees on
this machine, spread over the worker processes; ``spark``: each task's ``gpu`` resource)
and the CPU elsewhere; ``cuda`` is ``auto`` that refuses to fall back to the CPU; ``cpu``
and ``cuda:N`` are used as given. The driver checks what it can before anything is
written (:func:`check_device`); a Spark task that gets no GPU under ``cuda`` fails when
it starts (:func:`~cerebro_spark.backends._serve.resolve_device`).
"""

from __future__ import annotations

from typing import Any

from cerebro_spark.driver._config import ExperimentConfig
from cerebro_spark.errors import ConfigError
from cerebro_spark.spark_session import spark_setting

_SPARK_GPU_AMOUNT = "spark.task.resource.gpu.amount"


def pool_device(config: ExperimentConfig) -> str | None:
    """The ``device`` argument of the config's worker pool (``None``: each worker chooses)."""
    return None if config.device == "auto" else config.device


def local_gpus(config: ExperimentConfig) -> tuple[int, ...]:
    """The GPUs a ``backend: local`` run spreads its workers over (none: the CPU or one GPU).

    Raises:
        ConfigError: ``device`` asks for a GPU that torch does not see on this machine.
    """
    if config.device == "cpu":
        return ()
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    seen = f"torch {torch.__version__} sees {count} GPU{'' if count == 1 else 's'} here"
    if config.device == "cuda" and count == 0:
        raise ConfigError(f"device 'cuda' needs a GPU, but {seen}; use 'auto' or 'cpu'")
    if config.device.startswith("cuda:"):
        index = int(config.device.split(":", 1)[1])
        if index >= count:
            raise ConfigError(
                f"device {config.device!r} names GPU {index}, but {seen}"
                + (f" (cuda:0 to cuda:{count - 1})" if count else "")
            )
        return ()
    return tuple(range(count))


def check_device(config: ExperimentConfig) -> None:
    """Refuse, on the driver, a ``device`` its backend cannot honour here.

    ``backend: local``: the GPUs torch sees (:func:`local_gpus`). ``backend: spark``: the
    executors' GPUs are checked where the tasks run, or by :func:`check_spark_gpus` once
    the session exists.

    Raises:
        ConfigError: Naming the device and what is missing.
    """
    if config.backend == "local":
        local_gpus(config)


def check_spark_gpus(config: ExperimentConfig, session: Any) -> None:
    """Refuse ``device: cuda`` on a Spark application that gives its tasks no GPU.

    Raises:
        ConfigError: ``spark.task.resource.gpu.amount`` is not set (to more than 0).
    """
    if config.device != "cuda":
        return
    amount = spark_setting(session, _SPARK_GPU_AMOUNT)
    try:
        given = float(amount) > 0 if amount is not None else False
    except ValueError:
        given = False
    if not given:
        raise ConfigError(
            f"device 'cuda' needs a GPU for every Spark task, but {_SPARK_GPU_AMOUNT} is "
            f"{amount!r} in this application; set it (and spark.executor.resource.gpu.amount"
            " with a discovery script), or use device 'auto' or 'cpu'"
        )
