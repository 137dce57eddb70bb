"""The epoch driver: one async function that runs an epoch's batches in order, bounded.

The driver walks the batches in epoch order and keeps at most ``batch_tasks`` batch tasks
running (a bounded, ordered ``buffered`` map, so no reorder buffer is needed). It awaits the
oldest task, takes a prefetch permit, and only then forgets the task and hands its batch over:
a finished batch that waits for a permit still counts as one of the running tasks, so no batch
is ever started further than ``batch_tasks + prefetch_depth`` past the consumer.

A batch task fetches its items (one ``get_batch`` call, or ``item_concurrency`` lanes that each
fetch an item, transform it on the CPU pool as soon as it arrives, and take the next), then
collates on the CPU pool. Failures become :class:`Failure` values; cancellation cancels every
task and waits for them, so requests in flight are cancelled, not completed.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ._handoff import END, Failure
from ._pool import ThreadPool
from ._source import Source
from ._transform import Transform

Batch = tuple[list[int], Any]
"""A finished batch with its indices."""


class Handoff(Protocol):
    """Where the driver delivers batches (see :mod:`asyncloader._handoff`)."""

    async def acquire(self) -> None: ...

    def put(self, value: object) -> None: ...


@dataclass(frozen=True)
class Work:
    """What every batch task of one epoch needs."""

    source: Source
    transform: Transform | None
    collate: Callable[[list[Any]], Any]
    cpu: ThreadPool
    batch_tasks: int
    item_concurrency: int

    def finish(self, indices: Sequence[int], items: list[Any]) -> Any:
        """Transform a whole batch's items, then collate them (one CPU job)."""
        transform = self.transform
        if transform is not None:
            items = [transform(index, item) for index, item in zip(indices, items, strict=True)]
        return self.collate(items)

    async def on_cpu(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the CPU pool."""
        return await self.cpu.run(fn, *args)


async def _fetch_by_lanes(work: Work, indices: list[int]) -> list[Any]:
    """Fetch (and transform) a batch's items with ``item_concurrency`` lanes.

    Each lane takes the batch's next position until none is left, so uneven items balance.
    After a failure the lanes take no more items; the batch fails with the first error by
    position.
    """
    items: list[Any] = [None] * len(indices)
    positions = iter(range(len(indices)))
    errors: list[tuple[int, BaseException]] = []
    source, transform = work.source, work.transform

    async def lane() -> None:
        for position in positions:
            if errors:
                return
            index = indices[position]
            try:
                item = await source.get(index)
                if transform is not None:
                    item = await work.on_cpu(transform, index, item)
            except asyncio.CancelledError:
                raise
            except BaseException as error:
                errors.append((position, error))
                return
            items[position] = item

    lanes = min(work.item_concurrency, len(indices))
    if lanes == 1:
        await lane()
    else:
        # gather cancels the lanes and waits for them when this batch is cancelled.
        await asyncio.gather(*(lane() for _ in range(lanes)))
    if errors:
        raise min(errors, key=lambda pair: pair[0])[1]
    return items


async def process_batch(work: Work, indices: list[int]) -> Batch | Failure:
    """Fetch, transform and collate one batch; a failure is returned, never raised."""
    try:
        if work.item_concurrency == 1 and work.source.fetches_whole_batches:
            items = await work.source.get_batch(indices)
            return indices, await work.on_cpu(work.finish, indices, items)
        items = await _fetch_by_lanes(work, indices)
        return indices, await work.on_cpu(work.collate, items)
    except asyncio.CancelledError:
        raise
    except BaseException as error:
        return Failure(error)


async def drive(work: Work, batches: Sequence[list[int]], handoff: Handoff) -> None:
    """Run an epoch: every batch in order through ``handoff``, then :data:`END`."""
    loop = asyncio.get_running_loop()
    running: deque[asyncio.Task[Batch | Failure]] = deque()
    started = 0
    try:
        while True:
            while started < len(batches) and len(running) < work.batch_tasks:
                running.append(loop.create_task(process_batch(work, batches[started])))
                started += 1
            if not running:
                break
            outcome = await running[0]
            await handoff.acquire()
            running.popleft()
            handoff.put(outcome)
        handoff.put(END)
    except asyncio.CancelledError:
        raise
    except BaseException as error:  # a fault of the driver itself: end loudly, never hang
        handoff.put(Failure(error))
        handoff.put(END)
    finally:
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running)
