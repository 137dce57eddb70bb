"""Datasets the tests drive: they count what the loader does to them, from the inside; and
:func:`streamed` and :func:`first_item`, a built-in dataset read by hand."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any


class Probe:
    """Thread-safe counters of items in flight (now and peak) and of items started."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.in_flight = 0
        self.peak = 0
        self.started: list[int] = []
        self.cancelled = 0

    def enter(self, index: int) -> None:
        with self.lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self.started.append(index)
            self.lock.notify_all()

    def leave(self) -> None:
        with self.lock:
            self.in_flight -= 1
            self.lock.notify_all()

    def wait_for(self, predicate: Any, timeout: float = 3.0) -> None:
        with self.lock:
            assert self.lock.wait_for(predicate, timeout), "condition not reached in time"


class SyncData:
    """``__getitem__`` returns ``index``, after an optional random delay of up to ``delay`` s."""

    def __init__(self, n: int, delay: float = 0.0, seed: int = 0) -> None:
        self.n = n
        self.delay = delay
        self.probe = Probe()
        self.rng = random.Random(seed)
        self.fail_at: set[int] = set()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        if not 0 <= index < self.n:
            raise IndexError(index)
        self.probe.enter(index)
        try:
            if self.delay:
                time.sleep(self.rng.random() * self.delay)
            if index in self.fail_at:
                raise Boom(index)
            return index
        finally:
            self.probe.leave()


class AsyncData:
    """``async def __getitem__`` returning ``index`` after a random delay of up to ``delay`` s."""

    def __init__(self, n: int, delay: float = 0.0, seed: int = 0) -> None:
        self.n = n
        self.delay = delay
        self.probe = Probe()
        self.rng = random.Random(seed)
        self.fail_at: set[int] = set()
        self.closed = False

    def __len__(self) -> int:
        return self.n

    async def __getitem__(self, index: int) -> int:
        if not 0 <= index < self.n:
            raise IndexError(index)
        self.probe.enter(index)
        try:
            if self.delay:
                await asyncio.sleep(self.rng.random() * self.delay)
            if index in self.fail_at:
                raise Boom(index)
            return index
        except asyncio.CancelledError:
            with self.probe.lock:
                self.probe.cancelled += 1
            raise
        finally:
            self.probe.leave()

    async def aclose(self) -> None:
        self.closed = True


class Boom(Exception):
    """The failure the test datasets raise on purpose."""


async def eventually(predicate: Any, timeout: float = 10.0) -> None:
    """Wait, yielding to the loop, until ``predicate()`` holds; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    for _ in iter(int, 1):
        if predicate():
            return
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.001)


def streamed(dataset: Any, pause: float = 0.0) -> tuple[Any, list[bytes]]:
    """How ``dataset.stream(0, ...)`` ended (``None``, or its error) and the chunks it gave,
    on a loop of its own, waiting ``pause`` seconds after each (a slow reader); the dataset
    is closed after, where it has ``aclose``."""
    chunks: list[bytes] = []

    async def sink(chunk: Any) -> None:
        chunks.append(bytes(chunk))
        if pause:
            await asyncio.sleep(pause)

    async def run() -> Any:
        try:
            return await dataset.stream(0, sink, lambda *a: None)
        except Exception as error:
            return error
        finally:
            if hasattr(dataset, "aclose"):
                await dataset.aclose()

    return asyncio.run(run()), chunks


def first_item(dataset: Any) -> Any:
    """Item 0 of an async dataset, on a loop of its own, or the exception raised for it; the
    dataset is closed after."""

    async def get() -> Any:
        try:
            return await dataset[0]
        except Exception as error:
            return error
        finally:
            await dataset.aclose()

    return asyncio.run(get())
