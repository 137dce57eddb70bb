"""Per-item transforms: ``f(index, item) -> item``, run on the loader's CPU pool."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol


class Transform(Protocol):
    """A per-item transform: any callable ``f(index, item) -> item``.

    It gets the item's dataset index (whatever order the sampler chose), so it can look up
    per-item information the dataset does not return, or seed per-item randomness.
    """

    def __call__(self, index: int, item: Any, /) -> Any:
        """Return the transformed item."""


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
