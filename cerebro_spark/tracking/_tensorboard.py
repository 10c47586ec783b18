"""TensorBoard event files: one directory per trial, scalars per epoch, HParams."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cerebro_spark.driver import ExperimentState
from cerebro_spark.tracking._base import Tracker, TrackingContext

logger = logging.getLogger(__name__)


def hparam_value(value: Any) -> bool | int | float | str:
    """A param as the HParams plugin takes it: a bool, number or string (JSON otherwise)."""
    if isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, sort_keys=True)


class TensorBoardTracker(Tracker):
    """Writes ``<directory>/<experiment id>/<trial id>/`` event files for each trial.

    Each trial's directory gets its validation metrics per epoch (``validation/<metric>``,
    step = epoch) and, as each trial ends, its params and final metrics for the HParams
    plugin (``hparams/<metric>`` holds the trial's best epoch's value), so trials compare
    in TensorBoard's HParams table. A resumed run rewrites its trials' scalars from the
    event log, hiding (TensorBoard's ``purge_step``) what an earlier session wrote.

    Args:
        context: The experiment.
        directory: The TensorBoard log directory (``tensorboard --logdir`` it).
    """

    name = "tensorboard"

    def __init__(self, context: TrackingContext, directory: str | Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # needs the 'tensorboard' package

        del SummaryWriter  # imported now so that a missing package fails at the start
        self.context = context
        self.root = Path(directory) / context.experiment_id
        self.state = ExperimentState(prefix=context.prefix)
        self.metric, self.mode = context.config.objective
        self._writers: dict[str, Any] = {}
        self._closed: set[str] = set()

    # -- Tracker ----------------------------------------------------------------------------

    def catch_up(self, events: Sequence[Mapping[str, Any]]) -> None:
        """Rewrite the scalars of earlier sessions (their old files are purged)."""
        for event in events:
            self.handle(event)

    def handle(self, event: Mapping[str, Any]) -> None:
        """Write what ``event`` changes."""
        self.state.apply(event)
        kind = event["event"]
        if kind == "trial_epoch":
            writer = self._writer(event["trial"])
            for name, value in sorted(event["metrics"].items()):
                if isinstance(value, (int, float)):
                    writer.add_scalar(
                        f"validation/{name}", value, event["epoch"], walltime=event["time"]
                    )
            writer.flush()
        elif kind in ("decision", "trial_failed"):
            trial = self.state.trials[event["trial"]]
            if trial.status in ("completed", "stopped", "failed"):
                self._write_hparams(trial.trial_id)
        elif kind == "experiment_end":
            for trial_id in sorted(self.state.trials):
                self._write_hparams(trial_id)

    def close(self, error: BaseException | None) -> None:
        """Close every writer."""
        del error
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    # -- files ------------------------------------------------------------------------------

    def _writer(self, trial_id: str) -> Any:
        writer = self._writers.get(trial_id)
        if writer is None:
            from torch.utils.tensorboard import SummaryWriter

            directory = self.root / trial_id
            # A directory an earlier session wrote: hide its scalars, rewritten from the log.
            purge = 1 if directory.is_dir() and any(directory.iterdir()) else None
            writer = SummaryWriter(log_dir=str(directory), purge_step=purge)
            self._writers[trial_id] = writer
        return writer

    def _write_hparams(self, trial_id: str) -> None:
        """Write the trial's params and final metrics for the HParams plugin."""
        if trial_id in self._closed:
            return
        from torch.utils.tensorboard.summary import hparams

        trial = self.state.trials[trial_id]
        params = {
            **{name: hparam_value(value) for name, value in sorted(trial.params.items())},
            "spec": trial.spec or "",
        }
        best = {f"hparams/{name}": float(v) for name, v in sorted(trial.best_metrics.items())}
        best["hparams/epochs"] = float(trial.epochs)
        writer = self._writer(trial_id)
        experiment, start, end = hparams(params, best)  # type: ignore[no-untyped-call]
        file_writer = writer._get_file_writer()
        for summary in (experiment, start, end):
            file_writer.add_summary(summary)
        for tag, value in best.items():
            writer.add_scalar(tag, value, trial.epochs)
        writer.add_text("status", f"{trial.status}" + (f": {trial.error}" if trial.error else ""))
        writer.flush()
        self._closed.add(trial_id)
        logger.debug("tensorboard: wrote the hparams of trial %s", trial_id)
