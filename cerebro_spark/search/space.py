"""Search spaces: distributions over hyperparameters and the YAML form that describes them.

A :class:`SearchSpace` is a tree. Its leaves are constants or distributions; its inner
nodes are dicts (sub-spaces, sampled key by key) and :class:`Choice` distributions whose
options may themselves be sub-spaces. Sampling yields a dict of JSON values; :meth:`grid`
enumerates every combination of the finite distributions (the grid of grid search).

Config (YAML/dict) form, as read by :meth:`SearchSpace.from_config`::

    lr: {loguniform: [1.0e-4, 1.0e-1]}          # LogUniform(1e-4, 0.1)
    dropout: {uniform: [0.0, 0.5]}              # Uniform(0.0, 0.5)
    width: {int: [16, 256], log: true}          # IntUniform(16, 256, log=True), inclusive
    depth: {int: [1, 4]}                        # IntUniform(1, 4)
    batch_size: {quantized: {loguniform: [16, 512]}, q: 16}   # multiples of 16 (ints)
    wd: {grid: [0.0, 1.0e-4]}                   # Grid([0.0, 1e-4]): literal values
    activation: {choice: [relu, gelu]}          # Choice(["relu", "gelu"])
    layers: [64, 32]                            # plain lists and scalars are constants
    optimizer:                                  # a plain dict is a nested sub-space
      name: adam
      beta1: {uniform: [0.8, 0.95]}

and a choice whose options are dicts chooses between whole sub-spaces (branches); when it
is the whole space, the chosen branch's params are the sampled params::

    choice:
      - {model: "pkg.models:MLPSpec", hidden: {int: [32, 512]}}
      - {model: "pkg.models:CNNSpec", channels: {choice: [16, 32]}}

Params shared by all branches go into every branch; YAML merge keys make that short
(``common: &c {lr: ...}`` then ``- {<<: *c, model: ...}``).

Rules of the config form:

* A dict is a distribution iff one of its keys is a distribution name: ``choice``,
  ``grid``, ``uniform``, ``loguniform``, ``int``, ``quantized``. Its other keys must be that
  distribution's options (``log`` for ``int``; ``q``, required, for ``quantized``), and
  these names cannot be used as param names in a sub-space.
* ``choice`` options are parsed like any value (constants, distributions, sub-spaces);
  ``grid`` values are literal JSON values, never parsed (the escape hatch for a constant
  dict that would otherwise read as a distribution).
* Bounds of ``uniform``, ``loguniform`` and ``q`` may be numeric strings such as
  ``"1e-4"``: YAML 1.1 loaders (PyYAML) read ``1e-4`` without a dot as a string.
* Typos are caught: a single-key dict whose key is not a distribution name but resembles
  one (equal ignoring case and ``_``/``-``, or :func:`difflib.get_close_matches` at 0.8)
  and whose value has the shape that distribution takes (a list, or a dict for
  ``quantized``) raises ``ConfigError`` listing the known names. ``{init: xavier}`` and
  ``{hidden: [64, 32]}`` stay ordinary sub-spaces; ``{loguniforn: [1, 2]}`` is an error.

Errors name the param by its dotted path, e.g.
``space.optimizer.lr: loguniform low must be > 0, got 0``.

Grid order is deterministic: dict keys in their order with the last key varying fastest
(like :func:`itertools.product`); a choice lists its options' points in option order.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import decimal
import difflib
import functools
import itertools
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar, cast

import numpy as np

from cerebro_spark.errors import ConfigError

__all__ = [
    "Choice",
    "Distribution",
    "Grid",
    "IntUniform",
    "LogUniform",
    "Quantized",
    "SearchSpace",
    "Uniform",
]


class Distribution(abc.ABC):
    """A distribution over one param's values.

    Distributions are frozen and validated at construction (``ConfigError`` naming the
    value and the rule). Finite ones enumerate their values with :meth:`grid_values`.
    """

    name: ClassVar[str]
    """The key of the distribution in the config form."""

    @abc.abstractmethod
    def sample(self, rng: np.random.Generator) -> Any:
        """Draw one value (JSON values only) using ``rng``."""

    @abc.abstractmethod
    def to_config(self) -> dict[str, Any]:
        """Return the config form, which :meth:`SearchSpace.from_config` parses back."""

    @property
    def is_finite(self) -> bool:
        """Whether :meth:`grid_values` enumerates the distribution."""
        return True

    def grid_values(self) -> list[Any]:
        """Return every value in a deterministic order.

        Raises:
            ConfigError: The distribution is continuous.
        """
        return list(self._iter_grid())

    def grid_size(self) -> int:
        """Return ``len(grid_values())`` without building the list."""
        return sum(1 for _ in self._iter_grid())

    def _iter_grid(self) -> Iterator[Any]:
        raise ConfigError(
            f"{self.name} is continuous and has no grid; grid search needs choice, grid, "
            f"int or quantized"
        )


@dataclasses.dataclass(frozen=True)
class Choice(Distribution):
    """One of ``options``, picked uniformly.

    Options are parsed like any value of a space: constants, distributions (a mixture),
    or dicts, which are sub-spaces. A choice of sub-spaces selects a branch; its sample is
    the chosen branch's sampled dict. Grid search enumerates every option (a branch
    contributes all of its own grid points). Options must be distinct.

    Args:
        options: The non-empty list of options.
    """

    options: tuple[Any, ...]
    name: ClassVar[str] = "choice"

    def __init__(self, options: Sequence[Any]) -> None:
        if isinstance(options, (str, bytes, Mapping)) or not isinstance(options, Sequence):
            raise ConfigError(f"choice options must be a list, got {options!r}")
        if not options:
            raise ConfigError("choice needs at least one option, got []")
        parsed = tuple(_parse(opt, f"choice[{i}]") for i, opt in enumerate(options))
        _check_distinct("choice option", [_node_config(o) for o in parsed])
        object.__setattr__(self, "options", parsed)

    @property
    def is_finite(self) -> bool:
        """Whether every option is finite."""
        return all(_node_finite(o) for o in self.options)

    def sample(self, rng: np.random.Generator) -> Any:
        """Pick an option uniformly and sample it."""
        return _sample(self.options[int(rng.integers(len(self.options)))], rng)

    def to_config(self) -> dict[str, Any]:
        """Return ``{"choice": [...]}``."""
        return {"choice": [_node_config(o) for o in self.options]}

    def grid_size(self) -> int:
        """Return the number of grid points over all options."""
        return sum(_node_grid_size(o, f"choice[{i}]") for i, o in enumerate(self.options))

    def _iter_grid(self) -> Iterator[Any]:
        for i, option in enumerate(self.options):
            yield from _node_grid(option, f"choice[{i}]")


@dataclasses.dataclass(frozen=True)
class Grid(Distribution):
    """One of ``values``: enumerated by grid search, picked uniformly by random search.

    Unlike :class:`Choice`, values are literal JSON values (a dict is a constant, not a
    sub-space). Values must be distinct.

    Args:
        values: The non-empty list of values.
    """

    values: tuple[Any, ...]
    name: ClassVar[str] = "grid"

    def __init__(self, values: Sequence[Any]) -> None:
        if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Sequence):
            raise ConfigError(f"grid values must be a list, got {values!r}")
        if not values:
            raise ConfigError("grid needs at least one value, got []")
        checked = tuple(_json_constant(v, f"grid[{i}]") for i, v in enumerate(values))
        _check_distinct("grid value", list(checked))
        object.__setattr__(self, "values", checked)

    def sample(self, rng: np.random.Generator) -> Any:
        """Pick a value uniformly."""
        return copy.deepcopy(self.values[int(rng.integers(len(self.values)))])

    def to_config(self) -> dict[str, Any]:
        """Return ``{"grid": [...]}``."""
        return {"grid": copy.deepcopy(list(self.values))}

    def grid_size(self) -> int:
        """Return the number of values."""
        return len(self.values)

    def _iter_grid(self) -> Iterator[Any]:
        for value in self.values:
            yield copy.deepcopy(value)


@dataclasses.dataclass(frozen=True)
class Uniform(Distribution):
    """A float uniform in ``[low, high]``.

    Args:
        low: Lower bound, finite.
        high: Upper bound, finite and ``> low``.
    """

    low: float
    high: float
    name: ClassVar[str] = "uniform"

    def __post_init__(self) -> None:
        low, high = _bounds(self.name, self.low, self.high)
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)

    @property
    def is_finite(self) -> bool:
        """Always ``False``."""
        return False

    def sample(self, rng: np.random.Generator) -> float:
        """Draw a float in ``[low, high]``."""
        return min(max(float(rng.uniform(self.low, self.high)), self.low), self.high)

    def to_config(self) -> dict[str, Any]:
        """Return ``{"uniform": [low, high]}``."""
        return {"uniform": [self.low, self.high]}


@dataclasses.dataclass(frozen=True)
class LogUniform(Distribution):
    """A float whose logarithm is uniform: ``low * (high/low) ** U(0, 1)``.

    Args:
        low: Lower bound, finite and ``> 0``.
        high: Upper bound, finite and ``> low``.
    """

    low: float
    high: float
    name: ClassVar[str] = "loguniform"

    def __post_init__(self) -> None:
        low, high = _bounds(self.name, self.low, self.high)
        if low <= 0:
            raise ConfigError(f"loguniform low must be > 0, got {self.low!r}")
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)

    @property
    def is_finite(self) -> bool:
        """Always ``False``."""
        return False

    def sample(self, rng: np.random.Generator) -> float:
        """Draw a float in ``[low, high]``."""
        value = math.exp(float(rng.uniform(math.log(self.low), math.log(self.high))))
        return min(max(value, self.low), self.high)

    def to_config(self) -> dict[str, Any]:
        """Return ``{"loguniform": [low, high]}``."""
        return {"loguniform": [self.low, self.high]}


@dataclasses.dataclass(frozen=True)
class IntUniform(Distribution):
    """An int in ``[low, high]``, both inclusive.

    With ``log=True`` the int is ``floor(x)`` for ``x`` log-uniform in ``[low, high + 1)``,
    so small values are as likely as large ones relative to their size (needs ``low >= 1``).

    Args:
        low: Smallest value.
        high: Largest value, ``>= low``.
        log: Sample on a log scale.
    """

    low: int
    high: int
    log: bool = False
    name: ClassVar[str] = "int"

    def __post_init__(self) -> None:
        for field in ("low", "high"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ConfigError(f"int {field} must be an integer, got {value!r}")
            object.__setattr__(self, field, int(value))
        if not isinstance(self.log, (bool, np.bool_)):
            raise ConfigError(f"int log must be true or false, got {self.log!r}")
        object.__setattr__(self, "log", bool(self.log))
        if self.high < self.low:
            raise ConfigError(f"int high must be >= low, got [{self.low}, {self.high}]")
        if self.log and self.low < 1:
            raise ConfigError(f"int with log: true needs low >= 1, got {self.low}")

    def sample(self, rng: np.random.Generator) -> int:
        """Draw an int in ``[low, high]``."""
        if not self.log:
            return int(rng.integers(self.low, self.high, endpoint=True))
        x = math.exp(float(rng.uniform(math.log(self.low), math.log(self.high + 1))))
        return min(max(math.floor(x), self.low), self.high)

    def to_config(self) -> dict[str, Any]:
        """Return ``{"int": [low, high]}``, plus ``"log": true`` when log-scaled."""
        config: dict[str, Any] = {"int": [self.low, self.high]}
        if self.log:
            config["log"] = True
        return config

    def grid_size(self) -> int:
        """Return ``high - low + 1``."""
        return self.high - self.low + 1

    def _iter_grid(self) -> Iterator[Any]:
        yield from range(self.low, self.high + 1)


@dataclasses.dataclass(frozen=True)
class Quantized(Distribution):
    """A :class:`Uniform` or :class:`LogUniform` rounded to a multiple of ``q``.

    Samples are the multiple of ``q`` nearest the inner sample, kept within
    ``[low, high]`` (so the values are the multiples of ``q`` in the range, which is also
    the grid). Values are ints when ``q`` is an int, else floats without binary noise
    (``3 * 0.1`` gives ``0.3``).

    Args:
        dist: The continuous distribution to round.
        q: The step, ``> 0``; at least one multiple must lie in ``[low, high]``.
    """

    dist: Uniform | LogUniform
    q: float
    name: ClassVar[str] = "quantized"

    def __post_init__(self) -> None:
        if not isinstance(self.dist, (Uniform, LogUniform)):
            raise ConfigError(
                f"quantized applies to uniform or loguniform, got {_describe(self.dist)}"
            )
        if isinstance(self.q, (int, np.integer)) and not isinstance(self.q, bool):
            q: float = int(self.q)
        else:
            q = _number("quantized q", self.q)
        if not q > 0:
            raise ConfigError(f"quantized q must be > 0, got {self.q!r}")
        object.__setattr__(self, "q", q)
        if self._k_max < self._k_min:
            raise ConfigError(
                f"quantized: no multiple of q={q!r} lies in [{self.dist.low!r}, {self.dist.high!r}]"
            )

    def _dq(self) -> decimal.Decimal:
        return decimal.Decimal(repr(self.q))

    @functools.cached_property
    def _k_min(self) -> int:
        ratio = decimal.Decimal(repr(self.dist.low)) / self._dq()
        return int(ratio.to_integral_value(rounding=decimal.ROUND_CEILING))

    @functools.cached_property
    def _k_max(self) -> int:
        ratio = decimal.Decimal(repr(self.dist.high)) / self._dq()
        return int(ratio.to_integral_value(rounding=decimal.ROUND_FLOOR))

    def _value(self, k: int) -> int | float:
        if isinstance(self.q, int):
            return k * self.q
        return float(decimal.Decimal(k) * self._dq())

    def sample(self, rng: np.random.Generator) -> int | float:
        """Draw from the inner distribution and round to the nearest allowed multiple."""
        k = round(self.dist.sample(rng) / self.q)
        return self._value(min(max(k, self._k_min), self._k_max))

    def to_config(self) -> dict[str, Any]:
        """Return ``{"quantized": {...inner...}, "q": q}``."""
        return {"quantized": self.dist.to_config(), "q": self.q}

    def grid_size(self) -> int:
        """Return the number of multiples of ``q`` in the range."""
        return self._k_max - self._k_min + 1

    def _iter_grid(self) -> Iterator[Any]:
        for k in range(self._k_min, self._k_max + 1):
            yield self._value(k)


class SearchSpace:
    """A tree of params: constants, distributions and nested sub-spaces.

    Args:
        params: The top level: a mapping from param name to value (a constant, a
            :class:`Distribution`, a nested mapping, or any of the config forms described
            in the module docstring), or a :class:`Choice`/:class:`Grid` whose options are
            all mappings (branches).
        name: Root of the param paths used in error messages.

    Raises:
        ConfigError: A value breaks a rule; the message names its dotted path.
    """

    def __init__(self, params: Mapping[str, Any] | Distribution, *, name: str = "space") -> None:
        root = _parse(params, name)
        if not _produces_mapping(root):
            raise ConfigError(
                f"{name}: the top level must be a mapping of params or a choice of mappings "
                f"(branches), got {_describe(params)}"
            )
        self._root = root
        self._name = name

    @classmethod
    def from_config(cls, config: Any, *, name: str = "space") -> SearchSpace:
        """Parse the config (YAML/dict) form; see the module docstring for the syntax."""
        if isinstance(config, SearchSpace):
            raise ConfigError(f"{name}: expected the config form, got a SearchSpace")
        if not isinstance(config, Mapping):
            raise ConfigError(f"{name}: must be a mapping, got {_describe(config)}")
        return cls(config, name=name)

    def to_config(self) -> dict[str, Any]:
        """Return the config form; ``from_config(space.to_config()) == space``."""
        return cast("dict[str, Any]", _node_config(self._root))

    def sample(self, rng: np.random.Generator) -> dict[str, Any]:
        """Draw one configuration (JSON values only) using ``rng`` alone."""
        return cast("dict[str, Any]", _sample(self._root, rng))

    def iter_grid(self) -> Iterator[dict[str, Any]]:
        """Yield every grid point in the deterministic order described in the module.

        Raises:
            ConfigError: A continuous distribution is in the space (the message names it).
        """
        self.grid_size()  # raise now, not at the first next()
        return cast("Iterator[dict[str, Any]]", _node_grid(self._root, self._name))

    def grid(self) -> list[dict[str, Any]]:
        """Return :meth:`iter_grid` as a list."""
        return list(self.iter_grid())

    def grid_size(self) -> int:
        """Return the number of grid points without building them.

        Raises:
            ConfigError: A continuous distribution is in the space (the message names it).
        """
        return _node_grid_size(self._root, self._name)

    @property
    def is_finite(self) -> bool:
        """Whether :meth:`grid` works (no continuous distribution anywhere)."""
        return _node_finite(self._root)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SearchSpace):
            return NotImplemented
        return _canonical(self.to_config()) == _canonical(other.to_config())

    def __hash__(self) -> int:
        return hash(_canonical(self.to_config()))

    def __repr__(self) -> str:
        return f"SearchSpace.from_config({self.to_config()!r})"


# --- the tree: a node is a Distribution, a dict[str, node], or a JSON constant (not a dict)

_OPTIONS: dict[str, frozenset[str]] = {
    "choice": frozenset(),
    "grid": frozenset(),
    "uniform": frozenset(),
    "loguniform": frozenset(),
    "int": frozenset({"log"}),
    "quantized": frozenset({"q"}),
}
_LIST_SHAPED = frozenset({"choice", "grid", "uniform", "loguniform", "int"})


def _parse(value: Any, path: str) -> Any:
    """Turn a value of the Python or config form into a node, checking every rule."""
    if isinstance(value, Distribution):
        return value
    if isinstance(value, Mapping):
        kinds = [k for k in value if k in _OPTIONS]
        if kinds:
            return _parse_distribution(value, kinds, path)
        _check_typo(value, path)
        node: dict[str, Any] = {}
        for key, sub in value.items():
            if not isinstance(key, str) or not key:
                raise ConfigError(f"{path}: param names must be non-empty strings, got {key!r}")
            node[key] = _parse(sub, f"{path}.{key}")
        return node
    return _json_constant(value, path)


def _parse_distribution(value: Mapping[str, Any], kinds: list[str], path: str) -> Distribution:
    if len(kinds) > 1:
        raise ConfigError(
            f"{path}: a value names one distribution, got {kinds} (param names may not be "
            f"distribution names)"
        )
    kind = kinds[0]
    extra = sorted(set(value) - {kind} - _OPTIONS[kind])
    if extra:
        accepted = ", ".join(sorted(_OPTIONS[kind])) or "no other keys"
        raise ConfigError(
            f"{path}: unexpected key(s) {extra} next to {kind!r}; {kind} accepts {accepted}. "
            f"(A dict with a distribution name as a key is read as that distribution.)"
        )
    arg = value[kind]
    # Nested values are parsed first, outside the try: their errors carry their own path.
    if kind == "choice":
        if not isinstance(arg, Sequence) or isinstance(arg, (str, bytes)):
            raise ConfigError(f"{path}: choice options must be a list, got {arg!r}")
        arg = [_parse(opt, f"{path}.choice[{i}]") for i, opt in enumerate(arg)]
    elif kind == "quantized":
        if "q" not in value:
            raise ConfigError(
                f"{path}: quantized needs a step 'q', e.g. {{quantized: ..., q: 0.1}}"
            )
        arg = _parse(arg, f"{path}.quantized")
    try:
        if kind == "choice":
            return Choice(arg)
        if kind == "grid":
            return Grid(arg)
        if kind == "quantized":
            return Quantized(arg, value["q"])
        low, high = _pair(kind, arg)
        if kind == "int":
            return IntUniform(low, high, log=value.get("log", False))
        return Uniform(low, high) if kind == "uniform" else LogUniform(low, high)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def _pair(kind: str, arg: Any) -> tuple[Any, Any]:
    if isinstance(arg, (str, bytes, Mapping)) or not isinstance(arg, Sequence) or len(arg) != 2:
        raise ConfigError(f"{kind} takes a list [low, high], got {arg!r}")
    return arg[0], arg[1]


def _check_typo(value: Mapping[str, Any], path: str) -> None:
    if len(value) != 1:
        return
    ((key, arg),) = value.items()
    if not isinstance(key, str):
        return
    folded = key.lower().replace("_", "").replace("-", "")
    matches = [n for n in _OPTIONS if n == folded]
    matches = matches or difflib.get_close_matches(key.lower(), list(_OPTIONS), n=1, cutoff=0.8)
    if not matches:
        return
    guess = matches[0]
    is_list = isinstance(arg, Sequence) and not isinstance(arg, (str, bytes))
    if (guess in _LIST_SHAPED and is_list) or (guess == "quantized" and isinstance(arg, Mapping)):
        raise ConfigError(
            f"{path}: unknown distribution {key!r} (did you mean {guess!r}?); known "
            f"distributions: {', '.join(_OPTIONS)}. For a constant sub-space with this key, "
            f"write it as {{grid: [{{{key}: ...}}]}}"
        )


def _json_constant(value: Any, path: str) -> Any:
    """Check that ``value`` is a JSON value and return a copy (tuples become lists)."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"{path}: constants must be finite numbers, got {value!r}")
        return value
    if isinstance(value, (list, tuple)):
        return [_json_constant(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, sub in value.items():
            if not isinstance(key, str):
                raise ConfigError(f"{path}: dict keys must be strings, got {key!r}")
            out[key] = _json_constant(sub, f"{path}.{key}")
        return out
    raise ConfigError(f"{path}: values must be JSON values, got {_describe(value)}")


def _sample(node: Any, rng: np.random.Generator) -> Any:
    if isinstance(node, Distribution):
        return node.sample(rng)
    if isinstance(node, dict):
        return {key: _sample(sub, rng) for key, sub in node.items()}
    return copy.deepcopy(node)


def _node_config(node: Any) -> Any:
    if isinstance(node, Distribution):
        return node.to_config()
    if isinstance(node, dict):
        return {key: _node_config(sub) for key, sub in node.items()}
    return copy.deepcopy(node)


def _node_finite(node: Any) -> bool:
    if isinstance(node, Distribution):
        return node.is_finite
    if isinstance(node, dict):
        return all(_node_finite(sub) for sub in node.values())
    return True


def _node_grid_size(node: Any, path: str) -> int:
    if isinstance(node, Choice):
        return sum(
            _node_grid_size(option, f"{path}.choice[{i}]") for i, option in enumerate(node.options)
        )
    if isinstance(node, Distribution):
        try:
            return node.grid_size()
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from None
    if isinstance(node, dict):
        return math.prod(_node_grid_size(sub, f"{path}.{key}") for key, sub in node.items())
    return 1


def _node_grid(node: Any, path: str) -> Iterator[Any]:
    if isinstance(node, Distribution):
        if isinstance(node, Choice):
            for i, option in enumerate(node.options):
                yield from _node_grid(option, f"{path}.choice[{i}]")
        else:
            yield from node.grid_values()
        return
    if isinstance(node, dict):
        keys = list(node)
        axes = [list(_node_grid(node[key], f"{path}.{key}")) for key in keys]
        for combo in itertools.product(*axes):
            yield {key: copy.deepcopy(value) for key, value in zip(keys, combo, strict=True)}
        return
    yield copy.deepcopy(node)


def _produces_mapping(node: Any) -> bool:
    if isinstance(node, dict):
        return True
    if isinstance(node, Choice):
        return all(_produces_mapping(option) for option in node.options)
    if isinstance(node, Grid):
        return all(isinstance(value, dict) for value in node.values)
    return False


def _bounds(kind: str, low: Any, high: Any) -> tuple[float, float]:
    lo = _number(f"{kind} low", low)
    hi = _number(f"{kind} high", high)
    if not lo < hi:
        raise ConfigError(f"{kind} needs low < high, got [{low!r}, {high!r}]")
    return lo, hi


def _number(what: str, value: Any) -> float:
    """Return ``value`` as a finite float; numeric strings (YAML's ``1e-4``) are accepted."""
    if isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"{what} must be a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ConfigError(f"{what} must be finite, got {value!r}")
    return number


def _check_distinct(what: str, values: list[Any]) -> None:
    seen: dict[str, int] = {}
    for i, value in enumerate(values):
        key = _canonical(value)
        if key in seen:
            raise ConfigError(
                f"{what}s must be distinct: {what} {i} repeats {what} {seen[key]} ({value!r})"
            )
        seen[key] = i


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{type(value).__name__} {text}"
