"""Experiment configs: the YAML file behind ``cerebro-spark run``.

Every field is checked when the config is loaded, and an error names the field (with
its dotted path) and the rule, before anything is trained or written.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml

from cerebro_spark.data._options import KindOptions
from cerebro_spark.data._residence import default_worker_memory, format_bytes, parse_memory
from cerebro_spark.errors import ConfigError, DataError
from cerebro_spark.search import PROCEDURES, procedure_options
from cerebro_spark.search._registry import upgrade_options
from cerebro_spark.training import add_code_directory

VisitOrder = Literal["seeded", "dynamic"]
Rule = Literal["randomized", "work-aware"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where the training data comes from and how it is partitioned.

    Attributes:
        source: A built-in source (``sklearn:digits``) or a Parquet/CSV/JSON path or URI
            (Spark ML vector columns included); it is prepared (shuffled once, split,
            partitioned) into the store.
        dataset: An already prepared dataset (instead of ``source``): its name in the
            store (``prepare --name``), its id, or its URI. The fields below, which say
            how a source is prepared, are refused beside it.
        features: Feature columns (default: every column but the label).
        label: The label column.
        partitions: Number of partitions P per split.
        validation_fraction: Share of rows held out for validation.
        validation_column: Boolean column marking validation rows (instead of a fraction).
        feature_shapes: Shapes of array columns, e.g. ``{image: [1, 8, 8]}``.
        seed: Seed of the shuffle and split (default: the experiment's seed).
        kinds: Which columns are images, categories or sequences and how they are
            prepared (:class:`~cerebro_spark.data.KindOptions`); in a config file its
            fields are keys of ``data`` (``image_columns``, ``categorical``,
            ``sequence_columns``, ``image_size``, ``image_channels``,
            ``vocabulary_limit``, ``hash_buckets``, ``max_length``).
    """

    source: str | None = None
    dataset: str | None = None
    features: tuple[str, ...] | None = None
    label: str = "label"
    partitions: int = 4
    validation_fraction: float = 0.2
    validation_column: str | None = None
    feature_shapes: Mapping[str, tuple[int, ...]] | None = None
    seed: int | None = None
    kinds: KindOptions | None = None


#: The keys of ``data`` that fill :attr:`DataConfig.kinds`.
KIND_FIELDS: tuple[str, ...] = tuple(field.name for field in dataclasses.fields(KindOptions))


@dataclasses.dataclass(frozen=True)
class SparkConfig:
    """How to reach Spark when ``backend: spark``.

    Attributes:
        master: Master URL (``local[2]``, ``spark://host:7077``, ``yarn`` ...); ``None``
            keeps the one ``spark-submit`` or the environment set.
        conf: Extra Spark settings, e.g. ``{spark.executor.memory: 1g}``.
    """

    master: str | None = None
    conf: Mapping[str, str] = dataclasses.field(default_factory=dict)


MANAGERS = ("standalone", "spark", "databricks", "ec2")


@dataclasses.dataclass(frozen=True)
class ElasticConfig:
    """Budget and the cluster manager of an elastic run (``elastic:``).

    The run's deadline is the config's one :attr:`ExperimentConfig.deadline` (an
    ``elastic.deadline`` in a config file is read as that).

    Attributes:
        manager: Who resizes the cluster: ``standalone`` (worker daemons cerebro-spark
            starts on this machine), ``spark`` (the running application's executors on
            standalone, YARN or Kubernetes), ``databricks`` or ``ec2``.
        prices: Path of the price catalog.
        budget: Most dollars the search may cost (``None``: no limit).
        instance_type: Instance type of the executors (default: the cheapest plan's).
        profile: Path of a profile YAML (``cerebro-spark profile``), or ``auto``: a short
            pilot on the config's backend before the search.
        plan: ``auto`` (plan at the start) or the path of a plan written by
            ``cerebro-spark plan --format json`` (its workers per stage are followed).
        resize_timeout: Seconds a stage waits for the cluster to reach its size before it
            goes on with what it has (and re-plans).
        replan_drift: Share by which a stage's measured seconds may differ from the plan's
            before the remaining stages are re-planned.
        options: The manager's own section (``standalone: {cores, memory}`` ...).
    """

    manager: str
    prices: str
    budget: float | None = None
    instance_type: str | None = None
    profile: str = "auto"
    plan: str = "auto"
    resize_timeout: float = 180.0
    replan_drift: float = 0.25
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class MlflowConfig:
    """Where an experiment is tracked in MLflow (``tracking.mlflow``).

    Attributes:
        enabled: ``False`` (``mlflow: false``) turns MLflow tracking off even when
            ``MLFLOW_TRACKING_URI`` is set.
        uri: Tracking URI (``http://host:5000``, ``databricks`` ...); ``None``: the
            ``MLFLOW_TRACKING_URI`` environment variable.
        experiment: MLflow experiment name; ``None``: ``MLFLOW_EXPERIMENT_NAME``, else the
            config's ``name`` (on Databricks a workspace path: ``/Users/<you>/<name>``).
        register_model: Register the best trial's model under this name at the end of
            the run (``None``: it is logged, ready to register, but not registered).
    """

    enabled: bool = True
    uri: str | None = None
    experiment: str | None = None
    register_model: str | None = None


@dataclasses.dataclass(frozen=True)
class TrackingConfig:
    """Where a run is watched from besides its event log (``tracking:``).

    With no ``tracking.mlflow`` section, MLflow tracking is on exactly when the
    ``MLFLOW_TRACKING_URI`` environment variable is set (a Databricks notebook sets it),
    into the MLflow experiment named like the config; ``mlflow: false`` turns it off.

    Attributes:
        mlflow: The MLflow section (``None``: follow ``MLFLOW_TRACKING_URI``).
        tensorboard: Directory of TensorBoard event files (one sub-directory per
            experiment, one below it per trial); ``None``: no TensorBoard files.
        flush_timeout: Seconds the end of a run waits for tracking still in flight
            before it gives up on it (with a warning).
        queue_size: Events held for the tracking thread; beyond that they are dropped
            (with a warning) rather than slow the search down.
    """

    mlflow: MlflowConfig | None = None
    tensorboard: str | None = None
    flush_timeout: float = 30.0
    queue_size: int = 10000


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """A whole model-selection experiment.

    Attributes:
        name: Experiment name; experiment ids start with it.
        data: The data section.
        space: The search space, in the form of :meth:`SearchSpace.from_config`.
        model: Import path of the default ``ModelSpec``; a ``model`` param overrides it.
        procedure: Search procedure name (``grid``, ``random`` ...).
        procedure_options: Extra keyword arguments of the procedure.
        epochs: Epochs each trial is trained for (the procedure's maximum).
        metric: Validation metric to optimise; ``None`` (the default): ``accuracy`` for a
            classification dataset, ``rmse`` for regression. Every model family must
            produce it (checked before any worker starts).
        mode: ``max`` or ``min``; ``None`` (the default): the metric's own (``min`` for
            loss, errors and ``log_loss``, ``max`` for the others).
        workers: Number of workers.
        store: Store URI for datasets, checkpoints and experiment logs.
        seed: Seed of everything random in the experiment.
        backend: ``spark`` (a long-lived worker per Spark executor slot) or ``local``
            (worker processes on this machine, no Spark).
        spark: The Spark section (master and settings) for ``backend: spark``.
        rule: MOP scheduling rule: ``work-aware`` (default; the idle trial with the most
            remaining measured work first) or ``randomized`` (Cerebro Alg. 1). With seeded
            visit orders work-aware is closer to the makespan bound
            (``benchmarks/mop_makespan.py``).
        visit_order: ``seeded`` (reproducible bit for bit) or ``dynamic`` (Alg. 1 as
            written: any order, reproducible by ``replay`` from the logged order).
        torch_threads: Intra-op threads of each worker.
        device: Where workers train: ``auto`` (default: a GPU where there is one --
            ``backend: local`` spreads the workers over the GPUs torch sees on this
            machine, ``backend: spark`` uses each task's ``gpu`` resource -- else the CPU),
            ``cuda`` (the same, but a run without a GPU for every worker is refused),
            ``cpu``, or ``cuda:N`` (every worker on GPU N; ``backend: local`` only).
        deadline: The experiment's one deadline: seconds from ``run`` to the end of the
            search, start-up included (experiment time: time the driver was down before a
            ``resume`` is not counted). HyperSched, SEER and ASHA stop at it (their
            ``deadline``), the elastic planner and controller plan and re-plan for it,
            ``plan`` plans for it. In a file it is the top-level ``deadline:``; an
            ``elastic.deadline`` or a procedure's ``deadline`` option is read as it (given
            in two places with one value it loads with a warning; two values are
            refused). ``None``: no deadline.
        elastic: Plan workers per stage for the deadline and a budget and resize the
            cluster between stages (``None``: a fixed cluster of ``workers``).
        tracking: MLflow and TensorBoard tracking (:class:`TrackingConfig`).
        worker_memory: Bytes of held partitions each worker keeps in RAM (given as an int
            or a size such as ``"4GiB"``, ``"512MiB"``); partitions beyond it are written
            once to the executor's local disk and streamed from there. ``None`` (the
            default): derived from the executor's memory -- ``spark.executor.pyspark.memory``
            per Python worker where set, else half of the machine's available memory
            divided by the workers on that host
            (:func:`~cerebro_spark.data._residence.default_worker_memory`). A budget
            smaller than one batch is refused by the pre-flight.
        pack: How many trials of one architecture a worker trains together in one visit
            of a partition (issue 27, :mod:`cerebro_spark.training._pack`): ``"off"``
            (the default: one trial a unit), an int ``N >= 1`` (packs of up to ``N``
            trials whose models share a :func:`~cerebro_spark.training.pack_fingerprint`;
            1 is off), or ``"auto"`` (``N`` chosen by the pre-flight from a throughput
            curve measured once per architecture,
            :mod:`~cerebro_spark.driver._pack_choice`). A YAML
            ``pack: off`` (a boolean false to YAML 1.1) reads as ``"off"``.
        workers_per_device: How many workers share one GPU (issue 27: models too small to
            fill a GPU, whose architectures cannot be packed, train side by side).
            ``backend: local``: no GPU gets more (``workers`` may be at most this times
            the GPUs torch sees); ``backend: spark``: every task takes ``1 /
            workers_per_device`` of a GPU (``spark.task.resource.gpu.amount``, set so when
            cerebro-spark starts the session, refused when a running one says otherwise).
            ``None`` (the default): ``local`` spreads the workers evenly over the GPUs,
            ``spark`` takes the application's setting. Refused with ``device: cpu``.
        warm_workers: Seconds a search's started workers are kept, after it ended
            normally, for the next search of this process that needs the same workers
            (the same dataset, backend, workers and device): it starts training at once,
            their partitions loaded (:mod:`~cerebro_spark.driver._warm`). 0 (the default
            of ``run``; ``Tuner`` keeps them 120 s) closes them at the end of the search.
            Spark executor slots stay held while they are kept.
    """

    name: str
    data: DataConfig
    space: Mapping[str, Any]
    model: str | None = None
    procedure: str = "grid"
    procedure_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    epochs: int = 10
    metric: str | None = None
    mode: str | None = None
    workers: int = 2
    store: str = "runs"
    seed: int = 0
    backend: str = "local"
    spark: SparkConfig = dataclasses.field(default_factory=SparkConfig)
    rule: Rule = "work-aware"
    visit_order: VisitOrder = "seeded"
    torch_threads: int = 1
    device: str = "auto"
    deadline: float | None = None
    elastic: ElasticConfig | None = None
    tracking: TrackingConfig = dataclasses.field(default_factory=TrackingConfig)
    worker_memory: int | None = None
    pack: int | str = "off"
    warm_workers: float = 0.0
    workers_per_device: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """Return the config as plain JSON values (the inverse of :func:`parse_config`)."""
        out: dict[str, Any] = json.loads(json.dumps(dataclasses.asdict(self)))
        procedure = {"name": out.pop("procedure"), **out.pop("procedure_options")}
        out["procedure"] = procedure
        kinds = out["data"].pop("kinds", None) or {}
        defaults = dataclasses.asdict(KindOptions())
        out["data"].update({k: v for k, v in kinds.items() if v != defaults[k]})
        out["data"] = {
            k: v
            for k, v in out["data"].items()
            if v is not None and not (self.data.dataset is not None and k in PREPARATION_FIELDS)
        }
        out["spark"] = {k: v for k, v in out["spark"].items() if v is not None}
        if out["elastic"] is None:
            del out["elastic"]
        else:
            elastic = out["elastic"]
            elastic.update(
                {elastic["manager"]: elastic.pop("options")} if elastic["options"] else {}
            )
            elastic.pop("options", None)
            out["elastic"] = {k: v for k, v in elastic.items() if v is not None}
        if out["worker_memory"] is None:
            del out["worker_memory"]
        if out["deadline"] is None:
            del out["deadline"]
        if out["pack"] == "off":
            del out["pack"]
        if out["workers_per_device"] is None:
            del out["workers_per_device"]
        tracking = _tracking_dict(self.tracking)
        if tracking:
            out["tracking"] = tracking
        else:
            del out["tracking"]
        return out

    @property
    def objective(self) -> tuple[str, str]:
        """``(metric, mode)`` of a resolved config (as a run stores it in ``config.json``).

        Raises:
            ConfigError: Metric or mode is still ``None``: only a run's pre-flight, which
                knows the dataset's task and the specs' metrics, resolves them.
        """
        if self.metric is None or self.mode is None:
            raise ConfigError(
                f"metric={self.metric!r}, mode={self.mode!r} are not resolved yet: a run "
                "resolves them from the dataset's task and the model specs' metrics"
            )
        return self.metric, self.mode

    def replace(self, **changes: Any) -> ExperimentConfig:
        """Return a copy with some fields changed."""
        return dataclasses.replace(self, **changes)


class _Loader(yaml.SafeLoader):
    """A YAML loader with two fixes to PyYAML's safe loader.

    YAML 1.2 floats: ``1e-4`` is a number, not the string YAML 1.1 makes of it. A key
    given twice in one mapping is an error (YAML forbids it; PyYAML keeps the last).
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        # Only keys written in this mapping must be unique: a key may override one that
        # a merge key (<<) brings in, and flattening the merges comes after this check.
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r} "
                    f"(first given on line {seen[key].start_mark.line + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def load_yaml(text: str) -> Any:
    """Parse YAML with numbers as YAML 1.2 reads them (``1e-4`` is a float)."""
    return yaml.load(text, Loader=_Loader)


def load_config(path: str | Path) -> ExperimentConfig:
    """Read and validate a YAML experiment config.

    The config's directory becomes a code directory: spec modules beside the config
    import on the driver and on every backend's workers
    (:func:`~cerebro_spark.training.add_code_directory`).

    Raises:
        ConfigError: naming the file and the field when anything is wrong.
    """
    path = Path(path)
    if path.is_file():
        add_code_directory(path.parent)
    try:
        raw = load_yaml(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"config file {path} is not valid YAML: {error}") from None
    try:
        return parse_config(raw)
    except ConfigError as error:
        raise ConfigError(f"{path}: {error}") from None


def parse_config(raw: Any, *, stored: bool = False) -> ExperimentConfig:
    """Validate a config given as plain data (as parsed from YAML).

    Args:
        raw: The config.
        stored: ``raw`` is an experiment's ``config.json`` (:meth:`ExperimentConfig.to_dict`),
            perhaps of an earlier version: fields of ``data`` that only apply to a
            ``source`` are dropped beside a ``dataset`` instead of refused.
    """
    top = _Section(raw, "")
    data_raw = top.take("data", dict)
    space = top.take("space", dict)
    procedure = top.take("procedure", (str, dict), {"name": "grid"})
    if isinstance(procedure, str):
        procedure = {"name": procedure}
    procedure = dict(procedure)
    procedure_name = procedure.pop("name", None)
    if not isinstance(procedure_name, str) or not procedure_name:
        raise ConfigError("procedure.name must be a procedure name such as 'grid' or 'random'")
    if procedure_name in PROCEDURES:  # an unknown name is refused where it is built
        # Renamed options (SEER's budget -> worker_seconds) under their new names; a
        # stored config of an earlier version is upgraded without a warning.
        procedure = upgrade_options(procedure_name, procedure, warn=not stored)
    elastic_raw = top.take("elastic", dict, None)
    if elastic_raw is not None:
        elastic_raw = dict(elastic_raw)
    deadline = _one_deadline(
        top.take("deadline", object, None),
        procedure_name,
        procedure,
        elastic_raw,
        stored=stored,
    )
    config = ExperimentConfig(
        name=top.take_name(),
        data=_parse_data(data_raw, stored=stored),
        space=space,
        model=top.take("model", str, None),
        procedure=procedure_name,
        procedure_options=procedure,
        epochs=top.take_int("epochs", 10, minimum=1),
        metric=top.take("metric", str, None),
        mode=top.take_optional_choice("mode", ("max", "min")),
        workers=top.take_int("workers", 2, minimum=1),
        store=top.take("store", str, "runs"),
        seed=top.take_int("seed", 0, minimum=0),
        # elastic resizes a Spark cluster: its default backend is spark (local is refused)
        backend=top.take_choice("backend", ("local", "spark"), "spark" if elastic_raw else "local"),
        spark=_parse_spark(top.take("spark", dict, {})),
        rule=top.take_choice("rule", ("randomized", "work-aware"), "work-aware"),  # type: ignore[arg-type]
        visit_order=top.take_choice("visit_order", ("seeded", "dynamic"), "seeded"),  # type: ignore[arg-type]
        torch_threads=top.take_int("torch_threads", 1, minimum=1),
        device=top.take("device", str, _default_device(raw, stored=stored)),
        deadline=deadline,
        elastic=_parse_elastic(elastic_raw),
        tracking=_parse_tracking(top.take("tracking", dict, {})),
        worker_memory=_parse_worker_memory(top.take("worker_memory", (int, str), None)),
        pack=parse_pack(top.take("pack", (int, str, bool), "off")),
        warm_workers=_parse_warm_workers(top.take("warm_workers", (int, float), 0.0)),
        workers_per_device=_parse_workers_per_device(top.take("workers_per_device", int, None)),
    )
    top.finish()
    _check_device(config.device, config.backend)
    if config.elastic is not None and config.backend == "local":
        raise ConfigError(
            "elastic: plans and resizes a Spark cluster, but backend is 'local' (worker "
            "processes on this machine, nothing to resize): set backend: spark, or leave "
            "the elastic section out"
        )
    return config


def _parse_warm_workers(value: float) -> float:
    if isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise ConfigError(
            f"warm_workers must be a number of seconds >= 0 (0: close the workers at the "
            f"end of the search), got {value!r}"
        )
    return float(value)


def worker_budget(config: ExperimentConfig) -> int | None:
    """The ``worker_memory`` handed to workers (:attr:`WorkerJob.worker_memory`).

    The config's; unset, for ``backend: local`` half of this machine's available memory
    divided by ``workers`` (the workers run here), for ``backend: spark`` ``None``: each
    worker derives it from its executor.
    """
    if config.worker_memory is not None or config.backend != "local":
        return config.worker_memory
    budget, rule = default_worker_memory(config.workers)
    logger.info("worker_memory not set: %s a worker (%s)", format_bytes(budget), rule)
    return budget


PACK_RULE = (
    "'off', 'auto' or an int >= 1 (the most trials of one architecture a worker trains "
    "together in one visit of a partition; 1 is off)"
)


def _parse_workers_per_device(value: int | None) -> int | None:
    """``workers_per_device``: an int ``>= 1``, or absent."""
    if value is not None and (isinstance(value, bool) or value < 1):
        raise ConfigError(
            f"workers_per_device must be an int >= 1 (workers sharing one GPU), got {value!r}"
        )
    return value


def parse_pack(value: Any) -> int | str:
    """``pack``: ``"off"``, ``"auto"`` or an int ``>= 1`` (YAML's ``off``, false, is ``"off"``).

    Raises:
        ConfigError: Any other value (naming it and the rule).
    """
    if value is False or value == "off":
        return "off"
    if value == "auto":
        return "auto"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ConfigError(f"pack must be {PACK_RULE}, got {value!r}")


def pack_size(config: ExperimentConfig) -> int | None:
    """The config's most trials in one pack: 1 when ``pack`` is off, ``None`` for ``auto``."""
    if config.pack == "auto":
        return None
    return 1 if config.pack == "off" else int(config.pack)


def _parse_worker_memory(value: int | str | None) -> int | None:
    """``worker_memory`` in bytes (an int, or a size such as ``"4GiB"``), or ``None``."""
    return None if value is None else parse_memory(value, "worker_memory")


_DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


def _default_device(raw: Mapping[str, Any], *, stored: bool) -> str:
    """``auto``; but ``cpu`` for a stored local run of a version without ``device``.

    Local workers trained on the CPU before ``device`` existed (Spark tasks already took
    their ``gpu`` resource): resumed or replayed on a machine with a GPU, such a run goes
    on where it ran, so its checkpoints still compare bit for bit.
    """
    return "cpu" if stored and raw.get("backend", "local") == "local" else "auto"


def _check_device(device: str, backend: str) -> None:
    if not _DEVICE.fullmatch(device):
        raise ConfigError(
            f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N' (N a GPU index), got {device!r}"
        )
    if backend == "spark" and device.startswith("cuda:"):
        raise ConfigError(
            f"device {device!r} pins every worker to one GPU, which Spark does not schedule: "
            "with backend 'spark' use 'cuda' (or 'auto'), and give each task a GPU with "
            "spark.task.resource.gpu.amount"
        )


def _parse_data(raw: Mapping[str, Any], *, stored: bool = False) -> DataConfig:
    section = _Section(raw, "data.")
    source = section.take("source", str, None)
    dataset = section.take("dataset", str, None)
    if (source is None) == (dataset is None):
        raise ConfigError(
            "data must have exactly one of 'source' (data to prepare) or 'dataset' "
            f"(a prepared dataset's name, id or URI), got source={source!r}, "
            f"dataset={dataset!r}"
        )
    if dataset is not None:
        _refuse_preparation_fields(section, dataset, stored=stored)
    features = section.take("features", list, None)
    if features is not None and not all(isinstance(f, str) and f for f in features):
        raise ConfigError(f"data.features must be a list of column names, got {features!r}")
    shapes_raw = section.take("feature_shapes", dict, None)
    shapes: dict[str, tuple[int, ...]] | None = None
    if shapes_raw is not None:
        shapes = {}
        for column, shape in shapes_raw.items():
            if not isinstance(shape, list) or not all(isinstance(n, int) and n > 0 for n in shape):
                raise ConfigError(
                    f"data.feature_shapes.{column} must be a list of positive ints, got {shape!r}"
                )
            shapes[str(column)] = tuple(shape)
    fraction = section.take("validation_fraction", (int, float), 0.2)
    if not 0 < fraction < 1:
        raise ConfigError(f"data.validation_fraction must be in (0, 1), got {fraction!r}")
    seed = section.take("seed", int, None)
    if seed is not None and seed < 0:
        raise ConfigError(f"data.seed must be ≥ 0, got {seed}")
    kind_raw = {key: section.take(key, object, None) for key in KIND_FIELDS}
    try:
        kinds = KindOptions.from_mapping({k: v for k, v in kind_raw.items() if v is not None})
    except DataError as error:
        raise ConfigError(f"data: {error}") from None
    config = DataConfig(
        source=source,
        dataset=dataset,
        features=tuple(features) if features is not None else None,
        label=section.take("label", str, "label"),
        partitions=section.take_int("partitions", 4, minimum=1),
        validation_fraction=float(fraction),
        validation_column=section.take("validation_column", str, None),
        feature_shapes=shapes,
        seed=seed,
        kinds=kinds if kinds != KindOptions() else None,
    )
    section.finish()
    return config


#: Fields of ``data`` that say how a ``source`` is prepared, and why each cannot apply to
#: a dataset that is already prepared (what its manifest fixed).
PREPARATION_FIELDS: Mapping[str, str] = {
    "features": "its feature columns (and their order)",
    "label": "its label column",
    "partitions": "its number of partitions P",
    "validation_fraction": "its train/validation split",
    "validation_column": "its train/validation split",
    "feature_shapes": "its feature shapes",
    **{key: "its feature kinds" for key in KIND_FIELDS},
    "seed": "the seed of its shuffle and split",
}


def _refuse(given: list[str], dataset: str) -> None:
    if given:
        key = given[0]
        others = f" (also set: {', '.join(given[1:])})" if len(given) > 1 else ""
        raise ConfigError(
            f"data.{key} applies only when preparing data.source, but data.dataset "
            f"({dataset!r}) is already prepared: its manifest fixed {PREPARATION_FIELDS[key]}; "
            f"remove data.{key}{others}, or prepare the data again with the value you want "
            "(cerebro-spark prepare ... --name NAME) and use that dataset"
        )


def _refuse_preparation_fields(section: _Section, dataset: str, *, stored: bool) -> None:
    """Refuse preparation fields beside ``dataset`` (drop them from a ``stored`` config)."""
    given = [key for key in PREPARATION_FIELDS if section.raw.get(key) is not None]
    if stored:  # earlier versions wrote label, partitions and validation_fraction here
        for key in given:
            section.raw.pop(key)
        return
    _refuse(given, dataset)


def check_name(value: Any, what: str) -> str:
    """Check an experiment name or id: one path segment any store accepts.

    Rule: letters, digits, ``-``, ``_`` or ``.``, no ``..`` and not ``.`` alone.

    Raises:
        ConfigError: Naming ``what``, the value and the rule.
    """
    if (
        not isinstance(value, str)
        or not value
        or not all(c.isalnum() or c in "-_." for c in value)
        or ".." in value
        or value == "."
    ):
        raise ConfigError(
            f"{what} must be letters, digits, '-', '_' or '.' (no '..'), got {value!r}"
        )
    return value


def validate_config(config: ExperimentConfig) -> ExperimentConfig:
    """Check a config built or changed in code by the rules :func:`parse_config` applies.

    A config from :func:`load_config` or :func:`parse_config` is valid; one changed since
    (``config.replace(workers=0)``, a CLI override such as ``--seed -5``) or built in
    code is checked here, field by field, as if it had been read from YAML.

    Returns:
        ``config`` itself.

    Raises:
        ConfigError: Naming the first field that breaks its rule.
    """
    if not isinstance(config, ExperimentConfig):
        raise ConfigError(f"expected an ExperimentConfig, got {type(config).__name__}")
    check_data_section(config.data)
    try:
        raw = config.to_dict()
    except (TypeError, ValueError) as error:
        raise ConfigError(f"the config holds a value that is not plain data: {error}") from None
    parse_config(raw)
    return config


def check_data_section(data: DataConfig) -> None:
    """Refuse a :class:`DataConfig` built in code with preparation fields beside ``dataset``.

    :func:`parse_config` refuses any such field that is set; here (a config built without
    it) a field counts as set when it differs from its default.

    Raises:
        ConfigError: Naming the field and why it cannot apply.
    """
    if data.dataset is None:
        return
    defaults = DataConfig()
    given = [
        key
        for key in PREPARATION_FIELDS
        if hasattr(defaults, key) and getattr(data, key) != getattr(defaults, key)
    ]
    kinds = data.kinds or KindOptions()
    given += [key for key in KIND_FIELDS if getattr(kinds, key) != getattr(KindOptions(), key)]
    _refuse(given, data.dataset)


def _parse_spark(raw: Mapping[str, Any]) -> SparkConfig:
    section = _Section(raw, "spark.")
    conf = section.take("conf", dict, {})
    bad = [key for key, value in conf.items() if isinstance(value, (dict, list)) or value is None]
    if bad:
        raise ConfigError(f"spark.conf.{bad[0]} must be a string, number or boolean")
    config = SparkConfig(
        master=section.take("master", str, None),
        conf={str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in conf.items()},
    )
    section.finish()
    return config


def _parse_elastic(raw: Mapping[str, Any] | None) -> ElasticConfig | None:
    if raw is None:
        return None
    section = _Section(raw, "elastic.")
    section.known.append("deadline")  # read by _one_deadline
    manager = section.take_choice("manager", MANAGERS, "standalone")
    budget = section.take("budget", (int, float), None)
    if budget is not None and not budget > 0:
        raise ConfigError(f"elastic.budget must be a number of dollars > 0, got {budget!r}")
    options = section.take(manager, dict, {})
    for other in MANAGERS:
        if other != manager and other in section.raw:
            raise ConfigError(
                f"elastic.{other} is set but elastic.manager is {manager!r}: set manager: "
                f"{other} or remove the section"
            )
    config = ElasticConfig(
        manager=manager,
        prices=section.take("prices", str),
        budget=float(budget) if budget is not None else None,
        instance_type=section.take("instance_type", str, None),
        profile=section.take("profile", str, "auto"),
        plan=section.take("plan", str, "auto"),
        resize_timeout=section.take_number("resize_timeout", 180.0, positive=True),
        replan_drift=section.take_number("replan_drift", 0.25, positive=True),
        options=dict(options),
    )
    section.finish()
    return config


_DEADLINE_RULE = "seconds from `run` to the end, start-up included"


def _one_deadline(
    given: Any,
    procedure_name: str,
    procedure: dict[str, Any],
    elastic: dict[str, Any] | None,
    *,
    stored: bool,
) -> float | None:
    """The experiment's one deadline (:attr:`ExperimentConfig.deadline`).

    Read from the top-level ``deadline``, the procedure's ``deadline`` option (for a
    procedure that takes one) and ``elastic.deadline``; the last two are taken out of
    ``procedure`` and ``elastic``. Given in several places with one value, it loads with a
    warning (an older config: SEER and ``elastic:`` each needed it); a stored config of an
    earlier version is read without one. A stored run of an earlier version whose
    procedure took an optional deadline (ASHA) but was given none beside
    ``elastic.deadline`` keeps running without one (``procedure["deadline"] = None``).

    Raises:
        ConfigError: Two different values (naming both places), a value that is not a
            number of seconds > 0, a procedure that needs a deadline without one, or an
            ``elastic:`` section without one.
    """
    options = procedure_options(procedure_name) if procedure_name in PROCEDURES else {}
    takes = "deadline" in options
    places: list[tuple[str, float]] = []
    if given is not None:
        places.append(("deadline", _seconds("deadline", given)))
    if takes and procedure.get("deadline") is not None:
        places.append(
            ("procedure.deadline", _seconds("procedure.deadline", procedure.pop("deadline")))
        )
    elastic_deadline = None if elastic is None else elastic.pop("deadline", None)
    if elastic_deadline is not None:
        places.append(("elastic.deadline", _seconds("elastic.deadline", elastic_deadline)))
    for where, value in places[1:]:
        first, seconds = places[0]
        if value != seconds:
            raise ConfigError(
                f"{first} is {seconds:g} but {where} is {value:g}: an experiment has one "
                f"deadline ({_DEADLINE_RULE}), read by the search procedure and the elastic "
                "planner alike; give it once, as the top-level deadline:"
            )
    deadline = places[0][1] if places else None
    if len(places) > 1 and not stored:
        logger.warning(
            "the deadline is given %d times (%s), each %g s: an experiment has one deadline, "
            "read by the search procedure and the elastic planner alike; give it once, as "
            "the top-level deadline: %g",
            len(places),
            ", ".join(where for where, _ in places),
            deadline,
            deadline,
        )
    old_run = stored and given is None and takes and not options["deadline"]
    if old_run and places and places[0][0] == "elastic.deadline" and "deadline" not in procedure:
        procedure["deadline"] = None  # as it ran: without a deadline of its own
    if deadline is None and takes and options["deadline"]:
        raise ConfigError(
            f"search procedure {procedure_name!r} needs a deadline: set the top-level "
            f"deadline: ({_DEADLINE_RULE})"
        )
    if deadline is None and elastic is not None:
        raise ConfigError(
            f"an elastic: section needs a deadline: set the top-level deadline: ({_DEADLINE_RULE})"
        )
    return deadline


def _seconds(where: str, value: Any) -> float:
    """A deadline: a finite number of seconds > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where} must be a number of seconds > 0, got {value!r}")
    if not math.isfinite(value) or not value > 0:
        raise ConfigError(f"{where} must be a number of seconds > 0, got {value!r}")
    return float(value)


def _parse_tracking(raw: Mapping[str, Any]) -> TrackingConfig:
    section = _Section(raw, "tracking.")
    mlflow_raw = section.take("mlflow", (dict, bool), None)
    if mlflow_raw is True:
        mlflow_raw = {}
    mlflow = MlflowConfig(enabled=False) if mlflow_raw is False else None
    if isinstance(mlflow_raw, dict):
        inner = _Section(mlflow_raw, "tracking.mlflow.")
        mlflow = MlflowConfig(
            uri=inner.take("uri", str, None),
            experiment=inner.take("experiment", str, None),
            register_model=inner.take("register_model", str, None),
        )
        inner.finish()
        for key in ("uri", "experiment", "register_model"):
            if getattr(mlflow, key) == "":
                raise ConfigError(f"tracking.mlflow.{key} must not be empty")
    tensorboard = section.take("tensorboard", str, None)
    if tensorboard == "":
        raise ConfigError("tracking.tensorboard must be a directory, got ''")
    queue_size = section.take_int("queue_size", 10000, minimum=1)
    config = TrackingConfig(
        mlflow=mlflow,
        tensorboard=tensorboard,
        flush_timeout=section.take_number("flush_timeout", 30.0, positive=True),
        queue_size=queue_size,
    )
    section.finish()
    return config


def _tracking_dict(tracking: TrackingConfig) -> dict[str, Any]:
    """``tracking`` as :func:`parse_config` reads it, defaults left out."""
    out: dict[str, Any] = {}
    if tracking.mlflow is not None:
        if not tracking.mlflow.enabled:
            out["mlflow"] = False
        else:
            fields = dataclasses.asdict(tracking.mlflow)
            del fields["enabled"]
            out["mlflow"] = {k: v for k, v in fields.items() if v is not None}
    if tracking.tensorboard is not None:
        out["tensorboard"] = tracking.tensorboard
    defaults = TrackingConfig()
    for key in ("flush_timeout", "queue_size"):
        if getattr(tracking, key) != getattr(defaults, key):
            out[key] = getattr(tracking, key)
    return out


_MISSING = object()


class _Section:
    """Takes typed fields out of one mapping and complains about the rest."""

    def __init__(self, raw: Any, prefix: str) -> None:
        where = prefix.rstrip(".") or "the config"
        if not isinstance(raw, dict):
            raise ConfigError(f"{where} must be a mapping, got {type(raw).__name__}")
        self.raw = dict(raw)
        self.prefix = prefix
        self.known: list[str] = []

    def take(self, key: str, types: type | tuple[type, ...], default: Any = _MISSING) -> Any:
        self.known.append(key)
        value = self.raw.pop(key, None)
        if value is None:
            if default is _MISSING:
                raise ConfigError(f"{self.prefix}{key} is required")
            return default
        if isinstance(value, bool) and bool not in (
            types if isinstance(types, tuple) else (types,)
        ):
            raise ConfigError(f"{self.prefix}{key} must not be a boolean, got {value!r}")
        if not isinstance(value, types):
            names = " or ".join(
                t.__name__ for t in (types if isinstance(types, tuple) else (types,))
            )
            raise ConfigError(
                f"{self.prefix}{key} must be of type {names}, got {value!r} "
                f"({type(value).__name__})"
            )
        return value

    def take_int(self, key: str, default: int, *, minimum: int) -> int:
        value: int = self.take(key, int, default)
        if value < minimum:
            raise ConfigError(f"{self.prefix}{key} must be an int ≥ {minimum}, got {value}")
        return value

    def take_number(
        self, key: str, default: float | object = _MISSING, *, positive: bool = False
    ) -> float:
        value = self.take(key, (int, float), default)
        if not math.isfinite(value) or (positive and not value > 0):
            rule = "a finite number > 0" if positive else "a finite number"
            raise ConfigError(f"{self.prefix}{key} must be {rule}, got {value!r}")
        return float(value)

    def take_choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        value: str = self.take(key, str, default)
        if value not in choices:
            raise ConfigError(f"{self.prefix}{key} must be one of {list(choices)}, got {value!r}")
        return value

    def take_optional_choice(self, key: str, choices: tuple[str, ...]) -> str | None:
        value: str | None = self.take(key, str, None)
        if value is not None and value not in choices:
            raise ConfigError(f"{self.prefix}{key} must be one of {list(choices)}, got {value!r}")
        return value

    def take_name(self) -> str:
        name: str = self.take("name", str)
        check_name(name, "name")
        return name

    def finish(self) -> None:
        if self.raw:
            unknown = ", ".join(sorted(map(str, self.raw)))
            raise ConfigError(
                f"unknown field(s) {unknown} in {self.prefix.rstrip('.') or 'the config'}; "
                f"known fields: {', '.join(sorted(self.known))}"
            )
