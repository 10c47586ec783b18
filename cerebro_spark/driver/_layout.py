"""Where an experiment's files are: one place for each name."""

from __future__ import annotations

CONFIG_NAME = "config.json"
"""The config the experiment was started with (credentials redacted)."""
BEST_CHECKPOINT_NAME = "best.pt"
"""The best epoch of the best trial, copied at the end of the run."""


def experiment_prefix(experiment_id: str) -> str:
    """Return the store prefix of an experiment."""
    return f"experiments/{experiment_id}"


def logged_key(key: str) -> str:
    """How the event log names a store key inside an experiment: from its folder on.

    ``experiments/<id>/checkpoints/t0/e0000-s0000.pt`` is logged as
    ``checkpoints/t0/e0000-s0000.pt``, so a copied or moved experiment folder names its
    own files (logs of older versions hold the whole key; :func:`stored_key` reads both).
    """
    head, _, rest = key.partition("/")
    if head == "experiments" and "/" in rest:
        return rest.partition("/")[2]
    return key


def stored_key(prefix: str, logged: str) -> str:
    """The store key of a file the log of the experiment at ``prefix`` names.

    Args:
        prefix: The experiment's folder (:func:`experiment_prefix`), where its log is read.
        logged: The key as logged: relative to the experiment, or whole (older logs,
            whose ``experiments/<id>/`` is replaced by ``prefix``: a copy reads its own).
    """
    return f"{prefix.rstrip('/')}/{logged_key(logged)}"
