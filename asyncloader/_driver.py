"""The epoch driver: one async function that runs an epoch's batches in order, bounded.

The driver opens the batches in epoch order, each as a task, once it holds one of the
hand-off's permits: the consumer returns a permit when it takes a batch, so no batch is ever
started further than ``num_workers + prefetch_depth`` (the window) past the one the consumer
takes next. It awaits the tasks in the same order and hands each outcome over (a bounded,
ordered ``buffered`` map, so no reorder buffer is needed).

A batch task fetches its items, then collates on the CPU pool. With ``item_concurrency == 1`` a
batch is fetched whole when it can be (one ``__getitems__`` call, or one I/O-pool call for a
sync dataset), at most ``max(num_workers, 1)`` batches in work at once, and transformed in one
CPU job per thread when its transforms are worth a hop (:func:`._epoch.transform_in_parts`).
Otherwise the epoch's lanes fetch its items, after those of the batches opened before it, and
hand each item to the CPU pool for its transform as soon as it arrives (:mod:`._lanes`).
A stream's batches are read the same way, each whole, in batch order from the epoch's one
reader (:mod:`._stream`); a batch that finds the stream ended is :data:`EXHAUSTED`, and ends
the epoch. Failures become :class:`Failure` values; cancellation cancels every task and waits
for them, so requests in flight are cancelled, not completed. Under ``errors="skip"`` a
failing item is dropped from its batch instead (see :mod:`._skip`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterator
from typing import Any, Final, Protocol

from ._batch_work import Batch
from ._epoch import EpochContext, transform_in_parts
from ._handoff import END, Failure
from ._lanes import Lanes, ThreadLanes
from ._pool import priority
from ._skip import SKIPPED
from ._stream import SampleError, StreamReader


class _Exhausted:
    def __repr__(self) -> str:
        return "EXHAUSTED"


EXHAUSTED: Final = _Exhausted()
"""What a stream's batch opened past the stream's end gives: the epoch ends there."""


class EpochBatches(Protocol):
    """An epoch's batches of indices, in order: a list of them, or a stream's (whose
    ``len()`` raises ``TypeError`` when the stream has none)."""

    def __iter__(self) -> Iterator[list[int]]: ...

    def __len__(self) -> int: ...


class Handoff(Protocol):
    """Where the driver delivers batches (see :mod:`asyncloader._handoff`)."""

    async def acquire(self) -> None: ...

    def holds_batches(self) -> bool: ...

    def put(self, value: object) -> None: ...


class _Whole:
    """Batches fetched whole, ``max(num_workers, 1)`` in work at once: a batch keeps its slot
    through its CPU work too, so the first batch's collation does not share the cores with
    the next batches' fetches (docs/performance.md, "Issue 19")."""

    def __init__(self, context: EpochContext) -> None:
        self.context = context
        self.slots = asyncio.Semaphore(context.batch_tasks)

    async def fetch(self, indices: list[int]) -> list[Any]:
        recorder = self.context.recorder
        started = recorder.fetch_started(len(indices))
        try:
            items = await self.context.source.get_batch(indices)
        except BaseException:
            recorder.fetch_done(started, None, len(indices))
            if self.context.skipper is None:
                raise
        else:
            recorder.fetch_done(started, items, len(indices))
            return items
        return await self._each(indices)

    async def aclose(self) -> None:
        """Nothing to close: a batch's fetch is its task's own."""

    async def _each(self, indices: list[int]) -> list[Any]:
        """Find the failing items one by one, and drop just those (``errors="skip"``)."""
        recorder, skipper = self.context.recorder, self.context.skipper
        assert skipper is not None
        items: list[Any] = []
        for index in indices:
            started = recorder.fetch_started(1)
            try:
                item = await self.context.source.get(index)
            except Exception as error:
                recorder.fetch_done(started, None, 1)
                skipper.skip(index, error)
                item = SKIPPED
            else:
                recorder.item_done(started, item)
            items.append(item)
        return items


class _Streamed(_Whole):
    """A stream's batches: each pulled whole from the epoch's reader, then worked on like a
    batch fetched whole."""

    def __init__(self, context: EpochContext, reader: StreamReader) -> None:
        super().__init__(context)
        self.reader = reader

    async def fetch(self, indices: list[int]) -> list[Any]:
        items = await self.reader.pull(len(indices), self.context.recorder)
        skipper = self.context.skipper
        for position, item in enumerate(items):
            if type(item) is SampleError:
                if skipper is None:
                    raise item.error
                skipper.skip(indices[position], item.error)
                items[position] = SKIPPED
        return items

    async def aclose(self) -> None:
        """Close the stream's iterator."""
        await self.reader.aclose()


Outcome = Batch | Failure | _Exhausted
"""What a batch task gives."""


async def process_batch(
    context: EpochContext,
    indices: list[int],
    position: int,
    fetcher: Lanes | ThreadLanes | _Whole,
) -> Outcome:
    """Fetch, transform and collate one batch; a failure is returned, never raised.

    ``position`` (the batch's place in the epoch) is the priority of its pool jobs: older
    batches, which the consumer will take first, get the threads first.
    """
    priority.set(position)  # this task's own context: its jobs only
    try:
        batch: Batch
        if not isinstance(fetcher, _Whole):
            # Lanes: each item goes to the CPU pool for its transform as soon as it arrives.
            items = await fetcher.fetch(indices, position)
            if context.procs is not None:
                return await context.in_process(indices, items)
            batch = await context.batch_work(indices, items, transformed=True)
            return batch
        async with fetcher.slots:
            if (
                context.procs is not None
                and context.source.io is not None
                and not isinstance(fetcher, _Streamed)
            ):  # a sync dataset's batch: fetched in the worker process too
                return await context.in_process(indices, None)
            items = await fetcher.fetch(indices)
            if len(items) < len(indices):  # a stream's end
                if not items:
                    return EXHAUSTED
                indices = indices[: len(items)]
            if context.procs is not None:
                return await context.in_process(indices, items)
            parts = context.parts(len(indices))
            if parts == 1:  # one job: transform and collate
                batch = await context.batch_work(indices, items, transformed=False)
                return batch
            batch = await transform_in_parts(context, indices, items, parts)
            return batch
    except asyncio.CancelledError:
        raise
    except BaseException as error:
        return Failure(error)


async def drive(context: EpochContext, batches: EpochBatches, handoff: Handoff) -> None:
    """Run an epoch: every batch in order through ``handoff``, then :data:`END`."""
    with context.scope():  # the batch tasks, and the pool jobs they start, inherit it
        await _drive(context, batches, handoff)


def _fetcher(context: EpochContext) -> Lanes | ThreadLanes | _Whole:
    if context.stream is not None:
        return _Streamed(context, context.stream)
    if context.item_concurrency == 1 and context.source.fetches_whole_batches:
        return _Whole(context)
    if context.source.io is not None:
        return ThreadLanes(context)
    return Lanes(context)


async def _open(
    context: EpochContext,
    batches: EpochBatches,
    handoff: Handoff,
    fetcher: Lanes | ThreadLanes | _Whole,
    running: deque[asyncio.Future[Outcome]],
    opened: asyncio.Event,
) -> None:
    """Start each batch once the window has room for it (the driver's second task)."""
    loop = asyncio.get_running_loop()
    recorder = context.recorder
    try:
        for position, indices in enumerate(batches):
            # A full window of batches still in work is the loader's own wait; only a wait
            # that begins behind a finished batch is the consumer's (permit_wait).
            behind = handoff.holds_batches()
            waiting = time.perf_counter()
            await handoff.acquire()
            if behind:
                recorder.add("permit_wait", time.perf_counter() - waiting)
            running.append(loop.create_task(process_batch(context, indices, position, fetcher)))
            opened.set()
    except asyncio.CancelledError:
        raise
    except BaseException as error:  # a fault of the driver itself: end loudly, never hang
        failed: asyncio.Future[Outcome] = loop.create_future()
        failed.set_result(Failure(error))
        running.append(failed)
    finally:
        opened.set()  # the driver sees this task done once it wakes


async def _drive(context: EpochContext, batches: EpochBatches, handoff: Handoff) -> None:
    loop = asyncio.get_running_loop()
    running: deque[asyncio.Future[Outcome]] = deque()
    opened = asyncio.Event()
    fetcher: Lanes | ThreadLanes | _Whole | None = None
    opener: asyncio.Task[None] | None = None
    try:
        fetcher = _fetcher(context)  # made here, so that the lanes inherit the context
        opener = loop.create_task(_open(context, batches, handoff, fetcher, running, opened))
        while running or not opener.done():
            if not running:
                opened.clear()
                await opened.wait()
                continue
            outcome = await running[0]
            running.popleft()
            if outcome is EXHAUSTED:
                break
            handoff.put(outcome)
        handoff.put(END)
    except (asyncio.CancelledError, GeneratorExit):
        raise
    except BaseException as error:  # a fault of the driver itself: end loudly, never hang
        handoff.put(Failure(error))
        handoff.put(END)
    finally:
        # A loop closed with the epoch pending runs nothing again: the collector closes
        # this coroutine, and its tasks go with it.
        if not loop.is_closed():
            await _settle(running, opener, fetcher)


async def _settle(
    running: deque[asyncio.Future[Outcome]],
    opener: asyncio.Task[None] | None,
    fetcher: Lanes | ThreadLanes | _Whole | None,
) -> None:
    """Cancel the epoch's batch tasks and its opener, wait for them, then close the lanes."""
    waits: list[asyncio.Future[Any]] = [*running]
    if opener is not None:
        waits.append(opener)
    for task in waits:
        task.cancel()
    try:
        if waits:
            await asyncio.wait(waits)
    finally:  # a second cancellation while the batches end still cancels the lanes
        if fetcher is not None:
            await fetcher.aclose()
