"""Pieces shared by the successive-halving family (SHA, Hyperband, ASHA) and PBT.

* :func:`check_eta` and :func:`check_rung_epochs` validate the options every member takes.
* :func:`sha_ladder` is SHA's rung schedule: ``min(r·η^k, R)`` for ``k = 0, 1, ...`` up to
  the first rung that reaches ``R`` (RubberBand §3.1: the per-trial work grows by η at
  each stage).
* Scores are "larger is better" numbers, or ``None`` for a non-finite metric (NaN or ±inf),
  which ranks below every number. :func:`rank` orders trials best first; ties go to the
  older trial (smaller id), so rankings are deterministic.
* :class:`Bracket` is one synchronous successive-halving bracket on the epoch template
  (its rules are in its docstring); SHA runs one, Hyperband several.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from cerebro_spark.errors import ConfigError
from cerebro_spark.search._base import Decision, Mode
from cerebro_spark.search._grid import positive_int

Score = float | None
"""A metric as a number where larger is better; ``None`` when the metric was not finite."""


def check_eta(value: Any) -> int:
    """Return the reduction factor ``value`` if it is an int ``>= 2``, else raise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 2:
        raise ConfigError(f"eta must be an integer >= 2, got {value!r}")
    return int(value)


def check_rung_epochs(min_epochs: Any, epochs: Any) -> tuple[int, int]:
    """Return ``(min_epochs, epochs)`` checked: both ints ``>= 1``, ``min_epochs <= epochs``."""
    low = positive_int("min_epochs", min_epochs)
    high = positive_int("epochs", epochs)
    if low > high:
        raise ConfigError(f"min_epochs must be <= epochs ({high}), got {low}")
    return low, high


def sha_ladder(min_epochs: int, eta: int, epochs: int) -> list[int]:
    """Return SHA's rung epochs ``min(r·η^k, R)``, ``k = 0, 1, ...``, ending at ``R``.

    Example: ``sha_ladder(1, 3, 10) == [1, 3, 9, 10]``.
    """
    rungs = [min(min_epochs, epochs)]
    while rungs[-1] < epochs:
        rungs.append(min(rungs[-1] * eta, epochs))
    return rungs


def to_score(value: float, mode: Mode) -> Score:
    """Return ``value`` as a larger-is-better score (``None`` when it is not finite)."""
    if not math.isfinite(value):
        return None
    return value if mode == "max" else -value


def rank(scores: Mapping[str, Score]) -> list[str]:
    """Return the trial ids of ``scores`` best first (``None`` last, ties by id)."""

    def key(trial_id: str) -> tuple[int, float, str]:
        score = scores[trial_id]
        return (1, 0.0, trial_id) if score is None else (0, -score, trial_id)

    return sorted(scores, key=key)


def check_report(known: Mapping[str, int], trial_id: str, epoch: int, what: str) -> None:
    """Raise ``ValueError`` unless ``trial_id`` is in ``known`` and ``epoch`` is its next one.

    Args:
        known: Live trials mapped to the epochs they reported so far.
        trial_id: The reporting trial.
        epoch: The epoch of the report.
        what: How to describe a trial not in ``known`` (e.g. "not live").
    """
    done = known.get(trial_id)
    if done is None:
        raise ValueError(f"report for trial {trial_id!r}, which is {what}")
    if epoch != done + 1:
        raise ValueError(
            f"trial {trial_id}: report.epoch must be {done + 1} (its completed epochs), got {epoch}"
        )


class Bracket:
    """One synchronous successive-halving bracket (RubberBand §3.1) on the epoch template.

    Rules, for a bracket with rung epochs ``rungs`` (increasing, the last is the trials'
    full budget) and reduction factor ``eta``:

    * Every trial of the bracket starts at rung 0; all of them train together.
    * A trial that reports an epoch below its rung's epochs gets ``CONTINUE``.
    * A trial that reaches the last rung's epochs has finished: ``STOP``.
    * A trial that reaches an earlier rung waits there: ``PAUSE``, unless it is the last
      trial of the rung to report. That last report decides the rung: of the ``n_k`` trials
      at the rung the best ``max(1, ⌊n_k/η⌋)`` survive, the others are eliminated. The last
      reporter gets ``CONTINUE`` if it survives and ``STOP`` if not; paused survivors are
      handed out by :meth:`take_resumed`; paused losers stay paused for good (they are in
      :attr:`eliminated`). So no trial ever trains past a rung before the rung is decided,
      and every survivor starts the next rung in the same round.
    * A trial that fails leaves the bracket (:meth:`drop`); the rung is decided among the
      others, by the last of them to report or, if they were all waiting, at once.
    """

    def __init__(self, rungs: Sequence[int], eta: int) -> None:
        if not rungs or any(b <= a for a, b in itertools.pairwise(rungs)):
            raise ValueError(f"rung epochs must be increasing and non-empty, got {rungs!r}")
        self.rungs = list(rungs)
        self.eta = eta
        self.rung = 0
        self.training: dict[str, int] = {}  # trial -> epochs reported so far
        self.waiting: dict[str, Score] = {}  # trials at the current rung -> score there
        self.to_resume: list[str] = []
        self.eliminated: list[str] = []
        self.finished: list[str] = []

    def add(self, trial_ids: Iterable[str]) -> None:
        """Start trials at rung 0 (before any of the bracket's reports)."""
        for trial_id in trial_ids:
            self.training[trial_id] = 0

    @property
    def done(self) -> bool:
        """Whether the bracket has no trial training, waiting or to resume."""
        return not (self.training or self.waiting or self.to_resume)

    def on_epoch_end(self, trial_id: str, epoch: int, score: Score) -> Decision:
        """Decide a trial of the bracket after an epoch (rules in the class docstring)."""
        check_report(self.training, trial_id, epoch, "not training in its bracket")
        target = self.rungs[self.rung]
        if epoch < target:
            self.training[trial_id] = epoch
            return Decision.CONTINUE
        del self.training[trial_id]
        if self.rung == len(self.rungs) - 1:
            self.finished.append(trial_id)
            return Decision.STOP
        self.waiting[trial_id] = score
        if self.training:
            return Decision.PAUSE
        return self._decide_rung(trial_id)

    def drop(self, trial_id: str) -> None:
        """Take a failed trial out of the bracket.

        A rung it alone held open is decided at once among the trials waiting there (the
        survivors are resumed, the others eliminated).
        """
        if self.training.pop(trial_id, None) is None:
            return
        if not self.training and self.waiting:
            self._decide_rung(None)

    def _decide_rung(self, last: str | None) -> Decision:
        ranked = rank(self.waiting)
        keep = max(1, len(ranked) // self.eta)
        survivors, losers = ranked[:keep], ranked[keep:]
        self.rung += 1
        self.waiting = {}
        epochs = self.rungs[self.rung - 1]
        for trial_id in survivors:
            self.training[trial_id] = epochs
            if trial_id != last:
                self.to_resume.append(trial_id)
        self.eliminated.extend(t for t in losers if t != last)
        if last in losers:
            self.finished.append(last)
            return Decision.STOP
        return Decision.CONTINUE

    def take_resumed(self) -> list[str]:
        """Return (once) the paused survivors of the last decided rung, in id order."""
        resumed, self.to_resume = sorted(self.to_resume), []
        return resumed

    def state_dict(self) -> dict[str, Any]:
        """Return the bracket's state as JSON values."""
        return {
            "rungs": list(self.rungs),
            "rung": self.rung,
            "training": dict(self.training),
            "waiting": dict(self.waiting),
            "to_resume": list(self.to_resume),
            "eliminated": list(self.eliminated),
            "finished": list(self.finished),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any], eta: int) -> Bracket:
        """Rebuild a bracket from :meth:`state_dict` output."""
        bracket = cls([int(e) for e in state["rungs"]], eta)
        bracket.rung = int(state["rung"])
        bracket.training = {str(k): int(v) for k, v in state["training"].items()}
        bracket.waiting = {
            str(k): None if v is None else float(v) for k, v in state["waiting"].items()
        }
        bracket.to_resume = [str(t) for t in state["to_resume"]]
        bracket.eliminated = [str(t) for t in state["eliminated"]]
        bracket.finished = [str(t) for t in state["finished"]]
        return bracket


def check_same_arguments(procedure: object, state: Mapping[str, Any], **mine: Any) -> None:
    """Raise ``ConfigError`` if ``state`` was saved by a procedure with other arguments.

    Args:
        procedure: The procedure loading the state (its class names it in the message).
        state: The saved state; it holds each argument of ``mine`` under ``"args"``.
        **mine: The loading procedure's values of those arguments.
    """
    saved = state["args"]
    for key, value in mine.items():
        if saved.get(key) != value:
            raise ConfigError(
                f"cannot resume {type(procedure).__name__}: the state has "
                f"{key}={saved.get(key)!r} but this procedure has {key}={value!r}"
            )
