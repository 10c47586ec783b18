"""Loading a user's ModelSpec from its import path.

Cerebro §4.1: the user's functions are shipped to workers by reference, not by value.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import threading

from cerebro_spark.errors import ConfigError
from cerebro_spark.training._spec import ModelSpec

logger = logging.getLogger(__name__)

_CACHE: dict[str, ModelSpec] = {}
_LOCK = threading.Lock()


def load_spec(path: str) -> ModelSpec:
    """Import and instantiate a :class:`ModelSpec` from ``"package.module:ClassName"``.

    The class is instantiated with no arguments; the instance is cached per process, so
    specs must keep no per-trial state (everything per trial comes in ``params``).

    Args:
        path: ``"package.module:ClassName"``; the class name may be dotted for a nested
            class (``"pkg.mod:Outer.Inner"``).

    Returns:
        The cached spec instance.

    Raises:
        ConfigError: If the path is malformed, the module cannot be imported, the class
            is missing, is not a concrete ``ModelSpec`` subclass, or its constructor raises.
    """
    with _LOCK:
        cached = _CACHE.get(path)
        if cached is not None:
            return cached
        spec = _instantiate(path)
        _CACHE[path] = spec
        logger.debug("loaded model spec %s", path)
        return spec


def _instantiate(path: str) -> ModelSpec:
    if not isinstance(path, str) or path.count(":") != 1:
        raise ConfigError(f"spec must be 'package.module:ClassName', got {path!r}")
    module_name, _, class_name = path.partition(":")
    if not module_name or not class_name:
        raise ConfigError(f"spec must be 'package.module:ClassName', got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:
        raise ConfigError(
            f"spec {path!r}: cannot import module {module_name!r}: {type(error).__name__}: {error}"
        ) from error
    target: object = module
    for part in class_name.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"spec {path!r}: module {module_name!r} has no {class_name!r}")
        target = getattr(target, part)
    if not (isinstance(target, type) and issubclass(target, ModelSpec)):
        raise ConfigError(
            f"spec {path!r} must name a subclass of cerebro_spark.training.ModelSpec, "
            f"got {target!r}"
        )
    if inspect.isabstract(target):
        missing = sorted(getattr(target, "__abstractmethods__", ()))
        raise ConfigError(f"spec {path!r} is abstract: it does not implement {missing}")
    try:
        return target()
    except Exception as error:
        raise ConfigError(
            f"spec {path!r}: {class_name}() raised {type(error).__name__}: {error}"
        ) from error
