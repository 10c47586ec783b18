"""What an experiment leaves in its store, read back: its config and its state.

``config.json`` holds the config a run was started with, credentials redacted
(:mod:`cerebro_spark._redact`); ``events.jsonl`` the log its state folds from.
"""

from __future__ import annotations

import json

from cerebro_spark._redact import REDACTED, restore_redacted
from cerebro_spark.driver._config import ExperimentConfig, check_name, parse_config
from cerebro_spark.driver._events import read_events
from cerebro_spark.driver._layout import CONFIG_NAME, experiment_prefix
from cerebro_spark.driver._state import ExperimentState
from cerebro_spark.errors import ConfigError
from cerebro_spark.store import Store, open_store


def config_key(experiment_id: str) -> str:
    """The key of an experiment's ``config.json`` in the root store."""
    return f"{experiment_prefix(experiment_id)}/{CONFIG_NAME}"


def load_experiment_config(
    store: Store,
    experiment_id: str,
    *,
    secrets: ExperimentConfig | None = None,
    need_secrets: bool = False,
) -> ExperimentConfig:
    """Read the config an experiment was started with.

    Credentials were redacted when it was stored (:mod:`cerebro_spark._redact`); they are
    taken back from ``secrets`` (the config the experiment was started with, e.g.
    ``load_config("run.yaml")``). Without them a redacted value stays ``<redacted>``
    (enough to read results), or, with ``need_secrets`` (to run again), is refused
    naming the setting.

    Raises:
        ConfigError: No such experiment, or a redacted value no source gives back.
    """
    check_name(experiment_id, "experiment id")
    key = config_key(experiment_id)
    if not store.exists(key):
        raise ConfigError(f"no experiment {experiment_id!r} in {store.uri} (missing {key})")
    try:
        raw = json.loads(store.get(key))
    except ValueError as error:
        raise ConfigError(f"{store.url(key)} is not valid JSON: {error}") from None
    if isinstance(raw, dict) and REDACTED in str(raw.get("store", "")):
        raw["store"] = store.uri  # the store given now: its credentials are the caller's
    if secrets is not None or need_secrets:
        raw = restore_redacted(
            raw, secrets.to_dict() if secrets is not None else None, f"experiment {experiment_id}"
        )
    return parse_config(raw, stored=True)


def load_state(
    store_uri: str, experiment_id: str, *, secrets: ExperimentConfig | None = None
) -> tuple[ExperimentConfig, ExperimentState]:
    """Return an experiment's config and its state folded from the event log.

    Credentials redacted from the stored config read ``<redacted>`` unless ``secrets``
    (the config it was started with) gives them back.
    """
    store = open_store(store_uri)
    config = load_experiment_config(store, experiment_id, secrets=secrets)
    return config, ExperimentState.from_events(
        read_events(store.child(experiment_prefix(experiment_id)))
    )
