"""The threads one loader owns: its CPU pool, its I/O pool and its event loop thread.

Each is created on first use and serves every epoch. The runtime belongs to the process that
built it: after ``fork()`` the loader builds a fresh one, and the inherited one is left alone
(its threads do not exist in the child, and its locks may be held by threads that vanished).
A forgotten runtime is stopped by ``weakref.finalize``, so it never keeps the interpreter alive.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

from ._loop_thread import LoopThread
from ._pool import Jobs, ThreadPool
from ._processes import ProcessPool
from ._work import PickledWork

logger = logging.getLogger("asyncloader")

CLOSE_TIMEOUT_S: Final = 5.0
"""How long closing the loader waits for an async dataset's ``aclose()``."""


async def _close_all(closers: list[Callable[[], Awaitable[None]]]) -> None:
    # The epochs still open on this loop end first: a dataset is closed after the calls into
    # it, never under them (an async generator cannot even be closed while one waits in it).
    others = asyncio.all_tasks() - {asyncio.current_task()}
    for task in others:
        task.cancel()
    if others:
        await asyncio.wait(others, timeout=CLOSE_TIMEOUT_S)
    for close in closers:
        try:
            await asyncio.wait_for(close(), CLOSE_TIMEOUT_S)
        except Exception:
            logger.exception("%r failed", close)


@dataclass
class _Parts:
    """What the finalizer stops; it must not refer to the :class:`Runtime` itself."""

    pid: int = field(default_factory=os.getpid)
    cpu: ThreadPool | None = None
    io: ThreadPool | None = None
    loop: LoopThread | None = None
    procs: ProcessPool | None = None
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def stop(self) -> None:
        if os.getpid() != self.pid:
            return
        loop, self.loop = self.loop, None
        closers, self.closers = self.closers, []
        if closers and not sys.is_finalizing():
            # What ran on the loader's loop (an async dataset's sessions) is closed on it; a
            # loader used only with `async for` borrows a loop thread for the call.
            runner = loop if loop is not None else LoopThread()
            closing = runner.submit(_close_all, closers)
            try:
                closing.result(timeout=CLOSE_TIMEOUT_S + 1.0)
            except Exception:
                logger.exception("closing the dataset on the loader's loop failed")
            if runner is not loop:
                runner.stop()
        if loop is not None:
            loop.stop()
        for pool in (self.cpu, self.io):
            if pool is not None:
                pool.shutdown(wait=True)
        self.cpu = self.io = None
        procs, self.procs = self.procs, None
        if procs is not None:
            procs.close()


class Runtime:
    """The lazily built pools and loop thread of one loader in one process.

    Args:
        cpu_threads: Threads of the CPU pool (transforms, collation).
        io_threads: Threads of the I/O pool that runs a sync dataset's calls.
        closers: Awaited on the loop thread before it stops (an async dataset's ``aclose``),
            whether the loader is closed or forgotten.
        processes: Worker processes of the CPU stage (0: none).
        work: What they run, pickled (with ``processes``).
    """

    def __init__(
        self,
        cpu_threads: int,
        io_threads: int,
        closers: list[Callable[[], Awaitable[None]]] | None = None,
        processes: int = 0,
        work: PickledWork | None = None,
    ) -> None:
        self.cpu_threads = cpu_threads
        self.io_threads = io_threads
        self.processes = processes
        self.work = work
        self._parts = _Parts(closers=closers or [])
        self._finalizer = weakref.finalize(self, self._parts.stop)

    @property
    def pid(self) -> int:
        """The process that owns these threads."""
        return self._parts.pid

    @property
    def cpu(self) -> ThreadPool:
        """The CPU pool, started on first use."""
        if self._parts.cpu is None:
            self._parts.cpu = ThreadPool(self.cpu_threads, "asyncloader-cpu")
        return self._parts.cpu

    @property
    def io(self) -> ThreadPool:
        """The I/O pool for a sync dataset's calls, started on first use."""
        if self._parts.io is None:
            self._parts.io = ThreadPool(self.io_threads, "asyncloader-io")
        return self._parts.io

    @property
    def procs(self) -> ProcessPool | None:
        """The worker processes of the CPU stage, started on first use (``None``: none).

        Taken as an epoch starts: a pool whose processes could not be started is replaced,
        since what broke it may have passed (descriptors or memory short for a while), as
        torch starts its workers again each epoch. Work that the workers cannot load keeps
        failing every batch, saying why.
        """
        if self._parts.procs is not None and self._parts.procs.could_not_start:
            self._parts.procs.close()
            self._parts.procs = None
        if self.processes and self._parts.procs is None:
            assert self.work is not None
            self._parts.procs = ProcessPool(self.processes, self.work)
        return self._parts.procs

    @property
    def loop_thread(self) -> LoopThread:
        """The loader's own event loop thread, started on first use."""
        if self._parts.loop is None:
            self._parts.loop = LoopThread()
        return self._parts.loop

    def runs_here(self) -> bool:
        """Whether the calling thread is one of this runtime's (its loop or a pool's)."""
        parts, current = self._parts, threading.current_thread()
        if parts.loop is not None and parts.loop.thread is current:
            return True
        return any(pool is not None and pool.owns(current) for pool in (parts.cpu, parts.io))

    def retire_busy_pools(self, epoch: Jobs) -> None:
        """Replace the pools that still run jobs of the abandoned epoch whose jobs are
        ``epoch``.

        A dataset call that never returns holds its thread for good; the next epoch gets fresh
        threads instead of queueing behind it. The old threads exit when their call returns,
        once they have run the jobs queued to them (another epoch's, if one is open). A worker
        process is killed and replaced only if it runs one of ``epoch``'s jobs.
        """
        if epoch.busy == 0:
            return
        parts = self._parts
        if parts.cpu is not None and parts.cpu.busy:
            parts.cpu.shutdown(wait=False)
            parts.cpu = None
        if parts.io is not None and parts.io.busy:
            parts.io.shutdown(wait=False)
            parts.io = None
        if parts.procs is not None and parts.procs.busy:
            parts.procs.retire_busy(epoch)  # killed, and replaced

    def close(self, run_closers: bool = True) -> None:
        """Run the closers on the loop thread (unless the caller already closed the dataset),
        then stop it and the pools (bounded)."""
        if not run_closers:
            self._parts.closers = []
        self._finalizer()
