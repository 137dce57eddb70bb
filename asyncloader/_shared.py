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
from typing import TYPE_CHECKING, Any, Final

import numpy as np

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

from ._mapping import KEEPS_DESCRIPTOR, map_fd
from ._reword import reword
from ._settings import spare_descriptors

CONTROL_SIZE: Final = 4096
"""One control byte per segment: 1 while the loader may still use it."""

_KEEP_FREE: Final = 1
"""Free segments a worker keeps for reuse; more are closed. A worker makes one batch at a
time, and a consumer drops batches one at a time, in order: one free segment is the next
batch's; each more kept is a batch of idle memory."""

HELD_MAX: Final = 1024
"""The most segments of a worker's that the loader holds at once (each a mapping in both
processes). Past the limit a batch is written to ordinary memory and pickled in band, one
copy: a consumer that keeps every batch (``list(loader)``) would otherwise take a mapping
per batch until the process had none left (``vm.max_map_count``), or a descriptor per
batch (below) until it had none of those."""


def held_limit(processes: int) -> int:
    """How many segments each of ``processes`` workers may leave with the loader at once.

    :data:`HELD_MAX`; before Python 3.13 a mapping keeps a descriptor of its own in each
    process, so fewer where the descriptors would run out: the process's spare ones,
    shared among the workers.
    """
    spare = spare_descriptors() if KEEPS_DESCRIPTOR else None
    if spare is None:
        return HELD_MAX
    return max(4, min(HELD_MAX, spare // max(processes, 1)))


_ALIGN: Final = 64
"""Where each buffer copied into shared memory starts: any dtype's alignment, a cache line."""

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
        self.fd: int | None = anonymous(size)
        """The descriptor until it is handed to the loader; the mapping is what stays."""
        self.map = map_fd(self.fd, size)
        self.address = _address(memoryview(self.map))

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.map.close()


class Arena:
    """A worker's segments and its control page (the worker's side).

    Only the worker's one thread uses it: :meth:`empty` during a job, :meth:`pack` at its end.
    """

    def __init__(self, held: int = HELD_MAX) -> None:
        self.held = held
        """Segments the loader may hold at once (:func:`held_limit`)."""
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

    def empty(self, nbytes: int) -> np.ndarray[Any, np.dtype[np.uint8]] | None:
        """``nbytes`` of shared memory for this job's batch: a free segment of about that
        size, or a new one; ``None`` when the loader holds as many as it may."""
        number = self._take(nbytes)
        if number is None:
            return None
        return np.frombuffer(self.segments[number].map, dtype=np.uint8, count=nbytes)

    def _take(self, nbytes: int) -> int | None:
        free = [
            (segment.size, number)
            for number, segment in self.segments.items()
            if nbytes <= segment.size <= 2 * nbytes + mmap.PAGESIZE
            and number not in self._claimed
            and self.control[number] == 0
        ]
        if free:
            best = min(free)[1]
        elif self._room():
            best = self._create(nbytes)
        else:
            return None
        self._claimed.add(best)
        return best

    def _room(self) -> bool:
        """Whether one more segment may go to the loader."""
        taken = sum(self.control[number] for number in self.segments) + len(self._claimed)
        return taken < self.held

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
            self.segments.pop(number).close()
            if number in self._new:
                self._new.remove(number)
            else:
                self._dropped.append(number)

    def _within(self, buffer: memoryview) -> Ref | None:
        """Where ``buffer`` lies in a segment of this job's, if it does."""
        address, nbytes = _address(buffer), buffer.nbytes
        for number in self._claimed:
            segment = self.segments[number]
            if segment.address <= address and address + nbytes <= segment.address + segment.size:
                return number, address - segment.address, nbytes
        return None

    def _copy(self, buffers: list[memoryview]) -> list[Ref]:
        """``buffers`` copied into one segment: one, however many arrays a batch holds (a
        segment each was a descriptor and a mapping each)."""
        offsets, end = [], 0
        for buffer in buffers:
            offsets.append(end)
            end += -(-buffer.nbytes // _ALIGN) * _ALIGN
        number = self._take(end)
        assert number is not None  # room was there when the pickling started, and is still
        memory = self.segments[number].map
        for buffer, offset in zip(buffers, offsets, strict=True):
            memory[offset : offset + buffer.nbytes] = buffer.cast("B")
        return [(number, at, buffer.nbytes) for buffer, at in zip(buffers, offsets, strict=True)]

    def pack(self, value: Any) -> tuple[bytes, list[Ref], list[tuple[int, int]], list[int]]:
        """Pickle ``value`` with its buffers in shared memory (in band once the loader
        holds as many segments as it may).

        Returns:
            The pickle, its buffers' references, the segments created since the last call
            (``(number, size)``: their descriptors go to the loader with the result) and the
            numbers of the segments closed since.
        """
        refs: list[Ref | None] = []
        elsewhere: list[tuple[int, memoryview]] = []
        in_band = not self._room()

        def out_of_band(buffer: pickle.PickleBuffer) -> bool:
            raw = buffer.raw()
            ref = self._within(raw)
            if ref is None and in_band:
                return True
            if ref is None:
                elsewhere.append((len(refs), raw))
            refs.append(ref)
            return False

        try:
            stream = io.BytesIO()
            _dump_batch(_Pickler(stream, out_of_band), value)
            if elsewhere:
                copied = self._copy([raw for _, raw in elsewhere])
                for (at, _), ref in zip(elsewhere, copied, strict=True):
                    refs[at] = ref
        except BaseException:
            self.release()
            raise
        placed = [ref for ref in refs if ref is not None]
        for number in {ref[0] for ref in placed}:
            self.control[number] = 1  # the loader's until it drops the last view
        self._claimed.clear()
        self._trim(_KEEP_FREE)
        new = [(number, self.segments[number].size) for number in self._new]
        dropped, self._new, self._dropped = self._dropped, [], []
        return stream.getvalue(), placed, new, dropped

    def release(self) -> None:
        """Free the segments claimed by a job that failed (they stay for reuse)."""
        self._claimed.clear()

    def hand_over(self, numbers: list[int]) -> list[int]:
        """The descriptors of new segments ``numbers``, now the caller's to send to the loader
        and close: the worker keeps only its mappings, so a segment the loader holds costs
        the worker no descriptor."""
        fds = []
        for number in numbers:
            segment = self.segments[number]
            assert segment.fd is not None
            fds.append(segment.fd)
            segment.fd = None
        return fds


class _Pickler(pickle.Pickler):
    """Protocol 5, with a dense CPU tensor pickled as the NumPy array it shares memory with, so
    that its data goes out of band too (torch's own pickling copies it in band)."""

    def __init__(self, stream: SupportsWrite[bytes], buffer_callback: Any) -> None:
        super().__init__(stream, protocol=5, buffer_callback=buffer_callback)

    def reducer_override(self, obj: Any) -> Any:
        return tensor_reduction(obj) or NotImplemented


def tensor_reduction(obj: Any) -> tuple[Any, ...] | None:
    """How a dense CPU tensor is pickled with its data out of band: as the array it shares
    memory with, or as an array of its bytes if NumPy lacks its dtype. ``None`` for anything
    else, which pickle (torch, for another tensor) pickles its own way."""
    torch = sys.modules.get("torch")
    if (
        torch is None
        or type(obj) is not torch.Tensor
        or obj.device.type != "cpu"
        or obj.layout != torch.strided  # a sparse one is torch's to pickle (in band)
        or obj.is_nested  # strided too, but of no one size
        or obj.is_quantized
        or obj.requires_grad
    ):
        return None
    numpy = str(obj.dtype) in _NUMPY_DTYPES
    if (numpy or obj.dtype == torch.bfloat16) and (
        obj.numel() * obj.element_size() > obj.untyped_storage().nbytes()
    ):
        return None  # an expanded view: torch pickles the few elements it repeats
    # A lazy conjugate or negation is resolved: NumPy has no such bit (a copy only then).
    tensor = obj.resolve_conj().resolve_neg().contiguous()
    if numpy:
        return torch.from_numpy, (tensor.numpy(),)
    # A dtype NumPy lacks crosses as its bytes: torch's own pickling of some (uint16,
    # float8, complex32) cannot be loaded again, and it copies the data in band.
    return _from_bytes, (tensor.reshape(-1).view(torch.uint8).numpy(), obj.dtype, obj.shape)


class Discard:
    """A file that keeps nothing written to it: for a pickle made only to see that it can
    be."""

    def write(self, data: bytes) -> int:
        return len(data)


def check_packable(value: Any) -> None:
    """Raise what :meth:`Arena.pack` would raise for ``value`` in a worker (its out-of-band
    buffers passed over, not copied)."""
    _dump_batch(_Pickler(Discard(), _passed_over), value)


WHAT_PICKLES: Final = (
    "what pickles (arrays, tensors, bytes, numbers, str, and lists, tuples and dicts of them)"
)
"""What crosses between the loader and a worker, in the words an error gives a user."""


def _dump_batch(pickler: pickle.Pickler, batch: Any) -> None:
    """Pickle ``batch``; what fails says that a batch must pickle, in the user's terms."""
    try:
        pickler.dump(batch)
    except MemoryError:  # it would pickle, given room
        raise
    except Exception as error:
        said = (
            "cpu_processes: this batch cannot go back to the loader's process, which takes "
            "batches pickled"
        )
        advice = f"return {WHAT_PICKLES} from the transform and collate_fn, or use cpu_threads"
        reword(error, f"{said}: {error}; {advice}", f"{said}; {advice}")
        raise


def _passed_over(buffer: pickle.PickleBuffer) -> bool:
    return False  # out of band: left out of the pickle, and not copied anywhere


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


def _from_bytes(data: Any, dtype: Any, shape: Any) -> Any:
    """A tensor made again from its bytes (``data``, an array of uint8), sharing them."""
    import torch

    return torch.from_numpy(data).view(dtype).reshape(shape)


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
    memory = _arena.empty(count * dtype.itemsize)
    if memory is None:  # the loader holds as many of the worker's segments as it may
        return None
    array: np.ndarray[Any, Any] = memory.view(dtype)
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
            self.maps[number] = map_fd(fd, size)
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
