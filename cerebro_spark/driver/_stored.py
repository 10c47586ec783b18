"""What an experiment leaves in its store, read back: its config and its state.

``config.json`` holds the config a run was started with, credentials redacted
(:mod:`cerebro_spark._redact`); ``events.jsonl`` the log its state folds from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from cerebro_spark._redact import REDACTED, restore_redacted
from cerebro_spark.driver._config import ExperimentConfig, check_name, parse_config
from cerebro_spark.driver._events import EVENTS_NAME, read_events
from cerebro_spark.driver._layout import CONFIG_NAME, experiment_prefix
from cerebro_spark.driver._state import ExperimentState
from cerebro_spark.errors import ConfigError, EventLogError
from cerebro_spark.store import Store, open_store
from cerebro_spark.store._lease import LEASE_NAME


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
    events = read_experiment_events(store, experiment_id)
    return config, ExperimentState.from_events(events, experiment_prefix(experiment_id))


def read_experiment_events(store: Store, experiment_id: str) -> list[dict[str, Any]]:
    """An experiment's events (:func:`read_events`), refused when the log lost its head.

    Raises:
        EventLogError: The log is damaged (:func:`read_events`), or it does not begin with
            ``experiment_start``, or it is empty although the run left files
            (:func:`check_log_head`).
    """
    experiment = store.child(experiment_prefix(experiment_id))
    events = read_events(experiment)
    check_log_head(experiment, events, experiment_id)
    return events


def check_log_head(
    experiment: Store, events: Sequence[Mapping[str, Any]], experiment_id: str
) -> None:
    """Refuse a log whose beginning is gone (no crash removes it).

    Folding the rest would rewrite a finished experiment (``resume`` re-training it,
    ``best.pt`` replaced) or show it empty. A log is written from its ``experiment_start``
    on; an empty or missing one is an experiment that never started only while nothing
    else of the run is there (its ``config.json`` and lease are written first).

    Raises:
        EventLogError: Naming the log, what it starts with or what the run left, and
            that nothing was changed.
    """
    where = experiment.url(EVENTS_NAME)
    if events:
        first = events[0].get("event")
        if first != "experiment_start":
            raise EventLogError(
                f"experiment {experiment_id}: its event log {where} begins with a {first!r} "
                "event, not experiment_start: its beginning is missing (no crash removes it); "
                "restore it from a copy (nothing was changed)"
            )
        return
    left = [
        key
        for key in experiment.list()
        if key not in (CONFIG_NAME, LEASE_NAME) and not key.startswith(EVENTS_NAME)
    ]
    if left:
        shown = ", ".join(left[:3]) + (", ..." if len(left) > 3 else "")
        raise EventLogError(
            f"experiment {experiment_id}: its event log {where} is empty or missing, but the "
            f"run left {len(left)} file(s) ({shown}): the log was emptied; restore it from a "
            "copy (nothing was changed)"
        )
