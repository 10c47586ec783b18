"""A search procedure and its options as one typed, validated object."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cerebro_spark.errors import ConfigError
from cerebro_spark.search import check_procedure_options


class Procedure:
    """A search procedure by name with its options, checked when it is made.

    ``Procedure("sha", eta=2)`` is the config's ``procedure: {name: sha, eta: 2}``: an
    unknown name, an unknown option (a typo) or a missing required option raises at once,
    with the accepted names listed, instead of when the search starts.

    Args:
        name: A registered procedure (``grid``, ``random``, ``sha``, ``hyperband``,
            ``asha``, ``pbt``, ``tpe``, ``hypersched``, ``seer``).
        **options: The procedure's own options, e.g. ``num_trials`` for ``random``.

    Raises:
        ConfigError: The name is unknown, or an option is unknown or missing.
    """

    def __init__(self, name: str, **options: Any) -> None:
        check_procedure_options(name, options)
        self.name = name
        self.options: Mapping[str, Any] = dict(options)

    @classmethod
    def of(cls, value: str | Mapping[str, Any] | Procedure) -> Procedure:
        """Return ``value`` as a procedure: a name, the config's mapping, or a procedure.

        Raises:
            ConfigError: The value is none of these, or names no valid procedure.
        """
        if isinstance(value, Procedure):
            return value
        if isinstance(value, str):
            return cls(value)
        if isinstance(value, Mapping):
            options = dict(value)
            name = options.pop("name", None)
            if not isinstance(name, str) or not name:
                raise ConfigError(f"procedure must have a 'name', got {dict(value)!r}")
            return cls(name, **options)
        raise ConfigError(
            "procedure must be a name, a mapping with 'name' or a Procedure, "
            f"got {type(value).__name__}"
        )

    def to_config(self) -> dict[str, Any]:
        """The config form: ``{"name": ..., **options}``."""
        return {"name": self.name, **self.options}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Procedure):
            return NotImplemented
        return self.to_config() == other.to_config()

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        options = "".join(f", {k}={v!r}" for k, v in self.options.items())
        return f"Procedure({self.name!r}{options})"
