"""Where a config's workers train: :attr:`ExperimentConfig.device` made concrete.

``auto`` takes a GPU where the backend can give one (``local``: the GPUs torch sees on
this machine, spread over the worker processes; ``spark``: each task's ``gpu`` resource)
and the CPU elsewhere; ``cuda`` is ``auto`` that refuses to fall back to the CPU; ``cpu``
and ``cuda:N`` are used as given. The driver checks what it can before anything is
written (:func:`check_device`); a Spark task that gets no GPU under ``cuda`` fails when
it starts (:func:`~cerebro_spark.backends._serve.resolve_device`).

``workers_per_device`` (issue 27) shares each GPU among that many workers: ``local``
caps the workers the transport puts on one GPU (:func:`local_gpus` refuses more workers
than the GPUs can take); ``spark`` needs every task to take ``1 / workers_per_device`` of
a GPU (:func:`spark_gpu_settings` sets it for a session cerebro-spark starts,
:func:`check_spark_gpus` refuses a running application that says otherwise).
"""

from __future__ import annotations

import logging
from typing import Any

from cerebro_spark.driver._config import ExperimentConfig
from cerebro_spark.errors import ConfigError
from cerebro_spark.spark_session import spark_setting

logger = logging.getLogger(__name__)

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
    gpus = tuple(range(count))
    shared = config.workers_per_device
    if shared is not None and not gpus:
        logger.warning(
            "workers_per_device %d shares GPUs, but %s: the workers train on the CPU",
            shared,
            seen,
        )
    elif shared is not None and config.workers > shared * len(gpus):
        raise ConfigError(
            f"workers {config.workers} do not fit workers_per_device {shared} on the "
            f"{len(gpus)} GPU{'' if len(gpus) == 1 else 's'} torch sees here (at most "
            f"{shared * len(gpus)}); lower workers or raise workers_per_device"
        )
    return gpus


def check_device(config: ExperimentConfig) -> None:
    """Refuse, on the driver, a ``device`` its backend cannot honour here.

    ``backend: local``: the GPUs torch sees (:func:`local_gpus`). ``backend: spark``: the
    executors' GPUs are checked where the tasks run, or by :func:`check_spark_gpus` once
    the session exists.

    Raises:
        ConfigError: Naming the device and what is missing.
    """
    if config.workers_per_device is not None and config.device == "cpu":
        raise ConfigError(
            f"workers_per_device {config.workers_per_device} shares GPUs, but device is "
            "'cpu': leave workers_per_device out, or train on 'auto' or 'cuda'"
        )
    if config.backend == "local":
        local_gpus(config)


def spark_gpu_settings(config: ExperimentConfig) -> dict[str, str]:
    """The config's ``spark.conf``, with each task's GPU share for ``workers_per_device``.

    For a session cerebro-spark starts: ``spark.task.resource.gpu.amount`` is ``1 /
    workers_per_device`` unless the config sets it (then :func:`check_spark_gpus` checks
    that it agrees).
    """
    conf = {k: str(v) for k, v in config.spark.conf.items()}
    if config.workers_per_device is not None:
        conf.setdefault(_SPARK_GPU_AMOUNT, _share(config.workers_per_device))
    return conf


def _share(workers_per_device: int) -> str:
    return f"{1 / workers_per_device:.6g}"


def check_spark_gpus(config: ExperimentConfig, session: Any) -> None:
    """Refuse GPU settings of a Spark application that the config's device cannot use.

    ``device: cuda`` needs a GPU for every task; ``workers_per_device: N`` needs every
    task to take ``1 / N`` of one (Spark then runs ``N`` tasks on each GPU).

    Raises:
        ConfigError: ``spark.task.resource.gpu.amount`` is not set (to more than 0), or
            not ``1 / workers_per_device``; the message says what to set.
    """
    amount = spark_setting(session, _SPARK_GPU_AMOUNT)
    shared = config.workers_per_device
    if shared is not None and not _agrees(amount, shared):
        raise ConfigError(
            f"workers_per_device {shared} runs {shared} Spark tasks on each GPU, so each "
            f"must take 1/{shared} of one, but {_SPARK_GPU_AMOUNT} is {amount!r} in this "
            f"application; set it to {_share(shared)} (with spark.executor.resource.gpu."
            "amount and a discovery script), or leave workers_per_device out"
        )
    if config.device != "cuda":
        return
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


def _agrees(amount: str | None, shared: int) -> bool:
    """Whether a task GPU amount is ``1 / shared`` (as Spark reads it, to 1e-6)."""
    try:
        return amount is not None and abs(float(amount) * shared - 1) < 1e-6 * shared
    except ValueError:
        return False
