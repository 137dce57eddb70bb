"""Running an epoch in tests: every outcome in order, a batch or the error raised for it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asyncloader import DataLoader


def outcomes(
    loader: DataLoader, value: Callable[[Any], Any], error: type[BaseException] = OSError
) -> list[Any]:
    """``value(batch)`` for each batch of one epoch, or the message of the ``error`` raised in
    its place (the epoch goes on after it)."""
    out: list[Any] = []
    iterator = iter(loader)
    while True:
        try:
            out.append(value(next(iterator)))
        except StopIteration:
            return out
        except error as raised:
            out.append(str(raised))
