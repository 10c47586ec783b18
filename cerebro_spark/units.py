"""The messages that cross the driver/worker boundary: a unit of work and its result.

A *training unit* is one sub-epoch of one trial on one data partition (Cerebro §3.1); a
*validation unit* evaluates a trial's latest checkpoint on one validation partition. Both
are plain, picklable, JSON-friendly dataclasses with no torch or Spark inside, so the
scheduler, the event log and the backends can share them.

A *group unit* (Cerebro §5.7 and appendix D, "Horovod hybrid") is one train unit of one
trial run data-parallel by ``k`` workers at once, each on its own partition: it is sent as
``k`` :class:`UnitTask` s that differ only in ``partition`` and ``group.rank``
(:func:`group_tasks` builds them, :func:`check_group` checks them); the semantics are in
:mod:`cerebro_spark.training._group`.

Metric states travel *packed* (:func:`pack_states`), in a result and in the event log:
metrics that share an accumulator (precision, recall and F1, macro and per class, all
read the same per-class counts) report equal states, and each is written once.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from cerebro_spark.errors import ConfigError, WorkerLostError


class UnitKind(str, enum.Enum):
    """What a unit does with its partition."""

    TRAIN = "train"
    VALIDATE = "validate"


class GroupBrokenError(WorkerLostError):
    """A group unit could not finish because its group broke; *this* worker lives on.

    Raised by a rank of a group unit when a peer died, did not join within
    ``GroupSpec.timeout_s``, or the rendezvous failed. Like :class:`WorkerLostError` the
    unit goes back to the queue (the trial is not at fault); unlike it, the worker that
    reports it is alive and idle, so the engine must not drop it: the workers actually
    lost are those missing from ``Backend.workers()``.
    """


@dataclasses.dataclass(frozen=True)
class GroupSpec:
    """A rank's place in a group unit: ``size`` workers train one trial data-parallel.

    Attributes:
        rank: This task's rank, in ``range(size)``; rank 0 hosts the rendezvous and writes
            the checkpoint.
        size: Number of workers in the group (``k >= 1``).
        address: Host of rank 0's rendezvous (a ``torch.distributed`` TCP store).
        port: Its TCP port; ``0`` means "not chosen yet": the backend's ``submit_group``
            picks a free one (and the address) before the tasks are sent.
        partitions: The partition each rank trains, by rank (``partitions[rank]`` equals
            the task's ``partition``); distinct.
        group_id: Identifies this group unit (unique per attempt, for logs and checks).
        timeout_s: Seconds a rank waits for its peers at the rendezvous and at each
            collective before the unit fails with :class:`GroupBrokenError`.
        token: The group's secret: only ranks that present it can join the rendezvous.
            ``""`` lets the backend's ``submit_group`` draw a fresh random one for each
            attempt (it is not in ``repr`` and is never logged).

    Raises:
        ConfigError: A field breaks the rules above.
    """

    rank: int
    size: int
    address: str
    port: int
    partitions: tuple[int, ...]
    group_id: str
    timeout_s: float = 60.0
    token: str = dataclasses.field(default="", repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "partitions", tuple(self.partitions))
        for name in ("rank", "size", "port"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"GroupSpec.{name} must be an int, got {value!r}")
        if self.size < 1:
            raise ConfigError(f"GroupSpec.size must be >= 1, got {self.size}")
        if not 0 <= self.rank < self.size:
            raise ConfigError(f"GroupSpec.rank must be in range(size={self.size}), got {self.rank}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"GroupSpec.port must be in [0, 65535], got {self.port}")
        if len(self.partitions) != self.size:
            raise ConfigError(
                f"GroupSpec.partitions must name one partition per rank (size={self.size}), "
                f"got {list(self.partitions)}"
            )
        bad = [p for p in self.partitions if isinstance(p, bool) or not isinstance(p, int) or p < 0]
        if bad or len(set(self.partitions)) != self.size:
            raise ConfigError(
                "GroupSpec.partitions must be distinct non-negative ints, got "
                f"{list(self.partitions)}"
            )
        if not isinstance(self.group_id, str) or not self.group_id:
            raise ConfigError(f"GroupSpec.group_id must be a non-empty str, got {self.group_id!r}")
        timeout = self.timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ConfigError(f"GroupSpec.timeout_s must be a number > 0, got {timeout!r}")
        if not isinstance(self.token, str):
            raise ConfigError(f"GroupSpec.token must be a str, got {type(self.token).__name__}")

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-serialisable dict (the inverse of :meth:`from_json`)."""
        out = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        out["partitions"] = list(self.partitions)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GroupSpec:
        """Build a group spec from :meth:`to_json` output (``token`` may be absent)."""
        fields = dict(data)
        fields["partitions"] = tuple(fields["partitions"])
        return cls(**fields)


@dataclasses.dataclass(frozen=True)
class UnitTask:
    """Everything a worker needs to run one unit, besides the partition data it holds.

    Attributes:
        kind: Train (updates the checkpoint) or validate (reads it only).
        trial_id: The trial this unit belongs to.
        spec: Import path ``"package.module:ClassName"`` of the trial's ``ModelSpec``.
        params: The trial's hyperparameters (JSON values only).
        trial_seed: The trial's seed; model initialisation and batch order derive from it.
        epoch: The trial's own epoch, 0-based.
        partition: Index of the partition this unit reads (train or validation split).
        step: Position of this unit in the trial's visit order for ``epoch`` (train units).
        epoch_units: Number of train units in the trial's epoch (the unit with
            ``step == epoch_units - 1`` ends the epoch and steps the LR scheduler).
        checkpoint_in: Store key of the checkpoint to start from; ``None`` initialises.
        checkpoint_out: Store key the new checkpoint is written to (train units only).
        group: For a rank of a group unit (a train unit trained data-parallel by
            ``group.size`` workers), its place in the group; ``None`` (the default) for an
            ordinary unit. In a group unit ``step`` counts the trial's partitions already
            trained this epoch, and the unit ends the epoch when
            ``step + group.size == epoch_units``.
        checkpoint_in_sha256: SHA-256 the event log recorded for ``checkpoint_in``; the
            worker refuses other bytes with
            :class:`~cerebro_spark.errors.CheckpointCorruptError`. ``None`` (tasks of
            older drivers, or a checkpoint logged without a digest) reads unchecked.
    """

    kind: UnitKind
    trial_id: str
    spec: str
    params: Mapping[str, Any]
    trial_seed: int
    epoch: int
    partition: int
    step: int = 0
    epoch_units: int = 1
    checkpoint_in: str | None = None
    checkpoint_out: str | None = None
    group: GroupSpec | None = None
    checkpoint_in_sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-serialisable dict (the inverse of :meth:`from_json`).

        ``"group"`` and ``"checkpoint_in_sha256"`` are present only when set. ``params``
        is copied one level deep (its values are JSON values, read only). Built field by
        field: this runs for every unit on both sides of the wire, and
        ``dataclasses.asdict`` deep-copies.
        """
        out = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        out["kind"] = self.kind.value
        out["params"] = dict(self.params)
        if self.group is None:
            del out["group"]
        else:
            out["group"] = self.group.to_json()
        if self.checkpoint_in_sha256 is None:
            del out["checkpoint_in_sha256"]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> UnitTask:
        """Build a task from :meth:`to_json` output."""
        fields = dict(data)
        fields["kind"] = UnitKind(fields["kind"])
        if fields.get("group") is not None:
            fields["group"] = GroupSpec.from_json(fields["group"])
        return cls(**fields)


@dataclasses.dataclass(frozen=True)
class UnitResult:
    """What a worker reports after a unit.

    Attributes:
        task: The task that ran.
        worker_id: The worker that ran it.
        rows: Rows of the partition processed.
        seconds: Wall time of the unit on the worker (checkpoint I/O included; a train
            unit's checkpoint write may overlap the worker's next unit).
        metric_sums: Each metric's value over this unit's rows times ``rows`` (``"loss"``:
            the sum of per-row losses); divide by ``rows`` for the unit's value. The form
            logs written before ``metric_states`` carried; summing it over units gives
            row-weighted means, which are exact only for per-row means.
        checkpoint_bytes: Size of the checkpoint written (train) or read (validate).
        checkpoint_sha256: SHA-256 of the checkpoint written (train units), else ``None``.
        io_seconds: Part of ``seconds`` spent reading and writing checkpoints.
        metric_states: Each metric's mergeable state (JSON values, see
            :mod:`cerebro_spark.metrics`) by name, ``"loss"`` included: merging the states
            of a split's units gives the metric over the whole split exactly. Empty in
            results of older workers.
        checkpoint_bytes_read: Checkpoint bytes this unit read from the store (0 when the
            worker's checkpoint cache held them, or nothing was read).
        checkpoint_bytes_written: Checkpoint bytes this unit wrote to the store.
        checkpoint_cache_hits: Checkpoints this unit took from the worker's cache instead
            of the store (verified by digest). The three are 0 in results of older workers.
        checkpoint_prefetched: Of those hits, checkpoints the worker had read ahead while
            it trained an earlier unit (issue 27; their store bytes count in
            ``checkpoint_bytes_read``, read off this unit's critical path); 0 in results
            of older workers.
        data_wait_seconds: Part of ``seconds`` the training or validation loop waited for
            its batches (decoding, augmenting and collating not hidden behind compute);
            0 in results of older workers.
    """

    task: UnitTask
    worker_id: str
    rows: int
    seconds: float
    metric_sums: Mapping[str, float]
    checkpoint_bytes: int = 0
    checkpoint_sha256: str | None = None
    io_seconds: float = 0.0
    metric_states: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    checkpoint_bytes_read: int = 0
    checkpoint_bytes_written: int = 0
    checkpoint_cache_hits: int = 0
    data_wait_seconds: float = 0.0
    checkpoint_prefetched: int = 0

    def metrics(self) -> dict[str, float]:
        """Return each metric's value over this unit's rows (:attr:`metric_sums` / rows)."""
        if self.rows == 0:
            return {}
        return {name: total / self.rows for name, total in self.metric_sums.items()}

    def to_json(self) -> dict[str, Any]:
        """Return standard JSON values (NaN and infinities as text; see :meth:`from_json`)."""
        return {
            "task": self.task.to_json(),
            "worker_id": self.worker_id,
            "rows": self.rows,
            "seconds": _finite_or_text(self.seconds),
            "metric_sums": {name: _finite_or_text(v) for name, v in self.metric_sums.items()},
            "checkpoint_bytes": self.checkpoint_bytes,
            "checkpoint_sha256": self.checkpoint_sha256,
            "io_seconds": _finite_or_text(self.io_seconds),
            "metric_states": {
                name: _json_state(v) if isinstance(v, Mapping) else v
                for name, v in pack_states(self.metric_states).items()
            },
            "checkpoint_bytes_read": self.checkpoint_bytes_read,
            "checkpoint_bytes_written": self.checkpoint_bytes_written,
            "checkpoint_cache_hits": self.checkpoint_cache_hits,
            "data_wait_seconds": _finite_or_text(self.data_wait_seconds),
            "checkpoint_prefetched": self.checkpoint_prefetched,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> UnitResult:
        """Build a result from :meth:`to_json` output.

        Raises:
            ValueError: A field is missing or of the wrong type.
        """
        try:
            sha = data["checkpoint_sha256"]
            if sha is not None and not isinstance(sha, str):
                raise ValueError(f"checkpoint_sha256 must be a string or null, got {sha!r}")
            return cls(
                task=UnitTask.from_json(data["task"]),
                worker_id=str(data["worker_id"]),
                rows=int(data["rows"]),
                seconds=_number(data["seconds"]),
                metric_sums={
                    str(k): v if type(v) is float else _number(v)
                    for k, v in dict(data["metric_sums"]).items()
                },
                checkpoint_bytes=int(data["checkpoint_bytes"]),
                checkpoint_sha256=sha,
                io_seconds=_number(data["io_seconds"]),
                metric_states=unpack_states(
                    data.get("metric_states") or {}, convert=_state_from_json
                ),
                checkpoint_bytes_read=int(data.get("checkpoint_bytes_read", 0)),
                checkpoint_bytes_written=int(data.get("checkpoint_bytes_written", 0)),
                checkpoint_cache_hits=int(data.get("checkpoint_cache_hits", 0)),
                data_wait_seconds=_number(data.get("data_wait_seconds", 0.0)),
                checkpoint_prefetched=int(data.get("checkpoint_prefetched", 0)),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed unit result {dict(data)!r}: {exc!r}") from None


PackedStates = dict[str, Mapping[str, Any] | str]
"""Metric name to its state, or to the name of an earlier metric with an equal state."""


def pack_states(states: Mapping[str, Mapping[str, Any]]) -> PackedStates:
    """Return ``states`` with each state equal to an earlier one replaced by that one's name.

    The first metric with a state keeps it; a later metric whose state is equal (the same
    object, or equal values) names that metric instead::

        {"precision_macro": {"tp": [...], ...}, "recall_macro": "precision_macro"}

    A state is always a mapping, so a string is never a state. A 10-class validation unit
    reports 33 equal per-class-count states: written in full they were 80 % of the bytes a
    worker sent and the driver decoded, logged and folded for each validation unit. The
    order of ``states`` is kept; states are not copied.
    """
    packed: PackedStates = {}
    owners: list[tuple[str, Mapping[str, Any]]] = []  # each distinct state, first name
    by_id: dict[int, str] = {}
    for name, state in states.items():
        owner = by_id.get(id(state))
        if owner is None:
            owner = next((first for first, seen in owners if seen == state), None)
        if owner is None:
            owners.append((name, state))
            owner = name
            packed[name] = state
        else:
            packed[name] = owner
        by_id[id(state)] = owner
    return packed


def unpack_states(
    packed: Mapping[str, Any], convert: Callable[[Any], Any] | None = None
) -> dict[str, dict[str, Any]]:
    """Return every metric's state from a packed map (the inverse of :func:`pack_states`).

    Metrics that shared a state get the *same* object, so treat states as read-only (every
    merge returns a new state; see :class:`~cerebro_spark.metrics.Metric`). A map of full
    states (a result or log written before packing) is returned as it is.

    Args:
        packed: The packed map.
        convert: Applied once to each distinct state (e.g. NaN written as text).

    Raises:
        ValueError: A reference does not name an earlier metric, or a value is neither a
            state (a mapping) nor a reference (a string).
    """
    states: dict[str, dict[str, Any]] = {}
    for key, value in packed.items():
        name = str(key)
        if isinstance(value, str):
            if value not in states:
                raise ValueError(
                    f"the metric state of {name!r} refers to {value!r}, which is not an "
                    f"earlier metric of the same unit (metrics: {list(packed)})"
                )
            states[name] = states[value]
        elif isinstance(value, Mapping):
            states[name] = dict(convert(value) if convert is not None else value)
        else:
            raise ValueError(
                f"the metric state of {name!r} is {value!r}: it must be a state (a JSON "
                "object) or the name of an earlier metric with the same state"
            )
    return states


def _finite_or_text(value: float) -> float | str:
    """JSON has no NaN/inf: encode them as text."""
    return value if math.isfinite(value) else repr(value)


def _json_state(value: Any) -> Any:
    """A metric state with NaN and infinities as text (strict JSON)."""
    if isinstance(value, float):
        return _finite_or_text(value)
    if isinstance(value, Mapping):
        return {str(k): _json_state(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_state(v) for v in value]
    return value


_NON_FINITE = frozenset(("nan", "inf", "-inf"))
_PLAIN = (int, float)


def _state_from_json(value: Any) -> Any:
    """The inverse of :func:`_json_state`."""
    if isinstance(value, str) and value in _NON_FINITE:
        return float(value)
    if isinstance(value, Mapping):
        return {str(k): _state_from_json(v) for k, v in value.items()}
    if isinstance(value, list):  # counts: most items are plain numbers, kept as they are
        return [v if type(v) in _PLAIN else _state_from_json(v) for v in value]
    return value


def _number(value: Any) -> float:
    if isinstance(value, str):
        return float(value)  # "nan", "inf", "-inf"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {value!r}")
    return float(value)


def group_tasks(
    task: UnitTask,
    partitions: Sequence[int],
    group_id: str,
    *,
    address: str = "",
    port: int = 0,
    timeout_s: float = 60.0,
) -> tuple[UnitTask, ...]:
    """Return the ``len(partitions)`` rank tasks of one group unit, by rank.

    Rank ``r`` trains ``partitions[r]``; everything else is ``task``'s (a train unit whose
    ``step`` counts the trial's partitions already trained this epoch). Leave ``port`` at
    0 to let the backend's ``submit_group`` choose the rendezvous address and port.

    Args:
        task: The unit every rank shares (its ``partition`` and ``group`` are replaced).
        partitions: Distinct partitions, one per rank.
        group_id: Unique id of this group unit (per attempt).
        address: Rank 0's host, or ``""`` for the backend to fill in.
        port: Rendezvous port, or 0 for the backend to choose.
        timeout_s: See :attr:`GroupSpec.timeout_s`.

    Returns:
        The tasks, rank 0 first; they pass :func:`check_group`.

    Raises:
        ConfigError: The group breaks a rule of :class:`GroupSpec` or :func:`check_group`.
    """
    parts = tuple(partitions)
    tasks = tuple(
        dataclasses.replace(
            task,
            partition=partition,
            group=GroupSpec(rank, len(parts), address, port, parts, group_id, timeout_s),
        )
        for rank, partition in enumerate(parts)
    )
    check_group(tasks)
    return tasks


def check_group(tasks: Collection[UnitTask]) -> None:
    """Check that ``tasks`` are exactly the ranks of one group unit.

    Rules: every task is a train unit with a ``group``; the ranks are ``0 .. size-1``,
    each once, with ``size == len(tasks)``; rank ``r`` trains ``group.partitions[r]``;
    all tasks are equal except for ``partition`` and ``group.rank``; ``step + size <=
    epoch_units``.

    Raises:
        ConfigError: A rule is broken (the message names the rule and the values).
    """
    listed = list(tasks)
    if not listed:
        raise ConfigError("a group unit needs at least one task, got none")
    groups = [task.group for task in listed]
    if any(group is None for group in groups):
        raise ConfigError("every task of a group unit needs a GroupSpec in task.group")
    by_rank = {group.rank: task for task, group in zip(listed, groups, strict=True) if group}
    first = listed[0]
    assert first.group is not None  # ok: checked above
    size = first.group.size
    if sorted(by_rank) != list(range(size)) or len(listed) != size:
        raise ConfigError(
            f"group {first.group.group_id!r} of size {size} needs ranks 0..{size - 1} once "
            f"each, got ranks {sorted(g.rank for g in groups if g)}"
        )
    shared = _shared_fields(first)
    for task in listed:
        assert task.group is not None  # ok: checked above
        if task.kind is not UnitKind.TRAIN:
            raise ConfigError(f"group units train; got a {task.kind.value} task")
        if task.partition != task.group.partitions[task.group.rank]:
            raise ConfigError(
                f"rank {task.group.rank} of group {task.group.group_id!r} must train "
                f"partition {task.group.partitions[task.group.rank]}, got {task.partition}"
            )
        if _shared_fields(task) != shared:
            raise ConfigError(
                f"the tasks of group {first.group.group_id!r} must differ only in partition "
                f"and rank; rank {task.group.rank} differs from rank {first.group.rank}"
            )
    if first.step + size > first.epoch_units:
        raise ConfigError(
            f"group unit of size {size} at step {first.step} overruns the epoch of "
            f"epoch_units={first.epoch_units} partitions (needs step + size <= epoch_units)"
        )


def check_pack_tasks(tasks: Sequence[UnitTask]) -> None:
    """Check that ``tasks`` can be sent as one packed unit (issue 27), without torch.

    Rules (the wire's share of :func:`cerebro_spark.training.check_pack`, which also
    checks the data and the models when the worker runs the pack): a non-empty sequence
    of ordinary train tasks (no ``group``) of distinct trials, one partition and one
    spec, each with its own ``checkpoint_out``.

    Raises:
        ConfigError: A rule is broken (the message names the rule and the values).
    """
    if isinstance(tasks, (str, bytes)) or not isinstance(tasks, Sequence) or not tasks:
        raise ConfigError(f"a packed unit needs a non-empty sequence of UnitTasks, got {tasks!r}")
    first = tasks[0]
    trials: set[str] = set()
    outputs: set[str] = set()
    for task in tasks:
        if not isinstance(task, UnitTask):
            raise ConfigError(f"a packed unit holds UnitTasks, got {task!r}")
        name = f"trial {task.trial_id!r}"
        if task.kind is not UnitKind.TRAIN or task.group is not None:
            raise ConfigError(
                f"packed units are ordinary train units; the task of {name} is a "
                f"{task.kind.value} unit{' rank of a group' if task.group else ''}"
            )
        if task.partition != first.partition or task.spec != first.spec:
            raise ConfigError(
                f"a packed unit trains one partition with one spec: {name} has partition "
                f"{task.partition} and spec {task.spec!r}, trial {first.trial_id!r} has "
                f"{first.partition} and {first.spec!r}"
            )
        if task.trial_id in trials:
            raise ConfigError(f"the trials of a packed unit must be distinct: {name} is twice")
        if task.checkpoint_out is None or task.checkpoint_out in outputs:
            raise ConfigError(
                f"each trial of a packed unit writes its own checkpoint: {name} has "
                f"checkpoint_out {task.checkpoint_out!r}"
            )
        trials.add(task.trial_id)
        outputs.add(task.checkpoint_out)


def _shared_fields(task: UnitTask) -> dict[str, Any]:
    """The fields every rank of a group unit has in common, as JSON."""
    out = task.to_json()
    out.pop("partition")
    out["group"].pop("rank")
    return out
