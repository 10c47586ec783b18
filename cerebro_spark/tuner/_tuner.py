"""The notebook API: ``Tuner(...).fit(data)``.

A :class:`Tuner` is an experiment config without its data: every field of the YAML config
(``cerebro-spark run``) is a keyword here, and :meth:`Tuner.to_config` gives that YAML's
mapping back, so a search tried in a notebook can become a nightly job unchanged, and a
job's config can be opened in a notebook with :meth:`Tuner.from_config`.

:meth:`Tuner.fit` takes the data as a user has it: a Spark DataFrame (prepared by Spark in
the DataFrame's own session, never a new one), a table name, a pandas DataFrame, a prepared
dataset (its URI or name), or a Parquet/CSV/JSON path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from cerebro_spark.backends._connect import local_slots
from cerebro_spark.data import prepare_dataset, prepare_with_spark, read_manifest
from cerebro_spark.data._options import KindOptions
from cerebro_spark.driver._config import ExperimentConfig, load_yaml
from cerebro_spark.driver._warm import release_for_spark_job
from cerebro_spark.engine import SessionBackend, parse_config, run_experiment
from cerebro_spark.errors import ConfigError, DataError
from cerebro_spark.search import Distribution, SearchSpace
from cerebro_spark.spark_session import active_connect_session, is_connect_session
from cerebro_spark.store import Store, open_store
from cerebro_spark.tuner._display import ProgressDisplay, showing_progress
from cerebro_spark.tuner._procedure import Procedure
from cerebro_spark.tuner._result import TuningResult
from cerebro_spark.tuner._spark_log import spark_log_level

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

WARM_WORKERS_S = 120.0
"""Seconds a ``fit``'s workers are kept for the next ``fit`` unless ``warm_workers`` says."""
_UNRESOLVED = {"dataset": "unresolved"}  # stands in for the data while checking the rest


class Tuner:
    """A model-selection search, ready to be fitted on data.

    Args:
        space: The search space: a mapping of params to constants, distributions
            (:class:`~cerebro_spark.search.LogUniform`, ``Choice`` ...) or their config
            form (``{"loguniform": [1e-4, 1e-1]}``), or a
            :class:`~cerebro_spark.search.SearchSpace`. A ``model`` param (import path of a
            ``ModelSpec``, e.g. ``"cerebro_spark.training:MLPSpec"``) picks the model family.
        procedure: The search procedure: a name (``"grid"``), the config's mapping
            (``{"name": "sha", "eta": 2}``) or a :class:`Procedure`.
        epochs: Epochs each trial is trained for at most.
        metric: Validation metric to optimise (default: the config's default).
        mode: ``"max"`` or ``"min"`` (default: the config's default for the metric).
        model: Default ``ModelSpec`` import path when the space has no ``model`` param.
        workers: Workers training at once (default: the Spark session's default
            parallelism on Spark, else 2).
        store: Where datasets, checkpoints and logs go (a local path or an ``s3://`` URI;
            on a cluster, one every executor can reach).
        seed: Seed of everything random in the search.
        name: Experiment name (ids are ``<name>-<UTC time>``).
        backend: ``"spark"`` or ``"local"`` (default: ``"spark"`` when a Spark session is
            active or the data is a Spark DataFrame or table, else ``"local"``).
        partitions: Partitions per split when the data is prepared (default: ``workers``).
        validation_fraction: Share of rows held out for validation when preparing.
        progress: Show a progress bar (terminal and notebook; plain lines in logs).
        spark_log_level: Spark's log level during ``fit``, restored however ``fit`` ends
            (returned or raised: :mod:`cerebro_spark.tuner._spark_log`); ``None`` leaves
            it as it is.
        **options: Any other top-level config field (``rule``, ``visit_order``,
            ``torch_threads``, ``device``, ``worker_memory``, ``spark``, ``elastic`` ...),
            as in the YAML config (``worker_memory="4GiB"``: what each worker keeps of its
            partitions in RAM; the rest is streamed from its local disk; ``pack=4``: up
            to 4 trials of one architecture trained together in one visit of a partition,
            ``"auto"``: as many as the pre-flight measures to pay, ``"off"`` by default;
            ``warm_workers``: seconds the workers are kept for the next ``fit``, 120 by
            default, 0 to close them when ``fit`` returns, see :func:`release_workers`).

    Raises:
        ConfigError: A field breaks a rule (checked here, before any data is touched).
    """

    def __init__(
        self,
        space: Mapping[str, Any] | SearchSpace | Distribution,
        *,
        procedure: str | Mapping[str, Any] | Procedure = "grid",
        epochs: int = 10,
        metric: str | None = None,
        mode: str | None = None,
        model: str | None = None,
        workers: int | None = None,
        store: str = "runs",
        seed: int = 0,
        name: str = "tuner",
        backend: str | None = None,
        partitions: int | None = None,
        validation_fraction: float = 0.2,
        progress: bool = True,
        spark_log_level: str | None = "WARN",
        **options: Any,
    ) -> None:
        space_config = (space if isinstance(space, SearchSpace) else SearchSpace(space)).to_config()
        raw: dict[str, Any] = {
            "name": name,
            "seed": seed,
            "store": str(store),
            "procedure": Procedure.of(procedure).to_config(),
            "epochs": epochs,
            "metric": metric,
            "mode": mode,
            "model": model,
            "workers": workers,
            "backend": backend,
            **options,
            "space": space_config,
        }
        self._raw = {key: value for key, value in raw.items() if value is not None}
        self._data: dict[str, Any] | None = None
        self.partitions = partitions
        self.validation_fraction = validation_fraction
        self.progress = progress
        self.spark_log_level = spark_log_level
        parse_config({**self._raw, "data": _UNRESOLVED})

    @classmethod
    def from_config(cls, config: str | Path | Mapping[str, Any]) -> Tuner:
        """A tuner from a YAML config file (or its mapping).

        Its data section is kept and used by :meth:`fit` when called without data.

        Raises:
            ConfigError: The file is missing or a field breaks a rule.
        """
        if isinstance(config, Mapping):
            raw = dict(config)
        else:
            try:
                raw = load_yaml(Path(config).read_text())
            except FileNotFoundError:
                raise ConfigError(f"config file {config} does not exist") from None
            if not isinstance(raw, dict):
                raise ConfigError(f"config file {config} must hold a mapping")
        parse_config(raw)
        data = raw.pop("data")
        space = raw.pop("space")
        tuner = cls(space, **raw)
        tuner._data = dict(data)
        return tuner

    def to_config(self, data: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The YAML config's mapping.

        Its ``data`` is the given section, else the one this tuner was made with, else none.

        Raises:
            ConfigError: The result is not a valid config (with a data section).
        """
        out = dict(self._raw)
        section = data if data is not None else self._data
        if section is not None:
            out["data"] = dict(section)
            parse_config(out)
        return out

    def to_yaml(self, data: Mapping[str, Any] | None = None) -> str:
        """:meth:`to_config` as YAML text (what ``cerebro-spark run`` reads)."""
        return yaml.safe_dump(self.to_config(data), sort_keys=False)

    def fit(
        self,
        data: Any = None,
        *,
        features: str | Sequence[str] | None = None,
        label: str | None = None,
        validation_column: str | None = None,
        feature_shapes: Mapping[str, Sequence[int]] | None = None,
        kinds: KindOptions | Mapping[str, Any] | None = None,
        experiment_id: str | None = None,
    ) -> TuningResult:
        """Prepare ``data`` (once; an identical dataset is reused) and run the search.

        Args:
            data: A Spark DataFrame, a table name, a pandas DataFrame, a prepared dataset
                (URI or name), or a Parquet/CSV/JSON path; ``None``: the config's data.
            features: Feature columns, or one column's name (default: every column but
                the label and the validation column).
            label: The label column (default: ``"label"``).
            validation_column: A boolean column marking validation rows (instead of a
                random ``validation_fraction``).
            feature_shapes: Per-row shapes of array features, e.g. ``{"image": [1, 8, 8]}``.
            kinds: Which columns are images, categories or sequences and how they are
                prepared: a :class:`~cerebro_spark.data.KindOptions` or its fields as a
                dict (``{"image_size": [64, 64], "hash_buckets": 1000}``). Unnamed columns
                are inferred as ``prepare`` infers them (JPEG/PNG bytes: image; strings:
                categorical; integer lists of several lengths: sequence).
            experiment_id: The experiment's id (default: ``<name>-<UTC time>``).

        Returns:
            The results, read back from the experiment's log.

        Raises:
            ConfigError: Bad settings or data arguments.
            DataError: The data cannot be prepared (the message names the column).
            ConfigError: Also a deadline shorter than start-up plus one training unit
                (the pre-flight's numbers).
            SearchFailedError: The search produced nothing: no trial completed an epoch
                with a finite metric (every trial failed, or the procedure suggested none,
                as a deadline-bound one does once its deadline has passed).
        """
        spark = _spark_of(data)
        backend = self._raw.get("backend") or ("spark" if spark is not None else "local")
        workers = self._raw.get("workers") or _default_workers(backend, spark)
        request = _DataRequest(
            features=feature_columns(features),
            label=label,
            partitions=self.partitions or workers,
            seed=int(self._raw.get("seed", 0)),
            validation_fraction=self.validation_fraction,
            validation_column=validation_column,
            feature_shapes=feature_shapes,
            kinds=_kind_options(kinds),
        )
        if data is None and self._data is None:
            raise ConfigError("fit needs data: this tuner's config has no data section")
        with spark_log_level(spark, self.spark_log_level):  # preparing included
            section = self._data if data is None else request.section(data, spark, self._store())
            warm = self._raw.get("warm_workers", WARM_WORKERS_S)  # the next fit starts warm
            config = parse_config(
                {
                    **self._raw,
                    "backend": backend,
                    "workers": workers,
                    "data": section,
                    "warm_workers": warm,
                }
            )
            display = ProgressDisplay() if self.progress else None
            with showing_progress(display):
                result = run_experiment(
                    config, experiment_id=experiment_id, **_backend_on(spark, config)
                )
        return TuningResult.load(config.store, result.experiment_id)

    def _store(self) -> Store:
        return open_store(str(self._raw.get("store", "runs")))

    def __repr__(self) -> str:
        return f"Tuner({self._raw!r})"


def _backend_on(spark: SparkSession | None, config: ExperimentConfig) -> dict[str, Any]:
    """``run_experiment``'s backend on a Spark Connect session: the data's own session.

    Not whichever session the engine would find active.
    """
    if config.backend == "spark" and spark is not None and is_connect_session(spark):
        return {"backend_factory": SessionBackend(spark)}
    return {}


def _application_of(frame: Any) -> str | None:
    """The Spark application a DataFrame runs on (``None`` where it cannot be told)."""
    try:
        return str(frame.sparkSession.sparkContext.applicationId)
    except Exception:  # Spark Connect has no SparkContext
        return None


@dataclasses.dataclass(frozen=True)
class _DataRequest:
    """How :meth:`Tuner.fit` was asked to read its data."""

    features: tuple[str, ...] | None
    label: str | None
    partitions: int
    seed: int
    validation_fraction: float
    validation_column: str | None
    feature_shapes: Mapping[str, Sequence[int]] | None
    kinds: KindOptions | None = None

    def section(self, data: Any, spark: SparkSession | None, store: Store) -> dict[str, Any]:
        """The config's data section for ``data``, preparing it first where it is a table."""
        if _is_spark_frame(data) or (isinstance(data, str) and _is_table(spark, data)):
            frame = data if _is_spark_frame(data) else spark.table(data)  # type: ignore[union-attr]
            release_for_spark_job(_application_of(frame))
            manifest = prepare_with_spark(
                data,
                store,
                spark=spark,
                format=None if _is_spark_frame(data) else "table",
                **self._prepare_options(frame.columns),
            )
            return {"dataset": store.url(f"datasets/{manifest.dataset_id}")}
        if _is_pandas_frame(data):
            options = self._prepare_options(list(data.columns))
            manifest = prepare_dataset(data, store, source="pandas DataFrame", **options)
            return {"dataset": store.url(f"datasets/{manifest.dataset_id}")}
        if isinstance(data, (str, Path)):
            return self._named(str(data))
        raise ConfigError(
            "fit's data must be a Spark DataFrame, a table name, a pandas DataFrame, a "
            f"prepared dataset or a path, got {type(data).__name__}"
        )

    def _prepare_options(self, columns: Sequence[str]) -> dict[str, Any]:
        label = self.label or "label"
        skip = (label, self.validation_column)
        features = self.features or tuple(c for c in columns if c not in skip)
        return {
            "features": list(features),
            "label": label,
            "num_partitions": self.partitions,
            "seed": self.seed,
            "validation_fraction": self.validation_fraction,
            "validation_column": self.validation_column,
            "feature_shapes": self.feature_shapes,
            "kinds": self.kinds,
        }

    def _named(self, data: str) -> dict[str, Any]:
        """A prepared dataset (a URI holding a manifest, or a name), or a source path."""
        prepared = False
        with contextlib.suppress(DataError, OSError, ValueError):
            read_manifest(data)
            prepared = True
        if prepared or not (data.startswith("sklearn:") or "://" in data or Path(data).exists()):
            # a prepared dataset (a name is resolved by the engine, or it says why not)
            fixed = {
                "features": self.features,
                "label": self.label,
                "validation_column": self.validation_column,
                "feature_shapes": self.feature_shapes,
                "kinds": self.kinds,
            }
            given = sorted(name for name, value in fixed.items() if value is not None)
            if given:
                raise ConfigError(
                    f"fit({data!r}, {given[0]}=...): {data!r} is a prepared dataset, whose "
                    f"manifest fixed {', '.join(fixed)}; leave {', '.join(given)} out"
                )
            return {"dataset": data}
        section: dict[str, Any] = {
            "source": data,
            "label": self.label or "label",
            "partitions": self.partitions,
            "validation_fraction": self.validation_fraction,
            "features": None if self.features is None else list(self.features),
            "validation_column": self.validation_column,
            "feature_shapes": None
            if self.feature_shapes is None
            else {k: list(v) for k, v in self.feature_shapes.items()},
        }
        if self.kinds is not None:
            defaults = dataclasses.asdict(KindOptions())
            given_kinds = dataclasses.asdict(self.kinds)
            section.update(
                {
                    k: list(v) if isinstance(v, tuple) else v
                    for k, v in given_kinds.items()
                    if v != defaults[k]
                }
            )
        return {k: v for k, v in section.items() if v is not None}


def _kind_options(kinds: KindOptions | Mapping[str, Any] | None) -> KindOptions | None:
    """``fit``'s ``kinds``, checked (a :class:`DataError` becomes a :class:`ConfigError`)."""
    if kinds is None or isinstance(kinds, KindOptions):
        return kinds
    try:
        return KindOptions.from_mapping(kinds)
    except DataError as error:
        raise ConfigError(f"fit(kinds=...): {error}") from None


def _is_spark_frame(data: Any) -> bool:
    return type(data).__module__.startswith("pyspark.sql") and hasattr(data, "sparkSession")


def _is_pandas_frame(data: Any) -> bool:
    return type(data).__module__.startswith("pandas") and hasattr(data, "columns")


def _active_spark() -> SparkSession | None:
    """The active classic session, else the active Spark Connect session, else ``None``."""
    if "pyspark" not in sys.modules:
        return None  # nobody started Spark in this process
    from pyspark.sql import SparkSession  # already imported: no cost, none for non-Spark users

    active = SparkSession.getActiveSession()
    return active if active is not None else active_connect_session()


def feature_columns(features: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """``fit``'s ``features`` as column names: a string is one column, not its letters.

    Raises:
        ConfigError: A name that is not a non-empty string.
    """
    if features is None:
        return None
    names = (features,) if isinstance(features, str) else tuple(features)
    for name in names:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"features must name columns (strings), got {features!r}")
    return names


def _spark_of(data: Any) -> SparkSession | None:
    """The DataFrame's own session, else the active one."""
    if _is_spark_frame(data):
        session: SparkSession = data.sparkSession
        return session
    return _active_spark()


def _is_table(spark: SparkSession | None, name: str) -> bool:
    if spark is None or "/" in name or ":" in name:
        return False
    try:
        return bool(spark.catalog.tableExists(name))
    except Exception:  # ok: a name the catalog cannot parse is not a table
        return False


def _default_workers(backend: str, spark: SparkSession | None) -> int:
    """The session's default parallelism on Spark, else 2.

    A Connect session has none to read: its ``local[N]`` master's ``N``, else its
    ``spark.default.parallelism``.

    Raises:
        ConfigError: A Connect session that says neither: ``workers`` must be given.
    """
    if backend != "spark" or spark is None:
        return 2
    if not is_connect_session(spark):
        return max(int(spark.sparkContext.defaultParallelism), 1)
    master = str(spark.conf.get("spark.master", None) or "")
    slots = local_slots(master)
    if slots is None:
        given = spark.conf.get("spark.default.parallelism", None)
        slots = int(given) if given else None
    if slots is None:
        raise ConfigError(
            f"a Spark Connect session (master {master or 'unknown'}) does not say how many "
            "task slots its executors have: give Tuner(workers=N)"
        )
    return max(slots, 1)
