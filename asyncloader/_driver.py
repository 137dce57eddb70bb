"""The epoch driver: one async function that runs an epoch's batches in order, bounded.

The driver walks the batches in epoch order and keeps at most ``batch_tasks`` batch tasks
running (a bounded, ordered ``buffered`` map, so no reorder buffer is needed). It awaits the
oldest task, takes a prefetch permit, and only then forgets the task and hands its batch over:
a finished batch that waits for a permit still counts as one of the running tasks, so no batch
is ever started further than ``batch_tasks + prefetch_depth`` past the consumer.

A batch task fetches its items, then collates on the CPU pool. With ``item_concurrency == 1`` a
batch is fetched whole when it can be (one ``__getitems__`` call, or one I/O-pool call for a
sync dataset) and transformed in one CPU job per thread when its transforms are worth a hop
(``_Split``). Otherwise its items come from lanes that hand each item to the CPU pool for its
transform as soon as it arrives (:mod:`._lanes`).
Failures become :class:`Failure` values; cancellation cancels every task and waits for them, so
requests in flight are cancelled, not completed. Under ``errors="skip"`` a failing item is
dropped from its batch instead (see :mod:`._skip`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ._augment import epoch_key
from ._handoff import END, Failure
from ._lanes import Lanes, fetch_on_threads, fetch_one_lane
from ._pool import ThreadPool, priority
from ._skip import SKIPPED, Skipper
from ._source import Source, fetch_batch, fetch_item
from ._stats import Recorder, current
from ._transform import Transform

Batch = tuple[list[int], Any]
"""A finished batch with the indices of its items."""

_SPLIT_S = 0.002
"""A batch fetched whole has its transforms split over the CPU threads when they take at
least this long in all (by the epoch's mean so far; the first batch always is): a part costs
a thread hop, tens of microseconds, and a batch split over two cores is ready in about half
the time (side runs of the suite's (c), 64 JPEGs a batch on 2 threads: the first batch in
47-49 ms against 72-77, the same rate, and a batch less memory at the peak: the two batches
in work no longer end together)."""


class Handoff(Protocol):
    """Where the driver delivers batches (see :mod:`asyncloader._handoff`)."""

    async def acquire(self) -> None: ...

    def put(self, value: object) -> None: ...


def transform_items(
    indices: Sequence[int],
    items: list[Any],
    transform: Transform | None,
    recorder: Recorder,
    skipper: Skipper | None,
) -> tuple[list[int], list[Any]]:
    """Transform a batch's items, dropping the ones ``skipper`` lets go; keep their indices."""
    kept = list(indices)
    if transform is not None:
        durations = []
        out = []
        clock = time.perf_counter
        for index, item in zip(indices, items, strict=True):
            if item is not SKIPPED:
                started = clock()
                try:
                    item = transform(index, item)
                except Exception as error:
                    if skipper is None:
                        raise
                    skipper.skip(index, error)
                    item = SKIPPED
                durations.append(clock() - started)
            out.append(item)
        items = out
        recorder.add_many("transform", durations)
    if skipper is not None:
        kept = [index for index, item in zip(indices, items, strict=True) if item is not SKIPPED]
        items = [item for item in items if item is not SKIPPED]
    return kept, items


def transform_and_collate(
    indices: Sequence[int],
    items: list[Any],
    transform: Transform | None,
    collate: Callable[[list[Any]], Any],
    recorder: Recorder,
    skipper: Skipper | None,
) -> Batch:
    """Transform a batch's items (dropping the ones ``skipper`` lets go), then collate them:
    one CPU job of a batch task."""
    kept, items = transform_items(indices, items, transform, recorder, skipper)
    started = time.perf_counter()
    batch = collate(items)
    recorder.add("collate", time.perf_counter() - started)
    return kept, batch


def fetch_or_skip(dataset: Any, indices: list[int], skipper: Skipper | None) -> list[Any]:
    """Fetch a batch from a sync dataset; under ``errors="skip"``, drop the failing items."""
    try:
        return fetch_batch(dataset, indices)
    except Exception:
        if skipper is None:
            raise
    items: list[Any] = []
    for index in indices:  # find the failing items one by one
        try:
            items.append(fetch_item(dataset, index))
        except Exception as error:
            skipper.skip(index, error)
            items.append(SKIPPED)
    return items


@dataclass(frozen=True)
class Work:
    """What every batch task of one epoch needs."""

    source: Source
    transform: Transform | None
    collate: Callable[[list[Any]], Any]
    cpu: ThreadPool
    batch_tasks: int
    item_concurrency: int
    recorder: Recorder
    skipper: Skipper | None
    augment: tuple[int, int]
    """``(seed, epoch)``: the key random transforms draw from."""

    async def on_cpu(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the CPU pool."""
        return await self.cpu.run(fn, *args)

    def finish(self, indices: Sequence[int], items: list[Any]) -> Batch:
        """Transform and collate (one CPU job)."""
        return transform_and_collate(
            indices, items, self.transform, self.collate, self.recorder, self.skipper
        )

    def collate_only(self, indices: Sequence[int], items: list[Any]) -> Batch:
        """Collate items the lanes already transformed (one CPU job)."""
        return transform_and_collate(
            indices, items, None, self.collate, self.recorder, self.skipper
        )

    def parts(self, items: int) -> int:
        """How many CPU jobs transform a batch of ``items`` fetched whole (see _SPLIT_S)."""
        threads = self.cpu.max_threads
        if self.transform is None or threads < 2 or items < 2:
            return 1
        timing = self.recorder.transform
        if timing.count and timing.total / timing.count * items < _SPLIT_S:
            return 1
        return min(threads, items)

    def timed_transform(self, index: int, item: Any) -> Any:
        """The transform of one item, timed (on the CPU pool)."""
        assert self.transform is not None
        started = time.perf_counter()
        try:
            return self.transform(index, item)
        finally:
            self.recorder.add("transform", time.perf_counter() - started)


_Part = tuple[list[int], list[Any]]
"""The kept indices and transformed items of part of a batch."""


class _Split:
    """A batch fetched whole, its transforms split into CPU jobs; the job that ends last
    collates, so that the batch never waits in the queue behind another batch's jobs."""

    def __init__(self, work: Work, indices: list[int], items: list[Any], parts: int) -> None:
        self.work = work
        self.indices = indices
        self.items = items
        size = -(-len(items) // parts)
        self.parts = [slice(start, start + size) for start in range(0, len(items), size)]
        self.results: list[_Part | BaseException | None] = [None] * len(self.parts)
        self.left = len(self.parts)
        self.lock = threading.Lock()

    def run(self, part: int) -> Batch | None:
        """Transform part ``part``; the last part to end collates (or raises the first
        failure by position) and returns the batch, the others ``None``."""
        where, work = self.parts[part], self.work
        result: _Part | BaseException
        try:
            result = transform_items(
                self.indices[where], self.items[where], work.transform, work.recorder, work.skipper
            )
        except BaseException as error:
            result = error
        with self.lock:
            self.results[part] = result
            self.left -= 1
            if self.left:
                return None
        kept: list[int] = []
        transformed: list[Any] = []
        for done in self.results:
            if isinstance(done, BaseException):
                raise done
            assert done is not None
            kept += done[0]
            transformed += done[1]
        return work.collate_only(kept, transformed)


async def _transform_in_parts(
    work: Work, indices: list[int], items: list[Any], parts: int
) -> Batch:
    """Transform and collate a batch fetched whole in ``parts`` CPU jobs at once."""
    split = _Split(work, indices, items, parts)
    jobs = (work.on_cpu(split.run, part) for part in range(len(split.parts)))
    done: list[Batch | None] = await asyncio.gather(*jobs)
    return next(batch for batch in done if batch is not None)


async def _fetch_whole(work: Work, indices: list[int]) -> list[Any]:
    recorder = work.recorder
    started = recorder.fetch_started(len(indices))
    try:
        items = await work.source.get_batch(indices)
    except BaseException:
        recorder.fetch_done(started, None, len(indices))
        raise
    recorder.fetch_done(started, items, len(indices))
    return items


async def process_batch(
    work: Work, indices: list[int], position: int, lanes: Lanes | None
) -> Batch | Failure:
    """Fetch, transform and collate one batch; a failure is returned, never raised.

    ``position`` (the batch's place in the epoch) is the priority of its pool jobs: older
    batches, which the consumer will take first, get the threads first. ``lanes``: the
    slot's lanes for an async dataset when ``item_concurrency > 1``.
    """
    priority.set(position)  # this task's own context: its jobs only
    try:
        batch: Batch
        if work.item_concurrency > 1 or not work.source.fetches_whole_batches:
            # Lanes: each item goes to the CPU pool for its transform as soon as it arrives.
            if work.source.io is not None:  # a sync dataset: lanes on its I/O threads
                items = await fetch_on_threads(work, indices)
            elif lanes is None:
                items = await fetch_one_lane(work, indices)
            else:
                items = await lanes.fetch(indices, position)
            batch = await work.on_cpu(work.collate_only, indices, items)
            return batch
        try:
            items = await _fetch_whole(work, indices)
        except Exception:
            if work.skipper is None:
                raise
            # Find the failing items one by one, and drop just those.
            items = await fetch_one_lane(work, indices)
            batch = await work.on_cpu(work.collate_only, indices, items)
            return batch
        parts = work.parts(len(indices))
        if parts == 1:  # one job: transform and collate
            batch = await work.on_cpu(work.finish, indices, items)
            return batch
        batch = await _transform_in_parts(work, indices, items, parts)
        return batch
    except asyncio.CancelledError:
        raise
    except BaseException as error:
        return Failure(error)


async def drive(work: Work, batches: Sequence[list[int]], handoff: Handoff) -> None:
    """Run an epoch: every batch in order through ``handoff``, then :data:`END`."""
    loop = asyncio.get_running_loop()
    # The batch tasks, and the pool jobs they start, inherit both: the datasets' retry loops
    # count into the recorder, random transforms draw from the epoch's key.
    current.set(work.recorder)
    epoch_key.set(work.augment)
    running: deque[asyncio.Task[Batch | Failure]] = deque()
    started = 0
    recorder = work.recorder
    slots: list[Lanes] = []
    try:
        if work.item_concurrency > 1 and work.source.io is None:  # made here, so that the
            # lanes inherit the context
            slots = [Lanes(work) for _ in range(min(work.batch_tasks, len(batches)))]
        while True:
            while started < len(batches) and len(running) < work.batch_tasks:
                lanes = slots[started % len(slots)] if slots else None
                running.append(
                    loop.create_task(process_batch(work, batches[started], started, lanes))
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
