"""The context of one epoch and the CPU work of each of its batches.

An :class:`EpochContext` is what every batch of one epoch needs, whichever path runs it (the
direct path inside ``next()``, or the driver's batch tasks): the dataset as a source, the
transform and collate function, the CPU pool, the statistics recorder, the skip policy and the
key random transforms draw from. The per-batch CPU work (transform, skip, collate, a batch's
transforms split over the CPU threads) lives here too; the driver (:mod:`._driver`) only
schedules.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._augment import epoch_key
from ._batch_work import Batch, fetch_or_skip, transform_and_collate, transform_items
from ._pool import ThreadPool
from ._processes import ProcessPool, check_sendable
from ._shared import check_packable
from ._skip import Skipper
from ._source import Source
from ._stats import Recorder, current
from ._stream import StreamReader
from ._transform import Transform
from ._worker import FETCH, FINISH

_SPLIT_S = 0.002
"""A batch fetched whole has its transforms split over the CPU threads when they take at
least this long in all (by the loader's typical transform so far; the first batch always is):
a part costs a thread hop, tens of microseconds, and a batch split over two cores is ready in
about half the time, with a batch less memory at the peak (docs/performance.md)."""

_INLINE_S = 50e-6
"""A batch's CPU work runs on the event loop, not the CPU pool, once the loader's batches so far
(since it was built, or its statistics reset) took less than this each, by their typical
transform and collation (the first batch always goes to the pool): the hop to a pool thread
and back costs the process more CPU than that work, and it holds the loop no longer than a
callback of its own (docs/performance.md)."""
_INLINE_ITEM_S = 20e-6
"""An item a lane fetched is transformed by the lane itself, not handed to the CPU pool, once
the loader's typical transform so far took less than this (the first always goes to the pool):
the one hop to a pool thread costs more CPU than that transform.

"Typical" is the median of a stage's recent runs (``_Timing.typical``), not the mean since the
start, which one slow early run would hold over the threshold for tens of runs."""


class _Scope:
    __slots__ = ("_augment", "_key", "_recorder", "_token")

    def __init__(self, recorder: Recorder, augment: tuple[int, int]) -> None:
        self._recorder, self._augment = recorder, augment

    def __enter__(self) -> None:
        self._token = current.set(self._recorder)
        self._key = epoch_key.set(self._augment)

    def __exit__(self, *exc: object) -> None:
        try:
            current.reset(self._token)
            epoch_key.reset(self._key)
        except ValueError:  # a driver's coroutine closed by the collector, in no task of its
            pass  # own (its loop closed with it pending): that context is gone already


@dataclass(frozen=True)
class EpochContext:
    """What every batch of one epoch needs (see the module docstring)."""

    source: Source
    transform: Transform | None
    collate: Callable[[list[Any]], Any]
    cpu: ThreadPool
    batch_tasks: int
    item_concurrency: int
    lanes: int
    """``max(num_workers, 1) * item_concurrency``: the epoch's lanes (requests in flight)."""
    recorder: Recorder
    skipper: Skipper | None
    augment: tuple[int, int]
    """``(seed, epoch)``: the key random transforms draw from."""
    stream: StreamReader | None = None
    """A stream's reader for the epoch (``None`` for a map-style dataset)."""
    procs: ProcessPool | None = None
    """The worker processes that run the CPU stage (``None``: the CPU pool's threads)."""
    after: Callable[[Any], Any] | None = None
    """Applied to a batch from a worker process, in this process (pinning its memory)."""
    starting: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(1))
    """One batch at a time on the CPU threads while the worker processes start."""

    async def _while_starting(self, indices: list[int], items: list[Any] | None) -> Batch:
        """The batch on a CPU thread, the same code as in a worker, so that the first batches
        do not wait for the workers to start. One batch at a time, in one job: code written
        for processes may not be safe in two threads at once."""
        assert self.procs is not None
        async with self.starting:
            if not self.procs.ready:
                self.procs.note_slow_start()
                # Started with the first batch: what they take of the CPU to start is less
                # than what every batch made before they are ready would lose.
                self.procs.start()
                sent = items is not None
                if items is None:
                    started = self.recorder.fetch_started(len(indices))
                    fetched: list[Any] | None = None
                    try:
                        fetched = await self.on_cpu(
                            fetch_or_skip, self.source.dataset, indices, self.skipper
                        )
                    finally:
                        self.recorder.fetch_done(started, fetched, len(indices))
                    items = fetched
                kept, batch = await self.on_cpu(self._finish_as_if_sent, indices, items, sent)
                return kept, batch if self.after is None else self.after(batch)
        # The workers started while this batch waited: it goes to them, and the batches
        # behind it need not wait for it.
        return await self.in_process(indices, items)

    def _finish_as_if_sent(self, indices: list[int], items: list[Any], sent: bool) -> Batch:
        """:meth:`finish`, failing where the batch could not come back from a worker, or its
        items (``sent``: fetched here) could not go to one: a batch made while the workers
        start fails as it would in a worker, not as timing decides."""
        if sent:
            check_sendable(items)
        batch = self.finish(indices, items)
        check_packable(batch)
        return batch

    @property
    def transforms_items(self) -> bool:
        """Whether the lanes hand each item to the CPU threads for its transform (with
        worker processes, the batch's transforms run with its collation instead)."""
        return self.transform is not None and self.procs is None

    async def in_process(self, indices: list[int], items: list[Any] | None) -> Batch:
        """Transform and collate a batch in a worker process; fetch it there first when
        ``items`` is ``None`` (a sync dataset). What the worker recorded and dropped is
        counted here."""
        assert self.procs is not None
        if not self.procs.ready:
            if not self.procs.work.set_up:
                return await self._while_starting(indices, items)
            # Each worker sets itself up (worker_init_fn) for the batches: they wait for it.
            self.procs.start()
        fetching = items is None
        if fetching:
            self.recorder.calls_started(1, len(indices))
        try:
            reply = await self.procs.run(
                (FETCH if fetching else FINISH, indices, items, self.augment)
            )
        finally:
            if fetching:
                self.recorder.calls_started(-1, -len(indices))
        self.recorder.merge(reply.tally)
        for index, error in reply.skipped:
            assert self.skipper is not None
            self.skipper.skip(index, error)
        if reply.error is not None:
            raise reply.error
        kept, batch = reply.value
        return kept, batch if self.after is None else self.after(batch)

    def scope(self) -> _Scope:
        """Make the epoch's recorder and augmentation key current (the datasets' retry loops
        count into the one, random transforms draw from the other); pool jobs started inside
        inherit both. A plain context manager: the direct path enters it once per batch."""
        return _Scope(self.recorder, self.augment)

    async def on_cpu(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` on the CPU pool."""
        return await self.cpu.run(fn, *args)

    async def batch_work(
        self, indices: Sequence[int], items: list[Any], transformed: bool
    ) -> Batch:
        """The batch's CPU work (:meth:`collate_only` if its lanes ``transformed`` its items,
        else :meth:`finish`): on the event loop when the loader's batches so far were cheaper
        than a thread hop (see _INLINE_S), else on the CPU pool."""
        work = self.collate_only if transformed else self.finish
        collate = self.recorder.collate.typical
        untimed = transformed or self.transform is None
        transform = 0.0 if untimed else self.recorder.transform.typical
        cost = None if collate is None or transform is None else collate + transform * len(items)
        if cost is not None and cost < _INLINE_S:
            return work(indices, items)
        batch: Batch = await self.on_cpu(work, indices, items)
        return batch

    def cheap_transform(self) -> bool:
        """Whether a lane transforms its item itself (see _INLINE_ITEM_S)."""
        typical = self.recorder.transform.typical
        return typical is not None and typical < _INLINE_ITEM_S

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
        typical = self.recorder.transform.typical
        if typical is not None and typical * items < _SPLIT_S:
            return 1
        return min(threads, items)

    def timed_transform(self, index: int, item: Any) -> Any:
        """The transform of one item, timed (on the CPU pool)."""
        assert self.transform is not None
        started, cpu_started = time.perf_counter(), time.thread_time()
        try:
            return self.transform(index, item)
        finally:
            self.recorder.add("transform", time.perf_counter() - started)
            self.recorder.add_transform_cpu(time.thread_time() - cpu_started)


_Part = tuple[list[int], list[Any]]
"""The kept indices and transformed items of part of a batch."""


class _Split:
    """A batch fetched whole, its transforms split into CPU jobs; the job that ends last
    collates, so that the batch never waits in the queue behind another batch's jobs."""

    def __init__(
        self, context: EpochContext, indices: list[int], items: list[Any], parts: int
    ) -> None:
        self.context = context
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
        where, context = self.parts[part], self.context
        result: _Part | BaseException
        try:
            result = transform_items(
                self.indices[where],
                self.items[where],
                context.transform,
                context.recorder,
                context.skipper,
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
        return context.collate_only(kept, transformed)


async def transform_in_parts(
    context: EpochContext, indices: list[int], items: list[Any], parts: int
) -> Batch:
    """Transform and collate a batch fetched whole in ``parts`` CPU jobs at once."""
    split = _Split(context, indices, items, parts)
    jobs = (context.on_cpu(split.run, part) for part in range(len(split.parts)))
    done: list[Batch | None] = await asyncio.gather(*jobs)
    return next(batch for batch in done if batch is not None)
