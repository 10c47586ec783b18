"""The driver's checkpoint bookkeeping: keep what a trial needs, delete what it moved past.

Each trial keeps its latest checkpoint (Cerebro §5.6: training continues from it) and the
one trained through its best epoch; the log says which (``ExperimentState.needs_checkpoint``).
:class:`CheckpointKeeper` deletes a superseded checkpoint once the events that moved past
it are durable, sweeps what a killed driver left behind, re-checks a checkpoint a worker
found corrupt, and copies the best epoch of the best trial to ``best.pt``. Only the lease
holder deletes.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable

from cerebro_spark.driver._events import EventLog
from cerebro_spark.driver._layout import BEST_CHECKPOINT_NAME
from cerebro_spark.driver._state import ExperimentState, TrialState
from cerebro_spark.errors import CheckpointCorruptError, StoreError
from cerebro_spark.store import Store

logger = logging.getLogger(__name__)


class CheckpointKeeper:
    """Keeps an experiment's checkpoints to what its log says its trials need.

    Args:
        root: The root store (checkpoint keys are relative to it).
        prefix: The experiment's folder in it.
        state: The experiment's state, folded from its log as it is written.
        log: Its event log (deletions wait for the events that allow them to be durable).
        check_lease: Raises unless this driver still holds the experiment's lease.
    """

    def __init__(
        self,
        root: Store,
        prefix: str,
        state: ExperimentState,
        log: EventLog,
        check_lease: Callable[[], None],
    ) -> None:
        self.root, self.prefix, self.state, self.log = root, prefix, state, log
        self.check_lease = check_lease

    def write_best(
        self, best: TrialState | None, store: Store, metric: str
    ) -> tuple[str | None, str | None]:
        """Copy the best epoch of the best trial to ``best.pt``; return its key and SHA-256.

        The bytes are checked against the SHA-256 the log recorded for them. A trial
        folded from a log written before best checkpoints were kept may have lost its
        best epoch's checkpoint: its latest is copied then, with a warning.
        """
        if best is None:
            logger.warning(
                "no trial reported a finite %s: %s not written",
                metric,
                BEST_CHECKPOINT_NAME,
            )
            return None, None
        key, sha256 = best.best_checkpoint, best.best_checkpoint_sha256
        if key is None:
            key, sha256 = best.checkpoint, best.checkpoint_sha256
            logger.warning(
                "the checkpoint of trial %s's best epoch %s was not kept (its log predates "
                "best checkpoints); %s is its latest, epoch %d",
                best.trial_id,
                best.best_epoch,
                BEST_CHECKPOINT_NAME,
                best.epochs,
            )
        if key is None:
            return None, None
        data = self.root.get(key)
        actual = hashlib.sha256(data).hexdigest()
        if sha256 is not None and actual != sha256:
            raise CheckpointCorruptError(self.root.url(key), sha256, actual, len(data))
        store.put(BEST_CHECKPOINT_NAME, data)
        logger.info(
            "%s: trial %s, epoch %s (%s %s), from %s",
            BEST_CHECKPOINT_NAME,
            best.trial_id,
            best.best_epoch,
            metric,
            best.best_metrics.get(metric),
            key,
        )
        return key, actual

    def sweep(self) -> None:
        """Delete every checkpoint no trial needs and log the ones kept.

        Checkpoints are deleted as they are superseded (:meth:`drop`); this
        sweep also removes those a killed driver left behind (a unit written but never
        logged, a superseded one not yet deleted).
        """
        folder = f"{self.prefix}/checkpoints/"
        self.log.flush()  # what the state says must be durable before deleting by it
        self.check_lease()  # only the lease holder deletes checkpoints
        for key in self.root.list(folder):
            if not self.state.needs_checkpoint(key):
                logger.debug("deleting checkpoint %s: no trial needs it", key)
                self.root.delete(key)
        kept = []
        for trial in sorted(self.state.trials.values(), key=lambda t: t.trial_id):
            roles: dict[str, list[str]] = {}
            best = f"best, epoch {trial.best_epoch}"
            for checkpoint, role in ((trial.checkpoint, "latest"), (trial.best_checkpoint, best)):
                if checkpoint is not None:
                    roles.setdefault(checkpoint, []).append(role)
            if roles:
                files = (f"{_short(k, folder)} ({' and '.join(r)})" for k, r in roles.items())
                kept.append(f"{trial.trial_id}: {', '.join(files)}")
        where = self.root.url(folder.rstrip("/"))
        logger.info("checkpoints kept in %s: %s", where, "; ".join(kept) or "none")

    def verify(
        self, trial_id: str, errors: Iterable[BaseException]
    ) -> CheckpointCorruptError | None:
        """The driver's own check of a trial's latest checkpoint after a worker found it corrupt.

        A worker that reads checkpoint bytes other than those the log recorded raises
        :class:`CheckpointCorruptError`, which the backend rebuilds on the driver. The
        driver then reads the checkpoint and compares its SHA-256 itself: bytes that
        differ make the trial fail with
        ``"checkpoint corrupt: <url> ..."`` (rolling back to an earlier checkpoint would
        repeat training the log already counts, and the earlier ones are deleted once
        superseded). Bytes that match (the fault was in transit) or a store the driver
        cannot read either give ``None``: the unit is retried like after any I/O error.
        """
        if not any(isinstance(e, CheckpointCorruptError) for e in errors):
            return None
        trial = self.state.trials[trial_id]
        key, expected = trial.checkpoint, trial.checkpoint_sha256
        if key is None or expected is None:
            return None
        try:
            data = self.root.get(key)
        except (OSError, StoreError) as error:
            logger.warning("cannot re-read checkpoint %s to verify it: %s", key, error)
            return None
        actual = hashlib.sha256(data).hexdigest()
        if actual == expected:
            logger.warning("checkpoint %s verifies on the driver; retrying the unit", key)
            return None
        return CheckpointCorruptError(self.root.url(key), expected, actual, len(data))

    def drop(self, key: str | None, trial_id: str) -> None:
        """Delete a checkpoint trial ``trial_id`` no longer needs, unless another trial does.

        Each trial keeps its latest checkpoint (Cerebro §5.6: training continues from it)
        and the one trained through its best epoch. A checkpoint is shared when a trial was
        cloned from another (PBT's ``clone_from``): it is deleted only once no trial's
        latest or best is it.
        """
        if key is None or not key.startswith(f"{self.prefix}/checkpoints/"):
            return
        if self.state.needs_checkpoint(key):
            return

        def delete() -> None:  # once the events that moved past it are durable
            if self.state.needs_checkpoint(key):  # a later event needs it again
                return
            self.check_lease()  # only the lease holder deletes checkpoints
            logger.debug("deleting checkpoint %s (trial %s moved past it)", key, trial_id)
            self.root.delete(key)

        self.log.after_flush(delete)


def _short(key: str, folder: str) -> str:
    """A checkpoint key relative to the experiment's checkpoint folder, for logs."""
    return key[len(folder) :] if key.startswith(folder) else key
