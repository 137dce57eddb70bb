"""How worker processes start: a fork server of the loader's own, the zygote.

The loader's process runs threads, so it never forks. It starts a fresh interpreter instead
(``subprocess``, which execs at once). That interpreter, the zygote, imports the modules the
loader's work is made of and nothing else: not the main module, unless the work needs it, and
so not torch because a training script imports it. It then loads the work, once, from the
memory the loader pickled it into (:mod:`._work`), and forks a worker each time it is asked. A
fork from it is cheap and shares those imports and the loaded work, copy-on-write, as torch's
workers share a forked loader's dataset: no worker loads a copy of its own. The zygote runs one
thread: it starts with one thread per math library, and checks before every fork that no
import, and no loading, started another (if one did, each worker is a fresh interpreter that
loads the work itself).

The zygote is the workers' parent: it reaps them and reports each exit status to the loader.
It exits when the loader's end of its socket closes (the loader closed, or died), and so does
each worker (its own socket); it kills those still running as it goes (a dead loader's, in a
call that never returns).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import marshal
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, BinaryIO, Final

from ._file_mapped import descriptors_held
from ._forked import parents_only
from ._logs import Reporting, follow, reporting
from ._shared import anonymous
from ._worker import Layout, Work, error_payload, load_work, serve


class _Main:
    """Whether this process is importing the loader's main script, as the zygote (or a
    worker that starts alone) does: a loader built then is the script's unguarded code. A
    flag of the process, not of its environment, which every process a worker starts would
    inherit."""

    importing = False


def importing_main() -> bool:
    """Whether the loader's main script is being imported here, to find what the work needs."""
    return _Main.importing


MainSource = tuple[str, str]
"""How a fresh interpreter imports the loader's main module: ``("name", module)`` or
``("path", file)``."""


def main_source() -> MainSource | None:
    """How a fresh interpreter imports this process's main module again, as
    ``multiprocessing`` does: by the name it was run under (``python -m job.train``, whose
    relative imports need its package), else by its file. ``None`` where it cannot: no file
    holds it (a notebook, the interactive interpreter, ``python -c``), or it is a package's
    ``__main__.py``, whose code runs whole when imported."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    path = getattr(main, "__file__", None)
    if isinstance(name, str):
        if name == "__main__" or name.endswith(".__main__"):
            return None
        return "name", name
    if isinstance(path, str) and os.path.basename(path) != "__main__.py":
        return "path", path
    return None


def _import_main(source: MainSource) -> None:
    how, where = source
    _Main.importing = True
    try:
        if how == "path":
            from multiprocessing import spawn

            spawn.import_main_path(where)
        else:  # as multiprocessing's spawn does for a module run with -m
            import runpy
            import types

            module = types.ModuleType("__mp_main__")
            module.__dict__.update(runpy.run_module(where, run_name="__mp_main__", alter_sys=True))
            sys.modules["__main__"] = sys.modules["__mp_main__"] = module
    finally:
        _Main.importing = False


_ONE_THREAD: Final = {
    name: "1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
}
"""Math libraries start their thread pools at import; in the zygote they must not (a fork of
a process that runs threads is unsafe), and a worker is one of many processes anyway."""


_OPTIONS: Final[Callable[[], list[str]]] = subprocess._args_from_interpreter_flags  # type: ignore[attr-defined]
"""This interpreter's options as arguments; what ``multiprocessing`` starts its processes
with (private to the standard library, and there since Python 3.2)."""

_Memory = tuple[int, Layout]
"""The descriptor of the memory the work is pickled in, and where it lies in it."""


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # pragma: no cover - not Linux: no way to count, trust the settings
        return 1


class WorkerProcess:
    """A worker forked by the zygote, as the loader sees it: its pid once forked, its exit
    status once the zygote reports it.

    It is held by a pidfd too, where Linux has them: the loader can then kill it without
    hitting another process that took its pid, and, once the zygote is gone (killed alone:
    its workers serve on), see it exit.
    """

    def __init__(self, number: int) -> None:
        self.number = number
        self.pid: int | None = None
        self.exitcode: int | None = None
        self._forked = threading.Event()
        self._ended = threading.Event()
        self._pidfd: int | None = None
        self._orphan = False

    def forked(self, pid: int) -> None:
        self.pid = pid
        with contextlib.suppress(OSError, AttributeError):  # gone, out of descriptors, no pidfds
            self._pidfd = os.pidfd_open(pid)
            # Not at exit: the loader's own finalizer, made before, runs after and kills
            # through it (the process's end closes it then).
            weakref.finalize(self, os.close, self._pidfd).atexit = False
        self._forked.set()

    def orphaned(self) -> None:
        """The zygote is gone: nobody will report its exit, which its pidfd shows instead
        (without one, it is taken for ended)."""
        if self._pidfd is None:
            self.ended(None)
        else:
            self._orphan = True

    def _exited(self, timeout: float) -> bool:
        """Whether an orphan's pidfd says it exited, within ``timeout``."""
        assert self._pidfd is not None
        if select.select([self._pidfd], [], [], timeout)[0]:
            self.ended(None)
        return self._ended.is_set()

    def ended(self, code: int | None) -> None:
        self.exitcode = code
        self._forked.set()
        self._ended.set()

    def wait_forked(self, timeout: float) -> int | None:
        """Wait until the zygote forked it (or it can no longer be); its pid, if it has one."""
        self._forked.wait(timeout)
        return self.pid

    def join(self, timeout: float) -> bool:
        """Wait until it exited (or its exit can no longer be known); whether it did."""
        if self._orphan:
            return self._exited(timeout)
        return self._ended.wait(timeout)

    def is_alive(self) -> bool:
        if self._orphan:
            return not self._exited(0.0)
        return not self._ended.is_set()

    def kill(self) -> None:
        """SIGKILL it, if it was forked and runs."""
        if self.pid is None or self._ended.is_set():
            return
        with contextlib.suppress(ProcessLookupError):
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)


_SHIELDED: Final = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
"""Signals sent to every process of a job, that are its main process's to handle: Ctrl-C (to
the terminal's foreground group), SIGTERM (SLURM's preemption, ``scancel`` and time limit,
systemd's stop; a SIGKILL follows after a grace time in which a training loop saves its
checkpoint) and SIGUSR1 or SIGUSR2 (SLURM's ``--signal``, a warning that the time is nearly
up, on which Lightning and submitit save and requeue). The zygote and the workers take them
and do nothing: they exit when the loader closes or its process goes (their sockets close)."""


def _unheeded(number: int, frame: object) -> None:
    """A shielded signal's handler: nothing. Caught rather than ignored, since a program a
    worker starts keeps what is ignored (exec resets only what is caught): it must take Ctrl-C
    and ``terminate()`` as usual."""


def _shield() -> None:
    """Take the shielded signals, which the process started with blocked (:func:`_start`)."""
    for number in _SHIELDED:
        signal.signal(number, _unheeded)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SHIELDED)


def _start(
    entry: str, payload: object, pass_fds: list[int], env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """A fresh interpreter that runs this module's ``entry`` with this process's ``sys.path``
    and options; ``entry`` gets ``payload``.

    ``python -c`` puts the working directory first on ``sys.path``: set before any import
    that could be looked up there (marshal is built in), this process's own path makes the
    interpreter import the same asyncloader, and the same modules, as this process. The path
    and the payload go in an anonymous file, not in the environment, where Linux bounds one
    variable at 128 KiB: a path of a few hundred entries (Bazel's runfiles, a PEX) is more.
    Its options (``-W``, ``-X dev``, ``-O``, ...) are passed on as ``multiprocessing`` passes
    them to the processes it starts: the user's code runs under the same warning filters in a
    worker as on a thread. Its stdin is ``/dev/null``, as ``multiprocessing`` gives its
    processes: a worker that reads stdin (a ``breakpoint()``) takes nothing of the loader's.
    """
    # Only what imports look in (a pathlib.Path in sys.path is passed over, and marshal
    # could not write it).
    path = [entry for entry in sys.path if isinstance(entry, (str, bytes))]
    boot = anonymous(0, "asyncloader-boot")
    try:
        with os.fdopen(os.dup(boot), "wb") as file:
            marshal.dump(path, file)
            pickle.dump(payload, file)
        os.lseek(boot, 0, os.SEEK_SET)
        code = (
            "import marshal, os, sys; "
            "boot = open(int(os.environ.pop('ASYNCLOADER_BOOT')), 'rb'); "
            "sys.path[:] = marshal.load(boot); "
            f"from asyncloader._zygote import {entry}; {entry}(boot)"
        )
        # The child starts with the shielded signals blocked (a thread's mask crosses fork and
        # exec): one that comes before it can take them waits for it, never its death.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _SHIELDED)
        try:
            return subprocess.Popen(
                [sys.executable, *_OPTIONS(), "-c", code],
                stdin=subprocess.DEVNULL,
                pass_fds=[*pass_fds, boot],
                env={**env, "ASYNCLOADER_BOOT": str(boot)},
            )
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    finally:
        os.close(boot)


def _payload(boot: BinaryIO) -> Any:
    with boot:
        return pickle.load(boot)


class Zygote:
    """The loader's side of the zygote: starts it, asks it for workers, hears their exits.

    Args:
        modules: What the zygote imports before it forks.
        main: Whether the work needs the main module (defined in a script).
        work: A descriptor of the memory the work is pickled in (the zygote gets its own; the
            caller keeps this one).
        layout: Where the work lies in that memory.
    """

    def __init__(self, modules: list[str], main: bool, work: int, layout: Layout) -> None:
        ours, theirs = socket.socketpair()
        source = main_source() if main else None
        environment = {**os.environ, **_ONE_THREAD}
        self.process = _start("main", theirs.fileno(), [theirs.fileno(), work], environment)
        theirs.close()
        self._sock = ours
        self._conn = Connection(os.dup(ours.fileno()))
        parents_only(self._sock, self._conn)
        self._lock = threading.Lock()
        self._workers: dict[int, WorkerProcess] = {}
        self._by_pid: dict[int, WorkerProcess] = {}
        self.failure: Any = None
        """What went wrong as it started (the error payload of :mod:`._worker`), if it did."""
        self._forked = False
        # sys.argv too, as multiprocessing gives its processes: a script that parses its
        # options as it is imported gets the same ones.
        # How this process logs and warns too, for the workers to do as it does.
        message = (modules, source, sys.argv, reporting(), work, layout)
        self._conn.send_bytes(pickle.dumps(message))
        self._reader = threading.Thread(target=self._read, name="asyncloader-zygote", daemon=True)
        self._reader.start()

    def spawn(self, number: int) -> tuple[WorkerProcess, socket.socket]:
        """Ask for worker ``number``; returns its handle and this side's end of its socket."""
        ours, theirs = socket.socketpair()
        worker = WorkerProcess(number)
        try:
            with self._lock:
                self._workers[number] = worker
                self._conn.send_bytes(pickle.dumps(number))
                socket.send_fds(self._sock, [b"F"], [theirs.fileno()])
        except OSError:  # the zygote is gone: so is this worker
            worker.ended(None)
        finally:
            theirs.close()
        return worker, ours

    def _read(self) -> None:
        try:
            while True:
                message = pickle.loads(self._conn.recv_bytes())
                if message[0] == "forked":
                    _, number, pid = message
                    self._forked = True
                    with self._lock:
                        worker = self._workers.pop(number)
                        self._by_pid[pid] = worker
                    worker.forked(pid)
                elif message[0] == "exited":
                    _, pid, code = message
                    with self._lock:
                        ended = self._by_pid.pop(pid, None)
                    if ended is not None:
                        ended.ended(code)
                elif message[0] == "broken":
                    self.failure = message[1]
        except (EOFError, OSError):
            pass
        finally:  # no more news: a worker not forked never will be, one forked is orphaned
            with self._lock:
                unborn, forked = list(self._workers.values()), list(self._by_pid.values())
                self._workers.clear()
                self._by_pid.clear()
            for worker in unborn:
                worker.ended(None)
            for worker in forked:
                worker.orphaned()

    @property
    def loading(self) -> bool:
        """Whether it still imports and loads the work: it has forked no worker, and said
        of no failure."""
        return not self._forked and self.failure is None

    def kill(self) -> None:
        """SIGKILL it (one that still loads the work reads its socket only after)."""
        with contextlib.suppress(OSError):
            self.process.kill()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the zygote (its workers exit on their own sockets)."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(1.0)
        if self._reader is not threading.current_thread():
            self._reader.join(timeout)
        self._sock.close()
        self._conn.close()


# The zygote's own side ----------------------------------------------------------------------


def _send(conn: Connection, message: object) -> None:
    conn.send_bytes(pickle.dumps(message))


def _reap(conn: Connection, children: set[int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        _send(conn, ("exited", pid, os.waitstatus_to_exitcode(status)))


def _descriptors() -> int:
    """This process's descriptors, but those that its mappings of the work's files hold."""
    try:
        return len(os.listdir("/proc/self/fd")) - descriptors_held()
    except OSError:  # pragma: no cover - not Linux: no way to count
        return 0


def _load_shared(memory: _Memory) -> Work | None:
    """The work loaded here, for every worker forked from here to share; ``None`` if they
    must each load their own: loading started a thread (no fork is safe then), or opened a
    descriptor (a file or a socket opened in ``__setstate__``, which forked workers would all
    share, with one offset or one stream between them)."""
    if _threads() > 1:
        return None
    before = _descriptors()
    work = load_work(os.dup(memory[0]), memory[1])
    if _threads() > 1 or _descriptors() != before:
        return None
    return work


OOM_SCORE_ADJ: Final = 500
"""The least ``oom_score_adj`` of a worker: when the kernel picks a process to kill for memory,
it counts the worker as holding half of the memory there is (its cgroup's limit, or the
machine's) more than it does, so that a worker, which the loader replaces at the cost of the
batches it held, goes before the training process (its job, unless that process took the
memory itself). Ray raises its workers' likewise."""


def _first_for_the_oom_killer() -> None:
    """Raise this process's ``oom_score_adj`` to :data:`OOM_SCORE_ADJ`, never lower it (any
    process may raise its own; a container's may already be higher)."""
    path = "/proc/self/oom_score_adj"
    try:
        with open(path) as file:
            if int(file.read()) >= OOM_SCORE_ADJ:
                return
        with open(path, "w") as file:
            file.write(str(OOM_SCORE_ADJ))
    except (OSError, ValueError):
        pass  # no /proc here: the kernel's choice stands


def _serve(
    conn: Connection, work: Work | None, memory: _Memory, number: int, settings: Reporting
) -> None:
    """Worker ``number``'s life: with the work shared, or once it loaded its own (or said
    why not)."""
    _first_for_the_oom_killer()
    fd, layout = memory
    if work is not None:
        os.close(fd)
    else:
        try:
            work = load_work(fd, layout)
        except Exception as error:
            with contextlib.suppress(OSError):
                conn.send_bytes(pickle.dumps(("broken", error_payload(error))))
            return
    serve(conn, work, number, settings)


def _flush() -> None:
    """Write out what this process's stdout and stderr hold, as ``multiprocessing`` does
    before a fork (else each child writes it again) and as its processes end (a worker ends
    by ``os._exit``, which drops it: all a worker printed to a pipe or a file)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # closed, or replaced by something else
            stream.flush()


def _fork(
    number: int,
    source: MainSource | None,
    fd: int,
    inherited: list[int],
    work: Work | None,
    memory: _Memory,
    settings: Reporting,
) -> int:
    if _threads() > 1:  # an import or a load started a thread: fork no more, exec a worker
        payload = (number, fd, source, sys.argv, settings, *memory)
        return _start("alone", payload, [fd, memory[0]], dict(os.environ)).pid
    _flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:  # the worker: it never returns into the zygote's loop
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for descriptor in inherited:
            os.close(descriptor)
        gc.enable()
        _serve(Connection(fd), work, memory, number, settings)  # its own copy of fd
        code = 0
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        _flush()
        os._exit(code)


def main(boot: BinaryIO) -> None:
    """The zygote: import the work's modules, then fork workers until the loader goes."""
    _shield()
    sock = socket.socket(fileno=_payload(boot))
    conn = Connection(os.dup(sock.fileno()))
    with sock, conn:
        _zygote(sock, conn)


def _zygote(sock: socket.socket, conn: Connection) -> None:
    try:
        modules, source, sys.argv, settings, *memory = pickle.loads(conn.recv_bytes())
        follow(settings)
        work: Work | None = None
        try:
            if source is not None:
                _import_main(source)
            for name in modules:
                importlib.import_module(name)
            work = _load_shared((memory[0], memory[1]))
        except BaseException as error:
            _send(conn, ("broken", error_payload(error)))
            return
        # Loaded once, for every worker: collections in the workers must not write to its
        # objects (their pages would be copied), and gc.freeze() keeps them out of them.
        gc.disable()
        gc.freeze()
        wakeup = os.pipe()
        os.set_blocking(wakeup[1], False)
        signal.set_wakeup_fd(wakeup[1])
        signal.signal(signal.SIGCHLD, lambda *_: None)
        _fork_workers(sock, conn, source, wakeup, work, (memory[0], memory[1]), settings)
    except (EOFError, OSError):  # the loader is gone
        return


def _fork_workers(
    sock: socket.socket,
    conn: Connection,
    source: MainSource | None,
    wakeup: tuple[int, int],
    work: Work | None,
    memory: _Memory,
    settings: Reporting,
) -> None:
    """Fork a worker each time the loader asks, until it goes; then end those still running.

    The loader closes its workers before this socket, so those left when it closes are a
    dead loader's: a worker reads its own socket only between jobs, and one in a call that
    never returns would live on, an orphan, at a full core. Its pid is not reused before this
    process reaps it, so the signal reaches it and nothing else.
    """
    children: set[int] = set()
    try:
        while True:
            readable, _, _ = select.select([sock.fileno(), wakeup[0]], [], [])
            if wakeup[0] in readable:
                os.read(wakeup[0], 512)
                _reap(conn, children)
            if sock.fileno() in readable:
                number = pickle.loads(conn.recv_bytes())
                _, fds, _, _ = socket.recv_fds(sock, 1, 1)
                inherited = [*wakeup, sock.fileno(), conn.fileno()]
                pid = _fork(number, source, fds[0], inherited, work, memory, settings)
                children.add(pid)
                os.close(fds[0])
                _send(conn, ("forked", number, pid))
                _reap(conn, children)  # a child that ended before its handler was set
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def alone(boot: BinaryIO) -> None:
    """A worker in a fresh interpreter (the zygote had threads): it imports as it loads the
    work, and says so if it cannot."""
    _shield()
    number, fd, source, sys.argv, settings, memory, layout = _payload(boot)
    follow(settings)
    if source is not None:
        _import_main(source)
    _serve(Connection(fd), None, (memory, layout), number, settings)
