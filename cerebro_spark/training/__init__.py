"""Training units: the user's ModelSpec, ready specs, and the unit that trains one sub-epoch."""

from cerebro_spark.training._checkpoint import (
    CHECKPOINT_FORMAT_VERSION,
    Checkpoint,
    CheckpointError,
    Counters,
    decode_checkpoint,
    encode_checkpoint,
    state_digest,
    weights_digest,
)
from cerebro_spark.training._loading import load_spec
from cerebro_spark.training._models import CNNSpec, MLPSpec
from cerebro_spark.training._spec import ModelSpec
from cerebro_spark.training._unit import run_unit

__all__ = [
    "CHECKPOINT_FORMAT_VERSION",
    "CNNSpec",
    "Checkpoint",
    "CheckpointError",
    "Counters",
    "MLPSpec",
    "ModelSpec",
    "decode_checkpoint",
    "encode_checkpoint",
    "load_spec",
    "run_unit",
    "state_digest",
    "weights_digest",
]
