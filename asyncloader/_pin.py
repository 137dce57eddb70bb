"""``pin_memory``: page-locked torch batches for fast host-to-GPU copies."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping, MutableSequence, Sequence
from typing import Any

from ._collate import same_mapping


def pinning_available() -> bool:
    """Whether torch batches can be pinned; warns (as PyTorch does) when CUDA is absent."""
    try:
        import torch
    except ImportError:
        warnings.warn("pin_memory=True but torch is not installed; nothing is pinned", stacklevel=3)
        return False
    if not torch.cuda.is_available():
        warnings.warn(
            "pin_memory=True but no CUDA device is available; nothing is pinned", stacklevel=3
        )
        return False
    return True


def pin_batch(batch: Any) -> Any:
    """Pin every torch tensor in ``batch``, and every value with a ``pin_memory()`` method
    (torch's way to pin a custom batch), recursing into mappings and sequences, whose types
    are kept as torch's pinning keeps them."""
    if hasattr(batch, "pin_memory"):  # a tensor, or a type of the user's
        return batch.pin_memory()
    if isinstance(batch, str | bytes | bytearray | memoryview):  # kept whole, not per byte
        return batch
    if isinstance(batch, Mapping):
        return same_mapping(batch, {key: pin_batch(value) for key, value in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(pin_batch(value) for value in batch))
    if isinstance(batch, tuple):
        return type(batch)(pin_batch(value) for value in batch)
    if isinstance(batch, Sequence):
        return _same_sequence(batch, [pin_batch(value) for value in batch])
    return batch


def _same_sequence(model: Sequence[Any], values: list[Any]) -> Any:
    """``values`` in ``model``'s sequence type, as torch's pinning builds it (a copy of a
    mutable one with its values replaced); a list when that type cannot be built so."""
    try:
        if isinstance(model, MutableSequence):
            clone = copy.copy(model)
            for position, value in enumerate(values):
                clone[position] = value
            return clone
        return type(model)(values)  # type: ignore[call-arg]
    except TypeError:
        return values
