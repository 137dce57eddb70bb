"""The in-order hand-off between the epoch driver and the consumer.

The driver takes one of ``window`` permits before it starts a batch, and the consumer returns
the permit when it takes the batch, so no batch starts more than ``window`` batches past the
one the consumer takes next (``num_workers + prefetch_depth``: the loader's memory bound).
Close semantics: the driver ends every epoch with :data:`END`; a batch's
failure travels as a :class:`Failure` value and is raised by the consumer at that batch's turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from dataclasses import dataclass
from queue import Empty, SimpleQueue
from typing import Final

WAIT_SLICE_S: Final = 0.1
"""A blocked sync consumer wakes this often so that Ctrl-C interrupts it promptly."""


@dataclass(frozen=True)
class Failure:
    """A batch that failed: the consumer raises ``error`` (its type and traceback kept)."""

    error: BaseException


class _End:
    def __repr__(self) -> str:
        return "END"


END: Final = _End()
"""Sent after the last batch of an epoch."""


def _timed_out(timeout: float) -> TimeoutError:
    return TimeoutError(f"no batch arrived within timeout={timeout} s")


class AsyncHandoff:
    """A hand-off to a consumer on the driver's own event loop (``async for``)."""

    def __init__(self, window: int) -> None:
        self._permits = asyncio.Semaphore(window)
        self._ready: deque[object] = deque()
        self._arrived = asyncio.Event()

    async def acquire(self) -> None:
        """Wait for room in the window (the driver, before it starts a batch)."""
        await self._permits.acquire()

    def holds_batches(self) -> bool:
        """Whether a finished batch waits for the consumer."""
        return bool(self._ready)

    def put(self, value: object) -> None:
        """Hand a batch, a :class:`Failure` or :data:`END` to the consumer."""
        self._ready.append(value)
        self._arrived.set()

    async def get(self, timeout: float | None) -> object:
        """Take the next value, returning its permit; raise ``TimeoutError`` after ``timeout``."""
        # Waiting on an event, not on a queue, so a time-out can never lose a batch.
        while not self._ready:
            self._arrived.clear()
            if timeout is None:
                await self._arrived.wait()
                continue
            try:
                await asyncio.wait_for(self._arrived.wait(), timeout)
            except asyncio.TimeoutError:
                raise _timed_out(timeout) from None
        value = self._ready[0]
        if value is END:  # left for every other task that waits on this hand-off
            return value
        self._ready.popleft()
        self._permits.release()
        return value


class ThreadHandoff:
    """A hand-off from the loader's loop thread to a consumer on another thread (``for``)."""

    def __init__(self, window: int, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._permits = asyncio.Semaphore(window)
        self._ready: SimpleQueue[object] = SimpleQueue()

    async def acquire(self) -> None:
        """Wait for room in the window (the driver, before it starts a batch)."""
        await self._permits.acquire()

    def holds_batches(self) -> bool:
        """Whether a finished batch waits for the consumer."""
        return not self._ready.empty()

    def put(self, value: object) -> None:
        """Hand a batch, a :class:`Failure` or :data:`END` to the consumer."""
        self._ready.put(value)

    def get(self, timeout: float | None) -> object:
        """Block for the next value in short slices; raise ``TimeoutError`` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = WAIT_SLICE_S
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
                if wait <= 0:
                    assert timeout is not None
                    raise _timed_out(timeout)
            try:
                value = self._ready.get(timeout=wait)
                break
            except Empty:
                if self._loop.is_closed():
                    raise RuntimeError(
                        "the loader's event loop stopped before the epoch ended "
                        "(the loader was closed while this iterator was in use)"
                    ) from None
        if value is END:
            self._ready.put(END)  # for every other thread that waits on this hand-off
        else:
            # RuntimeError: the loop is gone, so nobody waits for the permit.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._permits.release)
        return value
