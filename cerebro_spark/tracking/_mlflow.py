"""MLflow: a parent run per experiment, a nested run per trial, the best model logged."""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cerebro_spark.data import read_manifest
from cerebro_spark.driver import ExperimentState, TrialState, best_trial, leaderboard_csv, rank
from cerebro_spark.driver._layout import stored_key
from cerebro_spark.tracking._base import Tracker, TrackerUnavailable, TrackingContext

logger = logging.getLogger(__name__)

#: Tags naming what a run tracks (also how a run is found when its id was not logged).
EXPERIMENT_TAG = "cerebro.experiment_id"
TRIAL_TAG = "cerebro.trial"
MODEL_ARTIFACT = "model"
"""Artifact path of the best trial's model (register ``runs:/<run id>/model``)."""

_MAX_PARAM = 6000
_MAX_KEY = 250
_KEY_REFUSED = re.compile(r"[^\w\-. /]")
_MAX_TAG = 8000
_FILE_STORE_VARIABLE = "MLFLOW_ALLOW_FILE_STORE"
_STATUS = {"completed": "FINISHED", "stopped": "FINISHED", "failed": "FAILED"}
_ELASTIC_EVENTS = {  # event kind -> the prefix of its metrics
    "elastic_plan": "plan",
    "stage_plan": "stage_plan",
    "stage_actual": "stage_actual",
    "elastic_summary": "cost",
}


def flatten(value: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested mappings as dotted keys, other values as JSON (MLflow params are strings).

    Characters MLflow refuses in a key become ``_``.
    """
    out: dict[str, str] = {}
    for key, item in value.items():
        name = _KEY_REFUSED.sub("_", f"{prefix}{key}")[:_MAX_KEY]
        if isinstance(item, Mapping) and item:
            out.update(flatten(item, f"{name}."))
        else:
            text = item if isinstance(item, str) else json.dumps(item, sort_keys=True)
            out[name] = text[:_MAX_PARAM]
    return out


class MlflowTracker(Tracker):
    """Logs an experiment to an MLflow tracking server.

    * The **parent run** (named after the experiment id) has the config as params (dotted
      keys) and as ``config.json``, the dataset's id and manifest summary, the procedure
      and seed as tags, the plan and the stages' predicted and actual seconds and dollars
      of an elastic run as metrics (``plan.*``, ``stage_plan.*``, ``stage_actual.*`` with
      the stage as step, from 1 as ``plan`` and the report number stages; ``cost.*``) and
      as ``elastic/*.json``, why the search was stopped (tag ``cerebro.stopped``, a
      budget), and at the end
      ``leaderboard.csv``, ``seconds`` (experiment time over all sessions), ``usd`` (when
      metered) and ``best.*`` metrics.
    * A **nested run** per trial has its params, seed and spec; each validation metric per
      epoch (step = epoch); its status (tag ``cerebro.status``, run status FINISHED or
      FAILED) and decision history (tag ``cerebro.decisions`` and ``decisions.json``); its
      best epoch's checkpoint (``checkpoints/best.pt``).
    * The best trial's run gets ``model``, an MLflow pyfunc model of its best checkpoint
      (:class:`~cerebro_spark.tracking.CheckpointModel`), ready for
      ``mlflow.register_model("runs:/<run id>/model", name)``; the parent's tag
      ``cerebro.best_model_uri`` names it. With ``register_model`` it is registered.

    Run ids are logged as ``tracking`` events: a resumed run continues the same runs, and
    skips the metric steps MLflow already has.

    Args:
        context: The experiment.
        uri: The tracking URI.
        experiment: The MLflow experiment's name.
        register_model: Registered model name for the best model (``None``: not registered).
    """

    name = "mlflow"

    def __init__(
        self,
        context: TrackingContext,
        uri: str,
        experiment: str,
        register_model: str | None = None,
    ) -> None:
        from mlflow.tracking import MlflowClient  # mlflow: only when tracking asks for it

        _allow_file_store(uri)
        self.context = context
        self.uri = uri
        self.experiment_name = experiment
        self.register_model = register_model
        self.client = MlflowClient(tracking_uri=uri)
        self.state = ExperimentState(prefix=context.prefix)
        self.metric, self.mode = context.config.objective
        self.mlflow_experiment: str | None = None
        self.runs: dict[str | None, str] = {}  # trial (None: the experiment) -> run id
        self._catching_up = False
        self._logged_steps: dict[tuple[str, str], int] = {}
        self._decisions: dict[str, list[dict[str, Any]]] = {}
        self._elastic: dict[str, list[dict[str, Any]]] = {}
        self._ended: dict[str, str] = {}  # run id -> the status it was ended with
        self._trials_ended: set[str] = set()  # trials whose artifacts are logged

    # -- Tracker ----------------------------------------------------------------------------

    def reachable(self) -> bool:
        """An HTTP tracking server answers (any status) within 2 s; other URIs: assumed."""
        if not self.uri.startswith(("http://", "https://")):
            return True
        try:
            with urllib.request.urlopen(f"{self.uri.rstrip('/')}/health", timeout=2):
                return True
        except urllib.error.HTTPError:  # it answered (behind a proxy or auth, say)
            return True
        except OSError:
            return False

    def catch_up(self, events: Sequence[Mapping[str, Any]]) -> None:
        """Find the runs earlier sessions opened, then log what they may have missed.

        Raises:
            TrackerUnavailable: The tracking server does not answer.
        """
        if not self.reachable():
            raise TrackerUnavailable(f"the MLflow tracking server {self.uri} does not answer")
        for event in events:
            if event["event"] == "tracking" and event.get("backend") == self.name:
                self.runs[event.get("trial")] = event["run_id"]
                self.mlflow_experiment = event.get("experiment", self.mlflow_experiment)
        self._catching_up = True
        try:
            for event in events:
                self.handle(event)
        finally:
            self._catching_up = False

    def handle(self, event: Mapping[str, Any]) -> None:
        """Log what ``event`` changes."""
        self.state.apply(event)
        kind = event["event"]
        handler = getattr(self, f"_on_{kind}", None)
        if handler is not None:
            handler(event)
        elif kind in _ELASTIC_EVENTS:
            self._on_elastic(event)

    def close(self, error: BaseException | None) -> None:
        """Mark the experiment's run FAILED when the run raised before it ended."""
        run = self.runs.get(None)
        if error is not None and run is not None and not self.state.finished:
            self.client.set_tag(run, "cerebro.error", str(error)[:_MAX_TAG])
            self._end(run, "FAILED")

    # -- events -----------------------------------------------------------------------------

    def _on_experiment_start(self, event: Mapping[str, Any]) -> None:
        if self.mlflow_experiment is None:
            found = self.client.get_experiment_by_name(self.experiment_name)
            self.mlflow_experiment = (
                found.experiment_id
                if found is not None
                else self.client.create_experiment(self.experiment_name)
            )
        config = event["config"]
        procedure = config.get("procedure", {})
        tags = {
            EXPERIMENT_TAG: self.context.experiment_id,
            "cerebro.procedure": str(procedure.get("name", "")),
            "cerebro.seed": str(config.get("seed", "")),
            "cerebro.metric": self.metric,
            "cerebro.mode": self.mode,
            "cerebro.store": self.context.store.url(self.context.prefix),
        }
        run = self._run(None, tags=tags)
        if event.get("resumed"):
            self.client.update_run(run, status="RUNNING")
            self._ended.pop(run, None)
        self._log_params(run, flatten(config))
        self._log_json(run, config, "config.json")

    def _on_dataset(self, event: Mapping[str, Any]) -> None:
        run = self.runs[None]
        self._log_params(
            run,
            {
                "dataset.id": event["dataset_id"],
                "dataset.uri": event["uri"],
                "dataset.partitions": str(event["partitions"]),
            },
        )
        rows = event.get("rows") or {}
        self._log_metrics(run, {f"dataset.rows.{k}": v for k, v in rows.items()}, 0, event)
        summary = _manifest_summary(event["uri"])
        if summary:
            self._log_json(run, summary, "dataset.json")
            for key in ("task", "num_classes", "label", "source"):
                if summary.get(key) is not None:
                    self.client.set_tag(run, f"cerebro.dataset.{key}", str(summary[key])[:_MAX_TAG])

    def _on_trial_added(self, event: Mapping[str, Any]) -> None:
        trial = event["trial"]
        tags = {TRIAL_TAG: trial, "cerebro.spec": str(event.get("spec"))}
        if event.get("clone_from"):
            tags["cerebro.clone_from"] = str(event["clone_from"])
        run = self._run(trial, tags=tags)
        params = flatten(event["params"])
        params.update({"seed": str(event["seed"]), "spec": str(event.get("spec"))})
        self._log_params(run, params)

    def _on_trial_epoch(self, event: Mapping[str, Any]) -> None:
        run = self._trial_run(event["trial"])
        metrics = {k: v for k, v in event["metrics"].items() if isinstance(v, (int, float))}
        self._log_metrics(run, metrics, int(event["epoch"]), event)

    def _on_decision(self, event: Mapping[str, Any]) -> None:
        trial = event["trial"]
        run = self._trial_run(trial)
        history = self._decisions.setdefault(trial, [])
        history.append(
            {k: event.get(k) for k in ("round", "epoch", "decision", "status") if k in event}
        )
        text = "; ".join(f"epoch {d.get('epoch')}: {d.get('decision')}" for d in history)
        status = self.state.trials[trial].status
        self.client.set_tag(run, "cerebro.decisions", text[-_MAX_TAG:])
        self.client.set_tag(run, "cerebro.status", status)
        if status in _STATUS:  # its artifacts now, spread over the run, not all at the end
            self._end_trial(self.state.trials[trial])

    def _on_trial_resumed(self, event: Mapping[str, Any]) -> None:
        run = self._trial_run(event["trial"])
        self.client.set_tag(run, "cerebro.status", "running")
        self.client.update_run(run, status="RUNNING")
        self._ended.pop(run, None)
        self._trials_ended.discard(event["trial"])

    def _on_trial_failed(self, event: Mapping[str, Any]) -> None:
        run = self._trial_run(event["trial"])
        self.client.set_tag(run, "cerebro.status", "failed")
        self.client.set_tag(run, "cerebro.error", str(event.get("error"))[:_MAX_TAG])
        self._end(run, "FAILED")

    def _on_search_stopped(self, event: Mapping[str, Any]) -> None:
        self.client.set_tag(self.runs[None], "cerebro.stopped", str(event.get("reason"))[:_MAX_TAG])

    def _on_elastic(self, event: Mapping[str, Any]) -> None:
        run = self.runs[None]
        kind = event["event"]
        fields = {k: v for k, v in event.items() if k not in ("event", "time")}
        self._elastic.setdefault(kind, []).append(fields)
        prefix = _ELASTIC_EVENTS[kind]
        numbers = {
            f"{prefix}.{k}": v
            for k, v in fields.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "stage"
        }
        stage = fields.get("stage")  # the log's, from 0; a user reads stages from 1
        self._log_metrics(run, numbers, 0 if stage is None else int(stage) + 1, event)
        self._log_json(run, self._elastic[kind], f"elastic/{kind}.json")

    def _on_experiment_end(self, event: Mapping[str, Any]) -> None:
        run = self.runs[None]
        state = self.state
        trials = rank(state.trials.values(), self.metric, self.mode)
        for trial in trials:
            if trial.trial_id not in self._trials_ended:
                self._end_trial(trial)
        totals: dict[str, float] = {
            "seconds": round(state.experiment_seconds, 3),
            "trials": float(len(trials)),
            "failed_trials": float(event.get("failed") or 0),
        }
        if state.elastic_summary is not None:
            totals.update(self._summary_metrics(run, state.elastic_summary))
        best = best_trial(trials)
        if best is not None:
            totals.update({f"best.{k}": float(v) for k, v in best.best_metrics.items()})
            totals["best.epoch"] = float(best.best_epoch or 0)
            self.client.set_tag(run, "cerebro.best_trial", best.trial_id)
        self._log_metrics(run, totals, 0, event)
        text = leaderboard_csv(state.trials.values(), self.metric, self.mode)
        self._log_text(run, text, "leaderboard.csv")
        if best is not None:
            self._log_best_model(best, event)
        self._end(run, "FINISHED" if best is not None else "FAILED")

    # -- helpers ----------------------------------------------------------------------------

    def _summary_metrics(self, run: str, summary: Mapping[str, Any]) -> dict[str, float]:
        """An elastic run's totals against its plans as metrics; met or missed as tags.

        ``deadline_met`` and ``budget_met`` are 1 or 0, ``first_plan.*`` and
        ``last_plan.*`` the plan made before the run and the one in force at its end,
        ``replans`` how many re-plans there were; the tag ``cerebro.misses`` says by how
        much and why a deadline or budget was missed (logs written before these fields
        existed carry only the totals).
        """
        metrics: dict[str, float] = {}
        for key in ("usd", "planned_usd", "planned_seconds", "instance_seconds"):
            value = summary.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                metrics[key] = float(value)
        for key in ("deadline_met", "budget_met"):
            if isinstance(summary.get(key), bool):
                metrics[key] = float(summary[key])
                self.client.set_tag(run, f"cerebro.{key}", str(summary[key]).lower())
        for plan in ("first_plan", "last_plan"):
            values = summary.get(plan)
            if isinstance(values, Mapping):
                for key in ("seconds", "usd"):
                    if isinstance(values.get(key), (int, float)):
                        metrics[f"{plan}.{key}"] = float(values[key])
        if isinstance(summary.get("replans"), list):
            metrics["replans"] = float(len(summary["replans"]))
        misses = summary.get("misses")
        if isinstance(misses, list) and misses:
            self.client.set_tag(run, "cerebro.misses", " | ".join(map(str, misses))[:_MAX_TAG])
        return metrics

    def _end(self, run: str, status: str) -> None:
        """End a run with ``status`` (once: MLflow prints the run's URL each time)."""
        if self._ended.get(run) != status:
            self.client.set_terminated(run, status)
            self._ended[run] = status

    def _run(self, trial: str | None, *, tags: Mapping[str, str]) -> str:
        """The run of the experiment (``trial=None``) or of a trial, created when new."""
        run = self.runs.get(trial)
        if run is None:
            assert self.mlflow_experiment is not None  # ok: experiment_start comes first
            all_tags = dict(tags)
            if trial is not None:
                all_tags["mlflow.parentRunId"] = self.runs[None]
            created = self.client.create_run(
                self.mlflow_experiment,
                tags=all_tags,
                run_name=trial if trial is not None else self.context.experiment_id,
            )
            run = created.info.run_id
            self.runs[trial] = run
            self.context.record(
                backend=self.name,
                trial=trial,
                run_id=run,
                experiment=self.mlflow_experiment,
                uri=self.uri,
            )
            logger.info(
                "mlflow: %s is run %s in %s",
                f"trial {trial}" if trial else self.context.experiment_id,
                run,
                self.uri,
            )
        else:
            for key, value in tags.items():
                self.client.set_tag(run, key, value)
        return run

    def _trial_run(self, trial: str) -> str:
        run = self.runs.get(trial)
        if run is None:  # its trial_added was never tracked (tracking came on later)
            state = self.state.trials[trial]
            self._on_trial_added(
                {
                    "trial": trial,
                    "params": state.params,
                    "seed": state.seed,
                    "spec": state.spec,
                    "clone_from": None,
                }
            )
            run = self.runs[trial]
        return run

    def _log_params(self, run: str, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v) for k, v in sorted(params.items())]
        for start in range(0, len(items), 100):
            self.client.log_batch(run, params=items[start : start + 100])

    def _log_metrics(
        self, run: str, metrics: Mapping[str, float], step: int, event: Mapping[str, Any]
    ) -> None:
        from mlflow.entities import Metric

        timestamp = int(float(event.get("time", 0)) * 1000)
        items = []
        for key, value in sorted(metrics.items()):
            if self._catching_up and step <= self._last_step(run, key):
                continue
            items.append(Metric(key, float(value), timestamp, step))
        for start in range(0, len(items), 500):
            self.client.log_batch(run, metrics=items[start : start + 500])

    def _last_step(self, run: str, key: str) -> int:
        """The last step of a metric MLflow already has (-1: none), asked once per key."""
        if (run, key) not in self._logged_steps:
            history = self.client.get_metric_history(run, key)
            self._logged_steps[(run, key)] = max((m.step for m in history), default=-1)
        return self._logged_steps[(run, key)]

    def _log_json(self, run: str, value: Any, path: str) -> None:
        self._log_text(run, json.dumps(value, indent=2, sort_keys=True, default=str), path)

    def _log_text(self, run: str, text: str, path: str) -> None:
        folder, _, name = path.rpartition("/")
        with tempfile.TemporaryDirectory(prefix="cerebro-mlflow-") as tmp:
            local = Path(tmp) / name
            local.write_text(text)
            self.client.log_artifact(run, str(local), folder or None)

    def _end_trial(self, trial: TrialState) -> None:
        """Log a trial's final tags, decisions and best checkpoint, and end its run."""
        self._trials_ended.add(trial.trial_id)
        run = self._trial_run(trial.trial_id)
        self.client.set_tag(run, "cerebro.status", trial.status)
        if trial.best_epoch is not None:
            self.client.set_tag(run, "cerebro.best_epoch", str(trial.best_epoch))
        self._log_json(run, self._decisions.get(trial.trial_id, []), "decisions.json")
        key = trial.best_checkpoint or trial.checkpoint
        if key is not None and self.context.store.exists(key):
            with tempfile.TemporaryDirectory(prefix="cerebro-mlflow-") as tmp:
                local = Path(tmp) / "best.pt"
                local.write_bytes(self.context.store.get(key))
                self.client.log_artifact(run, str(local), "checkpoints")
        self._end(run, _STATUS.get(trial.status, "FINISHED"))

    def _log_best_model(self, best: TrialState, event: Mapping[str, Any]) -> None:
        """Log the best checkpoint as a pyfunc model in the best trial's run."""
        from cerebro_spark.tracking._pyfunc import save_pyfunc  # imports mlflow.pyfunc

        logged = event.get("best_checkpoint")
        key = stored_key(self.context.prefix, logged) if logged else best.best_checkpoint
        best_pt = f"{self.context.prefix}/best.pt"
        source = best_pt if self.context.store.exists(best_pt) else key
        if source is None or not self.context.store.exists(source):
            logger.warning("mlflow: no checkpoint of trial %s to log as a model", best.trial_id)
            return
        run = self._trial_run(best.trial_id)
        with tempfile.TemporaryDirectory(prefix="cerebro-mlflow-") as tmp:
            checkpoint = Path(tmp) / "best.pt"
            checkpoint.write_bytes(self.context.store.get(source))
            model_dir = Path(tmp) / MODEL_ARTIFACT
            save_pyfunc(model_dir, checkpoint)
            self.client.log_artifacts(run, str(model_dir), MODEL_ARTIFACT)
        model_uri = f"runs:/{run}/{MODEL_ARTIFACT}"
        self.client.set_tag(self.runs[None], "cerebro.best_model_uri", model_uri)
        self.client.set_tag(run, "cerebro.best_model", "true")
        logger.info("mlflow: best model of trial %s logged as %s", best.trial_id, model_uri)
        if self.register_model is not None:
            self._register(run, model_uri)

    def _register(self, run: str, model_uri: str) -> None:
        """Register the logged model (as ``mlflow.register_model(model_uri, name)`` does)."""
        from mlflow.exceptions import MlflowException

        name = self.register_model
        assert name is not None  # ok: only called with a name
        try:
            self.client.create_registered_model(name)
        except MlflowException as error:
            if "ALREADY_EXISTS" not in str(error.error_code):
                raise
        source = f"{self.client.get_run(run).info.artifact_uri.rstrip('/')}/{MODEL_ARTIFACT}"
        version = self.client.create_model_version(name, source, run_id=run)
        registered = f"{name}/{version.version}"
        self.client.set_tag(self.runs[None], "cerebro.registered_model", registered)
        logger.info("mlflow: registered %s as %s version %s", model_uri, name, version.version)


def _allow_file_store(uri: str) -> None:
    """Let MLflow write a file store where the user named a folder (``./mlruns``, ``file:``).

    MLflow 3 keeps its file store in maintenance mode and refuses to open one unless
    ``MLFLOW_ALLOW_FILE_STORE`` is true; the user asked for exactly that store, so it is
    set for this process (unless set already), said in one INFO line.
    """
    from mlflow.utils.uri import is_local_uri

    if not is_local_uri(uri) or _FILE_STORE_VARIABLE in os.environ:  # type: ignore[no-untyped-call]
        return
    os.environ[_FILE_STORE_VARIABLE] = "true"
    logger.info(
        "MLflow: tracking into the file store %s (%s=true set for this process; MLflow "
        "recommends a database such as sqlite:///mlflow.db or a tracking server)",
        uri,
        _FILE_STORE_VARIABLE,
    )


def _manifest_summary(uri: str) -> dict[str, Any] | None:
    """What a dataset's manifest says about it, without its partition list."""
    try:
        manifest = read_manifest(uri)
    except Exception as error:  # the summary is a nicety; the id is logged regardless
        logger.warning("mlflow: could not read the manifest of %s: %s", uri, error)
        return None
    return {
        "dataset_id": manifest.dataset_id,
        "task": str(getattr(manifest.task, "value", manifest.task)),
        "num_classes": manifest.num_classes,
        "num_partitions": manifest.num_partitions,
        "features": [
            {"name": c.name, "dtype": c.dtype, "shape": list(c.shape)} for c in manifest.features
        ],
        "label": manifest.label.name,
        "seed": manifest.seed,
        "content_hash": manifest.content_hash,
        "source": manifest.source,
        "rows": {split: manifest.rows(split) for split in ("train", "validation")},
    }
