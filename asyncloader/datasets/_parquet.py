"""``ParquetShards``: rows of Parquet files on files or object stores, row group by row group.

The shards' walk (order, ranks, round-robin, shuffle buffer, exact resume) is
:class:`._shards.ShardStream`'s; a Parquet shard is read one row group at a time on the
shards' threads (pyarrow releases the interpreter lock while it reads and decodes), the
footer first, then each row group's column chunks: from a file, reads of it; from an object
store or an HTTP server, range GETs. A resumed walk skips the row groups it had taken whole, unread.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import io
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Final

from .._stats import note_bytes
from ._http import _check_max_bytes
from ._parquet_footer import Group, parse_groups, read_footer
from ._parquet_sizes import (
    ROWS_A_STEP,
    least_decoded,
    made,
    missing_column,
    read_columns,
    rows_a_step,
    size_read,
    top_names,
)
from ._shards import Shard, ShardStream
from ._streaming import Blocking
from ._tar import ShardError

_EXIT_WAIT_S: Final = 10.0
"""How long the interpreter's exit waits for the reads in progress to return (see
:func:`_close_at_exit`)."""
_OWN: Final = frozenset({"__shard__", "__row__"})
"""The keys the loader gives each row: a column of such a name would be replaced."""

_opened: set[_Opened] = set()
_opened_lock = threading.Lock()
_exiting = False


def _close_at_exit() -> None:
    """Close every Parquet file still open, each once its read in progress returns (for
    :data:`_EXIT_WAIT_S` in all), and start no read after.

    pyarrow must not be running on a daemon thread (a shard's reader, the thread that closes
    a shard whose epoch was left) when the interpreter finalizes: such a thread is ended
    where it stands, its C++ frames unwound, and the process aborts.
    """
    global _exiting
    with _opened_lock:
        _exiting = True
        files = list(_opened)
    deadline = time.monotonic() + _EXIT_WAIT_S
    for file in files:
        if file.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            try:
                file.close_locked()
            finally:
                file.lock.release()


def _forget() -> None:
    """In a forked child: the parent's files, and the lock (held by one of its threads, it
    may be), are the parent's."""
    global _opened, _opened_lock
    _opened, _opened_lock = set(), threading.Lock()


atexit.register(_close_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)


class _Counted(io.RawIOBase):
    """A shard's file (a file's, or one whose reads are range requests) that counts the bytes
    read of it: what pyarrow and the checks read, no more. pyarrow may read on threads of its
    own, where no epoch's statistics are seen, so the count is taken (:meth:`taken`) on the
    thread that asked for the reads."""

    def __init__(self, raw: Any) -> None:
        super().__init__()
        self._raw = raw
        self._count = 0
        self._lock = threading.Lock()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        position: int = self._raw.tell()
        return position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        position: int = self._raw.seek(offset, whence)
        return position

    def read(self, size: int = -1) -> bytes:
        data: bytes = self._raw.read(size)
        self._add(len(data))
        return data

    def readinto(self, buffer: Any) -> int:
        count: int = self._raw.readinto(buffer)
        self._add(count)
        return count

    def _add(self, count: int) -> None:
        with self._lock:
            self._count += count

    def taken(self) -> int:
        """The bytes read since the last call."""
        with self._lock:
            count, self._count = self._count, 0
        return count

    def close(self) -> None:
        try:
            self._raw.close()
        finally:
            super().close()


class _Opened:
    """A Parquet file whose reads and close take turns: a cancelled read closes it after."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.raw: Any = None
        self.file: Any = None
        self._steps: Any = None
        """The row group being read: its batches of decoded rows, a step at a time."""
        self._decoded = 0

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """Hold the file for reads, and count what they read in the epoch's statistics, on
        this thread (pyarrow's own threads see no epoch)."""
        with self.lock:
            try:
                yield
            finally:
                if self.raw is not None:
                    note_bytes(self.raw.taken())

    def open(
        self, source: Any, index: int, shard: str, loop: asyncio.AbstractEventLoop
    ) -> tuple[Any, list[Group]]:
        """Open the file: its pyarrow metadata, and its row groups as the checks read them
        (:mod:`._parquet_footer`), from one read of its footer."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        with self._reading():
            with _opened_lock:
                if _exiting:
                    raise ShardError("the interpreter is exiting")
                _opened.add(self)
            self.raw = _Counted(source.open_file(index, loop))
            try:
                footer = read_footer(self.raw)
            except ValueError as error:
                raise ShardError(f"shard {shard}: {error}") from None
            meta = pq.read_metadata(pa.BufferReader(footer))
            try:
                groups = parse_groups(footer[:-8], meta.num_columns)
            except ValueError as error:
                raise ShardError(f"shard {shard}: {error} (a corrupt footer)") from None
            if len(groups) != meta.num_row_groups:
                raise ShardError(f"shard {shard}: its footer's row groups do not add up")
            # It does not close a file it was given, and reads the footer no more.
            self.file = pq.ParquetFile(self.raw, metadata=meta)
            return meta, groups

    def _check_open(self) -> None:
        if self.file is None:  # closed as the interpreter exits
            raise ShardError("the interpreter is exiting")

    def begin(
        self,
        group: int,
        info: Group,
        where: str,
        columns: list[str] | None,
        numbers: list[int] | None,
        limit: int | None,
    ) -> None:
        """Start reading row group ``group`` (``info``: the footer's of it, ``where``: its
        name in errors; ``numbers``: the numbers of ``columns``): :meth:`step` gives its rows,
        as many at a time as keep a step's decoding within ``limit``."""
        with self._reading():
            self._check_open()
            rows = ROWS_A_STEP
            if limit is not None:
                rows = rows_a_step(self.file.metadata, self.raw, info, where, numbers, limit)
            self._steps = self.file.iter_batches(rows, row_groups=[group], columns=columns)
            self._decoded = 0

    def step(self, group: int, shard: str, first: int, limit: int | None) -> list[Any]:
        """The next rows of the row group begun (``first`` the place of the first of them);
        none once it is read.

        A step at a time: a dictionary or a run of repeated values decodes to far more bytes
        than the footer's size of the row group, which counts them encoded, and rows as Python
        dicts take many times their decoded bytes (a one-byte column, over 200 a row).
        """
        with self._reading():
            self._check_open()
            batch = next(self._steps, None)
            while batch is not None and batch.num_rows == 0:
                batch = next(self._steps, None)
            if batch is None:
                self._steps = None
                return []
            self._decoded += made(batch)
            if limit is not None and self._decoded > limit:
                raise ShardError(
                    f"shard {shard}: row group {group} decodes to over max_bytes={limit} bytes"
                )
            if clash := _OWN.intersection(batch.schema.names):
                raise ShardError(
                    f"shard {shard}: has a column {min(clash)!r}, the name of the key the "
                    "loader gives each row (its place); read the others with columns=[...]"
                )
            rows: list[dict[str, Any]] = batch.to_pylist()
        for offset, row in enumerate(rows):
            row["__shard__"], row["__row__"] = shard, first + offset
        return rows

    def close(self) -> None:
        with self.lock:
            self.close_locked()

    def close_locked(self) -> None:
        """Close the file; the caller holds :attr:`lock`."""
        self._steps = None
        if self.file is not None:
            self.file.close()
        if self.raw is not None:
            self.raw.close()
        self.file = self.raw = None
        with _opened_lock:
            _opened.discard(self)


class ParquetShards(ShardStream):
    """A stream of rows from Parquet shards, each row a dict ``{column: value}`` with its
    ``"__shard__"`` and ``"__row__"`` (its place in the shard).

    Args:
        shards: The dataset whose items are the shards: a :class:`FileDataset`, an
            :class:`ObjectStoreDataset` or an :class:`HttpDataset` (Parquet is read by
            ranges: reads of a file, range GETs of an object or a URL, whose server must
            answer ``Range`` requests).
        columns: The columns read (all by default): each name a column, or a field nested
            in one; a name that a shard does not have fails that shard, and so does reading
            a column named ``__shard__`` or ``__row__`` (the loader's keys).
        interleave, shuffle, shuffle_buffer, buffer, length: As :class:`TarShards` says
            (``buffer`` and ``length`` count rows).
        max_bytes: The largest row group accepted, of the columns read: its uncompressed
            size in the footer, and the fewest bytes its count of values decodes to, both
            checked before it is read; then its rows' size once decoded (dictionaries and
            runs of repeated values expanded), checked at every step of up to 1,024 rows as
            they are decoded (fewer where a dictionary's longest value, from its page,
            would take a step past ``max_bytes``).

    Raises:
        ImportError: pyarrow is not installed (``pip install asyncloader[parquet]``).
    """

    reads_with = "open_file"

    def __init__(
        self,
        shards: Any,
        *,
        columns: Sequence[str] | None = None,
        interleave: int = 4,
        shuffle: bool = False,
        shuffle_buffer: int = 0,
        buffer: int = 1024,
        max_bytes: int | None = None,
        length: int | None = None,
    ) -> None:
        try:
            import pyarrow.parquet  # noqa: F401
        except ImportError as error:
            raise ImportError(
                "ParquetShards needs pyarrow: pip install asyncloader[parquet]"
            ) from error
        if columns is not None and (
            isinstance(columns, str) or not all(isinstance(c, str) for c in columns)
        ):
            raise TypeError(f"columns must be a list of column names, got {columns!r}")
        if columns is not None and not columns:
            raise ValueError("columns must name at least one column (None: all of them)")
        if own := _OWN.intersection(columns or ()):
            raise ValueError(f"columns: {min(own)!r} is the key the loader gives each row")
        super().__init__(
            shards,
            interleave=interleave,
            shuffle=shuffle,
            shuffle_buffer=shuffle_buffer,
            buffer=buffer,
            length=length,
        )
        self.columns = None if columns is None else list(columns)
        self.max_bytes = _check_max_bytes(max_bytes)

    def _producer(self, index: int, blocking: Blocking) -> Callable[[Shard], Awaitable[None]]:
        source, columns, limit = self.shards, self.columns, self.max_bytes

        async def produce(shard: Shard) -> None:
            opened = _Opened()
            try:
                loop = asyncio.get_running_loop()
                meta, groups = await blocking(opened.open, source, index, shard.name, loop)
                if (missing := missing_column(meta, columns)) is not None:
                    named = ", ".join(repr(name) for name in top_names(meta))
                    raise ShardError(
                        f"shard {shard.name}: no column {missing!r} (its columns: {named})"
                    )
                numbers, first = read_columns(meta, columns), 0
                # Each row group as the footer's own reading gives it: pyarrow's accessors of
                # a column chunk abort the process on some corrupt footers.
                for group, info in enumerate(groups):
                    if info.num_rows < 0:  # a corrupt footer: it would skip other rows
                        raise ShardError(
                            f"shard {shard.name}: row group {group} has {info.num_rows} rows "
                            "(a corrupt footer)"
                        )
                    if shard.skip_ahead(info.num_rows):  # taken whole before a resume
                        first += info.num_rows
                        continue
                    if limit is not None and (size := size_read(info, numbers)) > limit:
                        raise ShardError(
                            f"shard {shard.name}: row group {group} is {size} bytes, over "
                            f"max_bytes={limit}"
                        )
                    if limit is not None and (least := least_decoded(meta, info, numbers)) > limit:
                        raise ShardError(
                            f"shard {shard.name}: row group {group} decodes to {least} bytes "
                            f"at least ({least >> 20} MiB), over max_bytes={limit}"
                        )
                    where = f"shard {shard.name}: row group {group}"
                    await blocking(opened.begin, group, info, where, columns, numbers, limit)
                    place = first
                    while rows := await blocking(opened.step, group, shard.name, place, limit):
                        shard.put_all(rows)
                        place += len(rows)
                        await shard.room()
                    if place - first != info.num_rows:
                        # The rows' places, and a resume's skips, count by the footer.
                        raise ShardError(
                            f"shard {shard.name}: row group {group} gave {place - first} rows, "
                            f"its footer says {info.num_rows} (a corrupt footer)"
                        )
                    first += info.num_rows
            finally:
                # On a thread of its own: the shards' pool may be shut down (a cancelled
                # epoch), and a read still running holds the file until it returns.
                threading.Thread(target=opened.close, name="asyncloader-close", daemon=True).start()

        return produce
