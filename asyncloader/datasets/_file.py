"""``FileDataset``: whole files read from a local or mounted file system.

It is a *sync* dataset: the loader's I/O threads (sized to the requests in flight) each make
one hop that opens, reads and closes a file, or it runs inline on the direct path. That is
faster than ``aiofiles``, which makes a thread hop for each of open, read and close
(``benches/bench_datasets.py --only files``; docs/performance.md), so aiofiles is not used.

With ``mmap=True`` an item is a read-only map of the file's pages in the page cache instead of
a copy: reading a file into fresh memory costs its page faults and a copy, mapping it costs
its page-table entries, filled at once (``MAP_POPULATE``) so that the training step touching
the bytes takes no faults. That is much faster for a file the kernel caches in large folios,
and about a read's speed for one cached in 4 KiB pages (``docs/settings.md``); so it is not
the default.
"""

from __future__ import annotations

import errno
import io
import mmap as _mmap
import os
import threading
from collections.abc import Callable
from typing import IO, Final

from .._mapping import KEEPS_DESCRIPTOR, map_fd
from ._http import _check_max_bytes
from ._locations import Locations
from ._open import open_regular
from ._retry import AttemptFailed, Retry, retrying_sync
from ._streaming import STREAM_CHUNK, Blocking, Sink

_TRANSIENT_ERRNOS: Final = frozenset({errno.EINTR, errno.EAGAIN, errno.ETIMEDOUT})

_MAP_FLAGS: Final = _mmap.MAP_SHARED | getattr(_mmap, "MAP_POPULATE", 0)
"""Shared (no copy on write: the map is read-only); populated at once where the system can
(Linux), so that the I/O thread, not the training step, takes the page faults."""


_HELD_MAPS: Final = (
    "before Python 3.13 each item of mmap=True keeps a descriptor open while you hold it "
    "(see `ulimit -n`): hold fewer, or copy what you keep (bytes(item))"
)


class FileDataset:
    """A dataset whose item ``i`` is the content of file ``locations[i]``, as ``bytes`` (or a
    read-only map of it, with ``mmap=True``).

    Args:
        locations: A list of paths (``str`` or ``pathlib`` paths), a function of the index, or a
            :class:`~asyncloader.Template` (a value containing ``/``, ``\\``, NUL, or equal to
            ``.``/``..`` is refused when the dataset is built).
        root: The folder that relative locations are read from. When set, an item whose path
            leaves it (by ``..``, an absolute path, or a symbolic link on its way, also one
            swapped in while the file is opened) fails with ``PermissionError``. Links that
            stay beneath it are followed.
        length: The number of items, for a function or a template of scalars only.
        retry: Retries for ``EINTR``, ``EAGAIN`` and ``ETIMEDOUT`` only.
        max_bytes: The largest file accepted (checked from its size before reading).
        mmap: Map each file into memory instead of reading it: an item is a read-only
            :class:`mmap.mmap` (a bytes-like buffer: ``len``, slices, ``memoryview``,
            ``numpy.frombuffer``) over the file's cached pages, with no copy; ``bytes(item)``
            copies it. An empty file is ``b""``. The map lives as long as you hold the item
            (before Python 3.13 with a descriptor open: mind ``ulimit -n`` when you keep
            many; from 3.13 it keeps none, so ``len(item)`` is its size, not ``size()``).
            For files that nothing truncates while they are read: touching a map whose file
            was cut short kills the process with ``SIGBUS``, as with any memory map.

    Only regular files are read: a FIFO, a device or a socket fails its item with an
    ``OSError`` that says what it is (instead of blocking, or reading forever).
    """

    def __init__(
        self,
        locations: object,
        *,
        root: str | os.PathLike[str] | None = None,
        length: int | None = None,
        retry: Retry | None = None,
        max_bytes: int | None = None,
        mmap: bool = False,
    ) -> None:
        if not isinstance(mmap, bool):
            raise TypeError(f"mmap must be True or False, got {mmap!r}")
        self.mmap = mmap
        self.locations = Locations(locations, "path", length)
        self.root = None if root is None else os.fspath(root)
        if self.root is not None and not os.path.isdir(self.root):  # else every item fails
            raise ValueError(f"root {self.root!r} is not a folder")
        self._real_root = None if self.root is None else os.path.realpath(self.root)
        self.retry = retry if retry is not None else Retry()
        if not isinstance(self.retry, Retry):
            raise TypeError(f"retry must be a Retry, got {retry!r}")
        self.max_bytes = _check_max_bytes(max_bytes)

    def __len__(self) -> int:
        return len(self.locations)

    def path(self, index: int) -> str:
        """The path item ``index`` is read from, as given (joined to ``root``).

        Nothing is checked here: the read itself opens the path beneath ``root`` and refuses
        what leaves it (see :mod:`._open`), so that the file read is the file checked.

        Raises:
            IndexError: ``index`` is out of range.
        """
        location = self.locations[index]
        assert isinstance(location, str)
        return location if self.root is None else os.path.join(self.root, location)

    def __getitem__(self, index: int) -> bytes | _mmap.mmap:
        location = self.locations[index]
        assert isinstance(location, str)
        return self.read(location)

    def read(self, location: str) -> bytes | _mmap.mmap:
        """The file at ``location`` (beneath ``root``), read as an item is: with the checks,
        limits and retries above."""
        return retrying_sync(self.retry, lambda: self._load(location))

    async def stream(self, index: int, sink: Sink, blocking: Blocking) -> None:
        """File ``index``, chunk by chunk into ``sink``: opened beneath ``root`` and checked to
        be a regular file within ``max_bytes`` as an item is (and the bytes read, so a file
        that grows as it is read stops there), each read a ``blocking`` call."""
        location = self.locations[index]
        assert isinstance(location, str)
        await self.stream_location(location, sink, blocking)

    async def stream_location(self, location: str, sink: Sink, blocking: Blocking) -> None:
        """The file at ``location``, chunk by chunk into ``sink``, as :meth:`stream` says."""
        file = _Shared()
        try:
            await blocking(
                file.open, lambda: retrying_sync(self.retry, lambda: self._open(location))
            )
            size = 0
            while chunk := await blocking(file.read, STREAM_CHUNK):
                size += len(chunk)
                # Its size was checked when it was opened: a file that grew since is caught
                # too (a writer that keeps appending would be read without end).
                if self.max_bytes is not None and size > self.max_bytes:
                    raise ValueError(f"{location!r} is over max_bytes={self.max_bytes}")
                await sink(chunk)
        finally:
            file.close()

    def open_file(self, index: int, loop: object = None) -> IO[bytes]:
        """File ``index`` opened for reading anywhere in it (blocking): beneath ``root``, a
        regular file within ``max_bytes``, as an item is."""
        location = self.locations[index]
        assert isinstance(location, str)
        return self.open_location(location)

    def open_location(self, location: str) -> IO[bytes]:
        """The file at ``location`` opened as :meth:`open_file` says."""
        return retrying_sync(self.retry, lambda: self._open(location))

    def _open(self, location: str) -> IO[bytes]:
        try:
            fd, size = open_regular(location, self.root, self._real_root)
        except OSError as error:
            raise AttemptFailed(error, transient=error.errno in _TRANSIENT_ERRNOS) from None
        try:
            self._check_size(location, size)
        except BaseException:
            os.close(fd)
            raise
        return open(fd, "rb", buffering=0)

    def _load(self, location: str) -> bytes | _mmap.mmap:
        try:
            fd, size = open_regular(location, self.root, self._real_root)
            with open(fd, "rb", buffering=0) as file:
                self._check_size(location, size)
                if self.mmap and size > 0:
                    # The map keeps the file's pages; the descriptor can close at once.
                    return map_fd(fd, size, flags=_MAP_FLAGS, prot=_mmap.PROT_READ)
                # A size of 0 may be a file of the kernel's (/proc) whose data only a read gets.
                return self._read(file, location, size)
        except AttemptFailed:
            raise
        except OSError as error:
            if error.errno == errno.EMFILE and self.mmap and KEEPS_DESCRIPTOR:
                error = OSError(error.errno, f"{error.strerror}: {_HELD_MAPS}", location)
            raise AttemptFailed(error, transient=error.errno in _TRANSIENT_ERRNOS) from None

    def _read(self, file: io.FileIO, path: str, size: int) -> bytes:
        if self.max_bytes is None:
            return file.readall()
        data = read_at_most(file, self.max_bytes + 1, size)  # a file that grew is caught too
        if len(data) > self.max_bytes:
            raise AttemptFailed(
                ValueError(f"{path!r} is over max_bytes={self.max_bytes}"), transient=False
            )
        return data

    def _check_size(self, path: str, size: int) -> None:
        if self.max_bytes is not None and size > self.max_bytes:
            raise AttemptFailed(
                ValueError(f"{path!r} is {size} bytes, over max_bytes={self.max_bytes}"),
                transient=False,
            )

    def __repr__(self) -> str:
        mapped = ", mmap=True" if self.mmap else ""
        return f"FileDataset({len(self)} items, root={self.root!r}{mapped})"


def read_at_most(file: IO[bytes], limit: int, expected: int) -> bytes:
    """The next ``limit`` bytes of the unbuffered ``file``, fewer only at its end, read at
    once where ``expected`` says how many there are.

    One read may give less than it was asked, and that is not the end: Linux gives at most
    2 GiB less 4 KiB a read, a kernel file (``/proc``) a page, a network or FUSE file system
    what it has at hand. Only a read that gives nothing is.
    """
    parts = []
    taken = 0
    while taken < limit:
        # The rest expected and a byte more, to see the end; then a byte, to see it; then
        # chunks, of a file that grew or a kernel file of no size.
        wanted = expected - taken + 1 if taken <= expected else STREAM_CHUNK
        part = file.read(min(limit - taken, wanted))
        if not part:
            break
        parts.append(part)
        taken += len(part)
    return b"".join(parts)  # the one part itself when one read took it all


class _Shared:
    """A file opened and read on other threads, closed from the loop: a stream cancelled while
    its open or read runs closes the file once that call returns, never under it (a closed
    descriptor's number can be reused by the next file opened)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._file: IO[bytes] | None = None
        self._busy = False
        self._closed = False

    def open(self, opener: Callable[[], IO[bytes]]) -> None:
        file = opener()
        with self._lock:
            if not self._closed:
                self._file = file
                return
        file.close()

    def read(self, size: int) -> bytes:
        with self._lock:
            if self._closed or self._file is None:
                return b""
            self._busy, file = True, self._file
        try:
            return file.read(size)
        finally:
            with self._lock:
                self._busy = False
                if self._closed:
                    file.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._file is not None and not self._busy:
                self._file.close()
