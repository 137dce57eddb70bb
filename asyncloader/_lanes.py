"""The epoch's lanes: one budget of requests in flight, across batch boundaries.

An epoch has ``max(num_workers, 1) * item_concurrency`` lanes. Each takes the next item in
epoch order from the batches the driver has opened (at most ``num_workers + prefetch_depth``
ahead of the consumer), fetches it, hands it to the CPU pool for its transform without waiting
for it (or transforms it itself once the loader's transforms are timed cheaper than that hop),
and takes the next: a lane that finds its batch's items all started goes on to the next
batch's, so the requests in flight do not sag while a batch waits for its slowest item. A
transformed item makes no hop back to the event loop: the last item of a batch to end wakes
the batch task, once.

An async dataset's lanes are tasks on the event loop, alive for the epoch (:class:`Lanes`); an
idle one waits until a batch is opened. A sync dataset's are jobs on its I/O threads
(:class:`ThreadLanes`): one is started for each idle lane when a batch is opened, and it takes
item after item with no hop back to the loop until none is left. What each of these measured
is in docs/performance.md ("Measurements behind the code").
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from typing import Any

from ._epoch import EpochContext
from ._pool import priority
from ._skip import SKIPPED
from ._source import fetch_item
from ._stats import item_bytes


def _wake(done: asyncio.Future[None]) -> None:
    if not done.done():  # cancelled while the lanes ran
        done.set_result(None)


class BatchFetch:
    """One batch's items as the lanes fetch them and the CPU pool transforms them; safe from
    any thread (its counts are kept under the lanes' lock).

    After a failure no more of its items are taken; under ``errors="skip"`` a failing item is
    dropped and the others go on. Once the batch is cancelled, none of its items is taken and
    its transforms not yet begun are skipped. Its items' fetches are counted in the
    statistics together, once none of them is left in work (before the batch task wakes):
    one update a batch, not one an item. The recorder's lock is taken inside the lanes' lock
    for it, never the other way.
    """

    def __init__(
        self, context: EpochContext, indices: list[int], position: int, lock: threading.Lock
    ) -> None:
        self.context = context
        self.indices = indices
        self.size = len(indices)
        self.position = position
        """The batch's place in the epoch: its pool jobs' priority."""
        self._transforms = context.transforms_items
        self.items: list[Any] = [SKIPPED] * len(indices)
        self.errors: list[tuple[int, BaseException]] = []
        self._failed_at = len(indices)
        """The first position that failed (the size: none): the items before it go on, so
        that the batch's error is its first failing item's whatever the timing."""
        self.stopped = False
        self.taken = 0
        """Positions handed to lanes (the next one to take)."""
        self.pending = 0
        """Items taken whose fetch or transform has not ended."""
        self.seconds: list[float] = []
        """The durations of the fetches that gave an item (appends are atomic)."""
        self.sizes: list[int] = []
        """Their items' bytes."""
        self._counted = False
        self._lock = lock
        """The lanes' lock: one for the lanes' queue and all its batches."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._done: asyncio.Future[None] = self._loop.create_future()
        if not indices:
            self._done.set_result(None)

    async def wait(self) -> list[Any]:
        """The items in order (transformed), or the first failure by position."""
        try:
            await self._done
        finally:
            with self._lock:
                self.stopped = True  # cancelled: no more items, no more transforms
                if not self.pending:
                    self._count_locked()
        if self.errors:
            raise min(self.errors, key=lambda pair: pair[0])[1]
        return self.items

    def arrived(self, position: int, seconds: float, item: Any) -> bool:
        """The item at ``position`` arrived after ``seconds``: count it, and store it and
        return ``True`` (the lane then ends it), or hand it to the CPU pool for its
        transform, which ends it."""
        self.seconds.append(seconds)
        # A call less for the built-in datasets' items, once per item.
        self.sizes.append(len(item) if type(item) is bytes else item_bytes(item))
        if not self._transforms:
            self.items[position] = item
            return True
        context = self.context
        if context.cheap_transform():  # cheaper than the hop to a CPU thread: here
            self._transform_here(position, item)
            return True
        try:
            context.cpu.submit(self._transform, position, item)
        except BaseException as error:  # the pool was shut down
            self.errors.append((position, error))
            self._failed_at = min(self._failed_at, position)
            self.end()
        return False

    def fetch_failed(self, position: int, seconds: float, error: BaseException) -> None:
        """The fetch of the item at ``position`` failed after ``seconds``: :meth:`fail`, and
        the item has ended."""
        self.fail(position, seconds, error)
        self.end()

    def fail(self, position: int, seconds: float, error: BaseException) -> None:
        """The fetch of the item at ``position`` failed after ``seconds``: count it; drop the
        item under ``errors="skip"``, or keep the failure for the batch (no more of its items
        are taken). The item has not ended: the caller ends it."""
        self.context.recorder.add("fetch", seconds)
        if not isinstance(error, asyncio.CancelledError):
            self._failed(position, error)

    def _failed(self, position: int, error: BaseException) -> None:
        skipper = self.context.skipper
        if skipper is not None and isinstance(error, Exception):
            try:
                skipper.skip(self.indices[position], error)
                return
            except Exception as over_budget:
                error = over_budget
        self.errors.append((position, error))
        self._failed_at = min(self._failed_at, position)

    def _transform_here(self, position: int, item: Any) -> None:
        """Transform one item where this runs (the caller ends it); a failure is the batch's."""
        if self.stopped or self._failed_at < position:
            return
        try:
            self.items[position] = self.context.timed_transform(self.indices[position], item)
        except BaseException as error:
            self._failed(position, error)

    def _transform(self, position: int, item: Any) -> None:
        """Transform one item (a CPU thread), and end it."""
        try:
            self._transform_here(position, item)
        finally:
            self.end()

    def end(self) -> None:
        """An item's fetch or transform ended."""
        with self._lock:
            self.end_locked()

    def end_locked(self) -> None:
        """:meth:`end`, with the lanes' lock held; the last item counts the batch's fetches
        and wakes the batch task."""
        self.pending -= 1
        if self.pending or not (self.errors or self.taken == self.size or self.stopped):
            return
        self._count_locked()
        if threading.get_ident() == self._loop_thread:  # an async lane: no wake-up write
            self._loop.call_soon(_wake, self._done)
            return
        # RuntimeError: the loop closed (an epoch cut off at exit); nobody waits.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(_wake, self._done)

    def _count_locked(self) -> None:
        """Count the batch's fetches in the statistics, once (no item of it is in work)."""
        if not self._counted:
            self._counted = True
            self.context.recorder.lane_items(self.seconds, self.sizes)


class _Opened:
    """The batches opened and not yet all taken, in epoch order, under one lock (theirs too);
    safe from any thread."""

    def __init__(self, context: EpochContext) -> None:
        self.context = context
        self.batches: deque[BatchFetch] = deque()
        self.lock = threading.Lock()

    def open(self, indices: list[int], position: int) -> BatchFetch:
        """Open a batch after the others (call with :attr:`lock` held)."""
        fetch = BatchFetch(self.context, indices, position, self.lock)
        self.batches.append(fetch)
        return fetch

    def take(self) -> tuple[BatchFetch, int] | None:
        """The next item in epoch order (call with :attr:`lock` held): ``None`` when every
        open batch's items are taken, or the batch failed or was cancelled."""
        batches = self.batches
        while batches:
            fetch = batches[0]
            taken = fetch.taken
            if taken < fetch.size and not fetch.errors and not fetch.stopped:
                fetch.taken = taken + 1
                fetch.pending += 1
                return fetch, taken
            batches.popleft()
        return None


class Lanes:
    """An async dataset's lanes: tasks on the event loop, alive for the whole epoch.

    Tasks made per batch cost their allocations, and, kept alive across a batch's requests,
    they set off the cyclic garbage collector; these are made once.
    """

    def __init__(self, context: EpochContext) -> None:
        self._context = context
        self._opened = _Opened(context)
        self._idle: deque[asyncio.Future[None]] = deque()
        loop = asyncio.get_running_loop()
        self._loop = loop
        lanes = context.lanes
        self._tasks = [loop.create_task(self._lane()) for _ in range(lanes)]

    async def fetch(self, indices: list[int], position: int) -> list[Any]:
        """The batch's items, taken by the lanes after every batch opened before it."""
        with self._opened.lock:
            fetch = self._opened.open(indices, position)
        for _ in range(min(len(indices), len(self._idle))):
            _wake(self._idle.popleft())
        return await fetch.wait()

    async def _lane(self) -> None:
        context = self._context
        get, recorder, clock = context.source.get, context.recorder, time.perf_counter
        opened = self._opened
        lock = opened.lock
        prioritized = context.transforms_items  # priority only orders transforms
        batch: BatchFetch | None = None
        stored: BatchFetch | None = None  # its item is ended as this lane takes the next
        busy = False  # counted in flight: from a lane's first item to its going idle
        try:
            while True:
                with lock:
                    if stored is not None:
                        stored.end_locked()
                        stored = None
                    work = opened.take()
                if work is None:
                    if busy:
                        busy = False
                        recorder.lanes_busy(-1)
                    idle = self._loop.create_future()
                    self._idle.append(idle)
                    await idle
                    continue
                if not busy:
                    busy = True
                    recorder.lanes_busy(1)
                fetch, position = work
                if prioritized and fetch is not batch:  # this lane's jobs are this batch's
                    batch = fetch
                    priority.set(fetch.position)
                started = clock()
                try:
                    item = await get(fetch.indices[position])
                except BaseException as error:
                    if isinstance(error, GeneratorExit):  # closed, not cancelled: no loop runs
                        raise
                    fetch.fetch_failed(position, clock() - started, error)
                    if isinstance(error, asyncio.CancelledError):
                        raise
                    continue
                if fetch.arrived(position, clock() - started, item):
                    stored = fetch
        finally:
            if stored is not None:
                stored.end()
            if busy:
                recorder.lanes_busy(-1)

    async def aclose(self) -> None:
        """Cancel the lanes (and the requests they have in flight); wait for them."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class ThreadLanes:
    """A sync dataset's lanes: jobs on its I/O threads (a thread blocks on each item)."""

    def __init__(self, context: EpochContext) -> None:
        assert context.source.io is not None
        self._context = context
        self._io = context.source.io
        self._opened = _Opened(context)
        self._lanes = context.lanes
        self._running = 0

    async def fetch(self, indices: list[int], position: int) -> list[Any]:
        """The batch's items, taken by the lanes after every batch opened before it."""
        with self._opened.lock:
            fetch = self._opened.open(indices, position)
            start = min(len(indices), self._lanes - self._running)
            self._running += start
        for _ in range(start):
            self._io.submit(self._lane)
        return await fetch.wait()

    def _lane(self) -> None:
        context = self._context
        dataset, recorder, clock = context.source.dataset, context.recorder, time.perf_counter
        opened = self._opened
        batch: BatchFetch | None = None
        busy = False  # counted in flight from its first item (a job may find none left)

        def following() -> tuple[BatchFetch, int] | None:
            # Taken before the item in hand is handed on: a lane with nothing left is idle
            # before its last item ends, since once that ends the epoch may finish, and its
            # statistics must have this lane idle.
            nonlocal busy
            with opened.lock:
                work = opened.take()
                if work is None:
                    self._running -= 1
            if work is None and busy:
                busy = False
                recorder.lanes_busy(-1)
            return work

        try:
            work = following()
            while work is not None:
                if not busy:
                    busy = True
                    recorder.lanes_busy(1)
                fetch, position = work
                if fetch is not batch:  # this job's own context: its transforms' priority
                    batch = fetch
                    priority.set(fetch.position)
                started = clock()
                try:
                    item = fetch_item(dataset, fetch.indices[position])
                except BaseException as error:
                    fetch.fail(position, clock() - started, error)  # none more of it taken
                    work = following()
                    fetch.end()
                    continue
                seconds = clock() - started
                work = following()
                if fetch.arrived(position, seconds, item):
                    fetch.end()
        finally:
            if busy:
                recorder.lanes_busy(-1)

    async def aclose(self) -> None:
        """Nothing to cancel: a job ends once its item is fetched and no batch is open."""
