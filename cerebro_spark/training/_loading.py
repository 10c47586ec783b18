"""Loading a user's ModelSpec from its import path, and the code paths it is found on.

Cerebro §4.1: the user's functions are shipped to workers by reference, not by value.

Where a spec module is found, with every backend: on the installed packages and
``sys.path``, and in the *code directories*: the working directory and the directory of
every config file loaded (:func:`add_code_directory`, called by ``load_config``). The
driver puts them on its ``sys.path``; local worker processes inherit it (``spawn`` starts
them with the parent's ``sys.path``); for Spark executors, which may run on other
machines, the modules of user specs found in a code directory are shipped with
``SparkContext.addPyFile`` (:func:`user_code_files`: a module file as is, a package as a
zip).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
import tempfile
import threading
import zipfile
from collections.abc import Iterable
from pathlib import Path

from cerebro_spark.errors import ConfigError
from cerebro_spark.metrics import did_you_mean
from cerebro_spark.training._spec import ModelSpec

logger = logging.getLogger(__name__)

_CACHE: dict[str, ModelSpec] = {}
_LOCK = threading.Lock()
_CODE_DIRECTORIES: list[Path] = []


def add_code_directory(directory: str | Path) -> None:
    """Look for spec modules in ``directory`` too (the driver's and local workers' path).

    Args:
        directory: A directory holding spec modules (a config file's directory).
    """
    path = Path(directory).resolve()
    if path not in _CODE_DIRECTORIES:
        _CODE_DIRECTORIES.append(path)
    _on_sys_path(path)


def code_directories() -> list[Path]:
    """Return the code directories: those added, then the working directory."""
    return [*_CODE_DIRECTORIES, Path(os.getcwd()).resolve()]


def _on_sys_path(path: Path) -> None:
    if str(path) not in sys.path:
        sys.path.append(str(path))
        logger.debug("spec modules are also looked for in %s", path)


def user_code_files(spec_paths: Iterable[str], directory: str | Path | None = None) -> list[Path]:
    """Return what must ship to remote workers for the specs' modules to import there.

    For each spec whose top-level module was imported from a code directory (not from
    the installed packages): the module file itself, or its package zipped into
    ``directory`` (default: a new temporary directory). ``cerebro_spark`` is never
    shipped; specs whose modules are not imported yet are imported first.

    Args:
        spec_paths: Import paths ``"package.module:Class"``.
        directory: Where package zips are written.

    Returns:
        Files for ``SparkContext.addPyFile``, without duplicates.
    """
    roots = code_directories()
    out: dict[str, Path] = {}
    for path in spec_paths:
        top = path.partition(":")[0].split(".")[0]
        if not top or top == "cerebro_spark" or top in out:
            continue
        try:
            module = importlib.import_module(top)
        except Exception:
            continue  # load_spec reports it
        origin = getattr(module, "__file__", None)
        if origin is None:
            continue
        file = Path(origin).resolve()
        source = file.parent if file.name == "__init__.py" else file
        if not any(source.parent == root for root in roots):
            continue  # installed, or on a path the user set up (PYTHONPATH, --py-files)
        if source.is_dir():
            zip_dir = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="specs-"))
            out[top] = _zip_package(source, zip_dir / f"{top}.zip")
        else:
            out[top] = source
    return list(out.values())


def _zip_package(package: Path, target: Path) -> Path:
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for file in sorted(package.rglob("*.py")):
            archive.write(file, file.relative_to(package.parent))
    return target


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
    for directory in code_directories():
        _on_sys_path(directory)
    try:
        module = importlib.import_module(module_name)
    except Exception as error:
        where = ", ".join(str(d) for d in code_directories())
        raise ConfigError(
            f"spec {path!r}: cannot import module {module_name!r}: {type(error).__name__}: "
            f"{error} (looked in the installed packages, sys.path and {where})"
        ) from error
    target: object = module
    for part in class_name.split("."):
        if not hasattr(target, part):
            classes = [n for n, v in vars(target).items() if isinstance(v, type)]
            raise ConfigError(
                f"spec {path!r}: module {module_name!r} has no {class_name!r}"
                f"{did_you_mean(part, classes)}"
            )
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
