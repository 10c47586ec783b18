"""Credentials stay out of ``config.json``, ``events.jsonl`` and logs.

One rule decides what a credential is, :func:`is_secret_key`: a setting whose name
contains ``secret``, ``password``/``passwd``, ``token``, ``credential``, ``access.key``
(``access_key``, ``accessKey`` ...), ``private.key``, ``api.key`` or ``session.key``
(case and separators ignored). It is applied to

* the Spark settings (``spark.conf``) and the cluster manager's options
  (``elastic.<manager>``): such a setting's value is replaced by :data:`REDACTED`;
* URIs (``store``, ``data.source``, ``data.dataset``, ``tracking.mlflow.uri`` ...): the
  password of ``scheme://user:password@host`` and the value of a secret query option
  (``?secret_key=...``) are replaced;
* log records (:class:`SecretFilter`, installed by the CLI on its handlers): the value of
  every environment variable with a secret name (``AWS_SECRET_ACCESS_KEY``,
  ``DATABRICKS_TOKEN`` ...), every value :func:`register_secret` was given (the config's
  secrets) and the URI forms above are replaced wherever they appear in a message.

The search space is never redacted: it is the experiment's content (a ``max_tokens``
hyperparameter is not a credential).

A redacted value is not written anywhere. ``resume`` and ``replay`` take it back from the
config the experiment was started with (``--config``), else refuse naming the setting
(:func:`restore_redacted`).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

from cerebro_spark.errors import ConfigError

REDACTED = "<redacted>"
"""What a redacted value is replaced with."""

_SECRET = re.compile(
    r"secret|passw|token|credential|access[^a-z0-9]?key|private[^a-z0-9]?key"
    r"|api[^a-z0-9]?key|session[^a-z0-9]?key",
    re.IGNORECASE,
)
_URI_FIELDS = (
    ("store",),
    ("data", "source"),
    ("data", "dataset"),
    ("tracking", "mlflow", "uri"),
    ("tracking", "tensorboard"),
    ("elastic", "prices"),
    ("elastic", "profile"),
    ("elastic", "plan"),
)
_MIN_SECRET_LENGTH = 6
"""Shorter values are not scrubbed from log messages (``true`` would be everywhere)."""


def is_secret_key(key: str) -> bool:
    """Whether a setting named ``key`` holds a credential (see the module docstring)."""
    return bool(_SECRET.search(str(key)))


def redact_uri(uri: str) -> str:
    """Return ``uri`` with its password and secret query options replaced."""
    if "://" not in uri:
        return uri
    try:
        parts = urllib.parse.urlsplit(uri)
    except ValueError:
        return uri
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, host = netloc.rpartition("@")
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:{REDACTED}@{host}" if colon else f"{REDACTED}@{host}"
    query = parts.query
    if query:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        if any(is_secret_key(k) for k, _ in pairs):
            query = "&".join(f"{k}={REDACTED if is_secret_key(k) else v}" for k, v in pairs)
    if netloc == parts.netloc and query == parts.query:
        return uri
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``settings`` with each secret setting's value replaced (nested ones too)."""
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if is_secret_key(key) and value is not None:
            out[key] = REDACTED
        elif isinstance(value, Mapping):
            out[key] = redact_settings(value)
        elif isinstance(value, str):
            out[key] = redact_uri(value)
        else:
            out[key] = value
    return out


def redact(config: Mapping[str, Any]) -> dict[str, Any]:
    """Return an experiment config document (``ExperimentConfig.to_dict()``) redacted.

    ``spark.conf`` and the ``elastic`` manager's options by setting name, the URI fields
    by their password and secret options; everything else (the space included) as it is.
    """
    out = dict(config)
    spark = out.get("spark")
    if isinstance(spark, Mapping) and isinstance(spark.get("conf"), Mapping):
        out["spark"] = {**spark, "conf": redact_settings(spark["conf"])}
    elastic = out.get("elastic")
    if isinstance(elastic, Mapping):
        out["elastic"] = {
            key: redact_settings(value) if isinstance(value, Mapping) else value
            for key, value in elastic.items()
        }
    for path in _URI_FIELDS:
        value = _get(out, path)
        if isinstance(value, str):
            out = _set(out, path, redact_uri(value))
    return out


def _get(document: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(document, Mapping) or key not in document:
            return None
        document = document[key]
    return document


def _set(document: Mapping[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A copy of ``document`` with ``value`` at ``path`` (copying the mappings on it)."""
    out = dict(document)
    if len(path) == 1:
        out[path[0]] = value
    else:
        out[path[0]] = _set(out[path[0]], path[1:], value)
    return out


def _redacted_paths(document: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Paths of the values holding :data:`REDACTED` (the space excluded)."""
    if isinstance(document, Mapping):
        return [
            found
            for key, value in document.items()
            if path or key != "space"
            for found in _redacted_paths(value, (*path, str(key)))
        ]
    if isinstance(document, str) and REDACTED in document:
        return [path]
    return []


def _dotted(path: tuple[str, ...]) -> str:
    return ".".join(path)


def restore_redacted(
    stored: Mapping[str, Any], original: Mapping[str, Any] | None, what: str
) -> dict[str, Any]:
    """Put back into a stored config the values :func:`redact` took out.

    Each redacted value is taken from ``original`` (the config the experiment was
    started with, as :meth:`ExperimentConfig.to_dict` gives it) at the same place.

    Args:
        stored: The stored document (``config.json``).
        original: The original config's document, or ``None``.
        what: The experiment, for messages.

    Raises:
        ConfigError: A redacted value that ``original`` does not give back, naming the
            setting and how to pass it.
    """
    out = dict(stored)
    for path in _redacted_paths(stored):
        value = _get(original, path) if original is not None else None
        if not isinstance(value, str) or REDACTED in value:
            raise ConfigError(
                f"{what}: the stored config does not hold {_dotted(path)} (a credential, "
                "redacted when stored); pass the config the experiment was started with: "
                "--config FILE on the command line, secrets=load_config(FILE) in Python"
            )
        out = _set(out, path, value)
    return out


# -- logs -----------------------------------------------------------------------------------

_registered: set[str] = set()
_registered_lock = threading.Lock()


def register_secret(value: str) -> None:
    """Scrub ``value`` from every message a :class:`SecretFilter` passes from now on."""
    if isinstance(value, str) and len(value) >= _MIN_SECRET_LENGTH and value != REDACTED:
        with _registered_lock:
            _registered.add(value)


def register_config_secrets(config: Mapping[str, Any]) -> None:
    """Register every value :func:`redact` would take out of a config document."""
    redacted = redact(config)
    for path in _redacted_paths(redacted):
        value = _get(config, path)
        if isinstance(value, str):
            if "://" in value:
                parts = urllib.parse.urlsplit(value)
                if parts.password:
                    register_secret(parts.password)
                for key, item in urllib.parse.parse_qsl(parts.query):
                    if is_secret_key(key):
                        register_secret(item)
            else:
                register_secret(value)


def environment_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """Values of environment variables whose names are secret (``AWS_SECRET_ACCESS_KEY``)."""
    environ = os.environ if environ is None else environ
    return [
        value
        for name, value in environ.items()
        if is_secret_key(name) and len(value) >= _MIN_SECRET_LENGTH
    ]


_URI_IN_TEXT = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """Return ``text`` with secret values and the secret parts of URIs in it replaced."""
    with _registered_lock:
        values = sorted({*_registered, *secrets}, key=len, reverse=True)
    for value in values:
        if value in text:
            text = text.replace(value, REDACTED)
    if "://" in text:
        text = _URI_IN_TEXT.sub(lambda match: redact_uri(match.group(0)), text)
    return text


class SecretFilter(logging.Filter):
    """A logging filter that redacts credentials from each record's message.

    It scrubs the values of secret environment variables (read when it is built), the
    values :func:`register_secret` registered and secret URI parts. Install it on a
    handler (``handler.addFilter(SecretFilter())``): a handler's filters see the records
    of every logger.
    """

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self._environment = environment_secrets(environ)

    def filter(self, record: logging.LogRecord) -> bool:
        """Redact ``record``'s message in place; never drops a record."""
        try:
            message = record.getMessage()
        except Exception:  # a broken format: leave it to the handler to report
            return True
        cleaned = redact_text(message, self._environment)
        if record.exc_info and record.exc_text is None:
            formatter = logging.Formatter()
            record.exc_text = formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text, self._environment)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


def install_log_filter(handlers: Iterable[logging.Handler] | None = None) -> SecretFilter:
    """Add one :class:`SecretFilter` to ``handlers`` (default: the root logger's)."""
    secret_filter = SecretFilter()
    for handler in logging.getLogger().handlers if handlers is None else handlers:
        if not any(isinstance(f, SecretFilter) for f in handler.filters):
            handler.addFilter(secret_filter)
    return secret_filter
