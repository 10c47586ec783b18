"""Exceptions raised by cerebro-spark.

Every error names the offending value and the rule it broke, so that a user can fix
the input without reading the source.
"""

from __future__ import annotations


class CerebroError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(CerebroError, ValueError):
    """An experiment config or API argument breaks a rule (the message names the field)."""


class DataError(CerebroError, ValueError):
    """A dataset or partition breaks the dataset format (the message names the column)."""


class StoreError(CerebroError, OSError):
    """A store operation failed (the message names the URI)."""


class WorkerLostError(CerebroError, RuntimeError):
    """A worker died or left while it ran a unit; the unit goes back to the queue."""


class TrialError(CerebroError, RuntimeError):
    """User code raised while training or evaluating a trial; the trial is marked failed."""


class EventLogError(CerebroError, ValueError):
    """An event log holds what no crash can leave (the message names the line)."""
