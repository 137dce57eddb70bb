"""``ImageCollator``: a batch of images copied once into one contiguous array, in memory
reused from dropped batches, normalized on the way if asked.

A batch is a plain ``ndarray`` whose ``base`` is a small holder of pooled memory; every view of
the batch (and a tensor made with ``torch.from_numpy`` or ``torch.from_dlpack``) keeps the
holder alive. When the last of them is gone, the memory goes back to the pool, which keeps at
most ``buffers`` of them. Taking memory never waits: with none free, new memory is allocated,
so a consumer that keeps many batches costs memory, never a deadlock. Reused memory spares the
page faults of fresh memory, which are most of the cost of collating large batches.

With ``mean`` and ``std`` the copy also normalizes, so that a chain can end at uint8: each
item stays a quarter of its float size until its batch is collated, and is converted once,
into the batch, instead of into a float copy per step (``ToFloat``, ``Normalize``), with the
same values bit for bit and a higher rate (docs/performance.md, "Measurements behind the
code").
"""

from __future__ import annotations

import collections
import threading
import weakref
from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from .. import _shared as shared
from ._image import CHWImage, describe
from ._tensor import Vector, channel_stats

_NUMERIC: Final = frozenset("biuf")
"""The kinds of dtype a batch can be: booleans, integers, floats (no objects, no strings)."""


class _Pool:
    """The ``limit`` buffers given back last, to be taken again by a batch of their size;
    safe from any thread. The oldest goes first: batches that change size (padded to their
    largest image) reuse the sizes they now have, not the first ones."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._free: collections.deque[np.ndarray[Any, Any]] = collections.deque()
        self._lock = threading.Lock()
        self.reused = 0

    def __reduce__(self) -> tuple[type[_Pool], tuple[int]]:
        return _Pool, (self.limit,)  # sent to a worker process: empty, with its own lock

    def take(self, nbytes: int) -> np.ndarray[Any, Any]:
        with self._lock:
            free = self._free
            for at in range(len(free) - 1, -1, -1):  # the newest first
                if free[at].nbytes == nbytes:
                    memory: np.ndarray[Any, Any] = free[at]
                    del free[at]
                    self.reused += 1
                    return memory
        return np.empty(nbytes, dtype=np.uint8)

    def give_back(self, memory: np.ndarray[Any, Any]) -> None:
        with self._lock:
            if self.limit:
                self._free.append(memory)
                if len(self._free) > self.limit:
                    self._free.popleft()


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
        dtype: The batch's dtype (``None``: the first item's; float32 with ``mean``).
        buffers: Memory of up to this many dropped batches is kept for reuse (0: none).
        mean: With ``std``, normalize while collating, per channel: the batch is float32,
            ``(x / 255 - mean) / std`` for uint8 images (what ``ToFloat`` then ``Normalize``
            give, bit for bit) and ``(x - mean) / std`` for float ones (computed in float32).
            End the chain at uint8, after its crops and flips: faster than normalizing each
            item, with a quarter of the memory per item (docs/performance.md).
        std: One value per channel, none zero (with ``mean``).

    Raises:
        ValueError (per batch): Items of different shapes, or (without ``dtype``) of
            different dtypes (both are named), an empty batch, or items whose channels do not
            match ``mean``.
        TypeError (per batch): An item that is not an image of numbers; with ``mean``, one
            that is neither uint8 nor floating point.
    """

    def __init__(
        self,
        layout: str = "NCHW",
        dtype: Any = None,
        buffers: int = 2,
        *,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
    ) -> None:
        if layout not in ("NCHW", "NHWC"):
            raise ValueError(f"ImageCollator: layout must be 'NCHW' or 'NHWC', got {layout!r}")
        if not isinstance(buffers, int) or isinstance(buffers, bool) or buffers < 0:
            raise ValueError(f"ImageCollator: buffers must be an int >= 0, got {buffers!r}")
        self.layout = layout
        self.dtype = None if dtype is None else np.dtype(dtype)
        if self.dtype is not None and self.dtype.kind not in _NUMERIC:
            raise ValueError(f"ImageCollator: dtype must be a numeric dtype, got {self.dtype!r}")
        self.buffers = buffers
        self._pool = _Pool(buffers)
        self._stats: tuple[Vector, Vector, Vector] | None = None
        """``mean``, ``std`` and ``1 / std`` when normalizing."""
        if (mean is None) != (std is None):
            raise ValueError("ImageCollator: give both mean and std, or neither")
        if mean is not None and std is not None:
            if self.dtype not in (None, np.dtype(np.float32)):
                raise ValueError(
                    f"ImageCollator: with mean and std the batch is float32, got dtype={dtype!r}"
                )
            self._stats = channel_stats("ImageCollator", mean, std)
            self.dtype = np.dtype(np.float32)

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
            if item.dtype.kind not in _NUMERIC:
                # Objects copied into raw memory would be pointers nothing counts.
                raise TypeError(f"ImageCollator takes images of numbers, got {describe(item)}")
            if item.shape != first.shape or isinstance(item, CHWImage) != isinstance(
                first, CHWImage
            ):
                # Channels (last for HWC, first for CHW) that alone differ: gray or RGBA
                # images among RGB ones, which Decode keeps as they are.
                axis = 0 if isinstance(first, CHWImage) else 2
                others = [d for n, d in enumerate(item.shape) if n != axis]
                hint = ""
                if others == [d for n, d in enumerate(first.shape) if n != axis]:
                    hint = " (of different channels: add ToRGB() or ToGray() after Decode)"
                raise ValueError(
                    f"ImageCollator: images of different shapes in one batch: "
                    f"{describe(first)} and {describe(item)}{hint}"
                )
            if self.dtype is None and item.dtype != first.dtype:
                # The first's dtype would wrap a uint16 into uint8, and floats in [0, 1] to 0.
                raise ValueError(
                    f"ImageCollator: images of different dtypes in one batch: "
                    f"{describe(first)} and {describe(item)} (give dtype= to convert them)"
                )
        chw_items = isinstance(first, CHWImage)
        if chw_items:
            channels, height, width = first.shape
        else:
            height, width, channels = first.shape
        if self._stats is not None and channels != len(self._stats[0]):
            raise ValueError(
                f"ImageCollator has {len(self._stats[0])} channels' mean and std, "
                f"the images {channels}"
            )
        dims = (channels, height, width) if self.layout == "NCHW" else (height, width, channels)
        shape = (len(items), *dims)
        dtype = self.dtype if self.dtype is not None else first.dtype
        batch = self._allocate(shape, dtype)
        move = None
        if chw_items and self.layout == "NHWC":
            move = (1, 2, 0)
        elif not chw_items and self.layout == "NCHW":
            move = (2, 0, 1)
        if self._stats is None:
            for out, item in zip(batch, items, strict=True):
                source = np.asarray(item)
                np.copyto(out, source if move is None else source.transpose(move), casting="unsafe")
            return batch
        mean, _, scale = self._stats
        per_channel = (-1, 1, 1) if self.layout == "NCHW" else (1, 1, -1)
        mean, scale = mean.reshape(per_channel), scale.reshape(per_channel)
        for out, item in zip(batch, items, strict=True):
            source = np.asarray(item)
            _normalize_into(out, source if move is None else source.transpose(move), mean, scale)
        return batch

    def _allocate(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray[Any, Any]:
        in_shared = shared.empty(shape, dtype)
        if in_shared is not None:  # a worker process: its shared memory is the pool
            return in_shared
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
        normalize = ""
        if self._stats is not None:
            mean, std, _ = self._stats
            normalize = f", mean={mean.tolist()}, std={std.tolist()}"
        return (
            f"ImageCollator(layout={self.layout!r}, dtype={self.dtype}, "
            f"buffers={self.buffers}{normalize})"
        )


def _normalize_into(
    out: np.ndarray[Any, Any], source: np.ndarray[Any, Any], mean: Vector, scale: Vector
) -> None:
    """Write ``source`` normalized into ``out`` (float32): the steps of ``ToFloat`` and
    ``Normalize``, in their order and precision, so the values are theirs bit for bit."""
    if source.dtype == np.uint8:
        # Cast first, then divide in place: the same values, and faster for an HWC image into
        # CHW (docs/performance.md): the strided read is a plain cast, and the division runs
        # on contiguous float32.
        np.copyto(out, source, casting="unsafe")
        np.divide(out, np.float32(255), out=out)
    elif np.issubdtype(source.dtype, np.floating):
        np.copyto(out, source, casting="same_kind")
    else:
        raise TypeError(
            f"ImageCollator with mean and std takes uint8 or float images, got {describe(source)}"
        )
    np.subtract(out, mean, out=out)
    np.multiply(out, scale, out=out)
