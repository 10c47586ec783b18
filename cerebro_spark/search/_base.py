"""The search-procedure seam: Cerebro's epoch template (Cerebro §4.2).

A procedure proposes trials, sees every live trial's validation metrics after each of
its epochs, and answers with a :class:`Decision`. The engine trains every live trial one
epoch with model hopper parallelism between two rounds of questions.

Rules every implementation keeps (``tests/search/procedure_contract.py`` checks them):

* No engine, runner or backend is ever passed in; a procedure sees only reports.
* Randomness comes from the ``numpy.random.Generator`` given to the constructor; time
  from the injected ``clock`` (seconds, monotonic). No global random state.
* :meth:`SearchProcedure.suggest` returns only trials not returned before; trial ids are
  unique, assigned by the procedure with :meth:`SearchProcedure._new_trial`.
* :meth:`SearchProcedure.on_epoch_end` is called exactly once per live trial per epoch,
  with ``report.epoch`` counting that trial's completed epochs (1 after its first).
* ``state_dict()`` is JSON-serialisable; ``load_state_dict(state_dict())`` on a freshly
  constructed procedure with the same arguments gives the same future behaviour. The base
  class saves and restores the generator's state (``"rng"``); subclasses extend the dict.
* Every report carries the procedure's metric; read it with
  :meth:`SearchProcedure.metric_value`, which raises ``ConfigError`` naming the trial and
  the metrics it got when it is missing.
* Time: ``clock()`` returns seconds of *experiment* time: 0 when the experiment started,
  advancing only while a driver runs it (time the driver was down before a ``resume`` is
  not charged). Deadlines are given in the same seconds.
* A procedure that needs the cluster size takes the keyword option ``num_workers``; the
  engine fills it in with the experiment's worker count when the config does not.
* :meth:`SearchProcedure.resources` says how many workers a live trial trains on in its
  next epoch (default 1); more than one means a data-parallel group (Cerebro §5.7).
* :meth:`SearchProcedure.stage_spec` gives the search's stages before it runs (for the
  elastic planner); it describes the procedure as constructed, options and defaults
  included.
* User-input problems raise :class:`~cerebro_spark.errors.ConfigError`, never ``assert``.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np

from cerebro_spark.errors import ConfigError
from cerebro_spark.search._stages import ExperimentSpec

Mode = Literal["min", "max"]
Clock = Callable[[], float]


class Decision(str, enum.Enum):
    """What happens to a trial after an epoch."""

    CONTINUE = "continue"
    """Train it another epoch."""
    PAUSE = "pause"
    """Keep its checkpoint but do not train it until the procedure resumes it."""
    STOP = "stop"
    """It is done (finished its budget or was eliminated)."""


@dataclasses.dataclass(frozen=True)
class TrialSpec:
    """A trial the procedure asks for.

    Attributes:
        trial_id: Unique id, e.g. ``"t0007"``.
        params: Hyperparameters (JSON values only).
        clone_from: Id of a trial whose latest checkpoint this one starts from (PBT).
    """

    trial_id: str
    params: Mapping[str, Any]
    clone_from: str | None = None


@dataclasses.dataclass(frozen=True)
class EpochReport:
    """A live trial's validation metrics after one of its epochs.

    Attributes:
        trial_id: The trial.
        epoch: Epochs this trial has completed (1 after its first).
        metrics: Row-weighted validation metrics, e.g. ``{"loss": .., "accuracy": ..}``.
        seconds: Wall seconds the trial's units took this epoch (train and validate,
            summed over its units: its cost on one worker).
    """

    trial_id: str
    epoch: int
    metrics: Mapping[str, float]
    seconds: float = 0.0


def check_mode(mode: str) -> Mode:
    """Validate an optimisation direction."""
    if mode not in ("min", "max"):
        raise ConfigError(f"mode must be 'min' or 'max', got {mode!r}")
    return mode  # type: ignore[return-value]


class SearchProcedure(abc.ABC):
    """Base class of all search procedures.

    Args:
        metric: Name of the validation metric to optimise.
        mode: ``"max"`` or ``"min"``.
        rng: Source of all randomness.
        clock: Monotonic clock in seconds (injected for testing and simulation).
    """

    def __init__(
        self,
        metric: str,
        mode: str,
        rng: np.random.Generator,
        clock: Clock = time.monotonic,
    ) -> None:
        if not metric:
            raise ConfigError("metric must be a non-empty metric name")
        self.metric = metric
        self.mode: Mode = check_mode(mode)
        self.rng = rng
        self.clock = clock
        self._next_trial_number = 0

    def _new_trial(self, params: Mapping[str, Any], clone_from: str | None = None) -> TrialSpec:
        """Create a trial with a fresh id."""
        trial_id = f"t{self._next_trial_number:04d}"
        self._next_trial_number += 1
        return TrialSpec(trial_id, dict(params), clone_from)

    def score(self, metrics: Mapping[str, float]) -> float:
        """Return the metric as a number where larger is better."""
        value = float(metrics[self.metric])
        return value if self.mode == "max" else -value

    def metric_value(self, report: EpochReport) -> float:
        """Return ``report``'s value of :attr:`metric`.

        Raises:
            ConfigError: The report lacks the metric (the message names the trial and the
                metrics it did report, so a misspelt metric name is easy to spot).
        """
        if self.metric not in report.metrics:
            got = ", ".join(sorted(report.metrics)) or "none"
            raise ConfigError(
                f"metric {self.metric!r} is missing from the report of trial "
                f"{report.trial_id} (epoch {report.epoch}); it reported: {got}"
            )
        return float(report.metrics[self.metric])

    @abc.abstractmethod
    def suggest(self) -> list[TrialSpec]:
        """Return new trials to start now (possibly none)."""

    @abc.abstractmethod
    def on_epoch_end(self, report: EpochReport) -> Decision:
        """Decide a live trial's fate after one of its epochs."""

    def on_trial_failed(self, trial_id: str) -> None:
        """Hear that a trial's user code failed; it will never report again.

        The default does nothing; a procedure that waits for every live trial's report
        (a rung, a PBT generation) must drop ``trial_id`` from what it waits for.
        """
        del trial_id

    def resources(self, trial_id: str) -> int:
        """Return the number of workers ``trial_id`` trains on in its next epoch (default 1)."""
        del trial_id
        return 1

    def resumed(self) -> list[str]:
        """Return ids of paused trials to train again from the next epoch (default: none)."""
        return []

    def stage_spec(self) -> ExperimentSpec | None:
        """Return the search's stage structure (RubberBand Fig. 6), known before it runs.

        Every registered procedure gives one (see :mod:`cerebro_spark.search._stages`):
        synchronous procedures their stages, asynchronous ones their work as one stage
        with ``elastic=False`` and the trials they keep in flight. ``None`` (the default)
        means the procedure cannot say, and the elastic planner refuses it.
        """
        return None

    @abc.abstractmethod
    def is_finished(self) -> bool:
        """Whether the procedure will suggest no more trials and resume none."""

    def state_dict(self) -> dict[str, Any]:
        """Return the procedure's state as JSON values (override and call super).

        Includes the generator's bit-generator state under ``"rng"``.
        """
        return {
            "next_trial_number": self._next_trial_number,
            "rng": _to_json(self.rng.bit_generator.state),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output (override and call super)."""
        self._next_trial_number = int(state["next_trial_number"])
        if "rng" in state:
            self.rng.bit_generator.state = state["rng"]


def _to_json(value: Any) -> Any:
    """Convert a bit generator's state (dicts, arrays, numpy ints) to JSON values."""
    if isinstance(value, Mapping):
        return {str(k): _to_json(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value
