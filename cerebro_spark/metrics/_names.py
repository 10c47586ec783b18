"""The "did you mean" of an error that names a wrong metric or class name."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(name: str, options: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the option closest to ``name``, else ``""``.

    Closeness is :func:`difflib.get_close_matches`' (ratio at least 0.6), tried as given
    and then ignoring case (``mlpspec`` finds ``MLPSpec``).

    Args:
        name: The name that was not found.
        options: The names that exist.
    """
    names = sorted(set(options))
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    if not close:
        lowered = {option.lower(): option for option in names}
        folded = difflib.get_close_matches(name.lower(), sorted(lowered), n=1, cutoff=0.6)
        close = [lowered[folded[0]]] if folded else []
    return f" (did you mean {close[0]!r}?)" if close else ""
