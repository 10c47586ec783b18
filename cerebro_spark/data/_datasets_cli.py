"""The ``datasets`` command: the prepared datasets of a store and their names.

::

    cerebro-spark datasets [--store runs] [--format table|json]   # list (also: datasets list)
    cerebro-spark datasets name NAME DATASET_ID [--force]          # name a prepared dataset
    cerebro-spark datasets forget NAME                             # remove a name (not the data)

``prepare --name NAME`` names the dataset it prepares; a config's
``data: {dataset: NAME}`` uses it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from cerebro_spark.data._names import (
    NAME_RULE,
    DatasetEntry,
    list_datasets,
    name_dataset,
    remove_dataset_name,
)


def _out(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _store_argument(parser: argparse.ArgumentParser, *, top: bool = False) -> None:
    # An action's own --store must not reset one given before it (datasets --store S list).
    default = "runs" if top else argparse.SUPPRESS
    parser.add_argument("--store", default=default, help="store URI (default: runs)")


def add_datasets_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``datasets`` command to ``subparsers`` and return its parser."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "datasets",
        help="list a store's prepared datasets and their names; name or unname one",
        description="Without an action: list the prepared datasets of the store, newest "
        "first, with their names, rows and creation time.",
    )
    _store_argument(parser, top=True)
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.set_defaults(handler=run_datasets)
    actions = parser.add_subparsers(dest="action")
    listing = actions.add_parser("list", help="list the datasets (the default)")
    _store_argument(listing)
    listing.add_argument("--format", choices=("table", "json"), default=argparse.SUPPRESS)
    name = actions.add_parser("name", help="give a prepared dataset a name")
    name.add_argument("name", help=f"the name ({NAME_RULE})")
    name.add_argument("dataset_id", help="the dataset's id (from 'datasets' or 'prepare')")
    name.add_argument(
        "--force", action="store_true", help="point the name here even if it points elsewhere"
    )
    _store_argument(name)
    forget = actions.add_parser("forget", help="remove a name (the dataset stays)")
    forget.add_argument("name")
    _store_argument(forget)
    return parser


def _rows(entry: DatasetEntry) -> str:
    return f"{entry.rows['train']}+{entry.rows['validation']}"


def format_datasets(entries: list[DatasetEntry]) -> str:
    """The datasets as an aligned text table, one line per (name, dataset)."""
    header = ("NAME", "DATASET ID", "ROWS (TRAIN+VAL)", "P", "TASK", "CREATED (UTC)", "SOURCE")
    lines = [header]
    for entry in entries:
        created = (entry.created or "-").replace("+00:00", "").replace("T", " ")
        for name in entry.names or ("-",):
            row = (name, entry.dataset_id, _rows(entry), str(entry.num_partitions), entry.task)
            lines.append((*row, created, entry.source or "-"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=False))
        + "  "
        + line[-1]
        for line in lines
    )


def run_datasets(args: argparse.Namespace) -> int:
    """Run ``cerebro-spark datasets`` (see the module docstring).

    Returns:
        0 on success.

    Raises:
        DataError: A bad or unknown name, an unknown dataset id, or a name that points at
            another dataset (without ``--force``).
    """
    action = args.action or "list"
    if action == "name":
        record = name_dataset(args.store, args.name, args.dataset_id, overwrite=args.force)
        _out(f"dataset {record.dataset_id} is named {record.name}")
        return 0
    if action == "forget":
        record = remove_dataset_name(args.store, args.name)
        _out(f"removed the name {record.name} (dataset {record.dataset_id} stays)")
        return 0
    entries = list_datasets(args.store)
    if args.format == "json":
        _out(json.dumps([dataclasses.asdict(entry) for entry in entries], indent=2))
    elif not entries:
        _out(f"no prepared datasets in {args.store}")
    else:
        _out(format_datasets(entries))
    return 0
