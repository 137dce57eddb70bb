"""The loader's own event loop, on one daemon thread, for the plain ``for`` loop.

uvloop is used when it is installed. The thread is started once per loader and reused by every
epoch; stopping it cancels what still runs there and waits for that, within a bound, so that no
"Task was destroyed but it is pending" warning is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, Final, TypeVar

T = TypeVar("T")

_STOP_GRACE_S = 2.0
"""How long stopping the loop waits for its cancelled tasks to finish."""


_new_loop: Callable[[], asyncio.AbstractEventLoop]
# Imported with the package, not by the first epoch: loading uvloop's extension takes ~2 ms,
# most of a first batch's time with workers (docs/performance.md, (f)).
try:
    import uvloop

    _new_loop = uvloop.new_event_loop
except ImportError:
    _new_loop = asyncio.new_event_loop


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's when it is installed, else asyncio's default."""
    _check_descriptors()
    return _new_loop()


_LOOP_DESCRIPTORS: Final = 6
"""The descriptors a loop takes as it is built (uvloop's five, asyncio's three), and more."""


def _check_descriptors() -> None:
    """Raise OSError (EMFILE) unless a loop can get its descriptors.

    Short of them, uvloop aborts the process (SIGABRT; libuv's half-built loop fails an
    assertion as it is freed), or raises after printing "deallocating an open event loop";
    asyncio's half-built loop prints an AttributeError as it is freed.
    """
    taken: list[int] = []
    try:
        while len(taken) < _LOOP_DESCRIPTORS:
            taken.extend(os.pipe())
    finally:
        for descriptor in taken:
            os.close(descriptor)


class LoopThread:
    """An event loop running forever on a daemon thread named ``asyncloader-loop``.

    The thread builds its loop itself: a Ctrl-C, raised only in the main thread, can then
    never leave a loop half built or never closed (uvloop says "deallocating an open event
    loop" of such a one).
    """

    loop: asyncio.AbstractEventLoop
    """The thread's loop, there once the constructor returns."""

    def __init__(self) -> None:
        self._started = threading.Event()
        self._claim = threading.Lock()
        self._abandoned = False
        self._failed: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="asyncloader-loop", daemon=True)
        try:
            self.thread.start()
            self._started.wait()
            if self._failed is not None:  # no loop for it (no descriptor left, say)
                failed, self._failed = self._failed, None
                raise failed
        except BaseException:  # no thread for it (the system gives no more), or Ctrl-C
            with self._claim:
                self._abandoned = True
                built = hasattr(self, "loop")
            if built:  # it runs the loop, or will: stopped, its thread closes it
                self._stop_soon()
            raise

    def _stop_soon(self) -> None:
        """Have the loop stop; its thread then closes it."""
        with contextlib.suppress(RuntimeError):  # closed already
            self.loop.call_soon_threadsafe(self.loop.stop)

    def _run(self) -> None:
        try:
            loop = new_event_loop()
        except BaseException as error:  # raised in the caller's thread instead
            self._failed = error
            self._started.set()
            return
        with self._claim:
            if self._abandoned:  # the constructor gave up before the loop was built
                loop.close()
                return
            self.loop = loop
        asyncio.set_event_loop(loop)
        loop.call_soon(self._started.set)
        try:
            loop.run_forever()
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.wait(tasks, timeout=_STOP_GRACE_S))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()

    def submit(self, function: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> Future[T]:
        """Run ``function(*args)`` as a task of this loop; return a future of its result
        (cancelling it cancels the task).

        The coroutine is made on the loop, not in the caller: a Ctrl-C there between making
        one and handing it over would leave it never run ("coroutine ... was never awaited").
        """
        future: Future[T] = Future()
        self.loop.call_soon_threadsafe(self._begin, future, function, args)
        return future

    def _begin(
        self, future: Future[T], function: Callable[..., Coroutine[Any, Any, T]], args: Any
    ) -> None:
        # Begun even if cancelled already: the cancellation then comes after its first step,
        # as with asyncio.run_coroutine_threadsafe, so that its `finally` blocks run.
        task = self.loop.create_task(function(*args))
        task.add_done_callback(lambda done: _settle(future, done))
        future.add_done_callback(lambda _: self._cancel_soon(future, task))

    def _cancel_soon(self, future: Future[Any], task: asyncio.Task[Any]) -> None:
        if future.cancelled():  # by the caller (or after the task was)
            with contextlib.suppress(RuntimeError):  # its loop is closed: the task is over
                self.loop.call_soon_threadsafe(task.cancel)

    def stop(self) -> None:
        """Stop the loop and join the thread (bounded; not while the interpreter finalizes)."""
        if self.loop.is_closed():
            return
        self._stop_soon()
        if not sys.is_finalizing() and threading.current_thread() is not self.thread:
            self.thread.join(timeout=_STOP_GRACE_S + 1.0)


def _settle(future: Future[T], task: asyncio.Task[T]) -> None:
    """Give ``future`` the outcome of ``task``, unless it was cancelled meanwhile."""
    if task.cancelled():
        future.cancel()
    elif future.set_running_or_notify_cancel():
        error = task.exception()
        if error is None:
            future.set_result(task.result())
        else:
            future.set_exception(error)
