"""The checkpoint format: round trips, byte determinism, digests, weights_only refusal."""

import io

import pytest
import torch
from torch import nn

from cerebro_spark.training import (
    CheckpointError,
    decode_checkpoint,
    encode_checkpoint,
    state_digest,
    weights_digest,
)
from cerebro_spark.training._checkpoint import PackedCheckpoint, checkpoint_payload

pytestmark = pytest.mark.torch


def make_checkpoint():
    """A trained state (Adam moments, a stepped cosine schedule), built deterministically."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=5)
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    scheduler.step()
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "lr_scheduler": scheduler.state_dict(),
        "torch_rng_state": torch.get_rng_state(),
        "counters": {"epoch": 0, "step": 0, "samples_seen": 8, "trial_seed": 3},
        "trial": {"trial_id": "t", "spec": "m:S", "params": {"lr": 0.1, "h": [3]}},
    }


def test_round_trip_restores_every_part():
    original = make_checkpoint()
    decoded = decode_checkpoint(encode_checkpoint(original))
    assert list(decoded["model"]) == list(original["model"])
    for name, tensor in original["model"].items():
        assert torch.equal(decoded["model"][name], tensor)
    assert decoded["lr_scheduler"] == original["lr_scheduler"]
    assert decoded["counters"] == original["counters"]
    assert decoded["trial"] == original["trial"]
    assert decoded["format_version"] == 1
    assert torch.equal(decoded["torch_rng_state"], original["torch_rng_state"])
    saved = decoded["optimizer"]["state"][0]["exp_avg"]
    assert torch.equal(saved, original["optimizer"]["state"][0]["exp_avg"])
    # The decoded optimizer state loads into a fresh optimizer.
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.5)
    optimizer.load_state_dict(decoded["optimizer"])
    assert optimizer.param_groups[0]["lr"] == original["optimizer"]["param_groups"][0]["lr"]


def test_encoding_is_byte_deterministic_and_stable_under_decode_encode():
    first = encode_checkpoint(make_checkpoint())
    second = encode_checkpoint(make_checkpoint())
    assert first == second
    assert encode_checkpoint(decode_checkpoint(first)) == first


def test_state_digest_compares_bits_names_dtypes_and_shapes():
    state = make_checkpoint()["model"]
    digest = state_digest(state)
    assert state_digest({k: v.clone() for k, v in state.items()}) == digest
    assert weights_digest(encode_checkpoint(make_checkpoint())) == digest

    nudged = {k: v.clone() for k, v in state.items()}
    first = nudged["0.weight"].view(-1)
    first[0] = torch.nextafter(first[0], torch.tensor(float("inf")))
    assert state_digest(nudged) != digest

    renamed = {("x." + k if k == "0.bias" else k): v for k, v in state.items()}
    assert state_digest(renamed) != digest
    as_double = {k: v.double() for k, v in state.items()}
    assert state_digest(as_double) != digest
    reshaped = dict(state, **{"0.weight": state["0.weight"].reshape(4, 3)})
    assert state_digest(reshaped) != digest


def test_digest_ignores_optimizer_and_counters():
    checkpoint = make_checkpoint()
    changed = dict(checkpoint, counters=dict(checkpoint["counters"], samples_seen=99))
    changed["optimizer"] = dict(checkpoint["optimizer"], state={})
    assert weights_digest(encode_checkpoint(changed)) == weights_digest(
        encode_checkpoint(checkpoint)
    )


SIDE_EFFECTS: list[str] = []


def _record_side_effect():
    SIDE_EFFECTS.append("executed")
    return "payload"


class Malicious:
    def __reduce__(self):
        return (_record_side_effect, ())


def test_a_checkpoint_with_an_arbitrary_pickled_object_is_refused():
    checkpoint = make_checkpoint()
    checkpoint["trial"] = {"payload": Malicious()}
    buffer = io.BytesIO()
    torch.save(dict(checkpoint, format_version=1), buffer)  # bypasses encode's checks
    with pytest.raises(CheckpointError, match="weights_only=True"):
        decode_checkpoint(buffer.getvalue())
    assert SIDE_EFFECTS == []  # the object's reduce function never ran


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (b"not a zip archive", "cannot load checkpoint"),
        ([1, 2], "must decode to a dict"),
        ({"format_version": 2}, "format_version is 2"),
        ({"format_version": 1, "model": {}}, "lacks keys"),
    ],
)
def test_malformed_checkpoints_are_refused(payload, match):
    if not isinstance(payload, bytes):
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        payload = buffer.getvalue()
    with pytest.raises(CheckpointError, match=match):
        decode_checkpoint(payload)


def test_bad_counters_are_refused_when_encoding_and_decoding():
    checkpoint = make_checkpoint()
    checkpoint["counters"] = {"epoch": 0, "step": 0}
    with pytest.raises(CheckpointError, match="samples_seen"):
        encode_checkpoint(checkpoint)
    buffer = io.BytesIO()
    torch.save(dict(checkpoint, format_version=1), buffer)
    with pytest.raises(CheckpointError, match="trial_seed"):
        decode_checkpoint(buffer.getvalue())
    with pytest.raises(CheckpointError, match="lacks keys"):
        encode_checkpoint({"model": {}})


def _restored_and_saved(checkpoint) -> bytes:
    """Restore a model and its optimizer from ``checkpoint``, step once, encode again."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=5)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["lr_scheduler"])
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    scheduler.step()
    return encode_checkpoint(
        {
            **checkpoint,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "lr_scheduler": scheduler.state_dict(),
        }
    )


def test_a_packed_checkpoint_unpacks_to_what_its_bytes_decode_to():
    payload = checkpoint_payload(make_checkpoint())
    packed = PackedCheckpoint.pack(payload)
    assert packed is not None and packed.nbytes > 0
    expected = encode_checkpoint(payload)
    decoded = decode_checkpoint(expected)
    unpacked = packed.unpack()
    assert encode_checkpoint(unpacked) == encode_checkpoint(decoded) == expected
    assert type(unpacked["model"]) is type(decoded["model"])
    assert unpacked["model"]._metadata == decoded["model"]._metadata
    # restoring from it writes the same bytes as restoring from the decoded bytes: the
    # strings and containers it shares with nothing else are new objects, as after a load
    assert _restored_and_saved(packed.unpack()) == _restored_and_saved(decoded)
    # its tensors are its own: neither the payload's later changes nor an unpacked
    # copy's reach it (the restore above stepped the optimizer's unpacked moments)
    payload["model"]["0.weight"].add_(1.0)
    unpacked["optimizer"]["state"][0]["exp_avg"].zero_()
    assert encode_checkpoint(packed.unpack()) == expected


def test_only_plain_payloads_are_packed():
    payload = checkpoint_payload(make_checkpoint())
    payload["trial"] = {"odd": {1, 2}}  # a set: torch.load(weights_only=True) refuses it
    assert PackedCheckpoint.pack(payload) is None
    payload["trial"] = {"odd": nn.Linear(1, 1)}
    assert PackedCheckpoint.pack(payload) is None
