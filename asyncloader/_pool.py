"""A thread pool of daemon threads that never blocks interpreter exit.

``concurrent.futures.ThreadPoolExecutor`` joins its workers at exit, so a dataset whose
``__getitem__`` never returns would hang the process. This pool's threads are daemons, are
started lazily up to ``max_threads``, and hold no reference to the pool (so a forgotten pool
is collected). Each job counts in the :class:`Jobs` of its epoch too (:data:`epoch_jobs`),
which is how an abandoned epoch proves that none of its jobs still runs the user's code,
whatever another epoch of the same loader runs.

At exit the jobs still queued are dropped and the running ones are given a few seconds to
return (:func:`_finish_at_exit`): a daemon thread still running as the interpreter finalizes
is ended where it stands, and if that is inside C++ code (a torch or pyarrow call in the
user's transform) the process aborts.

Results go straight to an asyncio future through ``call_soon_threadsafe``: one hop, no
``concurrent.futures.Future`` to chain, and a result that arrives after its loop closed (an
epoch cut off at exit) is dropped quietly instead of raising in the pool thread.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import itertools
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from queue import PriorityQueue
from typing import Any, Final, TypeVar

from ._stopped import escaped

T = TypeVar("T")
logger = logging.getLogger("asyncloader")

_EXIT_WAIT_S: Final = 2.0
"""How long the interpreter's exit waits, in all, for the jobs running on pool threads."""
_Job = tuple[
    Callable[..., Any],
    tuple[Any, ...],
    asyncio.AbstractEventLoop | None,
    asyncio.Future[Any] | None,
    "tuple[Jobs, ...]",
]
"""A job: its function and arguments, where its result goes (``None``: submitted), and where
it counts until it is done: its pool's jobs, and its epoch's if it is part of one."""
_Entry = tuple[float, int, _Job | None]

priority: contextvars.ContextVar[int] = contextvars.ContextVar("asyncloader_priority", default=0)
"""The priority of the jobs the running code submits: lower runs first. A batch task sets its
batch's position in the epoch, so the batch the consumer waits for gets the threads first."""


class Jobs:
    """The number of jobs submitted and not yet finished, with a wait for none: a pool's, or
    one epoch's, in every pool (threads and worker processes)."""

    def __init__(self) -> None:
        self.busy = 0
        self.idle = threading.Condition(threading.Lock())

    def add(self, delta: int) -> None:
        with self.idle:
            self.busy += delta
            if self.busy == 0:
                self.idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until none is queued or running; return whether that happened in time."""
        with self.idle:
            return self.idle.wait_for(lambda: self.busy == 0, timeout)


epoch_jobs: contextvars.ContextVar[Jobs | None] = contextvars.ContextVar(
    "asyncloader_epoch_jobs", default=None
)
"""The jobs of the epoch whose code runs: its driver sets it, and every job submitted from it
(the pools copy the context into their jobs) counts there as well as in its pool. An epoch
that ends waits for its own jobs, not for those of another epoch of the same loader."""


def _resolve(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # cancelled while the job ran
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


def _count(counts: tuple[Jobs, ...], delta: int) -> None:
    for jobs in counts:
        jobs.add(delta)


def _work(jobs: PriorityQueue[_Entry], ready: threading.Semaphore) -> None:
    while True:
        job = jobs.get()[2]
        if job is None:
            return
        fn, args, loop, future, counts = job
        del job  # so the user's objects are not kept alive by an idle thread
        if future is None:  # submitted: the job reports its own outcome
            try:
                fn(*args)
            except BaseException:  # a bug of ours: say so, and keep the thread
                logger.exception("asyncloader: a pool job failed")
        elif not future.cancelled():  # a cancelled epoch's queued jobs are skipped
            result: Any = None
            error: BaseException | None = None
            try:
                result = fn(*args)
            except BaseException as caught:
                error = escaped(caught)  # a future refuses a StopIteration
            # RuntimeError: the loop closed (an epoch cut off at exit); nobody waits.
            assert loop is not None
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_resolve, future, result, error)
            del result, error
        del fn, args, loop, future
        _count(counts, -1)
        ready.release()


class ThreadPool:
    """Up to ``max_threads`` daemon threads named ``{name}-N`` that run jobs for asyncio.

    Args:
        max_threads: The most threads it starts.
        name: The prefix of its threads' names.
    """

    def __init__(self, max_threads: int, name: str) -> None:
        self.max_threads = max_threads
        self.name = name
        self.pid = os.getpid()
        self._jobs: PriorityQueue[_Entry] = PriorityQueue()
        self._order = itertools.count()  # FIFO among jobs of the same priority
        self._ready = threading.Semaphore(0)
        self._counter = Jobs()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False
        self._inline = False
        """Whether a job ran on the caller's thread, since no thread could start."""
        _pools.add(self)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on a pool thread; cancelling the caller skips a job not yet begun."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if self._put(fn, args, loop, future):
            return await future
        try:
            return contextvars.copy_context().run(fn, *args)
        except (StopIteration, StopAsyncIteration) as stop:  # a coroutine refuses them
            raise escaped(stop) from stop

    def submit(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` on a pool thread, from any thread, with the caller's context and
        priority. Nobody waits for it: ``fn`` reports its own outcome and raises nothing."""
        if self._put(fn, args, None, None):
            return
        try:
            contextvars.copy_context().run(fn, *args)
        except BaseException:  # a bug of ours, as on a pool thread
            logger.exception("asyncloader: a pool job failed")

    def _put(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        loop: asyncio.AbstractEventLoop | None,
        future: asyncio.Future[Any] | None,
    ) -> bool:
        """Queue a job; ``False`` when not one thread of the pool could start to run it (the
        system gives no more): the caller then runs it in its own thread, slower, not failed."""
        if self._closed:
            raise RuntimeError(f"{self.name} pool is shut down")
        epoch = epoch_jobs.get()
        counts = (self._counter,) if epoch is None else (self._counter, epoch)
        _count(counts, 1)
        # The caller's context goes along (as with asyncio.to_thread): the retry loops of the
        # datasets find the epoch's statistics in it.
        job = (contextvars.copy_context().run, (fn, *args), loop, future, counts)
        entry = (priority.get(), next(self._order), job)
        self._jobs.put(entry)
        # A thread that finished a job released `_ready`: reuse it before starting another.
        if self._ready.acquire(blocking=False):
            return True
        try:
            self._start_thread()
        except RuntimeError as error:
            if self._withdraw(entry):  # no thread will ever run it
                self._say_inline(error)
                return False
        return True

    def _say_inline(self, error: RuntimeError) -> None:
        if not self._inline:
            self._inline = True
            logger.warning(
                "asyncloader: %s pool could start no thread (%s): its jobs run in the threads "
                "that submit them",
                self.name,
                error,
            )

    def _withdraw(self, entry: _Entry) -> bool:
        """Take back a queued job that no thread can run (none could start); whether it was
        still queued (a thread that started since may have taken it)."""
        found = False
        kept = []
        with self._lock:
            while not self._jobs.empty():
                queued = self._jobs.get_nowait()
                if queued is entry:
                    found = True
                else:
                    kept.append(queued)
            for queued in kept:
                self._jobs.put(queued)
        if found and entry[2] is not None:
            _count(entry[2][4], -1)
        return found

    def _start_thread(self) -> None:
        with self._lock:
            if len(self._threads) >= self.max_threads or self._closed:
                return
            thread = threading.Thread(
                target=_work,
                args=(self._jobs, self._ready),
                name=f"{self.name}-{len(self._threads)}",
                daemon=True,
            )
            try:
                thread.start()
            except RuntimeError as error:  # the system gives no more threads
                if not self._threads:
                    raise
                # Those running take the jobs: fewer at once, nothing failed for it.
                logger.warning(
                    "asyncloader: %s pool runs %d threads, not %d: %s",
                    self.name,
                    len(self._threads),
                    self.max_threads,
                    error,
                )
                self.max_threads = len(self._threads)
                return
            self._threads.append(thread)

    def owns(self, thread: threading.Thread) -> bool:
        """Whether ``thread`` is one of this pool's."""
        return thread in self._threads

    @property
    def busy(self) -> bool:
        """Whether a job is queued or running."""
        return self._counter.busy > 0

    def shutdown(self, wait: bool = True) -> None:
        """Stop the threads once their queued jobs are done; with ``wait``, join them (bounded).

        Joining is skipped in a forked child (the threads are not there), while the
        interpreter finalizes, and while a job still runs (a call that never returns must not
        hang the caller or the exit).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            threads = list(self._threads)
            wait = wait and not self.busy
        if os.getpid() != self.pid:
            return
        for _ in threads:  # after every queued job
            self._jobs.put((float("inf"), next(self._order), None))
        if wait and not sys.is_finalizing():
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join(timeout=5.0)

    def abandon(self) -> list[threading.Thread]:
        """At exit: drop the jobs not yet begun and stop the threads once their running job
        returns; the threads, to join."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        while not self._jobs.empty():
            job = self._jobs.get_nowait()[2]
            if job is not None:
                loop, future = job[2], job[3]
                _count(job[4], -1)
                if future is not None and loop is not None:
                    with contextlib.suppress(RuntimeError):  # its loop is closed
                        loop.call_soon_threadsafe(future.cancel)
        for _ in threads:
            self._jobs.put((float("inf"), next(self._order), None))
        return threads


_pools: weakref.WeakSet[ThreadPool] = weakref.WeakSet()


def _finish_at_exit() -> None:
    """Before the interpreter finalizes: each pool of this process drops its queued jobs,
    and the running ones get :data:`_EXIT_WAIT_S`, in all, to return (see the module
    docstring). One that is still running then is left as before."""
    deadline = time.monotonic() + _EXIT_WAIT_S
    threads = [
        thread for pool in list(_pools) if pool.pid == os.getpid() for thread in pool.abandon()
    ]
    for thread in threads:
        if thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))


atexit.register(_finish_at_exit)
