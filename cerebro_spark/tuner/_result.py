"""What :meth:`Tuner.fit` returns: the experiment's results as pandas and Spark tables.

pyspark is imported inside the methods that use Spark (``to_spark``, ``best_model``), so
that a notebook without Spark never loads it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pandas as pd

from cerebro_spark.engine import (
    ExperimentConfig,
    ExperimentState,
    TrialState,
    best_trial,
    cost_table,
    experiment_prefix,
    leaderboard_rows,
    load_state,
    rank,
)
from cerebro_spark.report import build_report
from cerebro_spark.scoring import best_checkpoint_uri, load_model
from cerebro_spark.store import open_store

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class TuningResult:
    """A finished (or interrupted) experiment, read from its event log.

    Everything here is rebuilt from ``events.jsonl``, so :meth:`load` gives the same object
    for an experiment run yesterday, by a job, or by the CLI.

    Args:
        store: The store URI the experiment lives in.
        experiment_id: Its id.
        config: The config it was run with.
        state: Its state, folded from its log.
    """

    def __init__(
        self, store: str, experiment_id: str, config: ExperimentConfig, state: ExperimentState
    ) -> None:
        self.store = store
        self.experiment_id = experiment_id
        self.config = config
        self.state = state

    @classmethod
    def load(cls, store: str, experiment_id: str) -> TuningResult:
        """Read an experiment's results from its store.

        Raises:
            ConfigError: There is no such experiment.
        """
        config, state = load_state(store, experiment_id)
        return cls(store, experiment_id, config, state)

    @property
    def metric(self) -> str:
        """The metric the search optimised."""
        return self.config.objective[0]

    @property
    def mode(self) -> str:
        """``"max"`` or ``"min"``: whether a larger metric is better."""
        return self.config.objective[1]

    @property
    def trials(self) -> list[TrialState]:
        """Every trial, best first."""
        return rank(self.state.trials.values(), self.metric, self.mode)

    @property
    def best(self) -> TrialState | None:
        """The trial with the best epoch, or ``None`` when no trial reported the metric.

        Its ``best_metrics``, ``best_epoch`` and ``best_checkpoint`` are that epoch's; the
        experiment's ``best.pt`` is that checkpoint.
        """
        return best_trial(self.trials)

    @property
    def url(self) -> str:
        """URI of the experiment's directory (its log, leaderboard and ``best.pt``)."""
        return open_store(self.store).url(experiment_prefix(self.experiment_id))

    def leaderboard(self) -> pd.DataFrame:
        """One row per trial, best first (the rows of ``leaderboard.csv``).

        Columns: ``rank``, ``trial_id``, ``status``, ``epochs``, ``best_epoch``, the
        optimised metric at the best epoch and ``last_<metric>`` after the latest, the other
        metrics at the best epoch, ``best_checkpoint``, ``error`` (failed trials), ``model``
        (the spec's class) and one ``params.<name>`` column per hyperparameter (lists and
        nested values as JSON text).
        """
        specs = {t.trial_id: t.spec for t in self.state.trials.values()}
        rows = []
        for position, row in enumerate(
            leaderboard_rows(self.state.trials.values(), self.metric, self.mode), 1
        ):
            params = row.pop("params")
            row = {"rank": position, **row, "model": specs[row["trial_id"]].rsplit(":", 1)[-1]}
            row.update({f"params.{k}": v for k, v in _flatten(params).items()})
            rows.append(row)
        if not rows:
            return pd.DataFrame(columns=["rank", "trial_id", "status", "epochs", self.metric])
        return pd.DataFrame(rows)

    def history(self) -> pd.DataFrame:
        """Validation metrics after every epoch of every trial, in trial and epoch order.

        Columns: ``trial_id``, ``epoch`` (from 1), then one column per metric.
        """
        rows = [
            {"trial_id": trial.trial_id, "epoch": epoch, **dict(metrics)}
            for trial in self.state.trials.values()
            for epoch, metrics in enumerate(trial.history, 1)
        ]
        if not rows:
            return pd.DataFrame(columns=["trial_id", "epoch", self.metric])
        return pd.DataFrame(rows)

    def to_spark(self, spark: SparkSession | None = None) -> DataFrame:
        """The leaderboard as a Spark DataFrame in ``spark`` (default: the active session).

        Hyperparameters whose values are not all numbers become string columns, so the
        schema holds for every trial (branches of a space have different params).

        Raises:
            RuntimeError: No session is given and none is active.
        """
        if spark is None:  # pyspark is imported where Spark is used (module docstring)
            from pyspark.sql import SparkSession

            spark = SparkSession.getActiveSession()
            if spark is None:
                raise RuntimeError("to_spark needs a SparkSession: pass one or start one")
        from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

        frame = self.leaderboard()
        fields = []
        for column in frame.columns:
            values = frame[column]
            if pd.api.types.is_integer_dtype(values):
                fields.append(StructField(column, LongType()))
            elif pd.api.types.is_float_dtype(values) or _all_numbers(values):
                frame[column] = [None if _missing(v) else float(v) for v in values]
                fields.append(StructField(column, DoubleType()))
            else:
                frame[column] = [None if _missing(v) else str(v) for v in values]
                fields.append(StructField(column, StringType()))
        # object arrays' tolist() gives Python scalars, which Spark's schema checks accept
        rows = [
            [None if _missing(v) else v for v in row] for row in frame.to_numpy(object).tolist()
        ]
        return spark.createDataFrame(rows, StructType(fields))

    def best_model(self) -> Any:
        """The best checkpoint (``best.pt``) as a Spark ML Transformer.

        ``transform(df)`` adds predictions (see :mod:`cerebro_spark.scoring`).
        """
        # Spark ML's classes: pyspark is imported where a transformer is asked for, not by
        # ``import cerebro_spark.tuner`` (a notebook without Spark never loads it).
        from cerebro_spark.scoring import ModelTransformer

        return ModelTransformer.from_checkpoint(best_checkpoint_uri(self.store, self.experiment_id))

    def load_model(self) -> Any:
        """The best checkpoint as a torch module with ``predict`` (on this machine)."""
        return load_model(self.url)

    def report(self) -> Any:
        """The experiment's HTML report (:class:`cerebro_spark.report.Report`).

        In a notebook it shows itself (an iframe holding the self-contained page);
        ``.save(path)`` writes the file, ``.html`` is the page.
        """
        return build_report(self.store, self.experiment_id)

    @property
    def elastic_summary(self) -> dict[str, Any] | None:
        """An elastic run's totals (``None``: not elastic, or it did not end).

        ``seconds`` and ``usd`` against ``deadline`` and ``budget`` (``deadline_met``,
        ``budget_met``), the ``first_plan`` (made before the run) and the ``last_plan``
        (in force at the end), each of the ``replans`` with its reason, and ``misses``:
        a line per missed deadline or budget saying by how much and why.
        """
        summary = self.state.elastic_summary
        return None if summary is None else dict(summary)

    def plan_vs_actual(self) -> str | None:
        """An elastic run's predicted-vs-actual table (``None``: not elastic).

        A row per stage against the plan it ran under, the totals against the first plan
        and against the last re-plan, then the misses (:func:`cerebro_spark.engine.cost_table`).
        """
        return cost_table(self.state)

    def __repr__(self) -> str:
        best = self.best
        summary = (
            "no trial reported"
            if best is None
            else f"best {best.trial_id} {self.metric}={best.best_metrics[self.metric]:.4f}"
        )
        elastic = self.state.elastic_summary
        if elastic is not None and elastic.get("deadline_met") is False:
            summary += f", deadline {elastic['deadline']:g} s missed ({elastic['seconds']:.1f} s)"
        return f"TuningResult({self.experiment_id!r}, {len(self.state.trials)} trials, {summary})"


def _flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists become JSON text."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{name}."))
        elif isinstance(value, (list, tuple)):
            out[name] = json.dumps(value)
        else:
            out[name] = value
    return out


def _all_numbers(values: pd.Series) -> bool:
    """Whether every present value is a number (not a bool), and one is present."""
    present = [v for v in values if not _missing(v)]
    return bool(present) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in present
    )


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))
