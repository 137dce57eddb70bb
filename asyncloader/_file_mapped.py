"""Arrays that map a file, sent to the worker processes as the file, not as its bytes.

A dataset that holds ``np.memmap(path)`` or ``np.load(path, mmap_mode="r")`` (a token file, a
feature matrix: gigabytes), a tensor of ``torch.load(path, mmap=True)``, or an Arrow table
read with ``memory_map=True`` would otherwise be pickled as a copy of every byte of it, in
anonymous memory, when the loader is built. Such an array is pickled as where it lies (the
file's device and inode, the byte range, its layout) and each worker process maps the same
file, once for all the arrays on it: the page cache is shared, as by torch's forked workers,
and nothing is copied. The file is found by path once, as the loader is built, and held open by the
loader from then on if it is still the one mapped (device and inode, checked on that
descriptor); the workers open it through that descriptor (``/proc/<pid>/fd/<n>``), so they
map the same file whatever becomes of its path (replaced, removed), and check it again.

Only a mapping that holds the file's bytes is sent so: a shared one (``mode="r"`` or
``"r+"``), or a private one not written to (``torch.load(mmap=True)``'s, or ``mode="c"``
before any write; one written to holds what the file lacks, and goes as its bytes). In a
worker, a writable array maps the file copy-on-write: its writes stay in that worker, as
they do for the rest of the work.
"""

from __future__ import annotations

import bisect
import mmap
import os
import stat
import sys
import weakref
from typing import Any, Final, NamedTuple

import numpy as np

_SMALLEST: Final = 1 << 16
"""Smaller arrays are copied into the pickle: mapping them costs more than the copy."""

_holding: weakref.WeakSet[mmap.mmap] = weakref.WeakSet()
"""This process's mappings of work files that hold a descriptor (an ``mmap`` keeps one open
before Python 3.13, while it lives): the zygote's check for descriptors that loading opened
leaves them out."""


_maps: weakref.WeakValueDictionary[tuple[int, int, int, int, bool], mmap.mmap] = (
    weakref.WeakValueDictionary()
)
"""This process's mapping of each work file (by the loader's pid and descriptor, the file's
device and inode, and whether copy-on-write), while an array or buffer on it lives."""

_KINDS: Final = (np.ndarray, np.memmap)


class _Mapping(NamedTuple):
    start: int
    end: int
    offset: int
    shared: bool
    writable: bool
    device: int
    inode: int
    path: str


def _mappings() -> list[_Mapping]:
    """This process's file mappings (``/proc/self/maps``)."""
    found = []
    try:
        with open("/proc/self/maps") as maps:
            lines = maps.readlines()
    except OSError:  # not Linux: nothing is sent as a file
        return []
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or fields[4] == "0" or not fields[5].startswith("/"):
            continue
        span, perms, offset, device, inode, path = fields
        start, end = (int(value, 16) for value in span.split("-"))
        major, minor = (int(value, 16) for value in device.split(":"))
        found.append(
            _Mapping(
                start,
                end,
                int(offset, 16),
                perms[3] == "s",
                perms[1] == "w",
                os.makedev(major, minor),
                int(inode),
                path.rstrip("\n"),
            )
        )
    return found


class FileMaps:
    """Finds which arrays map a file, reading this process's mappings once, when first
    asked (a pickle of the work asks for each array in it), and holds each such file open
    (:attr:`files`) for the workers to map: they open it through this process's descriptor,
    so it is the same file whatever becomes of its path (replaced, removed)."""

    def __init__(self) -> None:
        self._mappings: list[_Mapping] | None = None
        self._starts: list[int] = []
        self._unwritten: dict[int, bool] = {}
        self.files: dict[tuple[int, int], int] = {}
        """A descriptor of each file sent so, by device and inode; the caller closes them
        once no worker will map them again."""

    def reduction(self, obj: Any) -> tuple[Any, ...] | None:
        """How ``obj`` is pickled as the range of the file it maps, or ``None`` (it is no
        array or Arrow buffer, maps no file whose bytes it holds, or is small)."""
        kind = type(obj)
        if kind in _KINDS:
            if obj.nbytes < _SMALLEST or obj.dtype.hasobject:
                return None
            low, high = _byte_bounds(obj)
            place = self._place(low, high)
            if place is None:
                return None
            start = obj.__array_interface__["data"][0] - low
            layout = (obj.dtype, obj.shape, obj.strides, start)
            return _mapped_array, (place, high - low, obj.flags.writeable, layout, kind)
        pyarrow = sys.modules.get("pyarrow")
        if pyarrow is not None and kind is pyarrow.Buffer and obj.size >= _SMALLEST:
            # An Arrow table read with memory_map=True (Feather, Arrow IPC) holds such buffers.
            place = self._place(obj.address, obj.address + obj.size)
            if place is None:
                return None
            return _mapped_buffer, (place, obj.size, obj.is_mutable)
        return None  # (a subclass may pickle itself its own way)

    def _place(self, low: int, high: int) -> Place | None:
        """Where the memory from ``low`` to ``high`` lies in a file whose bytes it holds, or
        ``None`` if it does not."""
        if self._mappings is None:
            self._mappings = sorted(_mappings())
            self._starts = [mapping.start for mapping in self._mappings]
        at = bisect.bisect_right(self._starts, low) - 1
        mapping = self._mappings[at] if at >= 0 else None
        if mapping is None or high > mapping.end:
            return None
        if mapping.writable and not mapping.shared:
            if mapping.start not in self._unwritten:  # (a read of smaps: once a mapping)
                self._unwritten[mapping.start] = _unwritten(mapping.start)
            if not self._unwritten[mapping.start]:
                return None  # a private copy, written to: the file lacks what it holds
        key = (mapping.device, mapping.inode)
        if key not in self.files:
            fd = _open_same(mapping.path, key)
            if fd is None:  # removed or replaced since it was mapped: its bytes go as they are
                return None
            self.files[key] = fd
        where = mapping.offset + low - mapping.start
        return Place(os.getpid(), self.files[key], mapping.device, mapping.inode, where)


class Place(NamedTuple):
    """A range's start in a file that a process (the loader's) holds open."""

    pid: int
    fd: int
    device: int
    inode: int
    where: int


def _open_same(path: str, key: tuple[int, int]) -> int | None:
    """A descriptor of the file at ``path`` if it is the regular file of ``key`` (device,
    inode), else ``None``."""
    try:
        return _open_checked(path, key)
    except OSError:
        return None


def _open_checked(name: str, key: tuple[int, int]) -> int:
    """A descriptor of the file at ``name``, opened without blocking (a FIFO put there would
    block the open for ever, and is another file).

    Raises:
        OSError: It cannot be opened, or is not the regular file of ``key`` (device, inode).
    """
    fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    status = os.fstat(fd)
    if (status.st_dev, status.st_ino) != key or not stat.S_ISREG(status.st_mode):
        os.close(fd)
        raise OSError(
            f"cpu_processes: {name} is another file than the one the dataset mapped (the "
            "loader's descriptor of it was closed): its arrays cannot be mapped again"
        )
    return fd


def _unwritten(start: int) -> bool:
    """Whether no page of this process's private mapping at ``start`` was written to: none
    has become its own (``Anonymous``), in memory or swapped out (``/proc/self/smaps``)."""
    try:
        with open("/proc/self/smaps") as smaps:
            inside = False
            for line in smaps:
                first = line.split(maxsplit=1)[0]
                if "-" in first and not first.endswith(":"):  # a mapping's first line
                    inside = int(first.split("-")[0], 16) == start
                elif inside and first in ("Anonymous:", "Swap:") and line.split()[1] != "0":
                    return False
    except OSError:
        return False
    return True


def _byte_bounds(array: np.ndarray[Any, Any]) -> tuple[int, int]:
    bounds = getattr(np.lib, "array_utils", np).byte_bounds  # NumPy 2 moved it
    low, high = bounds(array)
    return int(low), int(high)


def _mapped_array(
    place: Place,
    length: int,
    writable: bool,
    layout: tuple[np.dtype[Any], tuple[int, ...], tuple[int, ...], int],
    kind: type[np.ndarray[Any, Any]],
) -> np.ndarray[Any, Any]:
    """The array of ``layout`` over ``length`` bytes of the file at ``place`` (in a worker
    process).

    Raises:
        OSError: As :func:`_map`.
    """
    dtype, shape, strides, start = layout
    mapped = _map(place, length, writable)
    array: np.ndarray[Any, Any] = np.ndarray(
        shape, dtype, buffer=mapped, offset=place.where + start, strides=strides
    )
    return array if kind is np.ndarray else array.view(kind)


def _mapped_buffer(place: Place, length: int, mutable: bool) -> Any:
    """An Arrow buffer over ``length`` bytes of the file at ``place`` (in a worker process).

    Raises:
        OSError: As :func:`_map`.
    """
    import pyarrow

    view = memoryview(_map(place, length, mutable))[place.where : place.where + length]
    return pyarrow.py_buffer(view if mutable else view.toreadonly())


def _map(place: Place, length: int, writable: bool) -> mmap.mmap:
    """This process's mapping of the whole file at ``place`` (copy-on-write if ``writable``),
    one for all the arrays on it: views of one file share its memory here as they did in the
    loader's process, and a dataset of many arrays holds one mapping, not one each.

    Raises:
        OSError: The file cannot be opened (the loader's process is gone), is not the one
            that was mapped, or is now shorter.
    """
    key = (place.pid, place.fd, place.device, place.inode, writable)
    mapped = _maps.get(key)
    if mapped is not None and len(mapped) >= place.where + length:
        return mapped
    # The loader's own descriptor of it: the same file, whatever became of its path.
    name = f"/proc/{place.pid}/fd/{place.fd}"
    try:
        fd = _open_checked(name, (place.device, place.inode))
    except OSError as error:
        if error.errno is None:  # it opened, and is another file: said so already
            raise
        raise OSError(
            f"cpu_processes: the file the dataset mapped cannot be opened through the loader's "
            f"descriptor of it ({name}: {error.strerror}); is the loader's process gone?"
        ) from error
    try:
        status = os.fstat(fd)
        if status.st_size < place.where + length:
            raise OSError(
                f"cpu_processes: the file the dataset mapped is shorter ({status.st_size} "
                f"bytes) than when it mapped it ({place.where + length} bytes or more)"
            )
        access = mmap.ACCESS_COPY if writable else mmap.ACCESS_READ
        if sys.version_info >= (3, 13):
            mapped = mmap.mmap(fd, status.st_size, access=access, trackfd=False)
        else:
            mapped = mmap.mmap(fd, status.st_size, access=access)
            _holding.add(mapped)
    finally:
        os.close(fd)
    _maps[key] = mapped
    return mapped


def descriptors_held() -> int:
    """How many descriptors this process's mappings of work files hold."""
    return len(_holding)
