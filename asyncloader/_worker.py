"""A worker process of ``cpu_processes``: it runs the CPU stage of batches, one at a time.

It starts with the loader's work (the sync dataset, the transform, the collate function)
loaded, by the zygote that forked it (:mod:`._zygote`) from the memory the loader pickled it
into, and gets jobs over its socket, each with its number, which its answer carries back
(the loader checks it is the job it expects): ``fetch`` (fetch a sync
dataset's batch, transform, collate) or ``finish`` (transform and collate items the loader
fetched). Each job runs in the code the threads run (:mod:`._epoch`), under the job's
``(seed, epoch)`` key, so its batch is the one a thread would make, bit for bit. The batch
goes back through shared memory (:mod:`._shared`); a failure goes back as a value: the
exception pickled if it can be, its text and its traceback.

A worker takes SIGINT, SIGTERM, SIGUSR1 and SIGUSR2 and does nothing (the zygote set it so):
Ctrl-C and a job's SIGTERM or SLURM's warning are the loader's process's to handle, and it
stops its workers. It exits when the loader says so or goes away (its socket closes).
"""

from __future__ import annotations

import contextlib
import io
import mmap
import multiprocessing
import os
import pickle
import random
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Final

from ._augment import epoch_key
from ._batch_work import fetch_or_skip, transform_and_collate
from ._forked import parents_only
from ._logs import Carrier, Reporting, warn_as
from ._shared import Arena, set_arena
from ._skip import SKIPPED
from ._stats import Recorder, current, fetched_bytes
from ._stopped import escaped
from ._transform import Transform

FETCH: Final = "fetch"
FINISH: Final = "finish"

ErrorPayload = tuple[bytes | None, str, str]
"""An exception sent back: pickled (``None`` if it cannot be), ``Type: text``, traceback."""


def _rebuilt(kind: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    error = kind.__new__(kind)
    error.args = args
    error.__dict__.update(state)
    return error


class _Rebuilt:
    """An exception pickled as its type, ``args`` and attributes, to be made again without
    calling its ``__init__``."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __reduce__(self) -> tuple[Any, ...]:
        error = self.error
        return _rebuilt, (type(error), error.args, dict(vars(error)))


def _pickled(error: BaseException) -> bytes | None:
    """``error`` pickled so that it loads, or ``None``. pickle makes an exception again by
    calling its type with its ``args``, which fails for a type whose ``__init__`` takes other
    arguments (``def __init__(self, path, reason)`` that passes one message on): such an
    exception goes as its type, ``args`` and attributes instead, so that it keeps its type,
    as on a thread."""
    try:
        pickled = pickle.dumps(error, protocol=5)
        pickle.loads(pickled)
        return pickled
    except Exception:
        pass
    try:
        return pickle.dumps(_Rebuilt(error), protocol=5)
    except Exception:
        return None


def error_payload(error: BaseException) -> ErrorPayload:
    """``error`` as it crosses to the loader."""
    trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    described = f"{type(error).__qualname__}: {error}"
    return _pickled(error), described, trace


@dataclass(frozen=True)
class Work:
    """What every job of a loader's workers needs, sent to each worker once."""

    dataset: Any
    """The sync map-style dataset the ``fetch`` jobs read (``None``: the loader fetches)."""
    transform: Transform | None
    collate: Any
    skip: bool
    """``errors="skip"``: failing items are dropped, and reported with the batch."""
    held: int
    """Segments a worker may leave with the loader at once (:func:`held_limit`)."""
    processes: int
    """How many workers the loader runs (``cpu_processes``)."""
    worker_init: Callable[[int], object] | None
    """torch's ``worker_init_fn``: called in each worker with its number, before its jobs."""


class _Collect:
    """The worker's side of ``errors="skip"``: it notes each dropped item; the loader's
    skipper counts them (and fails the batch once over the epoch's budget)."""

    def __init__(self) -> None:
        self.skipped: list[tuple[int, ErrorPayload]] = []

    def skip(self, index: int, error: BaseException) -> None:
        self.skipped.append((index, error_payload(error)))


Layout = tuple[int, list[tuple[int, int, bool]], int]
"""Where the work lies in the memory the loader pickled it into: the pickle's length, each
out-of-band buffer's ``(offset, bytes, read-only)``, and the memory's size."""

Job = tuple[str, list[int], list[Any] | None, tuple[int, int]]
"""``(kind, indices, items or None, (seed, epoch))``."""


def _run(work: Work, job: Job, arena: Arena) -> tuple[tuple[Any, ...], list[int]]:
    kind, indices, items, augment = job
    tally = Recorder(1, 1)
    collect = _Collect() if work.skip else None
    tokens = current.set(tally), epoch_key.set(augment)
    try:
        if kind == FETCH:
            started = time.perf_counter()
            items = fetch_or_skip(work.dataset, indices, collect)  # type: ignore[arg-type]
            tally.fetch.add(time.perf_counter() - started)
            tally.items += sum(item is not SKIPPED for item in items)
            tally.bytes += fetched_bytes(items)
        assert items is not None
        batch = transform_and_collate(
            indices,
            items,
            work.transform,
            work.collate,
            tally,
            collect,  # type: ignore[arg-type]
        )
        data, refs, new, dropped = arena.pack(batch)
        skipped = [] if collect is None else collect.skipped
        return ("ok", data, refs, new, dropped, tally.tally(), skipped), arena.hand_over(
            [number for number, _ in new]
        )
    # BaseException: a SystemExit from the user's code (a library that exits on bad input)
    # fails its batch, as on a CPU thread, and does not end the worker.
    except BaseException as error:
        arena.release()
        skipped = [] if collect is None else collect.skipped
        return ("error", error_payload(escaped(error)), tally.tally(), skipped), []
    finally:
        current.reset(tokens[0])
        epoch_key.reset(tokens[1])


def load_work(fd: int, layout: Layout) -> Work:
    """The work, from the memory the loader pickled it into. Without out-of-band buffers the
    memory is unmapped once loaded; with them it stays mapped, copy-on-write, as long as the
    arrays on it live."""
    length, spans, size = layout
    try:
        if not spans:
            with mmap.mmap(fd, length, prot=mmap.PROT_READ) as memory:
                work: Work = pickle.loads(memory)
                return work
        # Not released: the arrays loaded are views on it, and keep it mapped.
        view = memoryview(mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE))
        buffers = [
            view[at : at + nbytes].toreadonly() if readonly else view[at : at + nbytes]
            for at, nbytes, readonly in spans
        ]
        work = pickle.loads(view[:length], buffers=buffers)
        return work
    finally:
        os.close(fd)


def reseed() -> int:
    """Seed the global generators of Python, NumPy and torch (those imported) from the OS.

    As torch seeds each of its workers: a fork of the zygote has its NumPy and torch
    generators as they were in the zygote, and a fresh interpreter torch's fixed default, so
    every worker would draw the same ``np.random`` and ``torch.rand`` numbers (the same
    augmentation in each). Drawn from the OS, not from the loader's seed: which worker makes
    which batch is a matter of timing, so no seed could make such draws reproducible (the
    loader's random transforms are, drawn from ``(seed, epoch, index)``).
    """
    entropy = int.from_bytes(os.urandom(8), "little") >> 1  # torch takes below 2**63
    random.seed(entropy)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(numpy.random.SeedSequence(entropy).generate_state(4))
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(entropy)
    return entropy


def _tell_torch(worker: int, work: Work, seed: int) -> None:
    """Make ``torch.utils.data.get_worker_info()`` here say which worker this is, as in
    torch's workers: a ``worker_init_fn`` (or a dataset) written for torch finds there its
    number, their count, its seed and its copy of the dataset. Only with a
    ``worker_init_fn``, whose workers make every batch: without one the first batches are
    made in the loader's process, where it says ``None``, and so it does in every worker.
    Only where torch is imported (a torch dataset's module imports it); a torch that keeps
    it elsewhere is left as it is."""
    if "torch" not in sys.modules:
        return
    try:
        from torch.utils.data._utils import worker as torch_worker

        torch_worker._worker_info = torch_worker.WorkerInfo(
            id=worker, num_workers=work.processes, seed=seed, dataset=work.dataset
        )
    except Exception:  # pragma: no cover - a torch of another make
        return


def message(value: object) -> memoryview:
    """``value`` pickled for the socket between the loader and a worker. Through a file, not
    ``pickle.dumps``, which takes many times longer over a large value, the GIL held
    (docs/processes.md has the figures)."""
    stream = io.BytesIO()
    pickle.Pickler(stream, protocol=5).dump(value)
    return stream.getbuffer()


def serve(conn: Connection, work: Work, worker: int, settings: Reporting) -> None:
    """Worker ``worker``'s life, with the work loaded: run jobs until told to stop or
    orphaned. It warns as the loader's process does (``settings``), and what its jobs log
    goes back with their answers (:mod:`._logs`)."""
    seed = reseed()
    # As multiprocessing names its processes: the name its log records carry.
    multiprocessing.current_process().name = f"asyncloader-worker-{worker}"
    warn_as(settings)
    carrier = Carrier.install()
    if work.worker_init is not None:
        _tell_torch(worker, work, seed)
        try:
            work.worker_init(worker)
        # BaseException: a SystemExit too, which would end the worker unsaid.
        except BaseException as error:
            with contextlib.suppress(OSError):
                conn.send_bytes(pickle.dumps(("broken", error_payload(escaped(error)))))
            return
    arena = Arena(work.held)
    set_arena(arena)
    # The descriptors of new segments go over the same socket, after their result.
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    # The loader sees this process die as this socket's end: a process the user's code
    # forks here (a fork pool) must not keep it open.
    parents_only(conn, sock)
    try:
        conn.send_bytes(pickle.dumps(("ready", os.getpid())))
        socket.send_fds(sock, [b"F"], [arena.control_fd])
        while True:
            received = conn.recv_bytes()
            numbered: tuple[int, Job] | None = pickle.loads(received)
            del received
            if numbered is None:
                return
            number, job = numbered
            reply, fds = _run(work, job, arena)
            del job, numbered
            logged = [] if carrier is None else carrier.take()
            conn.send_bytes(message((number, reply, logged)))
            del reply, logged
            if fds:
                try:
                    socket.send_fds(sock, [b"F"], fds)
                finally:
                    for fd in fds:  # the loader has its own now; the mapping stays here
                        os.close(fd)
    except (EOFError, OSError):  # the loader is gone
        return
    finally:
        sock.close()
