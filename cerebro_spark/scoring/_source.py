"""Where a model comes from: checkpoint bytes, a checkpoint URI, or an experiment.

Every form is read through the package's store layer (:func:`~cerebro_spark.store.open_store`,
:func:`~cerebro_spark.store.resolve_filesystem`): local paths, ``file://``, ``s3://``
(with pyarrow options in the query string) and any URI pyarrow understands.

A checkpoint read from an experiment (its ``best.pt``, or a trial's checkpoint under its
``checkpoints/`` folder) is verified against the SHA-256 the experiment's event log
recorded for it: other bytes raise :class:`~cerebro_spark.errors.CheckpointCorruptError`
instead of scoring with a model nobody trained. Checkpoints outside an experiment, and
those its log records no digest for, are read unchecked.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import urllib.parse
from typing import Any, TypeAlias

import pyarrow.fs as pafs

from cerebro_spark.errors import CerebroError, CheckpointCorruptError, ConfigError
from cerebro_spark.store import Store, open_store, resolve_filesystem

#: The name of an experiment's best checkpoint (``<store>/experiments/<id>/best.pt``).
BEST_CHECKPOINT = "best.pt"
_EXPERIMENTS = "experiments"
_CHECKPOINTS = "checkpoints"
_EVENTS = "events.jsonl"

logger = logging.getLogger(__name__)

Source: TypeAlias = "str | os.PathLike[str] | bytes | bytearray | memoryview"
"""A checkpoint path or URI, an experiment directory URI, or checkpoint bytes."""


@dataclasses.dataclass(frozen=True)
class CheckpointSource:
    """Checkpoint bytes and where they came from.

    Attributes:
        data: The checkpoint bytes.
        where: The URI read (``"<bytes>"`` for bytes given directly), for messages.
        experiment: The experiment directory's store when the source named an experiment
            (used to find the dataset of a checkpoint without metadata), else ``None``.
        sha256: The SHA-256 of ``data``, checked against the experiment's event log when
            it recorded one (``None`` for bytes given directly).
    """

    data: bytes
    where: str
    experiment: Store | None = None
    sha256: str | None = None


def best_checkpoint_uri(store_uri: str | Store, experiment_id: str) -> str:
    """Return the URI of an experiment's best checkpoint, ``<store>/experiments/<id>/best.pt``.

    Args:
        store_uri: The experiments' store (local path, ``file://``, ``s3://`` URI or a store).
        experiment_id: The experiment's id.

    Returns:
        The checkpoint's URI (``s3://`` URIs keep their query options).

    Raises:
        ConfigError: The id is not a plain name.
        FileNotFoundError: The experiment has no ``best.pt`` (no trial finished an epoch,
            or no experiment by that id); the message names the URI.
    """
    if not isinstance(experiment_id, str) or not experiment_id or "/" in experiment_id:
        raise ConfigError(
            f"experiment_id must be a non-empty name without '/', got {experiment_id!r}"
        )
    store = open_store(store_uri)
    key = f"{_EXPERIMENTS}/{experiment_id}/{BEST_CHECKPOINT}"
    if not store.exists(key):
        raise FileNotFoundError(_no_best(store, f"{_EXPERIMENTS}/{experiment_id}"))
    return store.url(key)


def _no_best(store: Store, prefix: str) -> str:
    where = store.url(prefix)
    if not store.exists(f"{prefix}/config.json"):
        return f"no experiment at {where} (no config.json there)"
    return (
        f"experiment {where} has no {BEST_CHECKPOINT}: no trial has finished an epoch yet "
        "(or every trial failed)"
    )


def read_source(source: Source, store: str | Store | None = None) -> CheckpointSource:
    """Read the checkpoint a source names.

    Args:
        source: Checkpoint bytes; a checkpoint file (path or URI); an experiment directory
            (``<store>/experiments/<id>``: its ``best.pt``). With ``store``: an experiment
            id, ``experiments/<id>``, or a key of a checkpoint in that store.
        store: The store ``source`` is relative to.

    Raises:
        ConfigError: ``source`` is of the wrong type or empty.
        FileNotFoundError: Nothing readable there (the message says what was tried).
        CheckpointCorruptError: The bytes are not those the experiment's event log
            recorded for the checkpoint (see the module docstring).
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        return CheckpointSource(bytes(source), "<bytes>")
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str) or not source:
        raise ConfigError(
            "source must be a checkpoint path or URI, an experiment directory or id, or "
            f"checkpoint bytes; got {type(source).__name__} {source!r}"
        )
    if store is not None:
        return _from_store(open_store(store), source)
    filesystem, path = resolve_filesystem(source)
    kind = filesystem.get_file_info(path).type
    if kind == pafs.FileType.File:
        with filesystem.open_input_file(path) as stream:
            data = stream.read()
        found = _in_experiment(source)
        expected = None if found is None else _logged(_open_dir(found[0]), found[1])
        return _verified(data, source, expected)
    if kind == pafs.FileType.Directory:
        return _experiment(open_store(source))
    raise FileNotFoundError(f"no checkpoint file or experiment directory at {source}")


def _from_store(root: Store, source: str) -> CheckpointSource:
    key = source.strip("/")
    if key.endswith(".pt"):
        if not root.exists(key):
            raise FileNotFoundError(f"no checkpoint at {root.url(key)}")
        data = root.get(key)
        head, marker, rest = key.partition(f"/{_CHECKPOINTS}/")
        if not marker:
            head, _, rest = key.rpartition("/")
        relative = f"{_CHECKPOINTS}/{rest}" if marker else rest
        expected = _logged(root.child(head), relative) if head else None
        return _verified(data, root.url(key), expected)
    prefix = key if key.startswith(f"{_EXPERIMENTS}/") else f"{_EXPERIMENTS}/{key}"
    return _experiment(root.child(prefix))


def _experiment(experiment: Store) -> CheckpointSource:
    if not experiment.exists(BEST_CHECKPOINT):
        parent, name = _split(experiment.uri)
        raise FileNotFoundError(_no_best(open_store(parent), name))
    data = experiment.get(BEST_CHECKPOINT)
    where = experiment.url(BEST_CHECKPOINT)
    return _verified(data, where, _logged(experiment, BEST_CHECKPOINT), experiment)


def _in_experiment(source: str) -> tuple[str, str] | None:
    """``(experiment directory URI, key in it)`` of a checkpoint file URI or path.

    ``<dir>/best.pt`` and ``<dir>/checkpoints/<trial>/<file>`` name a checkpoint of the
    experiment ``<dir>`` (an ``s3://`` URI's query is kept on the directory); anything
    else gives ``None``.
    """
    remote = "://" in source and not source.startswith("file://")
    parts = urllib.parse.urlsplit(source) if remote else None
    path = parts.path if parts is not None else source
    before, marker, rest = path.rpartition(f"/{_CHECKPOINTS}/")
    if marker and before:
        head, key = before, f"{_CHECKPOINTS}/{rest}"
    else:
        head, _, key = path.rstrip("/").rpartition("/")
        if key != BEST_CHECKPOINT or not head:
            return None
    if parts is not None:
        head = urllib.parse.urlunsplit(parts._replace(path=head))
    return head, key


def _open_dir(uri: str) -> Store | None:
    try:
        return open_store(uri)
    except (OSError, ValueError):
        return None


def _logged(experiment: Store | None, key: str) -> str | None:
    """The SHA-256 an experiment's event log recorded for ``key`` (relative to it), if any.

    ``best.pt``: the last ``experiment_end``'s ``best_checkpoint_sha256``; a trial's
    checkpoint: the last ``unit_end`` that wrote it. Not an experiment (no event log), or
    a log that records no digest for it: ``None``.
    """
    # here: the driver package (~90 modules, 1.6 s) only where a run's log is read
    from cerebro_spark.driver._events import read_events

    if experiment is None:
        return None
    try:
        events = read_events(experiment) if experiment.exists(_EVENTS) else []
    except (OSError, CerebroError) as error:
        logger.warning("cannot read the event log of %s to verify %s: %s", experiment, key, error)
        return None
    recorded = None
    for event in events:
        if key == BEST_CHECKPOINT and event.get("event") == "experiment_end":
            recorded = event.get("best_checkpoint_sha256")
        elif event.get("event") == "unit_end" and _names(event.get("checkpoint"), key):
            recorded = event.get("checkpoint_sha256")
    return recorded if isinstance(recorded, str) else None


def _names(logged: Any, key: str) -> bool:
    """Whether a log's checkpoint field names ``key``, relative to the experiment.

    Older logs hold the whole store key, with the id of the experiment that wrote it.
    """
    from cerebro_spark.driver._layout import logged_key

    return isinstance(logged, str) and logged_key(logged) == key


def _verified(
    data: bytes, where: str, expected: str | None, experiment: Store | None = None
) -> CheckpointSource:
    actual = hashlib.sha256(data).hexdigest()
    if expected is not None and actual != expected:
        raise CheckpointCorruptError(where, expected, actual, len(data))
    if expected is None:
        logger.debug("no logged SHA-256 for %s: read unchecked", where)
    return CheckpointSource(data, where, experiment, actual)


def _split(uri: str) -> tuple[str, str]:
    """``(parent URI, last name)`` of a directory URI, keeping an ``s3://`` query."""
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme in ("", "file") and "://" not in uri:
        head, _, tail = uri.rstrip("/").rpartition("/")
        return head or "/", tail
    head, _, tail = parts.path.rstrip("/").rpartition("/")
    return urllib.parse.urlunsplit(parts._replace(path=head or "/")), tail
