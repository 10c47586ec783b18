"""The best model as a Spark ML Transformer: :class:`ModelTransformer`.

``transform(df)`` scores ``df`` on the executors with ``mapInArrow``: each Arrow batch's
raw feature columns become a partition held as the dataset stores it, in the task (the
rules of :mod:`cerebro_spark.scoring._inputs`: images decoded, converted and resized to the
trained size, categories mapped to ids, sequences cut and checked), scored by
:meth:`ScoringModel.outputs` exactly as :func:`~cerebro_spark.load_model`'s ``predict``
scores, and two columns are appended:

* ``predictionCol`` (default ``"prediction"``): the original class label (long, string,
  boolean or double, as the label values were) for classification; a double for
  regression;
* ``probabilityCol`` (default ``"probability"``, classification only; ``""`` leaves it
  out): ``array<double>``, the class probabilities in the order of
  :attr:`ModelTransformer.classes` (``pyspark.ml.functions.array_to_vector`` makes it an
  ML vector).

Every other column passes through unchanged. The checkpoint bytes travel to the executors
once per ``transform`` (a broadcast variable where there is a SparkContext); each Python
worker builds the model once per checkpoint (a module-level cache keyed by the bytes'
SHA-256 and the device) and uses a GPU when torch sees one there (the task's assigned GPU
when Spark schedules GPUs); on CPU, torch uses ``spark.task.cpus`` threads. Feature
columns may be numbers, arrays or Spark ML vectors (dense columns), ``binary`` JPEG/PNG
bytes or Spark's image struct (image columns), strings or integers (categorical),
``array<int>`` (sequence); they reach the tasks as Arrow, and nothing is decoded or mapped
on the driver. A bad value fails the task with a :class:`DataError` naming the column,
the Spark partition and the row within it.

Saved with ``write().save(path)``: Spark ML's parameter metadata (``path/metadata``) and the
checkpoint bytes themselves (``path/checkpoint``, one Parquet row), so a saved Transformer
keeps working after its experiment is deleted. ``ModelTransformer.load(path)`` reads it back.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark import keyword_only
from pyspark.ml import Transformer
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.util import (
    DefaultParamsReader,
    DefaultParamsWriter,
    MLReadable,
    MLReader,
    MLWritable,
    MLWriter,
)
from pyspark.sql import DataFrame
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from cerebro_spark.data import ColumnInfo, Manifest
from cerebro_spark.data import _validate as v
from cerebro_spark.data._kinds import SPARK_IMAGE_FIELDS
from cerebro_spark.errors import ConfigError, DataError
from cerebro_spark.scoring._inputs import raw_partition
from cerebro_spark.scoring._metadata import ModelMetadata
from cerebro_spark.scoring._model import (
    DEFAULT_BATCH_SIZE,
    ScoringModel,
    load_checkpoint,
    model_from_bytes,
)
from cerebro_spark.scoring._source import Source
from cerebro_spark.store import Store
from cerebro_spark.training import CheckpointError, decode_checkpoint

logger = logging.getLogger(__name__)

_SAVE_FORMAT = 1
_CHECKPOINT_DIR = "checkpoint"
_TMP_FEATURE = "__cerebro_feature_"
_DEVICES = ("auto", "cpu", "cuda")

_MODELS: dict[tuple[str, str, int], ScoringModel] = {}
_MODELS_LOCK = threading.Lock()


# -- on the executors -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _ScorePlan:
    """What a scoring task needs besides the checkpoint bytes (small, picklable)."""

    sha256: str
    features: tuple[ColumnInfo, ...]
    columns: tuple[str, ...]
    keep: tuple[str, ...]
    prediction_col: str
    probability_col: str
    prediction_type: pa.DataType
    classification: bool
    batch_size: int
    device: str


def _pin_threads() -> None:
    """Run torch on the task's CPUs (``spark.task.cpus``), not on every core of the host."""
    import torch
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is not None:
        torch.set_num_threads(max(1, int(context.cpus())))


def _task_device(requested: str) -> str:
    """The device a task scores on: ``auto`` is the task's GPU (or the first) when present."""
    import torch

    if requested != "auto":
        return requested
    if not torch.cuda.is_available():
        return "cpu"
    from pyspark import TaskContext

    context = TaskContext.get()
    gpus = context.resources().get("gpu") if context is not None else None
    if gpus is not None and gpus.addresses:
        return f"cuda:{gpus.addresses[0]}"
    return "cuda"


def _partition_id() -> int | str:
    """The Spark partition a task scores (for messages), ``"?"`` outside a task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else "?"


def cached_model(sha256: str, blob: Any, device: str, batch_size: int) -> ScoringModel:
    """The model of a checkpoint, built once per process, device and batch size.

    Args:
        sha256: The checkpoint bytes' SHA-256 (the cache key).
        blob: The bytes, or a Spark broadcast variable holding them (read on a miss only).
        device: ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        batch_size: Rows per forward pass.
    """
    resolved = _task_device(device)
    key = (sha256, resolved, batch_size)
    with _MODELS_LOCK:
        model = _MODELS.get(key)
        if model is None:
            data = bytes(blob.value if hasattr(blob, "value") else blob)
            if hashlib.sha256(data).hexdigest() != sha256:
                raise CheckpointError(
                    f"checkpoint bytes received by the task do not match SHA-256 {sha256}"
                )
            model = model_from_bytes(
                data, f"checkpoint {sha256[:12]}", device=resolved, batch_size=batch_size
            )
            _MODELS[key] = model
            logger.info("built model %s on %s", sha256[:12], resolved)
    return model


def _probabilities(outputs: np.ndarray) -> pa.Array:
    rows, width = outputs.shape
    offsets = pa.array(np.arange(0, rows * width + 1, width, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(outputs.reshape(-1), pa.float64()))


def _score(
    batches: Iterator[pa.RecordBatch], plan: _ScorePlan, blob: Any
) -> Iterator[pa.RecordBatch]:
    """Scoring task: append the prediction (and probability) columns to every batch."""
    model: ScoringModel | None = None
    names = [*plan.keep, plan.prediction_col]
    if plan.classification and plan.probability_col:
        names.append(plan.probability_col)
    first_row = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        if model is None:
            _pin_threads()
            model = cached_model(plan.sha256, blob, plan.device, plan.batch_size)
        try:
            data = raw_partition(
                batch,
                plan.features,
                plan.columns,
                classification=plan.classification,
                first_row=first_row,
            )
        except DataError as exc:
            raise DataError(f"in Spark partition {_partition_id()}: {exc}") from exc
        first_row += batch.num_rows
        outputs = model.outputs(data)
        arrays = [batch.column(name) for name in plan.keep]
        if plan.classification:
            labels = model.labels(outputs.argmax(axis=1))
            arrays.append(pa.array(labels.tolist(), type=plan.prediction_type))
            if plan.probability_col:
                arrays.append(_probabilities(outputs))
        else:
            arrays.append(pa.array(outputs, type=pa.float64()))
        yield pa.RecordBatch.from_arrays(arrays, names=names)


# -- on the driver ----------------------------------------------------------------------------


def _prediction_types(metadata: ModelMetadata) -> tuple[DataType, pa.DataType]:
    """Spark and Arrow types of the prediction column: the class labels' type, or double."""
    classes = metadata.classes
    if classes is None:
        return DoubleType(), pa.float64()
    if all(isinstance(c, bool) for c in classes):
        return BooleanType(), pa.bool_()
    if all(isinstance(c, int) and not isinstance(c, bool) for c in classes):
        return LongType(), pa.int64()
    if all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in classes):
        return DoubleType(), pa.float64()
    if all(isinstance(c, str) for c in classes):
        return StringType(), pa.string()
    raise ConfigError(
        f"class labels {list(classes)[:5]} mix types; predictions need one type per column"
    )


#: Spark's integral types (categories and token ids).
_INTEGRAL = ("ByteType", "ShortType", "IntegerType", "LongType")


def _check_kind_type(info: ColumnInfo, spark_type: DataType) -> None:
    """Refuse, on the driver, a column whose Spark type cannot hold its kind's raw values.

    Values are checked in the tasks; this catches a wrong column before any task runs.
    """
    kind = info.feature_kind
    name = type(spark_type).__name__
    if kind == "image":
        fields = (
            {field.name for field in spark_type.fields}
            if isinstance(spark_type, StructType)
            else set()
        )
        ok = name == "BinaryType" or fields == set(SPARK_IMAGE_FIELDS)
        rule = "binary (JPEG or PNG bytes) or the struct of Spark's image source"
    elif kind == "categorical":
        ok = name in (*_INTEGRAL, "StringType", "BooleanType")
        rule = "strings, integers or booleans"
    elif kind == "sequence":
        ok = (
            isinstance(spark_type, ArrayType) and type(spark_type.elementType).__name__ in _INTEGRAL
        )
        rule = "array<int> or array<bigint> of token ids"
    else:
        return  # numbers, arrays and vectors are checked in the tasks, as before
    if not ok:
        raise DataError(
            f"{kind} column {info.name!r} has Spark type {spark_type.simpleString()}; "
            f"a {kind} column to score must be {rule}"
        )


def _quoted(name: str) -> Any:
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


class ModelTransformer(Transformer, MLReadable["ModelTransformer"], MLWritable):
    """A trained checkpoint as a Spark ML Transformer (see the module docstring).

    Build it with :meth:`from_checkpoint` (an experiment, a checkpoint URI or bytes), or
    read a saved one with :meth:`load`. Params: ``predictionCol``, ``probabilityCol``
    (``""``: none), ``batchSize`` (rows per forward pass) and ``device`` (``"auto"``,
    ``"cpu"``, ``"cuda"``; ``"auto"`` uses the executor's GPU when torch sees one).
    """

    predictionCol = Param(
        Params._dummy(),
        "predictionCol",
        "output column: the predicted class label (classification) or value (regression)",
        typeConverter=TypeConverters.toString,
    )
    probabilityCol = Param(
        Params._dummy(),
        "probabilityCol",
        "output column of class probabilities (array<double>, classification only); '' for none",
        typeConverter=TypeConverters.toString,
    )
    batchSize = Param(
        Params._dummy(),
        "batchSize",
        "rows per forward pass (>= 1)",
        typeConverter=TypeConverters.toInt,
    )
    _input_kwargs: dict[str, Any]

    device = Param(
        Params._dummy(),
        "device",
        "'auto' (the executor's GPU when there is one), 'cpu' or 'cuda'",
        typeConverter=TypeConverters.toString,
    )

    @keyword_only
    def __init__(
        self,
        *,
        predictionCol: str = "prediction",
        probabilityCol: str = "probability",
        batchSize: int = DEFAULT_BATCH_SIZE,
        device: str = "auto",
    ) -> None:
        super().__init__()
        self._setDefault(
            predictionCol="prediction",
            probabilityCol="probability",
            batchSize=DEFAULT_BATCH_SIZE,
            device="auto",
        )
        self._set(**self._input_kwargs)
        self._checkpoint: bytes | None = None
        self._metadata: ModelMetadata | None = None

    # -- construction -----------------------------------------------------------------------

    @classmethod
    def from_checkpoint(
        cls,
        source: Source,
        *,
        store: str | Store | None = None,
        dataset: str | Manifest | None = None,
        **params: Any,
    ) -> ModelTransformer:
        """Build a Transformer from a checkpoint, read now on the driver.

        Args:
            source: As :func:`cerebro_spark.load_model`: checkpoint bytes, a checkpoint's
                path or URI, an experiment directory (its ``best.pt``), or with ``store``
                an experiment id.
            store: The store ``source`` is relative to.
            dataset: The training dataset, for checkpoints without dataset metadata.
            **params: Transformer params (``predictionCol``, ``probabilityCol``,
                ``batchSize``, ``device``).

        Raises:
            FileNotFoundError, CheckpointError, ConfigError: As :func:`load_model`.
        """
        loaded = load_checkpoint(source, store=store, dataset=dataset)
        metadata = loaded.metadata
        model_from_bytes(loaded.data, loaded.where, device="cpu")  # fails here, not in tasks
        transformer = cls(**params)
        transformer._attach(loaded.data, metadata)
        logger.info("Transformer for %s (%s) from %s", metadata.spec, metadata.task, loaded.where)
        return transformer

    def _attach(self, data: bytes, metadata: ModelMetadata | None = None) -> None:
        if metadata is None:
            metadata = ModelMetadata.from_checkpoint(decode_checkpoint(data), "<saved>")
        self._checkpoint = bytes(data)
        self._metadata = metadata
        self._check_params()

    def _check_params(self) -> None:
        size = self.getOrDefault(self.batchSize)
        if size < 1:
            raise ConfigError(f"batchSize must be >= 1, got {size}")
        device = self.getOrDefault(self.device)
        if device not in _DEVICES and not device.startswith("cuda:"):
            raise ConfigError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
        if not self.getOrDefault(self.predictionCol):
            raise ConfigError("predictionCol must be a non-empty column name")

    # -- what it holds ----------------------------------------------------------------------

    @property
    def metadata(self) -> ModelMetadata:
        """The checkpoint's metadata (spec, params, features, classes ...)."""
        if self._metadata is None:
            raise ConfigError(
                "this ModelTransformer holds no checkpoint: build it with "
                "ModelTransformer.from_checkpoint(...) or ModelTransformer.load(path)"
            )
        return self._metadata

    @property
    def checkpoint_bytes(self) -> bytes:
        """The checkpoint the Transformer scores with."""
        self.metadata  # noqa: B018  (raises when there is none)
        assert self._checkpoint is not None  # ok: set together with the metadata
        return self._checkpoint

    @property
    def checkpoint_sha256(self) -> str:
        """SHA-256 of :attr:`checkpoint_bytes`."""
        return hashlib.sha256(self.checkpoint_bytes).hexdigest()

    @property
    def classes(self) -> tuple[Any, ...] | None:
        """The class labels, in the order of the probability column; ``None`` for regression."""
        return self.metadata.classes

    def getPredictionCol(self) -> str:
        """The prediction column's name."""
        return str(self.getOrDefault(self.predictionCol))

    def getProbabilityCol(self) -> str:
        """The probability column's name (``""``: none)."""
        return str(self.getOrDefault(self.probabilityCol))

    # -- transform --------------------------------------------------------------------------

    def _transform(self, dataset: DataFrame) -> DataFrame:
        from pyspark.ml.functions import vector_to_array

        self._check_params()
        metadata = self.metadata
        data = self.checkpoint_bytes
        prediction, probability = self.getPredictionCol(), self.getProbabilityCol()
        classification = metadata.classes is not None
        outputs = [prediction] + ([probability] if classification and probability else [])
        taken = [name for name in outputs if name in dataset.columns]
        if taken or len(set(outputs)) != len(outputs):
            raise ConfigError(
                f"output column(s) {taken or outputs} already exist or repeat; set "
                "predictionCol / probabilityCol to new names"
            )
        names = [column.name for column in metadata.features]
        v.check_columns(dataset.columns, names)
        types = {field.name: field.dataType for field in dataset.schema.fields}
        frame = dataset
        columns: list[str] = []
        for index, (info, name) in enumerate(zip(metadata.features, names, strict=True)):
            _check_kind_type(info, types[name])
            if info.dense and type(types[name]).__name__ == "VectorUDT":
                temporary = f"{_TMP_FEATURE}{index}"
                frame = frame.withColumn(temporary, vector_to_array(_quoted(name), "float32"))
                columns.append(temporary)
            else:
                columns.append(name)
        spark_type, arrow_type = _prediction_types(metadata)
        fields = [*dataset.schema.fields, StructField(prediction, spark_type, True)]
        if classification and probability:
            fields.append(StructField(probability, ArrayType(DoubleType(), True), True))
        plan = _ScorePlan(
            sha256=hashlib.sha256(data).hexdigest(),
            features=metadata.features,
            columns=tuple(columns),
            keep=tuple(dataset.columns),
            prediction_col=prediction,
            probability_col=probability,
            prediction_type=arrow_type,
            classification=classification,
            batch_size=int(self.getOrDefault(self.batchSize)),
            device=str(self.getOrDefault(self.device)),
        )
        blob: Any = data
        try:
            blob = dataset.sparkSession.sparkContext.broadcast(data)
        except Exception:  # Spark Connect: no SparkContext; the bytes go with the tasks
            logger.debug("no SparkContext: shipping the checkpoint inside the task closure")
        return frame.mapInArrow(functools.partial(_score, plan=plan, blob=blob), StructType(fields))

    # -- persistence ------------------------------------------------------------------------

    def write(self) -> MLWriter:
        """A writer that saves the params and the checkpoint bytes (self-contained)."""
        return _Writer(self)

    @classmethod
    def read(cls) -> MLReader[ModelTransformer]:
        """A reader for directories written by :meth:`write`."""
        return _Reader(cls)


class _Writer(MLWriter):
    def __init__(self, instance: ModelTransformer) -> None:
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        data = self.instance.checkpoint_bytes
        sha256 = hashlib.sha256(data).hexdigest()
        DefaultParamsWriter.saveMetadata(
            self.instance,
            path,
            self.sparkSession,
            extraMetadata={"cerebroSaveFormat": _SAVE_FORMAT, "checkpointSha256": sha256},
        )
        frame = self.sparkSession.createDataFrame(
            [(sha256, bytearray(data))], "sha256 string, checkpoint binary"
        )
        frame.coalesce(1).write.parquet(f"{path.rstrip('/')}/{_CHECKPOINT_DIR}")


class _Reader(MLReader["ModelTransformer"]):
    def __init__(self, cls: type[ModelTransformer]) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> ModelTransformer:
        metadata = DefaultParamsReader.loadMetadata(
            path, self.sparkSession, f"{ModelTransformer.__module__}.{ModelTransformer.__name__}"
        )
        rows = self.sparkSession.read.parquet(f"{path.rstrip('/')}/{_CHECKPOINT_DIR}").collect()
        if len(rows) != 1:
            raise DataError(f"{path}/{_CHECKPOINT_DIR} holds {len(rows)} rows, expected 1")
        data = bytes(rows[0]["checkpoint"])
        expected = metadata.get("checkpointSha256")
        if hashlib.sha256(data).hexdigest() != expected:
            raise CheckpointError(
                f"the checkpoint saved at {path} does not match its SHA-256 {expected}"
            )
        instance = self.cls()
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        instance._attach(data)
        return instance
