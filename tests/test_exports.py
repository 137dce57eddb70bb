"""The public surface is exactly ``__all__``, and every public name is documented."""

from __future__ import annotations

import types

import pytest

import asyncloader
import asyncloader.datasets

PACKAGES = [asyncloader, asyncloader.datasets]


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
