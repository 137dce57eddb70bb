"""A batch's lanes: ``item_concurrency`` items fetched at once, each transformed as it arrives.

A lane takes the batch's next position, fetches the item, hands it to the CPU pool for its
transform without waiting for it, and takes the next. So the requests in flight stay at
``item_concurrency`` while items are transformed, and a transformed item makes no hop back to
the event loop: the last lane or transform of the batch to end wakes the batch task, once.

An async dataset's lanes are tasks on the event loop, alive for the epoch, one set per batch
slot (:class:`Lanes`). A sync dataset's are jobs on its I/O threads (:func:`fetch_on_threads`),
one per lane of a batch, each taking item after item with no hop back to the loop (a job per
item took four thread hops with a transform, and kept the loop thread busy); and an async lane
does not wait for an item's transform before its next request. What each of these measured is
in docs/performance.md ("Measurements behind the code").
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

from ._epoch import EpochContext
from ._pool import priority
from ._skip import SKIPPED
from ._source import fetch_item


def _wake(done: asyncio.Future[None]) -> None:
    if not done.done():  # cancelled while the lanes ran
        done.set_result(None)


class BatchFetch:
    """One batch's items as its lanes fetch them and the CPU pool transforms them; safe from
    any thread.

    After a failure the lanes take no more items; under ``errors="skip"`` a failing item is
    dropped and its lane goes on. Once the batch is cancelled, the lanes take no more items
    and its transforms not yet begun are skipped.
    """

    def __init__(
        self, context: EpochContext, indices: list[int], lanes: int, position: int = 0
    ) -> None:
        self.context = context
        self.indices = indices
        self.lanes = min(lanes, len(indices))
        self.position = position
        """The batch's place in the epoch: its pool jobs' priority."""
        self._items: list[Any] = [SKIPPED] * len(indices)
        self._errors: list[tuple[int, BaseException]] = []
        self._stopped = False
        self._positions = iter(range(len(indices)))
        self._lock = threading.Lock()
        self._open = self.lanes
        """Lanes at work and transforms not yet ended: the batch is done at zero."""
        self._loop = asyncio.get_running_loop()
        self._done: asyncio.Future[None] = self._loop.create_future()
        if not self.lanes:
            self._done.set_result(None)

    async def wait(self) -> list[Any]:
        """The items in order (transformed), or the first failure by position."""
        try:
            await self._done
        finally:
            self._stopped = True  # cancelled: no more items, no more transforms
        if self._errors:
            raise min(self._errors, key=lambda pair: pair[0])[1]
        return self._items

    def next_position(self) -> int | None:
        """The next position for a lane to fetch; ``None`` when none is left, after a
        failure, or once the batch is cancelled."""
        if self._errors or self._stopped:
            return None
        with self._lock:
            return next(self._positions, None)

    def started(self) -> float:
        """A lane begins fetching an item; returns the start time."""
        return self.context.recorder.fetch_started(1)

    def fetched(self, position: int, started: float, item: Any) -> None:
        """The item at ``position`` arrived: count it and hand it on (:meth:`arrived`)."""
        self.context.recorder.item_done(started, item)
        self.arrived(position, item)

    def fetch_failed(self, position: int, started: float, error: BaseException) -> bool:
        """The fetch of the item at ``position`` failed: count it; then :meth:`failed`."""
        self.context.recorder.fetch_done(started, None, 1)
        return not isinstance(error, asyncio.CancelledError) and self.failed(position, error)

    def arrived(self, position: int, item: Any) -> None:
        """The item at ``position`` was fetched: hand it to the CPU pool for its transform."""
        if self.context.transform is None:
            self._items[position] = item
            return
        with self._lock:
            self._open += 1
        try:
            self.context.cpu.submit(self._transform, position, item)
        except BaseException as error:  # the pool was shut down
            self._errors.append((position, error))
            self._end()

    def failed(self, position: int, error: BaseException) -> bool:
        """The item at ``position`` failed: drop it under ``errors="skip"`` (``True``: its
        lane goes on), or keep the failure for the batch (``False``: the lanes stop)."""
        skipper = self.context.skipper
        if skipper is not None and isinstance(error, Exception):
            try:
                skipper.skip(self.indices[position], error)
                return True
            except Exception as over_budget:
                error = over_budget
        self._errors.append((position, error))
        return False

    def lane_ended(self) -> None:
        """A lane took its last item."""
        self._end()

    def _transform(self, position: int, item: Any) -> None:
        """Transform one item (a CPU thread)."""
        try:
            if not (self._errors or self._stopped):
                try:
                    index = self.indices[position]
                    self._items[position] = self.context.timed_transform(index, item)
                except BaseException as error:
                    self.failed(position, error)
        finally:
            self._end()

    def _end(self) -> None:
        with self._lock:
            self._open -= 1
            if self._open:
                return
        # RuntimeError: the loop closed (an epoch cut off at exit); nobody waits.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(_wake, self._done)


async def run_lane(fetch: BatchFetch) -> None:
    """An async lane: fetch the batch's next positions until none is left (the event loop)."""
    get = fetch.context.source.get
    try:
        while (position := fetch.next_position()) is not None:
            started = fetch.started()
            try:
                item = await get(fetch.indices[position])
            except BaseException as error:
                if fetch.fetch_failed(position, started, error):
                    continue
                if isinstance(error, asyncio.CancelledError):
                    raise
                return
            fetch.fetched(position, started, item)
    finally:
        fetch.lane_ended()


def thread_lane(fetch: BatchFetch) -> None:
    """A sync lane: fetch the batch's next positions until none is left (an I/O thread)."""
    dataset = fetch.context.source.dataset
    try:
        while (position := fetch.next_position()) is not None:
            started = fetch.started()
            try:
                item = fetch_item(dataset, fetch.indices[position])
            except BaseException as error:
                if fetch.fetch_failed(position, started, error):
                    continue
                return
            fetch.fetched(position, started, item)
    finally:
        fetch.lane_ended()


async def fetch_on_threads(context: EpochContext, indices: list[int]) -> list[Any]:
    """A sync dataset's batch, fetched by up to ``item_concurrency`` lanes on I/O threads."""
    assert context.source.io is not None
    fetch = BatchFetch(context, indices, context.item_concurrency)
    for _ in range(fetch.lanes):
        context.source.io.submit(thread_lane, fetch)
    return await fetch.wait()


async def fetch_one_lane(context: EpochContext, indices: list[int]) -> list[Any]:
    """A batch's items fetched one after the other by the calling task."""
    fetch = BatchFetch(context, indices, 1)
    await run_lane(fetch)
    return await fetch.wait()


class Lanes:
    """The ``item_concurrency`` lanes of one batch slot, alive for the whole epoch.

    A batch task hands its batch to its slot's lanes instead of starting lanes of its own:
    tasks made per batch cost their allocations, and, kept alive across a batch's requests,
    they set off the cyclic garbage collector (about 10 us per item at 256 in flight, a
    tenth of the loop thread's time). Batches ``i`` and ``i + batch_tasks`` never run at
    once (the driver starts one only when the oldest is handed over), so slot ``i %
    batch_tasks`` is always free for batch ``i``.
    """

    def __init__(self, context: EpochContext) -> None:
        self._work = context
        self._queue: asyncio.Queue[BatchFetch] = asyncio.Queue()
        self._tasks = [
            asyncio.get_running_loop().create_task(self._lane())
            for _ in range(context.item_concurrency)
        ]

    async def fetch(self, indices: list[int], position: int) -> list[Any]:
        """The batch's items, fetched by up to ``item_concurrency`` of the slot's lanes."""
        fetch = BatchFetch(self._work, indices, len(self._tasks), position)
        for _ in range(fetch.lanes):
            self._queue.put_nowait(fetch)
        return await fetch.wait()

    async def _lane(self) -> None:
        while True:
            fetch = await self._queue.get()
            priority.set(fetch.position)  # this lane's jobs belong to this batch now
            await run_lane(fetch)

    async def aclose(self) -> None:
        """Cancel the lanes (and the requests they have in flight); wait for them."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
