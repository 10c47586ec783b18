"""One epoch template: the rules of a round, kept once for every loop that runs a procedure.

Cerebro's epoch template (Cerebro §4.2): each round the procedure proposes new trials and
resumes paused ones, every live trial trains one epoch (on as many workers as
:meth:`~cerebro_spark.search.SearchProcedure.resources` says, Cerebro §5.7), and the
procedure then decides each one's fate from its report. Three loops run it: the driver
(``cerebro_spark/driver/_experiment.py``, real training), the simulator
(``cerebro_spark/simulate/_run.py``, virtual time) and the contract tests' ``FakeLoop``
(``tests/search/procedure_contract.py``). Each keeps its own bookkeeping (events, lists,
dicts) and its own order of trials; :class:`EpochTemplate` holds what they must agree on,
one rule for each question:

* **New trials** (:meth:`EpochTemplate.open_round`): ``suggest()`` returns a list of
  :class:`~cerebro_spark.search.TrialSpec`, each with a non-empty string id never seen
  before (nor twice in the list), params that are JSON values (they go into the event
  log as they are), and a ``clone_from`` that names a known trial or one earlier in the list.
* **Resumed trials**: ``resumed()`` returns a list naming only trials that are paused
  now; a running, stopped, completed or failed trial, one suggested in the same round,
  one named twice and an unknown id are refused. A trial that failed never trains again.
* **A finished procedure** (``is_finished()`` true when the round opens) suggests and
  resumes nothing.
* **A stall**: a round opened with nothing to train while the procedure is not finished
  (:attr:`RoundOpening.stalled`). What to do about it is the loop's: the driver ends the
  search with a warning, the simulator ends the run with reason ``"stalled"``, the
  contract tests fail the procedure.
* **Resources** (:meth:`EpochTemplate.resources`): an integer (``int`` or a numpy integer,
  never ``bool``) ≥ 1, returned as ``int``; anything else is refused, never clamped. A
  loop may still give a trial fewer workers than it asked for when there are fewer (the
  MOP scheduler caps a group at the live workers, the simulator at its cluster).
* **An epoch's end** (:meth:`EpochTemplate.close_epoch`): ``on_epoch_end`` returns a
  :class:`~cerebro_spark.search.Decision` member (a plain string is refused); the trial's
  next status is ``running`` (continue), ``paused`` (pause), ``completed`` (stop after the
  epoch budget) or ``stopped`` (stop before it).

Every refusal raises :class:`~cerebro_spark.errors.ProcedureContractError` naming the
procedure, the trial and the value: the procedure's code is wrong, so the run ends there
(nothing it logged before is lost; ``resume`` replays the same procedure, which breaks the
rule again until it is fixed).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

import numpy as np

from cerebro_spark.errors import ProcedureContractError
from cerebro_spark.search._base import Decision, EpochReport, SearchProcedure, TrialSpec

TrialStatus = Literal["running", "paused", "completed", "stopped", "failed"]
"""A trial's status, as the driver's event log and leaderboard spell it."""
RUNNING: Final = "running"
PAUSED: Final = "paused"
COMPLETED: Final = "completed"
STOPPED: Final = "stopped"
FAILED: Final = "failed"


@dataclasses.dataclass(frozen=True)
class RoundOpening:
    """What a procedure asked for when a round opened (checked).

    Attributes:
        added: New trials from ``suggest()``, in its order.
        resumed: Paused trials from ``resumed()`` to train again, in its order.
        live: Trials that train this round: those running before, added and resumed.
        stalled: Nothing trains, yet the procedure is not finished (it would wait for
            ever: it waits for a report no trial will send).
    """

    added: tuple[TrialSpec, ...]
    resumed: tuple[str, ...]
    live: int
    stalled: bool


class EpochTemplate:
    """The rules of a round around one procedure (module docstring).

    It holds no trial state: each call is given the statuses of the trials the loop knows.

    Args:
        procedure: The search procedure.
        name: How errors name it (the registered name); its class name by default.
        epochs: The epoch budget per trial: a trial stopped after this many epochs is
            ``completed``, before it ``stopped``. ``None``: every stop is ``stopped``.
    """

    def __init__(
        self, procedure: SearchProcedure, *, name: str | None = None, epochs: int | None = None
    ) -> None:
        self.procedure = procedure
        self.name = name if name is not None else type(procedure).__name__
        self.epochs = epochs

    def _refuse(self, rule: str) -> ProcedureContractError:
        return ProcedureContractError(f"search procedure {self.name!r} {rule}")

    # -- a round opens ----------------------------------------------------------------------

    def open_round(self, statuses: Mapping[str, str]) -> RoundOpening:
        """Ask the procedure for new and resumed trials, and check both answers.

        Calls ``is_finished()``, ``suggest()``, ``resumed()`` and, when nothing would
        train, ``is_finished()`` again, in that order.

        Args:
            statuses: Every trial the procedure suggested before this round, by id, with
                its status (:data:`TrialStatus`).

        Raises:
            ProcedureContractError: An answer breaks a rule of the module docstring.
        """
        procedure = self.procedure
        was_finished = procedure.is_finished()
        added = self._check_suggested(procedure.suggest(), statuses, was_finished)
        resumed = self._check_resumed(procedure.resumed(), statuses, added, was_finished)
        live = sum(status == RUNNING for status in statuses.values()) + len(added) + len(resumed)
        stalled = live == 0 and not procedure.is_finished()
        return RoundOpening(added, resumed, live, stalled)

    def _check_suggested(
        self, specs: object, statuses: Mapping[str, str], was_finished: bool
    ) -> tuple[TrialSpec, ...]:
        if not isinstance(specs, list):
            raise self._refuse(
                f"returned {type(specs).__name__} from suggest(); it must return a list of "
                "TrialSpec"
            )
        if was_finished and specs:
            ids = [getattr(spec, "trial_id", spec) for spec in specs]
            raise self._refuse(
                f"suggested {ids} after is_finished() said it was finished; a finished "
                "procedure suggests no trial"
            )
        seen: set[str] = set()
        for spec in specs:
            if not isinstance(spec, TrialSpec):
                raise self._refuse(f"returned {spec!r} from suggest(), not a TrialSpec")
            trial_id = spec.trial_id
            if not isinstance(trial_id, str) or not trial_id:
                raise self._refuse(
                    f"suggested a trial with id {trial_id!r}; ids are non-empty strings"
                )
            if trial_id in statuses or trial_id in seen:
                raise self._refuse(
                    f"suggest() returned known trial id {trial_id!r}; each trial is "
                    "suggested once, with a fresh id (SearchProcedure._new_trial)"
                )
            source = spec.clone_from
            if source is not None and source not in statuses and source not in seen:
                raise self._refuse(
                    f"suggested trial {trial_id} as a clone of unknown trial {source!r}; "
                    "clone_from names a trial suggested before it"
                )
            self._check_params(trial_id, spec.params)
            seen.add(trial_id)
        return tuple(specs)

    def _check_params(self, trial_id: str, params: object) -> None:
        """Refuse params that do not come back unchanged through JSON (the log stores them)."""
        try:
            same = isinstance(params, Mapping) and (
                json.loads(json.dumps(dict(params), allow_nan=False)) == dict(params)
            )
        except (TypeError, ValueError):
            same = False
        if not same:
            raise self._refuse(
                f"suggested trial {trial_id} with params {params!r}, which are not JSON values "
                "(strings, finite numbers, booleans, null, lists, objects with string keys)"
            )

    def _check_resumed(
        self,
        resumed: object,
        statuses: Mapping[str, str],
        added: Sequence[TrialSpec],
        was_finished: bool,
    ) -> tuple[str, ...]:
        if not isinstance(resumed, list):
            raise self._refuse(
                f"returned {type(resumed).__name__} from resumed(); it must return a list of "
                "trial ids"
            )
        if was_finished and resumed:
            raise self._refuse(
                f"resumed {resumed} after is_finished() said it was finished; a finished "
                "procedure resumes no trial"
            )
        new = {spec.trial_id for spec in added}
        taken: set[str] = set()
        for trial_id in resumed:
            status = statuses.get(trial_id) if isinstance(trial_id, str) else None
            if trial_id in taken:
                why = "already resumed in this round"
            elif trial_id in new:
                why = "suggested in this round (it trains already)"
            elif status is None:
                why = "unknown (never suggested)"
            elif status != PAUSED:
                why = status
            else:
                taken.add(trial_id)
                continue
            raise self._refuse(
                f"resumed trial {trial_id!r}, which is {why}; resumed() names only paused trials"
            )
        return tuple(resumed)

    # -- a round runs ---------------------------------------------------------------------

    def resources(self, trial_id: str) -> int:
        """The workers a live trial trains on in its next epoch (Cerebro §5.7).

        Raises:
            ProcedureContractError: ``resources()`` gave anything but an integer ≥ 1 (a
                ``bool``, a float, ``0``): the message names the trial and the value.
        """
        size: Any = self.procedure.resources(trial_id)
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
            raise self._refuse(
                f"asked for resources={size!r} for trial {trial_id}; resources must be an "
                "integer >= 1 (workers)"
            )
        return int(size)

    # -- a trial's epoch ends -------------------------------------------------------------

    def close_epoch(self, report: EpochReport) -> tuple[Decision, TrialStatus]:
        """Give the procedure a live trial's report; return its decision and next status.

        Raises:
            ProcedureContractError: ``on_epoch_end`` returned anything but a
                :class:`~cerebro_spark.search.Decision`.
        """
        decision: Any = self.procedure.on_epoch_end(report)
        if not isinstance(decision, Decision):
            raise self._refuse(
                f"on_epoch_end (trial {report.trial_id}, epoch {report.epoch}) returned "
                f"{decision!r}, not a Decision"
            )
        return decision, self.status_after(decision, report.epoch)

    def status_after(self, decision: Decision, epochs: int) -> TrialStatus:
        """A trial's status after ``decision`` once it has trained ``epochs`` epochs."""
        if decision is Decision.CONTINUE:
            return RUNNING
        if decision is Decision.PAUSE:
            return PAUSED
        if self.epochs is not None and epochs >= self.epochs:
            return COMPLETED
        return STOPPED
