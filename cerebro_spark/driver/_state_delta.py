"""A search procedure's state in the event log: snapshots and deltas, linear in the work.

``round_start`` and ``round_end`` carry the procedure's state (``state_dict``), which
``resume`` loads. An asynchronous procedure's state grows with its trials (ASHA's rungs),
so a snapshot per round made the log quadratic in the trials. The driver now logs a
``procedure_state`` snapshot only when the deltas written since the last one would
outweigh a new one, and a ``procedure_state_delta`` otherwise: what changed since the
state the previous round event carried. The deltas since a snapshot then never weigh more
than it, so the state's share of the log is at most twice its deltas plus its last
snapshot: proportional to the work. A log of an earlier version (snapshots only) folds as
it always did.

A delta is JSON: ``{"=": value}`` replaces; ``{"{": {key: delta}, "-": [keys], "o":
[keys]}`` patches a mapping (keys set, keys removed, and the key order where it changed);
``{"+": [items]}`` extends a list that the new one starts with, and ``{"[": {index:
delta}, "+": [items]}`` patches a list's items in place too. States are compared as JSON
(tuples read as lists).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cerebro_spark.errors import EventLogError


def as_json(state: Any) -> Any:
    """``state`` as the log reads it back: JSON types only (tuples become lists)."""
    return json.loads(json.dumps(state, allow_nan=True))


def state_diff(old: Any, new: Any) -> dict[str, Any] | None:
    """The delta taking ``old`` to ``new`` (both JSON values), or ``None`` when equal."""
    if _same(old, new):
        return None
    if isinstance(old, dict) and isinstance(new, dict):
        changed = {key: state_diff(old.get(key), value) for key, value in new.items()}
        changed = {
            key: {"=": new[key]} if key not in old else delta
            for key, delta in changed.items()
            if key not in old or delta is not None
        }
        removed = [key for key in old if key not in new]
        delta: dict[str, Any] = {"{": changed}
        if removed:
            delta["-"] = removed
        kept = [key for key in old if key in new]
        if kept + [key for key in new if key not in old] != list(new):
            delta["o"] = list(new)  # the new key order, where applying would not give it
        return delta
    if isinstance(old, list) and isinstance(new, list) and len(new) >= len(old):
        items = {
            str(i): d
            for i, (a, b) in enumerate(zip(old, new, strict=False))
            if (d := state_diff(a, b)) is not None
        }
        delta = {"+": new[len(old) :]}
        if items:
            delta["["] = items
        return delta
    return {"=": new}


def apply_delta(old: Any, delta: Mapping[str, Any]) -> Any:
    """``old`` with ``delta`` applied (:func:`state_diff`'s inverse).

    Raises:
        EventLogError: The delta does not fit ``old`` (the log was not written by this
            driver, or its snapshot is missing).
    """
    if "=" in delta:
        return delta["="]
    if not delta.get("{") and not delta.get("+") and not delta.get("[") and not delta.get("-"):
        return old  # unchanged (whatever its type)
    if "{" in delta:
        if not isinstance(old, dict):
            raise EventLogError(f"a procedure state delta patches a mapping, found {old!r}")
        out = {key: value for key, value in old.items() if key not in delta.get("-", ())}
        for key, change in delta["{"].items():
            out[key] = apply_delta(old.get(key), change)
        if "o" in delta:
            out = {key: out[key] for key in delta["o"]}
        return out
    if "+" in delta or "[" in delta:
        if not isinstance(old, list):
            raise EventLogError(f"a procedure state delta patches a list, found {old!r}")
        out_list = list(old)
        for index, change in delta.get("[", {}).items():
            position = int(index)
            if not 0 <= position < len(out_list):
                raise EventLogError(f"a procedure state delta patches item {index} of {old!r}")
            out_list[position] = apply_delta(out_list[position], change)
        return out_list + list(delta.get("+", ()))
    raise EventLogError(f"not a procedure state delta: {dict(delta)!r}")


def _same(a: Any, b: Any) -> bool:
    """JSON equality (``True == 1`` is not: a bool stays a bool)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


class StateLog:
    """What the driver logs of the procedure's state at each round event.

    Args:
        last: The state the log holds now (folded from it on resume), or ``None``.
    """

    def __init__(self, last: Any = None) -> None:
        self.last = None if last is None else as_json(last)
        self.since_snapshot = 0  # bytes of deltas since the last snapshot
        self.snapshot_bytes = 0  # the last snapshot's bytes; a new session starts with one

    def fields(self, state: Any) -> dict[str, Any]:
        """``{"procedure_state": ...}`` or ``{"procedure_state_delta": ...}`` for ``state``."""
        new = as_json(state)
        if self.last is not None and self.snapshot_bytes:
            delta = state_diff(self.last, new) or _UNCHANGED
            size = _size(delta)
            if self.since_snapshot + size <= self.snapshot_bytes:
                self.since_snapshot += size
                self.last = new
                return {"procedure_state_delta": delta}
        self.last = new
        self.snapshot_bytes = _size(new)
        self.since_snapshot = 0
        return {"procedure_state": new}


_UNCHANGED: dict[str, Any] = {"+": [], "{": {}}
"""The delta of a state that did not change (a mapping or a list)."""


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")))
