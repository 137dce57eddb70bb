"""``pin_memory``: page-locked torch batches for fast host-to-GPU copies."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping
from typing import Any


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
    """Pin every torch tensor in ``batch`` (recursing into dicts, tuples and lists)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(batch, torch.Tensor):
        return batch.pin_memory()
    if isinstance(batch, Mapping):
        return {key: pin_batch(value) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(pin_batch(value) for value in batch))
    if isinstance(batch, tuple | list):
        return type(batch)(pin_batch(value) for value in batch)
    return batch
