"""The checkpoint format: how a trial's training state hops between workers.

Cerebro §4.2: "checkpointing and restoring is how Cerebro realizes model hops".

A checkpoint is the bytes of :func:`torch.save` of one dict of plain tensors and plain
containers (dict, list, tuple, str, int, float, bool, None)::

    {
        "format_version": 1,
        "model": model.state_dict(),               # tensors on CPU
        "optimizer": optimizer.state_dict(),       # tensors on CPU
        "lr_scheduler": scheduler.state_dict() or None,
        "torch_rng_state": torch.get_rng_state(),  # CPU generator at the end of the unit
        "counters": {"epoch": e, "step": s, "samples_seen": n, "trial_seed": seed},
        "trial": {"trial_id": ..., "spec": "pkg.mod:Class", "params": {...}},
        "data": {                                  # what scoring needs (with_dataset)
            "dataset_id": ..., "task": ..., "num_classes": ..., "classes": [...],
            "features": [{"name": ..., "dtype": ..., "shape": [...]}, ...],
            "feature_shape": [...], "label": ..., "statistics": {...} or None,
        },
        "content_sha256": "...",                   # content_digest of all the above
    }

``content_sha256`` is the checkpoint's own digest (:func:`content_digest`: every other
entry, tensors by their bytes): a ``.pt`` read outside its experiment (``load_model`` of a
path, a saved Transformer, a copy) is checked with it (:func:`verify_content`), where
units rely on the SHA-256 the event log recorded for the file. Checkpoints written before
it existed lack it and are read unchecked, as they always were.

``data`` (added by :func:`with_dataset` where a unit writes a checkpoint) describes the
dataset the weights were trained on: what :func:`cerebro_spark.load_model` and the
Transformer read to rebuild the model and turn outputs back into the original labels.
Checkpoints written before it existed lack it; everything else still reads them.

``counters.epoch``/``counters.step`` are those of the unit that wrote the checkpoint, as
the event log's unit events count them: from 0 (the first epoch is 0). They stay so in the
bytes (a replay compares checkpoints' SHA-256s with those of older runs); a user reads
the epoch counted from 1 (``ModelMetadata.epoch``, the leaderboard, the report);
``samples_seen`` counts every training row the weights have seen. ``torch_rng_state`` is
recorded for inspection only: every unit reseeds torch from ``(trial_seed, epoch,
partition)``, so nothing depends on restoring it.

Checkpoints are read **only** with ``torch.load(..., weights_only=True)``: a checkpoint
holding any other pickled object is refused with :class:`CheckpointError` before that
object is built. Units read them verified: bytes whose SHA-256 is not the one the event
log recorded (``UnitTask.checkpoint_in_sha256``) are refused with
:class:`~cerebro_spark.errors.CheckpointCorruptError` before they are decoded, and each
worker keeps the checkpoints it wrote or read in a digest-checked memory cache
(:mod:`cerebro_spark.training._cache`).

Byte determinism (measured with torch 2.13.0): encoding the same state twice gives
identical bytes, in one process and across processes. The zip entries carry a fixed
1980 timestamp and ``serialization_id`` is derived from the entries' CRCs, so
``UnitResult.checkpoint_sha256`` is itself reproducible. :func:`weights_digest` does not
rely on this: it hashes the model tensors alone.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, TypedDict

import torch

from cerebro_spark.data import DatasetInfo
from cerebro_spark.errors import CerebroError

CHECKPOINT_FORMAT_VERSION = 1
CONTENT_DIGEST_KEY = "content_sha256"
_KEYS = ("model", "optimizer", "lr_scheduler", "torch_rng_state", "counters")
_COUNTERS = ("epoch", "step", "samples_seen", "trial_seed")


class CheckpointError(CerebroError, ValueError):
    """Checkpoint bytes that cannot be decoded, or decode to something not a checkpoint."""


class Counters(TypedDict):
    """Progress counters stored in a checkpoint (see the module docstring)."""

    epoch: int
    step: int
    samples_seen: int
    trial_seed: int


class Checkpoint(TypedDict, total=False):
    """The decoded form of a checkpoint (see the module docstring for each key).

    ``model``, ``optimizer``, ``lr_scheduler``, ``torch_rng_state`` and ``counters`` are
    always present after :func:`decode_checkpoint`; ``trial`` and ``data`` may be absent.
    """

    format_version: int
    model: Mapping[str, Any]
    optimizer: Mapping[str, Any]
    lr_scheduler: Mapping[str, Any] | None
    torch_rng_state: torch.Tensor
    counters: Counters
    trial: Mapping[str, Any]
    data: Mapping[str, Any]
    content_sha256: str


def _to_cpu(value: Any) -> Any:
    """Return ``value`` with every tensor inside moved to the CPU (containers rebuilt)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, Mapping):
        out: dict[Any, Any] = OrderedDict() if isinstance(value, OrderedDict) else {}
        for key, item in value.items():
            out[key] = _to_cpu(item)
        metadata = getattr(value, "_metadata", None)
        if metadata is not None:  # nn.Module.state_dict's per-module versions
            out._metadata = metadata  # type: ignore[attr-defined]
        return out
    if isinstance(value, list):
        return [_to_cpu(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_to_cpu(item) for item in value)
    return value


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    """Serialise a checkpoint dict to bytes (tensors moved to the CPU first).

    Args:
        checkpoint: A dict with at least the keys ``model``, ``optimizer``,
            ``lr_scheduler``, ``torch_rng_state`` and ``counters``; ``format_version`` is
            set here.

    Returns:
        The bytes of ``torch.save`` of the dict; the same state gives the same bytes.

    Raises:
        CheckpointError: If a required key or counter is missing.
    """
    return encode_payload(checkpoint_payload(checkpoint))


def checkpoint_payload(checkpoint: Checkpoint, *, sealed: bool = True) -> Checkpoint:
    """Return what :func:`encode_checkpoint` saves: the checkpoint checked, on the CPU.

    Its tensors may be the checkpoint's own (a CPU tensor is not copied); with
    ``format_version`` set it is what :func:`decode_checkpoint` of its bytes returns.

    Args:
        checkpoint: The checkpoint to save.
        sealed: Add its ``content_sha256`` now (:func:`seal`). A train unit takes its
            payload unsealed and seals it in the thread that writes it, so that hashing
            every tensor (about 0.3 s for 600 MB here) does not delay its next unit.

    Raises:
        CheckpointError: If a required key or counter is missing.
    """
    missing = [key for key in _KEYS if key not in checkpoint]
    if missing:
        raise CheckpointError(f"checkpoint to encode lacks keys {missing}; required: {_KEYS}")
    _check_counters(checkpoint["counters"])
    payload = _to_cpu({k: v for k, v in checkpoint.items() if k != CONTENT_DIGEST_KEY})
    payload["format_version"] = CHECKPOINT_FORMAT_VERSION
    return seal(payload) if sealed else payload


def seal(payload: Checkpoint) -> Checkpoint:
    """Set ``payload``'s ``content_sha256`` (its last key) unless it has one; return it."""
    if "content_sha256" not in payload:  # CONTENT_DIGEST_KEY, as the TypedDict needs it
        payload["content_sha256"] = content_digest(payload)
    return payload


def content_digest(checkpoint: Mapping[str, Any]) -> str:
    """The SHA-256 of a checkpoint's content: every entry but ``content_sha256`` itself.

    Containers are walked in their order (a decoded checkpoint keeps the order it was
    saved in), each tensor fed as its dtype, shape and raw bytes, every other value as its
    ``repr``; so the digest of a decoded checkpoint is the one its writer computed
    exactly when every tensor and value came back the same.
    """
    digest = hashlib.sha256()
    _feed(digest, {k: v for k, v in checkpoint.items() if k != CONTENT_DIGEST_KEY})
    return digest.hexdigest()


def _feed(digest: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"T {tensor.dtype} {list(tensor.shape)}\n".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().data)
    elif isinstance(value, Mapping):
        digest.update(f"D {len(value)}\n".encode())
        for key, item in value.items():
            digest.update(f"K {key!r}\n".encode())
            _feed(digest, item)
    elif isinstance(value, (list, tuple)):
        digest.update(f"L {len(value)}\n".encode())
        for item in value:
            _feed(digest, item)
    else:
        digest.update(f"V {value!r}\n".encode())


def verify_content(checkpoint: Checkpoint, where: str) -> None:
    """Refuse a checkpoint whose content is not what its ``content_sha256`` says.

    A checkpoint without one (written before it existed) passes unchecked.

    Raises:
        CheckpointError: Naming ``where``, the digest it carries and the one it has.
    """
    carried = checkpoint.get(CONTENT_DIGEST_KEY)
    if carried is None:
        return
    actual = content_digest(checkpoint)
    if actual != carried:
        raise CheckpointError(
            f"checkpoint {where} is damaged: it carries content SHA-256 {carried}, but its "
            f"content has {actual} (changed after it was written)"
        )


def encode_payload(payload: Checkpoint) -> bytes:
    """The bytes of ``torch.save`` of a :func:`checkpoint_payload`."""
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


class PackedCheckpoint:
    """A decoded checkpoint kept in memory: what restoring it needs, without its bytes.

    :meth:`unpack` returns what :func:`decode_checkpoint` of the checkpoint's bytes
    returns, down to which objects are shared: the containers and strings come from a
    pickle of the payload (protocol 2, as ``torch.save`` writes them, so every string is
    a new object after unpacking, as after ``torch.load``), the tensors are copies. That
    matters because ``torch.save`` pickles shared objects once: a unit restored from an
    unpacked checkpoint writes the same bytes as one restored from the decoded bytes.

    Only plain payloads are packed (dicts, ordered dicts, lists, tuples, strings,
    numbers, ``None`` and dense tensors): anything else would not decode with
    ``weights_only=True``, so it is read from its bytes and refused there.
    """

    __slots__ = ("_skeleton", "_tensors", "nbytes")

    def __init__(self, skeleton: bytes, tensors: tuple[torch.Tensor, ...]) -> None:
        self._skeleton = skeleton
        self._tensors = tensors
        self.nbytes = len(skeleton) + sum(t.numel() * t.element_size() for t in tensors)

    @classmethod
    def pack(cls, payload: Checkpoint) -> PackedCheckpoint | None:
        """Pack a :func:`checkpoint_payload` (copying its tensors); ``None`` if not plain."""
        tensors: list[torch.Tensor] = []
        index: dict[int, int] = {}
        if not _plain(payload):
            return None

        class Pickler(pickle.Pickler):
            def persistent_id(self, obj: Any) -> int | None:
                if not isinstance(obj, torch.Tensor):
                    return None
                if id(obj) not in index:
                    index[id(obj)] = len(tensors)
                    tensors.append(obj.detach().to("cpu", copy=True))
                return index[id(obj)]

        buffer = io.BytesIO()
        Pickler(buffer, protocol=2).dump(payload)
        return cls(buffer.getvalue(), tuple(tensors))

    def unpack(self, device: str | torch.device = "cpu") -> Checkpoint:
        """Return a new decoded checkpoint with its own tensors on ``device``."""
        target = torch.device(device)
        tensors = self._tensors
        loaded: dict[int, torch.Tensor] = {}

        class Unpickler(pickle.Unpickler):
            def persistent_load(self, pid: Any) -> torch.Tensor:
                if pid not in loaded:
                    loaded[pid] = tensors[pid].to(target, copy=True)
                return loaded[pid]

            def find_class(self, module: str, name: str) -> Any:
                if (module, name) == ("collections", "OrderedDict"):
                    return OrderedDict
                raise pickle.UnpicklingError(f"{module}.{name} is not part of a plain checkpoint")

        checkpoint: Checkpoint = Unpickler(io.BytesIO(self._skeleton)).load()
        return checkpoint


_PLAIN_LEAVES = (str, int, float, bool, type(None))


def _plain(value: Any) -> bool:
    """Whether ``value`` holds only what :class:`PackedCheckpoint` packs."""
    if isinstance(value, torch.Tensor):
        return value.layout == torch.strided and type(value) is torch.Tensor
    if type(value) in (dict, OrderedDict):
        extra = vars(value) if type(value) is OrderedDict else {}
        if set(extra) - {"_metadata"} or not _plain(extra.get("_metadata")):
            return False
        return all(type(k) in _PLAIN_LEAVES and _plain(v) for k, v in value.items())
    if type(value) in (list, tuple):
        return all(_plain(item) for item in value)
    return type(value) in _PLAIN_LEAVES


def dataset_metadata(info: DatasetInfo) -> dict[str, Any]:
    """Return the checkpoint's ``data`` entry for a dataset (plain, JSON-like values).

    Args:
        info: The dataset the weights are trained on (:attr:`Manifest.info` on workers).

    Returns:
        The dataset id, task, number of classes, class labels in order, feature columns
        (name, dtype, shape) in order, the feature shape, the label column and the
        per-feature statistics; unknown values are ``None`` (or an empty list). A column
        is described in full (:meth:`ColumnInfo.to_dict`: kind, image shape, vocabulary
        and hash buckets ...), so a checkpoint alone can map raw inputs for scoring.
    """
    statistics = info.statistics
    return {
        "dataset_id": info.dataset_id,
        "task": info.task,
        "num_classes": info.num_classes,
        "classes": None if info.classes is None else list(info.classes),
        "features": [column.to_dict() for column in info.features],
        "feature_shape": list(info.feature_shape),
        "label": info.label,
        "statistics": None if statistics is None else statistics.to_dict(),
    }


def with_dataset(checkpoint: Checkpoint, info: DatasetInfo) -> Checkpoint:
    """Return ``checkpoint`` with its ``data`` entry describing ``info`` (see module docs)."""
    checkpoint["data"] = dataset_metadata(info)
    return checkpoint


def decode_checkpoint(data: bytes, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Load checkpoint bytes with ``torch.load(weights_only=True)``.

    Args:
        data: Bytes written by :func:`encode_checkpoint`.
        map_location: Device the tensors are loaded onto.

    Returns:
        The checkpoint dict.

    Raises:
        CheckpointError: If the bytes are not a torch archive, hold anything but tensors
            and plain containers (``weights_only`` refuses it), or lack a required key.
    """
    try:
        loaded = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
    except Exception as error:  # torch raises UnpicklingError, RuntimeError, EOFError ...
        raise CheckpointError(
            f"cannot load checkpoint ({len(data)} bytes) with torch.load(weights_only=True): "
            f"{type(error).__name__}: {error}"
        ) from error
    if not isinstance(loaded, dict):
        raise CheckpointError(f"checkpoint must decode to a dict, got {type(loaded).__name__}")
    version = loaded.get("format_version")
    if version != CHECKPOINT_FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint format_version is {version!r}; this version reads "
            f"{CHECKPOINT_FORMAT_VERSION}"
        )
    missing = [key for key in _KEYS if key not in loaded]
    if missing:
        raise CheckpointError(f"checkpoint lacks keys {missing}; required: {_KEYS}")
    if not isinstance(loaded["model"], Mapping):
        raise CheckpointError("checkpoint 'model' must be a state_dict mapping")
    _check_counters(loaded["counters"])
    checkpoint: Checkpoint = loaded  # type: ignore[assignment]
    return checkpoint


def _check_counters(counters: Any) -> None:
    if not isinstance(counters, Mapping):
        raise CheckpointError(f"checkpoint counters must be a dict, got {counters!r}")
    missing = [key for key in _COUNTERS if not isinstance(counters.get(key), int)]
    if missing:
        raise CheckpointError(
            f"checkpoint counters {dict(counters)!r} lack integer values for {missing}"
        )


def state_digest(state: Mapping[str, Any]) -> str:
    """Return a SHA-256 hex digest of a model ``state_dict``.

    Entries are hashed in sorted key order; for each, a JSON header with its name, dtype
    and shape, then its raw bytes (native byte order, C-contiguous). Two states have the
    same digest exactly when their weights are bit-identical. Non-tensor entries (module
    extra state) contribute their ``repr``.

    Args:
        state: A model ``state_dict`` (tensors on any device).

    Returns:
        The hex digest.
    """
    digest = hashlib.sha256()
    for name in sorted(state):
        value = state[name]
        header: dict[str, Any]
        if isinstance(value, torch.Tensor):
            tensor = value.detach().cpu().contiguous()
            raw = tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
            header = {"name": name, "dtype": str(tensor.dtype), "shape": list(tensor.shape)}
        else:
            raw = repr(value).encode()
            header = {"name": name, "dtype": "repr", "shape": []}
        header["nbytes"] = len(raw)
        digest.update(json.dumps(header, sort_keys=True).encode() + b"\n")
        digest.update(raw)
    return digest.hexdigest()


def weights_digest(checkpoint: bytes) -> str:
    """Return :func:`state_digest` of the model weights in checkpoint bytes.

    This is what "bit-identical final weights" compares: it ignores the optimizer, the
    scheduler, the counters and the archive layout.

    Args:
        checkpoint: Bytes written by :func:`encode_checkpoint`.

    Returns:
        The hex digest.

    Raises:
        CheckpointError: If the bytes are not a valid checkpoint.
    """
    return state_digest(decode_checkpoint(checkpoint)["model"])
