"""The public surface is exactly ``__all__``, and every public name is documented."""

from __future__ import annotations

import importlib
import pkgutil
import types

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
