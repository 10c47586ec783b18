"""Training units: the user's ModelSpec, ready specs, and the unit that trains one sub-epoch.

``run_pack`` trains ``k`` trials of one architecture in one visit of a partition (a
packed unit, ``_pack``; :func:`pack_fingerprint` says which trials can pack and
:func:`pack_throughput` measures how many to pack). ``train_unit`` trains a unit without
encoding or writing its checkpoint yet (a worker does both while it trains the next);
``run_group_unit`` runs one rank of a group unit (a trial trained data-parallel by k
workers, Cerebro §5.7), made of the ordinary unit's public pieces (``_unit``).

The one exception to "modules meet through public names" (``tests/test_import_graph.py``):
the built-in specs in ``_embedding``, ``_resnet`` and ``_sequence`` use ``_models``' private
parameter readers (``_choice``, ``_int``, ``_dropout``, ``_TrainingParams`` ...). They are one
family of specs with ``MLPSpec`` and ``CNNSpec``, split into modules for length; the readers
are no seam for anything else.
"""

from cerebro_spark.training._checkpoint import (
    CHECKPOINT_FORMAT_VERSION,
    CONTENT_DIGEST_KEY,
    Checkpoint,
    CheckpointError,
    Counters,
    content_digest,
    dataset_metadata,
    decode_checkpoint,
    encode_checkpoint,
    state_digest,
    verify_content,
    weights_digest,
    with_dataset,
)
from cerebro_spark.training._embedding import EmbeddingMLPSpec
from cerebro_spark.training._group import run_group_unit
from cerebro_spark.training._loading import add_code_directory, load_spec, user_code_files
from cerebro_spark.training._models import CNNSpec, MLPSpec, Standardize
from cerebro_spark.training._pack import check_pack, run_pack, train_pack
from cerebro_spark.training._pack_probe import choose_pack_size, pack_throughput
from cerebro_spark.training._pack_structure import pack_fingerprint
from cerebro_spark.training._resnet import ResNetSpec
from cerebro_spark.training._sequence import SequenceSpec
from cerebro_spark.training._spec import BASE_HYPERPARAMETERS, ModelSpec, accepted_hyperparameters
from cerebro_spark.training._unit import TrainedUnit, prefetch_checkpoint, run_unit, train_unit

__all__ = [
    "BASE_HYPERPARAMETERS",
    "CHECKPOINT_FORMAT_VERSION",
    "CONTENT_DIGEST_KEY",
    "CNNSpec",
    "Checkpoint",
    "CheckpointError",
    "Counters",
    "EmbeddingMLPSpec",
    "MLPSpec",
    "ModelSpec",
    "ResNetSpec",
    "SequenceSpec",
    "Standardize",
    "TrainedUnit",
    "accepted_hyperparameters",
    "add_code_directory",
    "check_pack",
    "choose_pack_size",
    "content_digest",
    "dataset_metadata",
    "decode_checkpoint",
    "encode_checkpoint",
    "load_spec",
    "pack_fingerprint",
    "pack_throughput",
    "prefetch_checkpoint",
    "run_group_unit",
    "run_pack",
    "run_unit",
    "state_digest",
    "train_pack",
    "train_unit",
    "user_code_files",
    "verify_content",
    "weights_digest",
    "with_dataset",
]
