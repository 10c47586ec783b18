"""The messages that cross the driver/worker boundary: a unit of work and its result.

A *training unit* is one sub-epoch of one trial on one data partition (Cerebro §3.1); a
*validation unit* evaluates a trial's latest checkpoint on one validation partition. Both
are plain, picklable, JSON-friendly dataclasses with no torch or Spark inside, so the
scheduler, the event log and the backends can share them.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any


class UnitKind(str, enum.Enum):
    """What a unit does with its partition."""

    TRAIN = "train"
    VALIDATE = "validate"


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

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-serialisable dict (the inverse of :meth:`from_json`)."""
        out = dataclasses.asdict(self)
        out["kind"] = self.kind.value
        out["params"] = dict(self.params)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> UnitTask:
        """Build a task from :meth:`to_json` output."""
        fields = dict(data)
        fields["kind"] = UnitKind(fields["kind"])
        return cls(**fields)


@dataclasses.dataclass(frozen=True)
class UnitResult:
    """What a worker reports after a unit.

    Attributes:
        task: The task that ran.
        worker_id: The worker that ran it.
        rows: Rows of the partition processed.
        seconds: Wall time of the unit on the worker (checkpoint I/O included).
        metric_sums: Row-weighted sums, e.g. ``{"loss": sum of per-row loss, ...}``;
            divide by ``rows`` for the mean. Summing over partitions and dividing by the
            summed rows gives the row-weighted epoch metric.
        checkpoint_bytes: Size of the checkpoint written (train) or read (validate).
        checkpoint_sha256: SHA-256 of the checkpoint written (train units), else ``None``.
        io_seconds: Part of ``seconds`` spent reading and writing checkpoints.
    """

    task: UnitTask
    worker_id: str
    rows: int
    seconds: float
    metric_sums: Mapping[str, float]
    checkpoint_bytes: int = 0
    checkpoint_sha256: str | None = None
    io_seconds: float = 0.0

    def metrics(self) -> dict[str, float]:
        """Return the per-row means of :attr:`metric_sums`."""
        if self.rows == 0:
            return {}
        return {name: total / self.rows for name, total in self.metric_sums.items()}
