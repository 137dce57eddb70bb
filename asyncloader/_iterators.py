"""The three ways an epoch is consumed: inline, from a background loop, or with ``async for``.

- :class:`DirectIterator`: a sync dataset with ``num_workers == 0`` and ``item_concurrency ==
  1`` is fetched, transformed and collated inside ``__next__``, with no thread or queue.
- :class:`ThreadedIterator`: ``for batch in loader`` otherwise; the driver runs on the loader's
  loop thread and the consumer blocks on a :class:`~asyncloader._handoff.ThreadHandoff`.
- :class:`AsyncEpochIterator`: ``async for batch in loader``; the driver runs as a task of the
  caller's loop.

Each yields batches (or ``(indices, batch)`` pairs) in epoch order and raises a failed batch's
exception at its turn, after which iteration goes on with the next batch.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from ._batch_work import Batch, collate_or_pass, fetch_or_skip, passed_over, transform_items
from ._driver import EpochBatches, drive
from ._epoch import EpochContext
from ._handoff import END, AsyncHandoff, Failure, ThreadHandoff
from ._interrupt import interrupt_after
from ._pool import Jobs, epoch_jobs
from ._runtime import Runtime
from ._skip import SKIPPED
from ._state import Progress
from ._stopped import escaped

CANCEL_WAIT_S: Final = 5.0
"""How long an abandoned sync epoch waits until no thread runs the user's code any more."""

_DRIVERS: set[asyncio.Task[None]] = set()
"""Every running epoch's driver task. An iterator caught in a reference cycle (a traceback
kept in the consumer's frame) would otherwise take its driver into the garbage with it, and
the collector would destroy a pending task ("Task was destroyed but it is pending!") instead
of the iterator's finalizer cancelling it."""


def _keep(task: asyncio.Task[None]) -> None:
    _DRIVERS.add(task)
    task.add_done_callback(_DRIVERS.discard)


Fresh = tuple[EpochContext, Any, Progress]
"""An epoch planned again: its context, batches and progress."""

Replan = Callable[[Progress], "Fresh | None"]
"""Asked before an epoch's first batch: the epoch to run instead of the one ``progress`` is
of, when its sampler's user set another since (``sampler.set_epoch(n)`` after ``iter()``:
Lightning's ``Trainer`` in a resumed run), else ``None``."""


def _inherited(pid: int) -> RuntimeError:
    return RuntimeError(
        f"this iterator was started in process {pid} before fork(); its threads and loop "
        "are not in this process: start a new epoch here with iter(loader)"
    )


def _elsewhere() -> RuntimeError:
    return RuntimeError(
        "this epoch was started on another event loop, which drives it (and cancels it as "
        "it closes, as asyncio.run does): take its batches in that loop, or start an epoch "
        "in this one with async for"
    )


def _unwrap(value: object, with_indices: bool) -> Any:
    if isinstance(value, Failure):
        error = value.error
        del value
        raise error
    assert isinstance(value, tuple)
    return value if with_indices else value[1]


class DirectIterator:
    """One epoch processed inline in ``__next__`` (the fastest path for cheap items)."""

    def __init__(
        self,
        context: EpochContext,
        batches: Sequence[list[int]],
        with_indices: bool,
        progress: Progress,
        replan: Replan | None = None,
    ) -> None:
        self._with_indices = with_indices
        self._replan = replan
        self._begin(context, batches, progress)

    def _begin(
        self, context: EpochContext, batches: Sequence[list[int]], progress: Progress
    ) -> None:
        self._context: EpochContext | None = context
        self._progress = progress
        self._recorder = context.recorder
        self._batches = batches
        self._position = 0
        self._open = True
        context.recorder.epoch_started()

    def __iter__(self) -> DirectIterator:
        return self

    def __len__(self) -> int:
        return len(self._batches) - self._position

    def __next__(self) -> Any:
        if self._replan is not None:
            replan, self._replan = self._replan, None
            fresh = replan(self._progress) if self._open else None
            if fresh is not None:
                self.close()
                self._begin(*fresh)
        batch = self._make()
        while batch is SKIPPED:  # every item skipped: passed over, not delivered
            batch = self._make()
        return batch

    def _make(self) -> Any:
        """The next batch (with its indices, if asked), or :data:`SKIPPED`."""
        if not self._open:  # closed, which is not finished: the state stays where it was
            raise StopIteration
        if self._position >= len(self._batches):
            self._progress.done = True
            self.close()
            raise StopIteration
        indices = self._batches[self._position]
        self._position += 1
        self._progress.received += 1  # the batch, or its error, is the consumer's now
        context = self._context
        assert context is not None
        recorder = self._recorder
        clock = time.perf_counter
        started = clock()
        fetched_items: list[Any] | None = None
        fetched = collating = collated = started
        batch: Any = None
        try:
            with context.scope():
                fetched_items = fetch_or_skip(context.source.dataset, indices, context.skipper)
                fetched = clock()
                kept, items = transform_items(
                    indices, fetched_items, context.transform, recorder, context.skipper
                )
                collating = clock()
                batch = collate_or_pass(items, context.collate, context.skipper)
                collated = clock()
        except KeyboardInterrupt:
            # Ctrl-C cancels the epoch, as on the other paths, and this batch never reached
            # the consumer: a state saved now resumes at it.
            self._progress.received -= 1
            self.close()
            raise
        except (StopIteration, StopAsyncIteration) as error:  # it would end the epoch here
            raise escaped(error) from error
        finally:
            # On this path the consumer waits for the whole of the loader's work.
            ended = clock()
            if fetched_items is not None and context.skipper is not None:
                fetched_items = [item for item in fetched_items if item is not SKIPPED]
            recorder.record_direct_batch(
                fetch_s=(fetched if fetched_items is not None else ended) - started,
                items=fetched_items,
                requested=len(indices),
                collate_s=collated - collating if collated > started else None,
                wait_s=ended - started,
                handed=batch is not SKIPPED,
            )
        return (kept, batch) if self._with_indices and batch is not SKIPPED else batch

    def close(self) -> None:
        """End the epoch; nothing is running, so nothing needs waiting for."""
        self._position = len(self._batches)
        self._context = None  # so that nothing but the loader refers to the dataset
        if self._open:
            self._open = False
            self._recorder.epoch_ended()


async def _run_epoch(
    context: EpochContext,
    batches: EpochBatches,
    handoff: ThreadHandoff,
    finished: threading.Event,
    jobs: Jobs,
) -> None:
    task = asyncio.current_task()
    assert task is not None
    _keep(task)
    epoch_jobs.set(jobs)  # in this task's context, and so in every job it submits
    try:
        await drive(context, batches, handoff)
    finally:
        finished.set()


class ThreadedIterator:
    """One epoch driven on the loader's loop thread, consumed from any other thread."""

    def __init__(
        self,
        runtime: Runtime,
        context: EpochContext,
        batches: EpochBatches,
        window: int,
        timeout: float | None,
        with_indices: bool,
        progress: Progress,
        replan: Replan | None = None,
    ) -> None:
        self._runtime = runtime
        self._window = window
        self._timeout = timeout
        self._with_indices = with_indices
        self._replan = replan
        self._pid = os.getpid()
        self._loop_thread = runtime.loop_thread
        self._begin(context, batches, progress)

    def _begin(self, context: EpochContext, batches: EpochBatches, progress: Progress) -> None:
        self._progress = progress
        self._recorder = context.recorder
        self._batches = batches  # its len() only (a stream's raises TypeError, as in torch)
        self._taken = 0
        self._handoff = ThreadHandoff(self._window, self._loop_thread.loop)
        self._finished = threading.Event()
        self._jobs = Jobs()
        self._future = self._loop_thread.submit(
            _run_epoch, context, batches, self._handoff, self._finished, self._jobs
        )
        self._open = True
        self._recorder.epoch_started()

    def __iter__(self) -> ThreadedIterator:
        return self

    def __len__(self) -> int:
        # A stream's __len__ may be wrong: never below none left, and none once it ended.
        return max(0, len(self._batches) - self._taken) if self._open else 0

    def __next__(self) -> Any:
        if self._replan is not None:
            self._run_replanned()
        value = self._take()
        while passed_over(value):  # every item skipped: passed over, not delivered
            value = self._take()
        self._recorder.add_batch(failed=isinstance(value, Failure))
        return _unwrap(value, self._with_indices)

    def _run_replanned(self) -> None:
        replan, self._replan = self._replan, None
        if replan is None or self._pid != os.getpid() or not self._open:
            return
        fresh = replan(self._progress)
        if fresh is not None:
            self._cancel(wait=True)
            self._begin(*fresh)

    def _take(self) -> object:
        """The next batch or :class:`Failure`, counted as received."""
        if self._pid != os.getpid():
            raise _inherited(self._pid)
        if not self._open:
            raise StopIteration
        started = time.perf_counter()
        try:
            value = self._handoff.get(self._timeout)
        except KeyboardInterrupt:
            self._cancel(wait=False)  # Ctrl-C: cancel without the bounded wait
            raise
        except RuntimeError:  # the loop is gone: this epoch can never go on
            self._cancel(wait=False)
            raise
        finally:
            self._recorder.add("consumer_wait", time.perf_counter() - started)
        if value is END:
            self._progress.done = True
            self._open = False
            self._recorder.epoch_ended()
            raise StopIteration
        self._taken += 1
        self._progress.received += 1
        return value

    def close(self) -> None:
        """Cancel the epoch and wait (at most 5 s) until none of its jobs runs the dataset's
        code (another epoch's may)."""
        self._cancel(wait=True)

    def _cancel(self, wait: bool) -> None:
        if not self._open:
            return
        self._open = False
        if self._pid != os.getpid():  # inherited through fork(): nothing of it runs here
            return
        self._recorder.epoch_ended()
        if not self._finished.is_set() and not self._loop_thread.loop.is_closed():
            self._future.cancel()  # cancels the driver task on its loop
        self._handoff.put(END)  # another thread blocked in next() returns too
        if sys.is_finalizing():
            return
        try:
            if wait and not self._runtime.runs_here():  # its own threads cannot wait for it
                deadline = time.monotonic() + CANCEL_WAIT_S
                self._finished.wait(CANCEL_WAIT_S)
                self._jobs.wait_idle(max(0.0, deadline - time.monotonic()))
        finally:  # Ctrl-C during the wait: what it waited for is left at once, as without it
            self._runtime.retire_busy_pools(self._jobs)

    def __del__(self) -> None:
        try:
            if getattr(self, "_open", False):
                self._cancel(wait=True)
        except KeyboardInterrupt:  # Ctrl-C here (most likely during the wait): not to be lost
            interrupt_after(sys._getframe())


class AsyncEpochIterator:
    """One epoch driven as a task of the caller's running event loop (``async for``)."""

    def __init__(
        self,
        runtime: Runtime,
        context: EpochContext,
        batches: EpochBatches,
        window: int,
        timeout: float | None,
        with_indices: bool,
        progress: Progress,
        replan: Replan | None = None,
    ) -> None:
        # Kept so that its threads outlive a loader nobody holds (`async for b in
        # DataLoader(...)`): a runtime no one refers to is stopped by its finalizer.
        self._runtime = runtime
        self._progress = progress
        self._recorder = context.recorder
        self._context: EpochContext | None = context
        self._batches = batches
        self._taken = 0
        self._timeout = timeout
        self._with_indices = with_indices
        self._replan = replan
        self._handoff = AsyncHandoff(window)
        self._task: asyncio.Task[None] | None = None
        self._pid = os.getpid()
        self._open = True

    def __aiter__(self) -> AsyncEpochIterator:
        return self

    def __len__(self) -> int:
        # A stream's __len__ may be wrong: never below none left, and none once it ended.
        return max(0, len(self._batches) - self._taken) if self._open else 0

    async def __anext__(self) -> Any:
        value = await self._take()
        while passed_over(value):  # every item skipped: passed over, not delivered
            value = await self._take()
        self._recorder.add_batch(failed=isinstance(value, Failure))
        return _unwrap(value, self._with_indices)

    async def _take(self) -> object:
        """The next batch or :class:`Failure`, counted as received."""
        if self._pid != os.getpid():
            raise _inherited(self._pid)
        if not self._open:
            raise StopAsyncIteration
        if self._task is not None and self._task.get_loop() is not asyncio.get_running_loop():
            raise _elsewhere()
        if self._task is None:
            replan, self._replan = self._replan, None
            fresh = None if replan is None else replan(self._progress)
            if fresh is not None:  # not begun: nothing of the planned epoch to stop
                self._context, self._batches, self._progress = fresh
                self._recorder = self._context.recorder
            assert self._context is not None
            self._task = asyncio.get_running_loop().create_task(
                drive(self._context, self._batches, self._handoff)
            )
            _keep(self._task)
            self._context = None
            self._recorder.epoch_started()
        started = time.perf_counter()
        try:
            value = await self._handoff.get(self._timeout)
        except asyncio.CancelledError:
            # The consumer's task was cancelled while it waited: it has abandoned the epoch
            # (its frame, and so this iterator, may stay referenced by the traceback).
            self._abandon()
            raise
        finally:
            self._recorder.add("consumer_wait", time.perf_counter() - started)
        if value is END:
            self._progress.done = True
            self._abandon()  # the driver is done: this only ends the epoch
            raise StopAsyncIteration
        self._taken += 1
        self._progress.received += 1
        return value

    async def aclose(self) -> None:
        """Cancel the epoch and wait until its tasks are gone (an epoch of another event loop
        is only cancelled: it ends when that loop runs)."""
        self._end()
        self._context = None
        task, self._task = self._task, None
        if task is not None and not task.done():
            if task.get_loop() is not asyncio.get_running_loop():
                task.get_loop().call_soon_threadsafe(task.cancel)
                return
            task.cancel()
            # Wait for the driver without letting its cancellation leak into our caller.
            await asyncio.wait([task])

    def _end(self) -> None:
        if getattr(self, "_open", False):
            self._open = False
            if self._task is not None:  # the epoch had started
                self._recorder.epoch_ended()

    def _abandon(self) -> None:
        """Cancel the epoch without waiting (from any thread), once: an iterator abandoned
        in its consumer's cancellation is abandoned again when it is collected."""
        was_open = getattr(self, "_open", False)
        self._end()
        if not was_open or getattr(self, "_pid", None) != os.getpid():
            return
        task = getattr(self, "_task", None)
        if task is None or task.done():
            return
        loop = task.get_loop()
        if not loop.is_closed():
            loop.call_soon_threadsafe(task.cancel)
        else:  # closed with the epoch pending: it can never run again, so let it go
            _DRIVERS.discard(task)

    def __del__(self) -> None:
        self._abandon()


__all__ = ["AsyncEpochIterator", "Batch", "DirectIterator", "ThreadedIterator"]
