"""Where an experiment's files are: one place for each name."""

from __future__ import annotations

CONFIG_NAME = "config.json"
"""The config the experiment was started with (credentials redacted)."""
BEST_CHECKPOINT_NAME = "best.pt"
"""The best epoch of the best trial, copied at the end of the run."""


def experiment_prefix(experiment_id: str) -> str:
    """Return the store prefix of an experiment."""
    return f"experiments/{experiment_id}"
