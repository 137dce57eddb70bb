"""``cpu_processes``: a loader's worker processes, as the loader drives them.

The workers are started once per loader by its zygote (:mod:`._zygote`), never by forking the
loader's process, which runs threads. The zygote loads the loader's work once
(:class:`._worker.Work`, pickled when the loader was built, into memory it maps:
:mod:`._work`) and forks each worker with it, then each gets jobs. Every
worker has two threads here: one sends it jobs, the other takes its results. A job goes to
whichever worker has room for it (at most :data:`DEPTH` held, so that its next job is already
there when it ends one), the oldest batch first.

A result is rebuilt on the shared memory the worker wrote it into (:mod:`._shared`) and
resolves the job's asyncio future. A worker that dies (a segfault, ``os._exit``, the OOM
killer) fails the jobs it held with a :class:`WorkerError` naming the signal or exit code, and
is replaced (a zygote killed alone after it served is started again for that); a worker that
cannot load the work breaks the pool, and every job then fails saying why.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import errno
import heapq
import itertools
import logging
import os
import pickle
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Final

from ._forked import parents_only
from ._logs import replay
from ._pool import Jobs, epoch_jobs, priority
from ._reword import reword
from ._shared import WHAT_PICKLES, Discard, Mapped
from ._stats import Tally
from ._work import PickledWork
from ._worker import ErrorPayload, Job, message
from ._zygote import Zygote

logger = logging.getLogger("asyncloader")

SLOW_START_S = 30.0
"""How long the workers may take to be ready before a warning says so (their start is
about a quarter of a second here; a load that waits on a network can take for ever)."""

DEPTH: Final = 2
"""Jobs one worker holds at most: the one it runs and the next."""

RESTARTS: Final = 3
"""Workers (and their server) started in a row in the place of one killed before it could load
the work (by SIGKILL, or in any way once a worker has loaded it): the pool then breaks, as when
the work cannot load, until the next epoch where they were killed."""

_JOIN_S: Final = 5.0
"""How long closing waits for the workers to exit before it kills them."""


class WorkerError(RuntimeError):
    """A worker process of ``cpu_processes`` failed a batch in a way the batch's own
    exception cannot say: the worker died, or its exception could not be sent back."""


def _again(error: BaseException) -> BaseException:
    """``error`` for one more batch: a copy of it, caused by what caused it, with no traceback
    yet. The one object raised for every batch would gather each raise's frames (three more a
    batch, and the locals they hold, for as long as the loader fails), and a traceback read
    from one batch's error would change under the next."""
    try:
        fresh = copy.copy(error)
    except Exception:  # an exception whose __init__ its own args do not fit
        return error.with_traceback(None)
    fresh.__cause__, fresh.__context__ = error.__cause__, error.__context__
    fresh.__suppress_context__ = error.__suppress_context__
    return fresh


def _not_started(what: str, error: BaseException) -> WorkerError:
    """``what`` could not start, because of ``error`` (its cause), saying which limit it may
    have met when the system refused a thread or a process."""
    refused = (isinstance(error, RuntimeError) and "can't start new thread" in str(error)) or (
        isinstance(error, OSError) and error.errno in (errno.EAGAIN, errno.ENOMEM)
    )
    hint = (
        " (the system refused a new thread or process: a limit on them, as `ulimit -u` or "
        "a container's pids.max sets, or on memory)"
        if refused
        else ""
    )
    wrapped = WorkerError(f"{what} could not start: {error}{hint}")
    wrapped.__cause__ = error
    return wrapped


def _reason(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    if code is None:  # never forked, or orphaned: the zygote that reports exits is gone
        return "ended, its exit status unknown"
    return f"exited with code {code}"


def _unsendable(error: Exception) -> Exception:
    if isinstance(error, MemoryError):  # they would pickle, given room
        return error
    return WorkerError(
        f"a batch's items cannot be pickled: {error}; with cpu_processes, an async dataset's "
        "or a stream's items go to the worker processes pickled, for the transform and "
        f"collate_fn: have it return {WHAT_PICKLES}, or use cpu_threads"
    )


def check_sendable(items: list[Any]) -> None:
    """Raise the error a job of ``items`` would fail with as it went to a worker."""
    try:
        pickle.Pickler(Discard(), protocol=5).dump(items)
    except Exception as error:
        raise _unsendable(error) from None


def rebuild_error(payload: ErrorPayload, where: str) -> BaseException:
    """The exception a worker sent, of its own type where it can be rebuilt, with the
    worker's traceback in its message."""
    pickled, described, trace = payload
    told = f"\n\n{where}; the worker's traceback:\n{trace}"
    error: BaseException | None = None
    if pickled is not None:
        with contextlib.suppress(Exception):
            error = pickle.loads(pickled)
    if error is None:
        return WorkerError(f"{described}{told}")
    reword(error, f"{error}{told}", told.lstrip("\n"))
    return error


@dataclass
class Reply:
    """A job's outcome: its value (or the exception to raise), what it recorded, and the
    items ``errors="skip"`` dropped (for the loader's skipper to count)."""

    value: Any
    error: BaseException | None
    tally: Tally
    skipped: list[tuple[int, BaseException]]


class _Task:
    __slots__ = ("epoch", "future", "job", "loop", "number", "priority")

    def __init__(
        self, job: Job, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Reply]
    ) -> None:
        self.job, self.loop, self.future = job, loop, future
        self.number = 0
        """The job's number, unique in its pool: its worker's answer carries it back."""
        self.priority = priority.get()
        self.epoch = epoch_jobs.get()
        """The jobs of the epoch it is part of, if any, where it counts until settled."""

    def resolve(self, reply: Reply | None, error: BaseException | None = None) -> None:
        def settle() -> None:
            if self.future.done():  # cancelled meanwhile
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(reply)  # type: ignore[arg-type]

        # RuntimeError: the loop closed (an epoch cut off at exit); nobody waits.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(settle)


class _Worker:
    """One worker process, its socket and the two threads that serve it."""

    def __init__(self, pool: ProcessPool, number: int) -> None:
        self.pool = pool
        self.number = number
        assert pool.zygote is not None
        self.zygote = pool.zygote
        """The server it was forked from."""
        self.process, self.sock = self.zygote.spawn(number)
        self.conn = Connection(os.dup(self.sock.fileno()))
        parents_only(self.sock, self.conn)
        self.held: deque[_Task] = deque()
        """Jobs sent and not yet answered, in the order sent (and answered)."""
        self.mapped: Mapped | None = None
        self.ready = False
        self.dead = False
        self.failure: str | None = None
        """What the worker did wrong, where it did not die: it is killed and replaced."""
        self.retired = False
        """The loader killed it, its epoch abandoned amid a job (Ctrl-C, a call that never
        returns): it did not die, and its end is no warning's."""
        self.threads: list[threading.Thread] = []
        self._sockets = threading.Lock()
        self._serving = 0
        """Its threads that may still read or write its socket."""
        self._closed = False
        """:meth:`close` was called: the last of its threads to end closes the socket."""

    @property
    def where(self) -> str:
        """Where a batch's error happened, for its message."""
        return f"in asyncloader worker process {self.number} (pid {self.process.pid})"

    def serve(self) -> None:
        """Start the threads that send its jobs and take its results."""
        self.threads = [
            threading.Thread(
                target=self._serve,
                args=(role,),
                name=f"asyncloader-worker-{self.number}-{role.__name__[1:]}",
                daemon=True,
            )
            for role in (self._send, self._receive)
        ]
        for thread in self.threads:
            with self._sockets:
                self._serving += 1
            try:
                thread.start()
            except BaseException:
                self._left()
                raise

    def _serve(self, role: Callable[[], None]) -> None:
        try:
            role()
        finally:
            self._left()

    def _left(self) -> None:
        """One of its threads is done with the socket (or never started)."""
        with self._sockets:
            self._serving -= 1
            last = self._closed and self._serving == 0
        if last:
            self._close_socket()

    def _send(self) -> None:
        pool = self.pool
        try:
            while True:
                task = pool.take(self)
                if task is None:
                    break
                try:
                    sent = message((task.number, task.job))
                except Exception as error:  # items that cannot cross
                    pool.done(self, None)
                    task.resolve(None, _unsendable(error))
                    continue
                self.conn.send_bytes(sent)
                del sent, task
            if not self.dead:
                self.conn.send_bytes(pickle.dumps(None))  # stop
        except OSError:  # the worker is gone: the receiving thread fails what it held
            return

    def _receive(self) -> None:
        try:
            status = pickle.loads(self.conn.recv_bytes())
            if status[0] == "broken":
                self.pool.broke(rebuild_error(status[1], self.where))
                return
            _, fds, _, _ = socket.recv_fds(self.sock, 1, 1)
            if not fds:  # it died between its word and its memory: as it started
                return
            self.mapped = Mapped(fds[0])
            self.ready = True
            self.pool.started()
            while True:
                number, reply, logged = pickle.loads(self.conn.recv_bytes())
                replay(logged)
                del logged
                expected = len(reply[3]) if reply[0] == "ok" else 0
                fds = socket.recv_fds(self.sock, 1, expected)[1] if expected else []
                # Short of descriptors: it died between its answer and them, and the batch
                # fails as any a dead worker held (until session 33 a ValueError ended this
                # thread, the batch never answered).
                complete = len(fds) == expected
                if not complete or not self.pool.answers(self, number):
                    for fd in fds:
                        os.close(fd)
                    if complete:
                        self.failure = f"answered a job it was not given (job {number})"
                    return
                task = self.pool.done(self, True)
                self._deliver(task, reply, fds)
                del task, reply
        except (EOFError, OSError):
            pass
        finally:
            self._died()

    def _deliver(self, task: _Task, reply: tuple[Any, ...], fds: list[int]) -> None:
        mapped = self.mapped
        assert mapped is not None
        if reply[0] != "ok":
            _, error, tally, skipped = reply
            result = Reply(None, rebuild_error(error, self.where), tally, self._errors(skipped))
            task.resolve(result)
            return
        _, data, refs, new, dropped, tally, skipped = reply
        mapped.update(new, fds, dropped)
        if task.future.cancelled():
            mapped.free(refs)
            return
        try:
            value = mapped.unpack(data, refs)
        except Exception as error:
            task.resolve(Reply(None, error, tally, self._errors(skipped)))
            return
        task.resolve(Reply(value, None, tally, self._errors(skipped)))

    def _errors(self, skipped: list[tuple[int, ErrorPayload]]) -> list[tuple[int, BaseException]]:
        return [(index, rebuild_error(error, self.where)) for index, error in skipped]

    def _died(self) -> None:
        pool = self.pool
        held = pool.lost(self)
        self.process.join(timeout=1.0)
        if self.process.is_alive():  # its socket failed, not the process: end it
            self.process.kill()
            self.process.join(timeout=1.0)
        if pool.closing:
            for task in held:
                task.resolve(None, RuntimeError("the loader's worker processes are shut down"))
            return
        reason = self.failure or _reason(self.process.exitcode)
        if self.retired:
            reason = "was stopped by the loader, its epoch abandoned"
            logger.debug("asyncloader worker process %d %s", self.number, reason)
        elif held and self.ready:  # one that could not start: broke() says why, once
            logger.warning("asyncloader worker process %d %s", self.number, reason)
        if not self.ready:
            zygote = self.zygote
            ended = None
            if not self.process.pid:  # never forked: did the zygote end?
                with contextlib.suppress(subprocess.TimeoutExpired):  # it may still be exiting
                    ended = zygote.process.wait(timeout=1.0)
            killed = -signal.SIGKILL in (ended, self.process.exitcode)
            if pool.restart_unready(zygote, killed):
                # It (or its server) died before it loaded the work: killed (the OOM killer),
                # or the work loads elsewhere. It ran none of its jobs; another takes its place.
                pool.requeue(held)
                self._replace()
                return
            # It could not even start: a new one would fare no better.
            failure = zygote.failure
            if failure is not None:
                error = rebuild_error(failure, "as the worker processes started")
            elif ended is not None:  # the zygote ended before it forked: as it loaded the work
                error = WorkerError(
                    f"the asyncloader worker processes' server {_reason(ended)} as it loaded "
                    "the work (the dataset, transform and collate_fn) for the workers"
                )
            else:
                error = WorkerError(
                    f"asyncloader worker process {self.number} {reason} as it started "
                    "(its output says why)"
                )
            if killed:
                error = WorkerError(
                    f"{error} ({RESTARTS + 1} times in a row; the next epoch starts the "
                    "workers again)"
                )
            error = pool.broke(error, may_pass=killed)
            for task in held:
                task.resolve(None, _again(error))
            return
        error = WorkerError(
            f"asyncloader worker process {self.number} (pid {self.process.pid}) {reason} "
            "while it held this batch; a new worker took its place"
        )
        for task in held:
            task.resolve(None, _again(error))
        self._replace()

    def _replace(self) -> None:
        try:
            self.pool.replace(self)
        except Exception as failed:
            error = _not_started("a new asyncloader worker process", failed)
            self.pool.broke(error, start_failed=True)

    @property
    def sending(self) -> bool:
        """Whether its sending thread started (it tells the worker to stop)."""
        return bool(self.threads) and self.threads[0].ident is not None

    def close(self, join: float = 0.0) -> None:
        """Close this side's socket (after the worker exited or was killed), and wait up to
        ``join`` seconds for its threads to end; one still running closes it as it ends."""
        # Shut down first: a thread blocked on the socket returns, and only then is it closed
        # (a descriptor closed under a blocked read could be reused by another file).
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        # A thread may never have started (none can at interpreter shutdown, 3.12 and on).
        for thread in self.threads:
            if thread.ident is not None and thread is not threading.current_thread():
                thread.join(join)
        # Closed once no thread of its own may be in a call on it: closed under a call, its
        # descriptors' numbers could go to the next file opened (a new worker's socket),
        # which the call would then write to or read from. Until session 33 a job sent as
        # its worker died could reach the worker that replaced it, whose answer was then
        # taken for another batch's.
        with self._sockets:
            self._closed = True
            now = self._serving == 0
        if now:
            self._close_socket()

    def _close_socket(self) -> None:
        self.sock.close()
        self.conn.close()


class ProcessPool:
    """``processes`` worker processes running jobs for asyncio code, oldest batch first.

    Args:
        processes: How many workers.
        work: What every worker loads.
    """

    def __init__(self, processes: int, work: PickledWork) -> None:
        self.processes = processes
        self.work = work
        self.zygote: Zygote | None = None
        self.workers: list[_Worker] = []
        self.pid = os.getpid()
        self.closing = False
        self._broken: BaseException | None = None
        self._start_failed = False
        self._queue: list[tuple[int, int, _Task]] = []
        self._order = itertools.count()
        self._busy = 0
        """Jobs queued or held by a worker."""
        self._changed = threading.Condition(threading.Lock())
        self._ready = threading.Event()
        self._starter: threading.Thread | None = None
        self._reviving = threading.Lock()
        """Held while a server killed alone is replaced: one new server, whoever notices."""
        self._served = False
        """Whether a worker has loaded the work (one that dies as it starts since was
        killed)."""
        self._restarts = 0
        """Workers started in a row in the place of one that died as it started."""
        self._dead: Zygote | None = None
        """The last dead server counted in :attr:`_restarts`."""
        self._start_time: float | None = None
        self._slow_said = False

    def start(self) -> None:
        """Start the workers, on a thread of their own (the caller goes on); idempotent."""
        with self._changed:
            if self._starter is not None or self.closing:
                return
            self._start_time = time.monotonic()
            self._starter = threading.Thread(
                target=self._start, name="asyncloader-workers-start", daemon=True
            )
        self._starter.start()

    def _start(self) -> None:
        try:
            self.zygote = self._new_zygote()
            with self._changed:
                self.workers = [_Worker(self, number) for number in range(self.processes)]
            for worker in self.workers:
                worker.serve()
        except Exception as error:
            self.broke(_not_started("the worker processes", error), start_failed=True)

    def _new_zygote(self) -> Zygote:
        work = self.work.descriptor()
        try:
            return Zygote(self.work.modules, self.work.main, work, self.work.layout)
        finally:
            os.close(work)

    def restart_unready(self, zygote: Zygote, killed: bool) -> bool:
        """Whether to start a worker in the place of one from ``zygote`` that died before it
        loaded the work without saying why: yes if it (or ``zygote``) was ``killed`` by
        SIGKILL, never the work's own doing, or a worker has loaded the work before, and
        fewer than :data:`RESTARTS` in a row died so."""
        with self._reviving:
            if not (self._served or killed) or zygote.failure is not None:
                return False
            if zygote is self._dead:  # one death for all the workers it took
                return True
            if self._restarts >= RESTARTS:
                return False
            self._restarts += 1
            if zygote.process.poll() is not None:
                self._dead = zygote
            return True

    def _revive(self) -> None:
        """Start a new server if the one that forks the workers died (its workers serve on,
        but no new one could start)."""
        with self._reviving:
            dead = self.zygote
            if dead is None or dead.process.poll() is None:
                return
            dead.close()
            self.zygote = self._new_zygote()
            with self._changed:
                closed = self.closing
        if closed:  # close() may have closed the dead one only
            self.zygote.close()

    async def run(self, job: Job) -> Reply:
        """Run ``job`` in a worker; cancelling the caller drops a job not yet sent."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Reply] = loop.create_future()
        task = _Task(job, loop, future)
        with self._changed:
            if self.closing:
                raise RuntimeError("the loader's worker processes are shut down")
            if self._broken is not None:
                raise _again(self._broken)
            task.number = next(self._order)
            heapq.heappush(self._queue, (task.priority, task.number, task))
            self._busy += 1
            if task.epoch is not None:
                task.epoch.add(1)
            self._changed.notify()
        return await future

    def take(self, worker: _Worker) -> _Task | None:
        """The next job for ``worker`` once it has room (its sending thread); ``None``: stop."""
        with self._changed:
            while True:
                if self.closing or worker.dead or worker.retired:
                    return None
                while self._queue and len(worker.held) < DEPTH:
                    task = heapq.heappop(self._queue)[2]
                    if task.future.cancelled():  # its epoch ended: never sent
                        self._settle_locked(task)
                        continue
                    worker.held.append(task)
                    return task
                self._changed.wait()

    def answers(self, worker: _Worker, number: int) -> bool:
        """Whether an answer of ``worker`` to job ``number`` is to its oldest job, as each of
        its answers must be (any other would be taken for another batch's)."""
        with self._changed:
            return bool(worker.held) and worker.held[0].number == number

    def done(self, worker: _Worker, answered: bool | None) -> _Task:
        """``worker`` answered its oldest job (or, with ``None``, could not send it)."""
        with self._changed:
            task = worker.held.popleft() if answered else worker.held.pop()
            self._settle_locked(task)
            self._changed.notify_all()
            return task

    def _settle_locked(self, task: _Task) -> None:
        self._busy -= 1
        if task.epoch is not None:
            task.epoch.add(-1)
        if self._busy == 0:
            self._changed.notify_all()

    def lost(self, worker: _Worker) -> list[_Task]:
        """``worker`` is gone: the jobs it held, no longer counted."""
        with self._changed:
            worker.dead = True
            held = list(worker.held)
            worker.held.clear()
            for task in held:
                self._settle_locked(task)
            self._changed.notify_all()
            return held

    def replace(self, worker: _Worker) -> None:
        """Start a new worker in the place of ``worker``, which died."""
        worker.close()
        with self._changed:
            if self.closing or self._broken is not None or worker not in self.workers:
                return
        self._revive()
        with self._changed:
            if self.closing or self._broken is not None:
                return
            try:
                position = self.workers.index(worker)
            except ValueError:
                return
            worker = self.workers[position] = _Worker(self, worker.number)
        worker.serve()

    def requeue(self, tasks: list[_Task]) -> None:
        """Queue again ``tasks``, which a worker that never ran them held."""
        with self._changed:
            broken = self._broken
            if broken is None and not self.closing:
                for task in tasks:
                    self._busy += 1
                    if task.epoch is not None:
                        task.epoch.add(1)
                    heapq.heappush(self._queue, (task.priority, task.number, task))
                self._changed.notify_all()
                return
        for task in tasks:
            shut = RuntimeError("the loader's worker processes are shut down")
            task.resolve(None, shut if broken is None else _again(broken))

    def broke(
        self, error: BaseException, start_failed: bool = False, may_pass: bool = False
    ) -> BaseException:
        """No worker can run the work: fail every job, now and later, with the first such
        ``error`` (the one that says why; ``start_failed``: a process could not be started;
        ``may_pass``: what broke it may pass, as a start that failed may); return it."""
        first = False
        with self._changed:
            if self._broken is None:
                self._broken = error
                self._start_failed = start_failed or may_pass
                first = True
            error = self._broken
            self._ready.set()  # nothing to wait for
            queued, self._queue = self._queue, []
            for _, _, task in queued:
                self._settle_locked(task)
            self._changed.notify_all()
        for _, _, task in queued:
            task.resolve(None, _again(error))
        if first and not start_failed:  # (a start fails at exit too: its batches say so)
            logger.warning(
                "asyncloader: the worker processes cannot run the work, and every batch "
                "fails: %s: %s",
                type(error).__name__,
                str(error).split("\n", 1)[0],
            )
        return error

    def started(self) -> None:
        """A worker has loaded the work: jobs go to the workers from now on."""
        self._served = True
        self._restarts = 0
        self._ready.set()

    def note_slow_start(self) -> None:
        """Say once, as a warning, that the workers are still not ready after
        :data:`SLOW_START_S` (their server still loads the work: a ``__setstate__`` that
        waits on something): until they are, one CPU thread makes the batches."""
        started = self._start_time
        if self._slow_said or started is None or time.monotonic() - started < SLOW_START_S:
            return
        self._slow_said = True
        logger.warning(
            "asyncloader: the %d worker processes are not ready %.0f s after they were "
            "started (they still load the work: the dataset, transform and collate_fn); "
            "until they are, the batches are made on one CPU thread",
            self.processes,
            time.monotonic() - started,
        )

    @property
    def ready(self) -> bool:
        """Whether a worker has loaded the work, or none ever will (the pool is broken: a job
        then raises why)."""
        return self._ready.is_set()

    def wait_ready(self, timeout: float) -> bool:
        """Start the workers if need be, and wait until :attr:`ready`; return whether that
        happened in time."""
        self.start()
        return self._ready.wait(timeout)

    @property
    def could_not_start(self) -> bool:
        """Whether it broke because a process could not be started (descriptors or memory
        short, say) or was killed as it started: unlike work that cannot be loaded, what
        broke it may pass."""
        return self._start_failed  # set only with the pool's first breakage

    @property
    def busy(self) -> bool:
        """Whether a job is queued or held by a worker."""
        return self._busy > 0

    def retire_busy(self, epoch: Jobs) -> None:
        """Kill the workers still running a job of the abandoned epoch whose jobs are
        ``epoch`` (a call that never returns); each is replaced. A worker running another
        epoch's job is left to it."""
        with self._changed:
            stuck = [w for w in self.workers if w.held and w.held[0].epoch is epoch]
            for worker in stuck:  # it takes no job more: one of the next epoch's would fail
                worker.retired = True
            self._changed.notify_all()
        for worker in stuck:
            with contextlib.suppress(OSError):
                worker.process.kill()

    def close(self) -> None:
        """Stop the workers: each ends its job and exits, or is killed after a while."""
        with self._changed:
            if self.closing:
                return
            self.closing = True
            queued, self._queue = self._queue, []
            for _, _, task in queued:
                self._settle_locked(task)
            self._changed.notify_all()
            starter = self._starter
        if starter is not None and starter is not threading.current_thread():
            starter.join(_JOIN_S)  # its workers, if any, are then in the list
        with self._changed:
            workers = list(self.workers)
        for _, _, task in queued:
            task.resolve(None, RuntimeError("the loader's worker processes are shut down"))
        if os.getpid() != self.pid:
            return
        # One that still loads the work (imports, a dataset's __setstate__: seconds, or for
        # ever) reads its socket only once it has: waited for below, each worker in turn,
        # then the zygote. It has run no job; nothing is lost with it.
        zygote = self.zygote
        if zygote is not None and zygote.loading:
            zygote.kill()
        for worker in workers:
            if not worker.ready:
                worker.process.kill()
        for worker in workers:
            if not worker.sending:  # nobody to tell it to stop: its socket's end does
                worker.close()
            worker.process.join(timeout=_JOIN_S / max(1, len(workers)))
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(timeout=1.0)
            worker.close(join=1.0)
        if self.zygote is not None:
            self.zygote.close()
