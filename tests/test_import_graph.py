"""The package's import graph, read from the code: no cycle, no import from a floor above.

Every ``import`` counts, at module level, inside functions and under ``TYPE_CHECKING``
alike: a cycle dodged by importing inside a function is still a cycle. ``from package
import name`` depends on the package's ``__init__`` (which Python runs), unless ``name``
is a module of it. The floors, lowest first, are :data:`FLOORS`; a module may import
from its own floor or any below it, never from one above (DEVELOPERS.md, "Floors").
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "cerebro_spark"

FLOORS: tuple[frozenset[str], ...] = tuple(
    frozenset(floor.split())
    for floor in (
        "errors _redact units",  # words everyone shares
        "store metrics search mop spark_session spark_daemon",  # rooms with small seams
        "data",
        "training",
        "backends elastic",  # the worker pool; the planner (pure)
        "simulate driver",  # the lower floor: runs a search, knows only seams
        "scoring report tracking cluster",  # read what the driver writes; resize clusters
        "engine",  # the front door: composes the rest
        "tuner __init__",
        "cli",
    )
)


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The package's modules that module ``name`` imports, anywhere in its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def owner(dotted: str) -> str:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "cerebro_spark":
                    yield owner(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            if source.split(".")[0] != "cerebro_spark":
                continue
            for alias in node.names:
                full = f"{source}.{alias.name}"
                yield full if full in known else owner(source)


@functools.cache
def graph() -> dict[str, set[str]]:
    known = modules()
    return {
        name: {target for target in imports(name, path, known) if target != name}
        for name, path in known.items()
    }


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def floor(module: str) -> int:
    """The floor of a module: that of its top-level room (``cerebro_spark.x...``)."""
    parts = module.split(".")
    room = parts[1] if len(parts) > 1 else "__init__"
    for number, rooms in enumerate(FLOORS):
        if room in rooms:
            return number
    raise AssertionError(f"{module}: room {room!r} is on no floor; add it to FLOORS")


def test_the_package_has_no_import_cycle() -> None:
    assert cycles(graph()) == []


def test_no_module_imports_from_a_floor_above_its_own() -> None:
    upward = sorted(
        f"{module} (floor {floor(module)}) imports {target} (floor {floor(target)})"
        for module, targets in graph().items()
        for target in targets
        if floor(target) > floor(module)
    )
    assert upward == []


def test_every_room_is_on_a_floor() -> None:
    for module in modules():
        floor(module)


def test_the_checks_see_a_cycle_and_an_upward_import() -> None:
    """The two checks can fail: a cycle and an upward import are found where they are."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    assert floor("cerebro_spark.driver._experiment") > floor("cerebro_spark.backends._pool")
    edges = graph()
    assert "cerebro_spark.driver._experiment" in edges["cerebro_spark.engine._api"]
    with pytest.raises(AssertionError, match="on no floor"):
        floor("cerebro_spark.nowhere")


PRIVATE_NAME_IMPORTS_ALLOWED: dict[tuple[str, str], str] = {
    (f"cerebro_spark.training.{spec}", "cerebro_spark.training._models"): (
        "the built-in specs share _models' parameter readers: one family of specs split "
        "into modules for length (cerebro_spark/training/__init__.py says so)"
    )
    for spec in ("_embedding", "_resnet", "_sequence")
}
"""``(importer, owner)``: why ``importer`` may use private names of ``owner``."""


def private_name_imports(known: dict[str, Path]) -> list[tuple[str, str, str]]:
    """Every private name a module takes from another: ``(importer, owner, name)``.

    ``from owner import _name`` (``_name`` not a module, relative imports resolved) and
    ``alias._name`` where ``alias`` is a module of the package that the importer bound
    with ``from package import _mod as alias`` or ``import package._mod as alias``.
    """
    found = []
    for name, path in sorted(known.items()):
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        root = name.split(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                if source.split(".")[0] != root:
                    continue
                for alias in node.names:
                    if f"{source}.{alias.name}" in known:
                        aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
                    elif alias.name.startswith("_") and not alias.name.startswith("__"):
                        found.append((name, source, alias.name))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name in known:
                        aliases[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and aliases[node.value.id] != name
            ):
                found.append((name, aliases[node.value.id], node.attr))
    return sorted(set(found))


def test_no_module_imports_a_private_name_of_another_but_where_its_package_says_why(
    tmp_path: Path,
) -> None:
    """Modules meet through public seams; the allowed exceptions name their reason."""
    found = private_name_imports(modules())
    unexplained = [
        f"{importer} uses {owner}.{private}"
        for importer, owner, private in found
        if (importer, owner) not in PRIVATE_NAME_IMPORTS_ALLOWED
    ]
    assert unexplained == []
    used = {(importer, owner) for importer, owner, _ in found}
    assert set(PRIVATE_NAME_IMPORTS_ALLOWED) <= used, "an allowed exception is gone: drop it"
    # The check sees both forms, and a relative import.
    package = tmp_path / "pkg"
    (package / "room").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "room" / "__init__.py").write_text("")
    (package / "room" / "_mod.py").write_text("_a = _b = _c = public = 1\n")
    (package / "room" / "_user.py").write_text(
        "from pkg.room._mod import _a, public\n"
        "from . import _mod as m\n"
        "from ._mod import _c as c\n"
        "print(m._b, m.public, m.__name__)\n"
    )
    fake = {
        "pkg": package / "__init__.py",
        "pkg.room": package / "room" / "__init__.py",
        "pkg.room._mod": package / "room" / "_mod.py",
        "pkg.room._user": package / "room" / "_user.py",
    }
    assert private_name_imports(fake) == [
        ("pkg.room._user", "pkg.room._mod", private) for private in ("_a", "_b", "_c")
    ]
