"""Exceptions raised by cerebro-spark.

Every error names the offending value and the rule it broke, so that a user can fix
the input without reading the source.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class CerebroError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(CerebroError, ValueError):
    """An experiment config or API argument breaks a rule (the message names the field)."""


class DataError(CerebroError, ValueError):
    """A dataset or partition breaks the dataset format (the message names the column)."""


class StoreError(CerebroError, OSError):
    """A store operation failed (the message names the URI)."""


class CheckpointCorruptError(StoreError):
    """Checkpoint bytes differ from those the event log recorded (a storage fault).

    Raised when a checkpoint's SHA-256 is not the one logged when it was written: another
    file copied over it, a truncated or partly overwritten file, a flipped byte. It is an
    I/O fault, never blamed on the trial's code: the unit is retried, and a trial whose
    checkpoint itself is bad is reported failed with ``"checkpoint corrupt: <url>"``.

    Attributes:
        where: The checkpoint's key or URI.
        expected: The SHA-256 the log recorded.
        actual: The SHA-256 of the bytes read.
        size: The number of bytes read.
    """

    def __init__(self, where: str, expected: str, actual: str, size: int) -> None:
        super().__init__(
            f"checkpoint corrupt: {where} has SHA-256 {actual} ({size} bytes), but the event "
            f"log recorded {expected} for it (truncated, overwritten or changed after it was "
            "written)"
        )
        self.where = where
        self.expected = expected
        self.actual = actual
        self.size = size

    def __reduce__(self) -> tuple[Any, ...]:
        return (CheckpointCorruptError, (self.where, self.expected, self.actual, self.size))


class StoreFullError(StoreError):
    """The store's disk is full (``ENOSPC`` or ``EDQUOT``) while writing a key.

    The run ends (retrying cannot help); the event log was left at a line boundary, so
    ``cerebro-spark resume`` continues once space is freed. The message names the URI.
    """


class StoreUnavailableError(StoreError):
    """A remote store stayed unreachable longer than the retry budget allows.

    Only connection-level failures are retried (see
    :func:`cerebro_spark.store.retry_seconds`); the message names the URI, the operation
    and how long it was retried.
    """


class LeaseError(CerebroError, RuntimeError):
    """Another driver holds the experiment's lease, or this driver lost it (names who)."""


class WorkerLostError(CerebroError, RuntimeError):
    """A worker died or left while it ran a unit; the unit goes back to the queue."""


class TrialError(CerebroError, RuntimeError):
    """User code raised while training or evaluating a trial; the trial is marked failed."""


class EventLogError(CerebroError, ValueError):
    """An event log holds what no crash can leave (the message names the line)."""


class ProcedureContractError(CerebroError, RuntimeError):
    """A search procedure's answer breaks a rule of the epoch template (a bug in its code).

    Raised by :class:`cerebro_spark.search.EpochTemplate` for the driver, the simulator and
    the contract tests alike: a resumed trial that is not paused, ``resources()`` that is
    not an integer >= 1, a decision that is not a ``Decision``, a reused trial id, a
    finished procedure that suggests or resumes. The message names the procedure, the
    trial and the value.
    """


class SearchFailedError(CerebroError, RuntimeError):
    """A search produced nothing: no trial completed with a finite metric.

    Every trial failed, none reported a finite metric, or the procedure suggested none
    (its deadline passed first). It is raised after the event log, the leaderboard and
    the checkpoints are written, so nothing is lost; the message names the first failure
    (trial id and error), or the deadline when no trial was suggested.

    Attributes:
        experiment_id: The experiment.
        url: URI of its directory (``events.jsonl``, ``leaderboard.csv``).
        failures: ``(trial id, error)`` of each failed trial, in the order they failed.
        trials: Every trial, ranked as the leaderboard ranks them (engine ``TrialState``).
    """

    def __init__(
        self,
        message: str,
        *,
        experiment_id: str,
        url: str,
        failures: Sequence[tuple[str, str]] = (),
        trials: Sequence[Any] = (),
    ) -> None:
        super().__init__(message)
        self.experiment_id = experiment_id
        self.url = url
        self.failures = list(failures)
        self.trials = list(trials)

    def __reduce__(self) -> tuple[Any, ...]:
        fields = {
            "experiment_id": self.experiment_id,
            "url": self.url,
            "failures": self.failures,
            "trials": self.trials,
        }
        return (_rebuild_search_failed, (str(self), fields))


def _rebuild_search_failed(message: str, fields: dict[str, Any]) -> SearchFailedError:
    return SearchFailedError(message, **fields)
