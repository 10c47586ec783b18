"""Dataset names: a store's registry of ``name -> dataset id``.

Prepared datasets are immutable and named by a content hash (``datasets/<id>/``); a name
(``churn-2026-11``) is a small JSON object ``datasets/_names/<name>.json`` holding the id
it points at, written atomically by :meth:`Store.put`. Configs can say
``data: {dataset: churn-2026-11}``; what a name resolved to (id and URI) is logged with the
experiment, so results always point at immutable data.

Pointing an existing name at another dataset is refused unless asked for
(``overwrite=True``, ``prepare --force``); the message says where the name points now.
On object stores two writers naming different datasets with one name at the same instant
cannot be told apart (there is no compare-and-swap): the later write wins, and the
earlier writer finds out on read-back (:class:`DataError`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import re
from collections.abc import Mapping

import pyarrow.fs as pafs

from cerebro_spark.data._format import MANIFEST_NAME, Manifest
from cerebro_spark.errors import DataError
from cerebro_spark.store import FileSystemStore, Store, open_store

logger = logging.getLogger(__name__)

#: Where names live in a store (``_`` cannot start a dataset id or a name).
NAMES_PREFIX = "datasets/_names"

#: The rule every dataset name follows (and it contains no ``..``).
NAME_RULE = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
_NAME = re.compile(NAME_RULE)

#: What a dataset id looks like (24 hex digits); a name may not look like one.
DATASET_ID_RULE = r"[0-9a-f]{24}"
_DATASET_ID = re.compile(DATASET_ID_RULE)

_RECORD_VERSION = 1


@dataclasses.dataclass(frozen=True)
class DatasetName:
    """One name of a prepared dataset.

    Attributes:
        name: The name.
        dataset_id: The id of the dataset it points at.
        rows: Rows per split (``{"train": ..., "validation": ...}``).
        named_at: When the name was (last) set, ISO 8601 UTC.
        source: Where the data came from (the manifest's ``source``).
    """

    name: str
    dataset_id: str
    rows: Mapping[str, int]
    named_at: str
    source: str = ""

    def to_json(self) -> str:
        """The record as stored (one small JSON object)."""
        record = {"version": _RECORD_VERSION, **dataclasses.asdict(self)}
        return json.dumps(record, sort_keys=True, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> DatasetName:
        """Parse a stored record; ``where`` names it in errors."""
        try:
            raw = json.loads(text)
            return cls(
                name=str(raw["name"]),
                dataset_id=str(raw["dataset_id"]),
                rows={str(k): int(n) for k, n in dict(raw.get("rows", {})).items()},
                named_at=str(raw.get("named_at", "")),
                source=str(raw.get("source", "")),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"dataset name record {where} is not valid: {exc}") from exc


@dataclasses.dataclass(frozen=True)
class DatasetEntry:
    """A prepared dataset in a store, with its names (one row of ``cerebro-spark datasets``).

    Attributes:
        dataset_id: The dataset's id.
        uri: Where it is.
        names: Its names, sorted (empty when unnamed).
        rows: Rows per split.
        num_partitions: P.
        task: ``classification`` or ``regression``.
        source: Where the data came from.
        created: When the dataset was written (its manifest's modification time, ISO 8601
            UTC), or ``None`` where the store does not say.
    """

    dataset_id: str
    uri: str
    names: tuple[str, ...]
    rows: Mapping[str, int]
    num_partitions: int
    task: str
    source: str
    created: str | None


def check_dataset_name(name: object) -> str:
    """Return ``name`` if it is a valid dataset name, else raise :class:`DataError`.

    Raises:
        DataError: Naming the value and the rule.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name:
        raise DataError(
            f"dataset name {name!r} breaks the rule {NAME_RULE} (a letter or digit, then up "
            "to 127 letters, digits, '.', '_' or '-', no '..')"
        )
    if _DATASET_ID.fullmatch(name):
        raise DataError(
            f"dataset name {name!r} looks like a dataset id ({DATASET_ID_RULE}); pick a name "
            "that is not 24 hex digits"
        )
    return name


def is_dataset_id(text: str) -> bool:
    """Whether ``text`` has the form of a dataset id."""
    return _DATASET_ID.fullmatch(text) is not None


def _key(name: str) -> str:
    return f"{NAMES_PREFIX}/{name}.json"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _manifest(store: Store, dataset_id: str) -> Manifest:
    if not _DATASET_ID.fullmatch(str(dataset_id)):
        raise DataError(
            f"dataset id {dataset_id!r} breaks the rule {DATASET_ID_RULE} (24 lower-case hex "
            "digits, as 'cerebro-spark datasets' lists them)"
        )
    key = f"datasets/{dataset_id}/{MANIFEST_NAME}"
    if not store.exists(key):
        raise DataError(
            f"no prepared dataset {dataset_id} in {store.uri} (missing {store.url(key)})"
        )
    return Manifest.from_json(store.get(key).decode())


def name_dataset(
    store: str | Store, name: str, dataset: str | Manifest, *, overwrite: bool = False
) -> DatasetName:
    """Give a prepared dataset of ``store`` a name (or leave it if it already has it).

    Args:
        store: The store the dataset was prepared into.
        name: The name (see :data:`NAME_RULE`).
        dataset: The dataset's id or manifest; it must be in ``store``.
        overwrite: Point the name at this dataset even if it points at another one.

    Returns:
        The name's record.

    Raises:
        DataError: A bad name, no such dataset in the store, or a name that points at
            another dataset (without ``overwrite``; the message names that dataset).
    """
    check_dataset_name(name)
    root = open_store(store)
    dataset_id = dataset.dataset_id if isinstance(dataset, Manifest) else dataset
    manifest = _manifest(root, dataset_id)
    key = _key(name)
    if root.exists(key):
        current = read_dataset_name(root, name)
        if current.dataset_id == dataset_id:
            logger.info("dataset %s is already named %s", dataset_id, name)
            return current
        if not overwrite:
            raise DataError(
                f"dataset name {name!r} already points at dataset {current.dataset_id} "
                f"(named {current.named_at}); pass --force (overwrite=True) to point it at "
                f"{dataset_id}, or pick another name"
            )
        logger.warning(
            "dataset name %s pointed at %s; it now points at %s",
            name,
            current.dataset_id,
            dataset_id,
        )
    record = DatasetName(
        name=name,
        dataset_id=dataset_id,
        rows={"train": manifest.rows("train"), "validation": manifest.rows("validation")},
        named_at=_now(),
        source=manifest.source,
    )
    root.put(key, record.to_json().encode())
    written = read_dataset_name(root, name)
    if written.dataset_id != dataset_id:
        raise DataError(
            f"dataset name {name!r} was set to {written.dataset_id} by another writer at "
            f"the same time; it does not point at {dataset_id}"
        )
    logger.info("dataset %s named %s in %s", dataset_id, name, root.uri)
    return record


def read_dataset_name(store: str | Store, name: str) -> DatasetName:
    """Return the record of a dataset name.

    Raises:
        DataError: A bad name, or no such name in the store (the message lists the names
            there).
    """
    check_dataset_name(name)
    root = open_store(store)
    key = _key(name)
    if not root.exists(key):
        known = [entry.name for entry in dataset_names(root)]
        listing = ", ".join(known[:20]) + (", ..." if len(known) > 20 else "")
        raise DataError(
            f"no dataset named {name!r} in {root.uri}; "
            + (f"names there: {listing}" if known else "the store has no named datasets")
        )
    return DatasetName.from_json(root.get(key), root.url(key))


def dataset_names(store: str | Store) -> list[DatasetName]:
    """Return every dataset name in ``store``, sorted by name."""
    root = open_store(store)
    records: list[DatasetName] = []
    for key in root.list(NAMES_PREFIX):
        base = key[len(NAMES_PREFIX) + 1 :]
        if "/" in base or not base.endswith(".json"):
            continue
        records.append(DatasetName.from_json(root.get(key), root.url(key)))
    return sorted(records, key=lambda record: record.name)


def remove_dataset_name(store: str | Store, name: str) -> DatasetName:
    """Remove a name (the dataset stays); return the record it had.

    Raises:
        DataError: A bad or unknown name.
    """
    root = open_store(store)
    record = read_dataset_name(root, name)
    root.delete(_key(name))
    logger.info("removed dataset name %s (it pointed at %s)", name, record.dataset_id)
    return record


def _modified(store: Store, key: str) -> str | None:
    if not isinstance(store, FileSystemStore):
        return None
    info = store.filesystem.get_file_info(store.path(key))
    if info.type != pafs.FileType.File or info.mtime is None:
        return None
    stamp: datetime.datetime = info.mtime
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=datetime.timezone.utc)
    return stamp.astimezone(datetime.timezone.utc).isoformat(timespec="seconds")


def list_datasets(store: str | Store) -> list[DatasetEntry]:
    """Return the complete prepared datasets of ``store`` with their names, newest first.

    A dataset directory without a manifest (a writer died, or one is writing now) is not
    listed. Names pointing at a dataset that is no longer there are logged as warnings.
    """
    root = open_store(store)
    names: dict[str, list[str]] = {}
    for record in dataset_names(root):
        names.setdefault(record.dataset_id, []).append(record.name)
    entries: list[DatasetEntry] = []
    for key in root.list("datasets"):
        parts = key.split("/")
        if len(parts) != 3 or parts[2] != MANIFEST_NAME or not is_dataset_id(parts[1]):
            continue
        manifest = Manifest.from_json(root.get(key).decode())
        entries.append(
            DatasetEntry(
                dataset_id=manifest.dataset_id,
                uri=root.url(f"datasets/{parts[1]}"),
                names=tuple(sorted(names.pop(parts[1], []))),
                rows={"train": manifest.rows("train"), "validation": manifest.rows("validation")},
                num_partitions=manifest.num_partitions,
                task=manifest.task,
                source=manifest.source,
                created=_modified(root, key),
            )
        )
    for dataset_id, dangling in sorted(names.items()):
        logger.warning(
            "dataset name(s) %s point at dataset %s, which is not in %s",
            ", ".join(dangling),
            dataset_id,
            root.uri,
        )
    return sorted(entries, key=lambda entry: (entry.created or "", entry.dataset_id), reverse=True)


def _looks_like_path(reference: str) -> bool:
    return "://" in reference or "/" in reference or "\\" in reference or reference[:1] in ".~"


def find_dataset(store: str | Store, reference: str) -> str:
    """Return the URI of the prepared dataset ``reference`` stands for.

    ``reference`` is, in this order: a URI or path (anything with ``/`` or ``://``: used
    as it is, in any store), a dataset id of ``store`` (``<store>/datasets/<id>``), a
    name in ``store``'s registry, or (as before names existed) a relative directory that
    holds a manifest.

    Raises:
        DataError: No dataset with that id or name in ``store`` (the message lists the
            names there), or a name pointing at a dataset that is gone.
    """
    if not isinstance(reference, str) or not reference:
        raise DataError(f"a dataset reference must be a non-empty string, got {reference!r}")
    if _looks_like_path(reference):
        return reference
    root = open_store(store)
    if is_dataset_id(reference):
        if root.exists(f"datasets/{reference}/{MANIFEST_NAME}"):
            return root.url(f"datasets/{reference}")
    elif _NAME.fullmatch(reference) and root.exists(_key(reference)):
        record = read_dataset_name(root, reference)
        if not root.exists(f"datasets/{record.dataset_id}/{MANIFEST_NAME}"):
            raise DataError(
                f"dataset name {reference!r} points at dataset {record.dataset_id}, which is "
                f"no longer in {root.uri}; prepare the data again with --name {reference} "
                "--force"
            )
        logger.info("dataset name %s is dataset %s", reference, record.dataset_id)
        return root.url(f"datasets/{record.dataset_id}")
    if os.path.isfile(os.path.join(reference, MANIFEST_NAME)):
        return os.path.abspath(reference)
    known = [record.name for record in dataset_names(root)]
    listing = ", ".join(known[:20]) + (", ..." if len(known) > 20 else "")
    what = "dataset id" if is_dataset_id(reference) else "dataset name"
    raise DataError(
        f"no {what} {reference!r} in {root.uri} (nor a directory with a manifest here); "
        + (f"names there: {listing}; " if known else "the store has no named datasets; ")
        + f"'cerebro-spark datasets --store {root.uri}' lists its datasets"
    )
