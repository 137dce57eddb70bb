"""``ImageCollator``: a batch of images copied once into one contiguous array, in memory
reused from dropped batches.

A batch is a plain ``ndarray`` whose ``base`` is a small holder of pooled memory; every view of
the batch (and a tensor made with ``torch.from_numpy`` or ``torch.from_dlpack``) keeps the
holder alive. When the last of them is gone, the memory goes back to the pool, which keeps at
most ``buffers`` of them. Taking memory never waits: with none free, new memory is allocated,
so a consumer that keeps many batches costs memory, never a deadlock. Reused memory spares the
page faults of fresh memory, which are most of the cost of collating large batches.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._image import CHWImage, describe


class _Pool:
    """Free buffers by size, at most ``limit`` of them; safe from any thread."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._free: dict[int, list[np.ndarray[Any, Any]]] = {}
        self._count = 0
        self._lock = threading.Lock()
        self.reused = 0

    def take(self, nbytes: int) -> np.ndarray[Any, Any]:
        with self._lock:
            free = self._free.get(nbytes)
            if free:
                self._count -= 1
                self.reused += 1
                return free.pop()
        return np.empty(nbytes, dtype=np.uint8)

    def give_back(self, memory: np.ndarray[Any, Any]) -> None:
        with self._lock:
            if self._count < self.limit:
                self._free.setdefault(memory.nbytes, []).append(memory)
                self._count += 1


class _Holder:
    """The ``base`` of a pooled batch: it exposes the memory as ``shape`` of ``dtype``."""

    __slots__ = ("__array_interface__", "__weakref__", "memory")

    def __init__(self, memory: np.ndarray[Any, Any], shape: tuple[int, ...], dtype: Any) -> None:
        self.memory = memory
        self.__array_interface__ = {
            "shape": shape,
            "typestr": np.dtype(dtype).str,
            "data": (memory.ctypes.data, False),
            "version": 3,
        }


class ImageCollator:
    """Collate images (HWC, or CHW after ``ToCHW``) into one contiguous batch array.

    Args:
        layout: ``"NCHW"`` (default) or ``"NHWC"``: the batch's layout, whatever the items'.
        dtype: The batch's dtype (``None``: the first item's).
        buffers: Memory of up to this many dropped batches is kept for reuse (0: none).

    Raises:
        ValueError (per batch): Items of different shapes (both shapes are named), or an
            empty batch.
        TypeError (per batch): An item that is not an image.
    """

    def __init__(self, layout: str = "NCHW", dtype: Any = None, buffers: int = 2) -> None:
        if layout not in ("NCHW", "NHWC"):
            raise ValueError(f"ImageCollator: layout must be 'NCHW' or 'NHWC', got {layout!r}")
        if not isinstance(buffers, int) or buffers < 0:
            raise ValueError(f"ImageCollator: buffers must be an int >= 0, got {buffers!r}")
        self.layout = layout
        self.dtype = None if dtype is None else np.dtype(dtype)
        self.buffers = buffers
        self._pool = _Pool(buffers)

    @property
    def reused(self) -> int:
        """Batches written into reused memory so far."""
        return self._pool.reused

    def __call__(self, items: Sequence[Any]) -> np.ndarray[Any, Any]:
        """The batch of ``items``: one array, copied into once."""
        if not items:
            raise ValueError("ImageCollator: an empty batch")
        first = items[0]
        for item in items:
            if not isinstance(item, np.ndarray) or item.ndim != 3:
                raise TypeError(f"ImageCollator takes 3-D images, got {describe(item)}")
            if item.shape != first.shape or isinstance(item, CHWImage) != isinstance(
                first, CHWImage
            ):
                raise ValueError(
                    f"ImageCollator: images of different shapes in one batch: "
                    f"{describe(first)} and {describe(item)}"
                )
        chw_items = isinstance(first, CHWImage)
        if chw_items:
            channels, height, width = first.shape
        else:
            height, width, channels = first.shape
        dims = (channels, height, width) if self.layout == "NCHW" else (height, width, channels)
        shape = (len(items), *dims)
        dtype = self.dtype if self.dtype is not None else first.dtype
        batch = self._allocate(shape, dtype)
        move = None
        if chw_items and self.layout == "NHWC":
            move = (1, 2, 0)
        elif not chw_items and self.layout == "NCHW":
            move = (2, 0, 1)
        for out, item in zip(batch, items, strict=True):
            source = np.asarray(item)
            np.copyto(out, source if move is None else source.transpose(move), casting="unsafe")
        return batch

    def _allocate(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray[Any, Any]:
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if self.buffers == 0:
            return np.empty(shape, dtype)
        memory = self._pool.take(nbytes)
        holder = _Holder(memory, shape, dtype)
        batch = np.asarray(holder)
        # When the holder goes (the batch and every view of it gone), the memory comes back.
        weakref.finalize(holder, self._pool.give_back, memory)
        return batch

    def __repr__(self) -> str:
        return f"ImageCollator(layout={self.layout!r}, dtype={self.dtype}, buffers={self.buffers})"
