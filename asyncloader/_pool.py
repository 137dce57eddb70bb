"""A thread pool of daemon threads that never blocks interpreter exit.

``concurrent.futures.ThreadPoolExecutor`` joins its workers at exit, so a dataset whose
``__getitem__`` never returns would hang the process. This pool's threads are daemons, are
started lazily up to ``max_threads``, hold no reference to the pool (so a forgotten pool is
collected), and can be waited on until idle, which is how an abandoned epoch proves that no
thread still runs the user's code.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from queue import SimpleQueue
from typing import Any, TypeVar

T = TypeVar("T")
_Job = tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None


class _Counter:
    """The number of jobs submitted and not yet finished, with a wait for zero."""

    def __init__(self) -> None:
        self.busy = 0
        self.idle = threading.Condition(threading.Lock())

    def add(self, delta: int) -> None:
        with self.idle:
            self.busy += delta
            if self.busy == 0:
                self.idle.notify_all()


def _work(jobs: SimpleQueue[_Job], ready: threading.Semaphore, counter: _Counter) -> None:
    while True:
        job = jobs.get()
        if job is None:
            return
        future, fn, args = job
        del job  # so the user's objects are not kept alive by an idle thread
        if future.set_running_or_notify_cancel():
            try:
                result = fn(*args)
            except BaseException as error:
                future.set_exception(error)
                del error
            else:
                future.set_result(result)
                del result
        del future, fn, args
        counter.add(-1)
        ready.release()


class ThreadPool(Executor):
    """An executor of up to ``max_threads`` daemon threads named ``{name}-N``.

    Args:
        max_threads: The most threads it starts.
        name: The prefix of its threads' names.
    """

    def __init__(self, max_threads: int, name: str) -> None:
        self.max_threads = max_threads
        self.name = name
        self.pid = os.getpid()
        self._jobs: SimpleQueue[_Job] = SimpleQueue()
        self._ready = threading.Semaphore(0)
        self._counter = _Counter()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Run ``fn(*args)`` on a pool thread and return its future."""
        if kwargs:
            raise TypeError("ThreadPool.submit takes positional arguments only")
        if self._closed:
            raise RuntimeError(f"{self.name} pool is shut down")
        future: Future[T] = Future()
        self._counter.add(1)
        self._jobs.put((future, fn, args))
        # A thread that finished a job released `_ready`: reuse it before starting another.
        if not self._ready.acquire(blocking=False):
            self._start_thread()
        return future

    def _start_thread(self) -> None:
        with self._lock:
            if len(self._threads) >= self.max_threads or self._closed:
                return
            thread = threading.Thread(
                target=_work,
                args=(self._jobs, self._ready, self._counter),
                name=f"{self.name}-{len(self._threads)}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    @property
    def busy(self) -> bool:
        """Whether a job is queued or running."""
        return self._counter.busy > 0

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no job is queued or running; return whether that happened in time."""
        with self._counter.idle:
            return self._counter.idle.wait_for(lambda: self._counter.busy == 0, timeout)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
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
        for _ in threads:
            self._jobs.put(None)
        if wait and not sys.is_finalizing():
            for thread in threads:
                if thread is not threading.current_thread():
                    thread.join(timeout=5.0)
