"""The public surface is exactly ``__all__``, and every public name is documented."""

from __future__ import annotations

import asyncloader


def test_all_is_the_public_surface() -> None:
    public = {name for name in dir(asyncloader) if not name.startswith("_")}
    assert public == set(asyncloader.__all__)


def test_every_public_name_has_a_docstring() -> None:
    for name in asyncloader.__all__:
        obj = getattr(asyncloader, name)
        assert (obj.__doc__ or "").strip(), name
        for attr, value in vars(obj).items() if isinstance(obj, type) else []:
            if not attr.startswith("_") and callable(value):
                assert (value.__doc__ or "").strip(), f"{name}.{attr}"
