"""Shared memory between a worker process and the loader, so batches come back uncopied.

A worker owns its segments. Each is anonymous memory: a memfd, or else an unlinked temporary
file. The worker maps it, and so does the loader once the worker has passed it the descriptor
over its socket. Nothing gets a name in ``/dev/shm``, so nothing is left behind, whoever dies
and however: the kernel frees a segment with its last descriptor and mapping.

A batch's arrays are written into segments: a collator asks :func:`empty` for its output, and
any other out-of-band buffer of pickle protocol 5 is copied into one. The batch is pickled
with references to them. The loader rebuilds each buffer on its mapping of the segment. When
the last view of a segment is gone (the batch, a tensor made by ``torch.from_numpy``), the
segment's byte in the worker's control page goes back to free, and the worker reuses the
segment for a later batch.
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import sys
import tempfile
import weakref
from typing import Any, Final

import numpy as np

CONTROL_SIZE: Final = 4096
"""One control byte per segment: 1 while the loader may still use it."""

_KEEP_FREE: Final = 1
"""Free segments a worker keeps for reuse; more are closed. A worker makes one batch at a
time, and a consumer drops batches one at a time, in order: one free segment is the next
batch's; each more kept is a batch of idle memory."""

Ref = tuple[int, int, int]
"""A buffer in a segment: ``(segment, offset, bytes)``."""


def anonymous(size: int, label: str = "asyncloader", sealed: bool = False) -> int:
    """A descriptor of ``size`` bytes of zeroed memory that no name refers to (``label`` is
    what ``/proc`` shows of it; ``sealed``: seals may be added to it)."""
    if hasattr(os, "memfd_create"):
        flags = os.MFD_CLOEXEC | (os.MFD_ALLOW_SEALING if sealed else 0)
        fd = os.memfd_create(label, flags)
    else:  # pragma: no cover - not Linux
        with tempfile.TemporaryFile() as file:
            fd = os.dup(file.fileno())
    os.ftruncate(fd, max(size, 1))
    return fd


def _address(buffer: memoryview) -> int:
    return int(np.frombuffer(buffer, dtype=np.uint8).ctypes.data)


class _Segment:
    __slots__ = ("address", "fd", "map", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.fd = anonymous(size)
        self.map = mmap.mmap(self.fd, size)
        self.address = _address(memoryview(self.map))


class Arena:
    """A worker's segments and its control page (the worker's side).

    Only the worker's one thread uses it: :meth:`empty` during a job, :meth:`pack` at its end.
    """

    def __init__(self) -> None:
        self.control_fd = anonymous(CONTROL_SIZE)
        self.control = mmap.mmap(self.control_fd, CONTROL_SIZE)
        self.segments: dict[int, _Segment] = {}
        self.created = 0
        """Segments created so far (a reused one is not created)."""
        self._claimed: set[int] = set()
        self._new: list[int] = []
        """Segments the loader has not mapped yet: their descriptors go with the next result."""
        self._dropped: list[int] = []
        """Segments closed since the last result that the loader had mapped."""

    def empty(self, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """``nbytes`` of shared memory for this job's batch: a free segment of about that
        size, or a new one."""
        number = self._take(nbytes)
        return np.frombuffer(self.segments[number].map, dtype=np.uint8, count=nbytes)

    def _take(self, nbytes: int) -> int:
        free = [
            (segment.size, number)
            for number, segment in self.segments.items()
            if nbytes <= segment.size <= 2 * nbytes + mmap.PAGESIZE
            and number not in self._claimed
            and self.control[number] == 0
        ]
        best = min(free)[1] if free else None
        if best is None:
            best = self._create(nbytes)
        self._claimed.add(best)
        return best

    def _create(self, nbytes: int) -> int:
        self._trim(_KEEP_FREE - 1)  # room for the new one among the free
        number = next(n for n in range(CONTROL_SIZE) if n not in self.segments)
        size = -(-max(nbytes, 1) // mmap.PAGESIZE) * mmap.PAGESIZE
        self.segments[number] = _Segment(size)
        self._new.append(number)
        self.created += 1
        return number

    def _trim(self, keep: int) -> None:
        """Close the free segments beyond ``keep``, the oldest first."""
        free = [
            number
            for number in self.segments
            if self.control[number] == 0 and number not in self._claimed
        ]
        for number in free[: max(0, len(free) - keep)]:
            segment = self.segments.pop(number)
            os.close(segment.fd)
            segment.map.close()
            if number in self._new:
                self._new.remove(number)
            else:
                self._dropped.append(number)

    def _locate(self, buffer: memoryview) -> Ref:
        address, nbytes = _address(buffer), buffer.nbytes
        for number in self._claimed:
            segment = self.segments[number]
            if segment.address <= address and address + nbytes <= segment.address + segment.size:
                return number, address - segment.address, nbytes
        number = self._take(nbytes)  # not written in shared memory: one copy into it
        self.segments[number].map[:nbytes] = buffer
        return number, 0, nbytes

    def pack(self, value: Any) -> tuple[bytes, list[Ref], list[tuple[int, int]], list[int]]:
        """Pickle ``value`` with its buffers in shared memory.

        Returns:
            The pickle, its buffers' references, the segments created since the last call
            (``(number, size)``: their descriptors go to the loader with the result) and the
            numbers of the segments closed since.
        """
        refs: list[Ref] = []

        def out_of_band(buffer: pickle.PickleBuffer) -> bool:
            refs.append(self._locate(buffer.raw()))
            return False

        try:
            stream = io.BytesIO()
            _Pickler(stream, out_of_band).dump(value)
        except BaseException:
            self.release()
            raise
        for number in {ref[0] for ref in refs}:
            self.control[number] = 1  # the loader's until it drops the last view
        self._claimed.clear()
        self._trim(_KEEP_FREE)
        new = [(number, self.segments[number].size) for number in self._new]
        dropped, self._new, self._dropped = self._dropped, [], []
        return stream.getvalue(), refs, new, dropped

    def release(self) -> None:
        """Free the segments claimed by a job that failed (they stay for reuse)."""
        self._claimed.clear()

    def fds(self, numbers: list[int]) -> list[int]:
        """The descriptors of segments ``numbers``."""
        return [self.segments[number].fd for number in numbers]


class _Pickler(pickle.Pickler):
    """Protocol 5, with a CPU tensor pickled as the NumPy array it shares memory with, so that
    its data goes out of band too (torch's own pickling copies it in band)."""

    def __init__(self, stream: io.BytesIO, buffer_callback: Any) -> None:
        super().__init__(stream, protocol=5, buffer_callback=buffer_callback)

    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if (
            torch is not None
            and type(obj) is torch.Tensor
            and obj.device.type == "cpu"
            and not obj.requires_grad
            and str(obj.dtype) in _NUMPY_DTYPES
        ):
            return torch.from_numpy, (obj.contiguous().numpy(),)
        return NotImplemented


_NUMPY_DTYPES: Final = frozenset(
    (
        "torch.float16",
        "torch.float32",
        "torch.float64",
        "torch.uint8",
        "torch.int8",
        "torch.int16",
        "torch.int32",
        "torch.int64",
        "torch.bool",
        "torch.complex64",
        "torch.complex128",
    )
)
"""The tensor dtypes NumPy has too (not bfloat16): these tensors cross as arrays."""


_arena: Arena | None = None


def set_arena(arena: Arena | None) -> None:
    """Make ``arena`` the one :func:`empty` allocates from (a worker process, at its start)."""
    global _arena
    _arena = arena


def in_worker() -> bool:
    """Whether this is a worker process, whose batches go into shared memory."""
    return _arena is not None


def empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray[Any, Any] | None:
    """An uninitialised array in shared memory when running in a worker process, else
    ``None`` (the caller allocates as usual). An array of Python objects is never in shared
    memory: its references mean nothing in another process (it is pickled by value)."""
    dtype = np.dtype(dtype)
    if _arena is None or dtype.hasobject:
        return None
    count = 1
    for dim in shape:
        count *= dim
    array: np.ndarray[Any, Any] = _arena.empty(count * dtype.itemsize).view(dtype)
    return array.reshape(shape)


def _free(control: mmap.mmap, number: int) -> None:
    if not control.closed:
        control[number] = 0


class Mapped:
    """One worker's segments as the loader maps them (the loader's side)."""

    def __init__(self, control_fd: int) -> None:
        self.control = mmap.mmap(control_fd, CONTROL_SIZE)
        os.close(control_fd)
        self.maps: dict[int, mmap.mmap] = {}

    def update(self, new: list[tuple[int, int]], fds: list[int], dropped: list[int]) -> None:
        """Forget the segments the worker closed (a mapping closes once its views are gone),
        then map its new ones (``(number, size)``) from their descriptors, and close those.
        In that order: a new segment may have the number of one closed."""
        for number in dropped:
            self.maps.pop(number, None)
        for (number, size), fd in zip(new, fds, strict=True):
            self.maps[number] = mmap.mmap(fd, size)
            os.close(fd)

    def unpack(self, data: bytes, refs: list[Ref]) -> Any:
        """The value pickled by :meth:`Arena.pack`, its buffers on the shared segments.

        A segment is freed when the last view of it is gone; if unpickling fails, now.
        """
        holders: dict[int, np.ndarray[Any, Any]] = {}
        buffers = []
        try:
            for number, offset, nbytes in refs:
                if number not in holders:
                    holder = np.frombuffer(self.maps[number], dtype=np.uint8)
                    weakref.finalize(holder, _free, self.control, number)
                    holders[number] = holder
                buffers.append(holders[number][offset : offset + nbytes])
        except BaseException:
            self.free(refs)
            raise
        return pickle.loads(data, buffers=buffers)

    def free(self, refs: list[Ref]) -> None:
        """Free the segments of a result nobody takes (its batch was cancelled)."""
        for number, _, _ in refs:
            _free(self.control, number)
