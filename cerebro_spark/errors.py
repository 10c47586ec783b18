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


class LeaseError(CerebroError, RuntimeError):
    """Another driver holds the experiment's lease, or this driver lost it (names who)."""


class WorkerLostError(CerebroError, RuntimeError):
    """A worker died or left while it ran a unit; the unit goes back to the queue."""


class TrialError(CerebroError, RuntimeError):
    """User code raised while training or evaluating a trial; the trial is marked failed."""


class EventLogError(CerebroError, ValueError):
    """An event log holds what no crash can leave (the message names the line)."""


class SearchFailedError(CerebroError, RuntimeError):
    """A search produced nothing: every trial failed, or none reported a finite metric.

    It is raised after the event log, the leaderboard and the checkpoints are written, so
    nothing is lost; the message names the first failure (trial id and error).

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
