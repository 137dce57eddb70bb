"""Per-item transforms: ``f(index, item) -> item``, run on the loader's CPU pool."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

Transform = Callable[[int, Any], Any]
"""A per-item transform: called with the item's dataset index and the item."""


class Compose:
    """Chain transforms: each gets the item's index and the previous transform's result.

    Args:
        transforms: The transforms, applied in order.
    """

    def __init__(self, transforms: Iterable[Transform]) -> None:
        self.transforms: tuple[Transform, ...] = tuple(transforms)
        for position, transform in enumerate(self.transforms):
            if not callable(transform):
                raise TypeError(f"Compose: transforms[{position}] is not callable: {transform!r}")

    def __call__(self, index: int, item: Any) -> Any:
        """Apply every transform in turn."""
        for transform in self.transforms:
            item = transform(index, item)
        return item

    def __repr__(self) -> str:
        return f"Compose({list(self.transforms)!r})"
