"""A bounded pipe of bytes from an event loop to a thread that reads it as a file.

A shard streamed by aiohttp arrives in chunks on the event loop, while :mod:`tarfile` reads
it with blocking ``read()`` calls on a thread of its own. The loop puts chunks and waits while
``limit`` bytes are buffered (so a shard is never held whole: the connection is paused
instead, and aiohttp pauses its read time-out with it); the thread takes them. Closing the
pipe from the thread (the reader is done or cancelled) drops what is buffered and calls
``on_close`` (which cancels the request).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable

from ._tar import ReadFailed


class Pipe:
    """Bytes from ``loop`` to one reading thread.

    Args:
        loop: The loop that puts.
        limit: The bytes buffered before :meth:`put` waits.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int) -> None:
        self._loop = loop
        self._limit = limit
        self._chunks: deque[bytes] = deque()
        self._at = 0  # where the first chunk's unread bytes begin
        self._size = 0
        self._done = False
        self._closed = False
        self._error: BaseException | None = None
        self._changed = threading.Condition(threading.Lock())
        self._room: asyncio.Event | None = None
        self._waiting = False
        self.started = False
        """Whether any byte was put (a request that failed after it cannot be retried)."""
        self.on_close: Callable[[], object] | None = None

    async def put(self, chunk: bytes) -> None:
        """Add ``chunk``, once fewer than ``limit`` bytes are buffered (on the loop)."""
        self.started = True
        while True:
            with self._changed:
                if self._closed:
                    return  # the reader is gone: its request is being cancelled
                if self._size < self._limit:
                    self._chunks.append(chunk)
                    self._size += len(chunk)
                    self._changed.notify()
                    return
                if self._room is None:
                    self._room = asyncio.Event()
                self._room.clear()
                self._waiting = True
            await self._room.wait()

    def finish(self, error: BaseException | None = None) -> None:
        """No more bytes: the end of the data, or ``error`` (on the loop)."""
        with self._changed:
            self._done, self._error = True, error
            self._changed.notify()

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (all that is buffered for ``-1``), ``b""`` at the end, once
        some are there (on the reading thread).

        Raises:
            ReadFailed: The data ended with an error.
        """
        with self._changed:
            while not self._chunks and not self._done and not self._closed:
                self._changed.wait()
            if not self._chunks:
                if self._error is not None:
                    raise ReadFailed(str(self._error) or type(self._error).__name__)
                return b""
            out = self._take(size)
            if self._waiting and self._size < self._limit:
                self._waiting = False
                room = self._room
                assert room is not None
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                    self._loop.call_soon_threadsafe(room.set)
            return out

    def _take(self, size: int) -> bytes:
        first, start = self._chunks[0], self._at
        end = len(first) if size < 0 else min(len(first), start + size)
        if end == len(first):
            self._chunks.popleft()
            self._at = 0
        else:
            self._at = end
        self._size -= end - start
        return first if start == 0 and end == len(first) else first[start:end]

    def close(self) -> None:
        """The reader is done: drop the buffer and stop the writer (from the reading thread)."""
        with self._changed:
            if self._closed:
                return
            self._closed = True
            self._chunks.clear()
            self._size = self._at = 0
            room = self._room
        if room is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(room.set)
        if self.on_close is not None:
            self.on_close()
