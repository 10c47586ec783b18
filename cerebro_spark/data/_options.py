"""How ``prepare`` turns input columns into feature kinds: :class:`KindOptions`.

One set of options serves both writers, the ``prepare`` CLI, the config's ``data:``
section and ``Tuner.fit``. A column's kind comes from these options where they name it,
else it is inferred from its type (and logged): numbers and uniform arrays of numbers are
``number``/``array``, binary values with JPEG/PNG magic (or Spark's image struct) are
``image``, strings are ``categorical``, integer lists of different lengths are
``sequence``. Integer columns are never inferred categorical: name them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from cerebro_spark.errors import DataError

#: Values of a categorical column that get an id of their own, at most (most frequent first).
DEFAULT_VOCABULARY_LIMIT = 100_000


def _names(what: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) or not all(isinstance(name, str) and name for name in value):
        raise DataError(f"{what} must be a list of column names, got {value!r}")
    return tuple(value)


def _positive(what: str, value: Any, *, minimum: int = 1, allow_none: bool = True) -> Any:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DataError(f"{what} must be an integer >= {minimum}, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class KindOptions:
    """Which columns are of which kind, and the parameters of each kind.

    Attributes:
        image_columns: Columns of encoded images (JPEG/PNG bytes, Spark's image struct).
        categorical: Columns of categories (strings or integers) stored as ``int32`` ids.
        sequence_columns: Columns of variable-length integer lists (token ids).
        image_size: ``(height, width)`` every image is resized to at prepare time;
            ``None``: images must all have one size.
        image_channels: 1 (grayscale) or 3 (RGB) for every image; ``None``: 1 when every
            image is grayscale, else 3.
        vocabulary_limit: At most this many values of a categorical column get an id of
            their own (the most frequent).
        hash_buckets: Ids shared, by a stable hash, among the values beyond the
            vocabulary (0: they all map to the unknown id 0).
        max_length: Sequences are cut to their first ``max_length`` ids; ``None`` keeps
            them whole.
    """

    image_columns: tuple[str, ...] = ()
    categorical: tuple[str, ...] = ()
    sequence_columns: tuple[str, ...] = ()
    image_size: tuple[int, int] | None = None
    image_channels: int | None = None
    vocabulary_limit: int = DEFAULT_VOCABULARY_LIMIT
    hash_buckets: int = 0
    max_length: int | None = None

    def __post_init__(self) -> None:
        named: dict[str, str] = {}
        for what in ("image_columns", "categorical", "sequence_columns"):
            names = _names(what, getattr(self, what))
            object.__setattr__(self, what, names)
            for name in names:
                if name in named:
                    raise DataError(
                        f"column {name!r} is named in both {named[name]} and {what}; "
                        "a column has one kind"
                    )
                named[name] = what
        if self.image_size is not None:
            size = tuple(self.image_size)
            if len(size) != 2:
                raise DataError(f"image_size must be (height, width), got {self.image_size!r}")
            for dim in size:
                _positive("image_size", dim)
            object.__setattr__(self, "image_size", (int(size[0]), int(size[1])))
        if self.image_channels not in (None, 1, 3):
            raise DataError(f"image_channels must be 1, 3 or None, got {self.image_channels!r}")
        _positive("vocabulary_limit", self.vocabulary_limit)
        _positive("hash_buckets", self.hash_buckets, minimum=0, allow_none=False)
        _positive("max_length", self.max_length)

    def named(self) -> dict[str, str]:
        """The kind of every column these options name: ``{column: kind}``."""
        kinds = {name: "image" for name in self.image_columns}
        kinds.update({name: "categorical" for name in self.categorical})
        kinds.update({name: "sequence" for name in self.sequence_columns})
        return kinds

    def check_features(self, features: Sequence[str]) -> None:
        """Raise if a named column is not among ``features``."""
        unknown = [name for name in self.named() if name not in features]
        if unknown:
            raise DataError(
                f"{', '.join(map(repr, unknown))} named as image, categorical or sequence "
                f"columns but not among the features ({', '.join(features)})"
            )

    def id_params(self) -> dict[str, Any]:
        """The options that change a dataset's bytes, for its id (defaults left out)."""
        raw: dict[str, Any] = {}
        if self.image_size is not None:
            raw["image_size"] = list(self.image_size)
        if self.image_channels is not None:
            raw["image_channels"] = self.image_channels
        if self.vocabulary_limit != DEFAULT_VOCABULARY_LIMIT:
            raw["vocabulary_limit"] = self.vocabulary_limit
        if self.hash_buckets:
            raw["hash_buckets"] = self.hash_buckets
        if self.max_length is not None:
            raw["max_length"] = self.max_length
        return raw

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> KindOptions:
        """Build from keyword-style settings (a config's ``data:`` keys), checked.

        Raises:
            DataError: An unknown key, or a value that breaks its rule.
        """
        raw = dict(raw or {})
        fields = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - fields)
        if unknown:
            raise DataError(
                f"unknown feature-kind option(s) {', '.join(unknown)}; known: "
                f"{', '.join(sorted(fields))}"
            )
        if raw.get("image_size") is not None:
            raw["image_size"] = tuple(raw["image_size"])
        return cls(**raw)
