"""The public surface is exactly ``__all__``, and every public name is documented."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import types
from pathlib import Path

import pytest

import asyncloader
import asyncloader.datasets


def public_modules() -> list[types.ModuleType]:
    """asyncloader and every module under it whose dotted name has no private part."""
    names = [
        found.name
        for found in pkgutil.walk_packages(asyncloader.__path__, "asyncloader.")
        if not any(part.startswith("_") for part in found.name.split("."))
    ]
    return [asyncloader, *(importlib.import_module(name) for name in sorted(names))]


PACKAGES = public_modules()


def test_the_public_modules_are_found() -> None:
    assert [module.__name__ for module in PACKAGES] == [
        "asyncloader",
        "asyncloader.datasets",
        "asyncloader.testing",
        "asyncloader.transforms",
    ]


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_all_is_the_public_surface(package: types.ModuleType) -> None:
    public = {
        name
        for name, value in vars(package).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(package.__all__)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.__name__)
def test_every_public_name_has_a_docstring(package: types.ModuleType) -> None:
    for name in package.__all__:
        obj = getattr(package, name)
        assert (obj.__doc__ or "").strip(), name
        for attr, value in vars(obj).items() if isinstance(obj, type) else []:
            if not attr.startswith("_") and callable(value):
                assert (value.__doc__ or "").strip(), f"{name}.{attr}"


def test_the_datasets_are_re_exported_at_the_top() -> None:
    for name in asyncloader.datasets.__all__:
        assert getattr(asyncloader, name) is getattr(asyncloader.datasets, name)


def _imports(path: Path, package: str) -> set[str]:
    """The asyncloader modules ``path`` imports (also under ``TYPE_CHECKING``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("asyncloader"):
                found.add(target)
                found.update(f"{target}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("asyncloader"))
    return found


def test_no_import_cycle_among_the_packages_modules() -> None:
    root = Path(asyncloader.__file__).parent
    modules: dict[str, Path] = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        graph[name] = {m for m in _imports(path, package) if m in modules and m != name}
    # A package's __init__ re-exports from its children: that edge is not a cycle's.
    for name in graph:
        graph[name] = {m for m in graph[name] if not name.startswith(m + ".")}
    state: dict[str, int] = {}

    def visit(name: str, trail: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                cycle = [*trail[trail.index(target) :], target] if target in trail else [target]
                raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
            if target not in state:
                visit(target, [*trail, target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
