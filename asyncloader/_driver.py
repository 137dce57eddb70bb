"""The epoch driver: one async function that runs an epoch's batches in order, bounded.

The driver walks the batches in epoch order and keeps at most ``batch_tasks`` batch tasks
running (a bounded, ordered ``buffered`` map, so no reorder buffer is needed). It awaits the
oldest task, takes a prefetch permit, and only then forgets the task and hands its batch over:
a finished batch that waits for a permit still counts as one of the running tasks, so no batch
is ever started further than ``batch_tasks + prefetch_depth`` past the consumer.

A batch task fetches its items, then collates on the CPU pool. With ``item_concurrency == 1`` a
batch is fetched whole when it can be (one ``__getitems__`` call, or one I/O-pool call for a
sync dataset) and transformed in one CPU job per thread when its transforms are worth a hop
(:func:`._epoch.transform_in_parts`). Otherwise its items come from lanes that hand each item
to the CPU pool for its transform as soon as it arrives (:mod:`._lanes`).
Failures become :class:`Failure` values; cancellation cancels every task and waits for them, so
requests in flight are cancelled, not completed. Under ``errors="skip"`` a failing item is
dropped from its batch instead (see :mod:`._skip`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol

from ._epoch import Batch, EpochContext, transform_in_parts
from ._handoff import END, Failure
from ._lanes import Lanes, fetch_on_threads, fetch_one_lane
from ._pool import priority


class Handoff(Protocol):
    """Where the driver delivers batches (see :mod:`asyncloader._handoff`)."""

    async def acquire(self) -> None: ...

    def put(self, value: object) -> None: ...


async def _fetch_whole(context: EpochContext, indices: list[int]) -> list[Any]:
    recorder = context.recorder
    started = recorder.fetch_started(len(indices))
    try:
        items = await context.source.get_batch(indices)
    except BaseException:
        recorder.fetch_done(started, None, len(indices))
        raise
    recorder.fetch_done(started, items, len(indices))
    return items


async def process_batch(
    context: EpochContext, indices: list[int], position: int, lanes: Lanes | None
) -> Batch | Failure:
    """Fetch, transform and collate one batch; a failure is returned, never raised.

    ``position`` (the batch's place in the epoch) is the priority of its pool jobs: older
    batches, which the consumer will take first, get the threads first. ``lanes``: the
    slot's lanes for an async dataset when ``item_concurrency > 1``.
    """
    priority.set(position)  # this task's own context: its jobs only
    try:
        batch: Batch
        if context.item_concurrency > 1 or not context.source.fetches_whole_batches:
            # Lanes: each item goes to the CPU pool for its transform as soon as it arrives.
            if context.source.io is not None:  # a sync dataset: lanes on its I/O threads
                items = await fetch_on_threads(context, indices)
            elif lanes is None:
                items = await fetch_one_lane(context, indices)
            else:
                items = await lanes.fetch(indices, position)
            batch = await context.on_cpu(context.collate_only, indices, items)
            return batch
        try:
            items = await _fetch_whole(context, indices)
        except Exception:
            if context.skipper is None:
                raise
            # Find the failing items one by one, and drop just those.
            items = await fetch_one_lane(context, indices)
            batch = await context.on_cpu(context.collate_only, indices, items)
            return batch
        parts = context.parts(len(indices))
        if parts == 1:  # one job: transform and collate
            batch = await context.on_cpu(context.finish, indices, items)
            return batch
        batch = await transform_in_parts(context, indices, items, parts)
        return batch
    except asyncio.CancelledError:
        raise
    except BaseException as error:
        return Failure(error)


async def drive(context: EpochContext, batches: Sequence[list[int]], handoff: Handoff) -> None:
    """Run an epoch: every batch in order through ``handoff``, then :data:`END`."""
    with context.scope():  # the batch tasks, and the pool jobs they start, inherit it
        await _drive(context, batches, handoff)


async def _drive(context: EpochContext, batches: Sequence[list[int]], handoff: Handoff) -> None:
    loop = asyncio.get_running_loop()
    running: deque[asyncio.Task[Batch | Failure]] = deque()
    started = 0
    recorder = context.recorder
    slots: list[Lanes] = []
    try:
        if context.item_concurrency > 1 and context.source.io is None:  # made here, so that the
            # lanes inherit the context
            slots = [Lanes(context) for _ in range(min(context.batch_tasks, len(batches)))]
        while True:
            while started < len(batches) and len(running) < context.batch_tasks:
                lanes = slots[started % len(slots)] if slots else None
                running.append(
                    loop.create_task(process_batch(context, batches[started], started, lanes))
                )
                started += 1
            if not running:
                break
            outcome = await running[0]
            waiting = time.perf_counter()
            await handoff.acquire()
            recorder.add("permit_wait", time.perf_counter() - waiting)
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
        for lanes in slots:
            await lanes.aclose()
