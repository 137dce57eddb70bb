"""Datasets and transforms sent to worker processes (``cpu_processes``).

Kept apart from the test modules, so that a worker imports only this, NumPy and asyncloader.
Each one behaves the same in the loader's process and in a worker, except where it says.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import types
import warnings
from collections.abc import Iterator
from typing import Any, Literal

import numpy as np

from asyncloader import transforms


class Images:
    """A sync map-style dataset of small HWC images (item ``i`` filled from ``i``)."""

    def __init__(self, n: int, size: int = 12) -> None:
        self.n = n
        self.size = size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> np.ndarray[Any, Any]:
        if not 0 <= index < self.n:
            raise IndexError(index)
        rng = np.random.default_rng(index)
        image: np.ndarray[Any, Any] = rng.integers(0, 256, (self.size, self.size, 3), np.uint8)
        return image


class AsyncImages(Images):
    """The same images from ``async def __getitem__``."""

    async def __getitem__(self, index: int) -> np.ndarray[Any, Any]:  # type: ignore[override]
        await asyncio.sleep(0)
        return super().__getitem__(index)


class AsyncFailing(AsyncImages):
    """Item ``fail_at`` fails its fetch, on the loader's event loop."""

    def __init__(self, n: int, fail_at: int) -> None:
        super().__init__(n)
        self.fail_at = fail_at

    async def __getitem__(self, index: int) -> np.ndarray[Any, Any]:  # type: ignore[override]
        if index == self.fail_at:
            raise OSError(f"item {index} is gone")
        return await super().__getitem__(index)


class StreamOfImages:
    """The same images as a stream (an iterable without ``__getitem__``)."""

    def __init__(self, n: int) -> None:
        self.images = Images(n)

    def __iter__(self) -> Iterator[np.ndarray[Any, Any]]:
        return (self.images[index] for index in range(self.images.n))


def augment() -> transforms.Compose:
    """Random crops and flips: drawn from ``(seed, epoch, index)``."""
    return transforms.Compose([transforms.RandomCrop(8), transforms.RandomHorizontalFlip()])


class BadItem(Exception):
    """An exception of the user's that pickle cannot rebuild from its ``args``: its
    ``__init__`` takes two arguments, and ``args`` holds one (the message)."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"item {index} {reason}")
        self.index = index
        self.reason = reason


class Failing(Images):
    """Item ``fail_at`` raises a ``ValueError`` (or kills its process, as ``how`` says) in a
    worker process; in the loader's own process every item is fine."""

    def __init__(self, n: int, fail_at: int, how: str = "raise") -> None:
        super().__init__(n)
        self.fail_at = fail_at
        self.how = how
        self.parent = os.getpid()

    def __getitem__(self, index: int) -> np.ndarray[Any, Any]:
        if index == self.fail_at and os.getpid() != self.parent:
            if self.how == "raise":
                raise ValueError(f"item {index} is bad")
            if self.how == "own":
                raise BadItem(index, "is bad")
            if self.how == "segfault":
                os.kill(os.getpid(), signal.SIGSEGV)
            if self.how == "exit":
                os._exit(7)
            if self.how == "sysexit":  # a library that calls sys.exit on bad input
                sys.exit(3)
            if self.how == "kill":  # as the OOM killer does
                os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(index)


class DiesAfterAFork(Images):
    """Item ``die_at``, in a worker process, forks a process that lives on (a fork pool's),
    which writes its pid to ``marker``, then exits with code 7."""

    def __init__(self, n: int, die_at: int, marker: str) -> None:
        super().__init__(n)
        self.die_at, self.marker, self.parent = die_at, marker, os.getpid()

    def __getitem__(self, index: int) -> np.ndarray[Any, Any]:
        if index == self.die_at and os.getpid() != self.parent:
            if os.fork() == 0:
                with open(self.marker, "w") as file:
                    file.write(str(os.getpid()))
                signal.sigtimedwait([], 60.0)
                os._exit(0)
            os._exit(7)
        return super().__getitem__(index)


class HangsOnce(Images):
    """Item ``hang_at`` never returns in the first worker process that fetches it (it leaves
    ``marker`` behind, so the worker that replaces it goes on)."""

    def __init__(self, n: int, hang_at: int, marker: str) -> None:
        super().__init__(n)
        self.hang_at = hang_at
        self.marker = marker

    def __getitem__(self, index: int) -> np.ndarray[Any, Any]:
        if index == self.hang_at and not os.path.exists(self.marker):
            with open(self.marker, "w"):
                pass
            threading.Event().wait()
        return super().__getitem__(index)


class Gated(Images):
    """Item ``i`` of ``gated`` is made only once the file ``{folder}/{i}`` exists (at most 30
    s later: then it fails), in whichever process makes it."""

    def __init__(self, n: int, folder: str, gated: tuple[int, ...]) -> None:
        super().__init__(n)
        self.folder = folder
        self.gated = gated

    def __getitem__(self, index: int) -> np.ndarray[Any, Any]:
        if index in self.gated:
            gate = os.path.join(self.folder, str(index))
            for _ in range(3000):
                if os.path.exists(gate):
                    break
                threading.Event().wait(0.01)
            else:
                raise TimeoutError(f"item {index}: no {gate} within 30 s")
        return super().__getitem__(index)


class Sent(Images):
    """Says, as it is loaded, whether it was pickled in another process (a worker's, or the
    zygote, loads what the loader's process pickled)."""

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "pickled_in": os.getpid()}

    @staticmethod
    def crossed(state: dict[str, Any]) -> bool:
        """Whether ``state`` was pickled in another process than this."""
        return bool(state["pickled_in"] != os.getpid())


class LoadsOnlyHere(Sent):
    """Pickles, but cannot be unpickled in a worker process."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        if self.crossed(state):
            raise ValueError("this dataset cannot be loaded in a worker")
        self.__dict__.update(state)


class EndsAsLoaded(Sent):
    """Pickles, but ends the process that loads it in a worker (with ``os._exit(code)``, or
    the signal ``code`` when ``signal`` is true)."""

    def __init__(self, n: int, code: int, signal: bool = False) -> None:
        super().__init__(n)
        self.code, self.signal = code, signal

    def __setstate__(self, state: dict[str, Any]) -> None:
        if self.crossed(state):
            if state["signal"]:
                os.kill(os.getpid(), state["code"])
            os._exit(state["code"])
        self.__dict__.update(state)


class KilledWhenLoadedAgain(Sent):
    """Pickles, and loads in the first process that loads it in a worker (leaving ``marker``
    behind); any process that loads it after is killed by SIGKILL as it does (as the OOM
    killer does to a process that takes what memory was left)."""

    def __init__(self, n: int, marker: str) -> None:
        super().__init__(n)
        self.marker = marker

    def __setstate__(self, state: dict[str, Any]) -> None:
        if self.crossed(state):
            if os.path.exists(state["marker"]):
                os.kill(os.getpid(), signal.SIGKILL)
            with open(state["marker"], "w"):
                pass
        self.__dict__.update(state)


class KilledAtLoad(Sent):
    """Loaded by each process of the workers' own (its loading opens a file, so no worker
    shares the zygote's), numbered in ``folder``: the loads numbered in ``kill_at`` are killed
    by SIGKILL (the zygote's is the first, then each worker's in turn)."""

    def __init__(self, n: int, folder: str, kill_at: range | tuple[int, ...]) -> None:
        super().__init__(n)
        self.folder, self.kill_at = folder, kill_at

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if not self.crossed(state):
            return
        self.opened = open(__file__, "rb")  # noqa: SIM115  # held as a dataset holds its file
        number = 1
        while True:
            try:
                os.close(os.open(os.path.join(self.folder, str(number)), os.O_CREAT | os.O_EXCL))
                break
            except FileExistsError:
                number += 1
        if number in self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


class WaitsAsLoaded(Sent):
    """Pickles, but its loading in a worker waits for ever (a ``__setstate__`` that waits on
    a server that never answers)."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        if self.crossed(state):
            threading.Event().wait()
        self.__dict__.update(state)


class WaitsAsLoadedAfresh(Sent):
    """Pickles; its loading starts a thread, so each worker is a fresh interpreter that loads
    it again, and each loading after the zygote's (the first to create ``marker``) waits for
    ever."""

    def __init__(self, n: int, marker: str) -> None:
        super().__init__(n)
        self.marker = marker

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if not self.crossed(state):
            return
        threading.Thread(target=threading.Event().wait, daemon=True).start()
        try:
            os.close(os.open(state["marker"], os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            threading.Event().wait()


class Unpicklable(Images):
    """Holds a lock, which cannot be pickled."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.state = {"fine": 1}
        self.guard = Guarded()


class Guarded:
    def __init__(self) -> None:
        self.lock = threading.Lock()


class LockedItems(Images):
    """Pickles, but each item holds a lock, which cannot cross to or from a worker."""

    def __getitem__(self, index: int) -> Any:
        return {"index": index, "lock": threading.Lock()}


class AsyncLockedItems(LockedItems):
    """The same items from ``async def __getitem__``: they would go to the workers."""

    async def __getitem__(self, index: int) -> Any:  # type: ignore[override]
        await asyncio.sleep(0)
        return super().__getitem__(index)


class NoRoom:
    """Pickling it runs out of memory (as a batch too large to pickle would)."""

    def __reduce__(self) -> Any:
        raise MemoryError("no room to pickle this")


class ItemsWithNoRoom(Images):
    """Pickles, but each item runs out of memory as it is pickled."""

    def __getitem__(self, index: int) -> Any:
        return NoRoom()


class AsyncItemsWithNoRoom(ItemsWithNoRoom):
    """The same items from ``async def __getitem__``: they would go to the workers."""

    async def __getitem__(self, index: int) -> Any:  # type: ignore[override]
        await asyncio.sleep(0)
        return super().__getitem__(index)


class Where:
    """Item ``i`` is ``(i, pid, parent pid)`` of the process that fetched it."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> tuple[int, int, int]:
        return index, os.getpid(), os.getppid()


def stamped(index: int, item: Any) -> dict[str, Any]:
    """A transform: ``item`` with the pid of the process that transformed it, and that
    process's ``oom_score_adj``."""
    with open("/proc/self/oom_score_adj") as adjusted:
        return {"image": item, "pid": os.getpid(), "oom_score_adj": int(adjusted.read())}


class Balloons:
    """Item ``i`` is ``[i, i, i, i]``; item ``at``, made in a worker process, first takes
    (and writes) ``mib`` MiB for a moment, as a decoder fed a huge image does."""

    def __init__(self, at: int, mib: int) -> None:
        self.at = at
        self.mib = mib

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> np.ndarray[Any, Any]:
        if index == self.at and multiprocessing.current_process().name != "MainProcess":
            taken = np.ones(self.mib << 20, dtype=np.uint8)
            index += int(taken[-1]) - 1
        return np.full(4, index, dtype=np.int64)


def outcomes(loader: Any) -> Iterator[Any]:
    """Each batch of an epoch of ``loader``, or the exception raised in its place."""
    batches = iter(loader)
    while True:
        try:
            yield next(batches)
        except StopIteration:
            return
        except Exception as raised:
            yield raised


class CountsPickles(Images):
    """Counts, in the loader's process, how often it was pickled."""

    pickled = 0

    def __reduce__(self) -> Any:
        CountsPickles.pickled += 1
        return Images, (self.n, self.size)


_calls = threading.Lock()
_active = [0, 0]
"""Calls of :func:`overlapping` in this process: running now, and the most at once."""


def overlapping(index: int, item: Any) -> Any:
    """A transform that notes how many of its calls run at once in this process."""
    with _calls:
        _active[0] += 1
        _active[1] = max(_active[1], _active[0])
    threading.Event().wait(0.002)  # room for another thread to come in
    with _calls:
        _active[0] -= 1
    return item


def most_at_once() -> int:
    """The most :func:`overlapping` calls that ran at once in this process."""
    return _active[1]


def worker_pids(loader: Any, within: float = 30.0) -> list[int | None]:
    """The pids of ``loader``'s workers, once each is forked (ready is when the first is)."""
    procs = loader._runtime_here().procs
    assert procs.wait_ready(within)
    return [worker.process.wait_forked(within) for worker in procs.workers]


def spin(index: int, item: Any) -> Any:
    """A transform that holds the GIL for a while (pure Python)."""
    total = 0
    for step in range(20_000):
        total += step * index
    return item


class HoldsArray:
    """A sync dataset whose samples are rows of one NumPy array it holds (1 MiB), as an
    in-memory dataset does; item ``i`` is its row, and whether this process maps the work's
    memory (``/proc/self/maps``). With ``writes``, each call adds 1 to its row first."""

    def __init__(self, n: int = 1024, writes: bool = False, readonly: bool = False) -> None:
        self.table = (np.arange(n * 1024) % 251).astype(np.uint8).reshape(n, 1024)
        self.table.flags.writeable = not readonly
        self.writes = writes

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, index: int) -> np.ndarray[Any, Any]:
        row, mapped = _row(self.table, index, self.writes, "asyncloader-work")
        return np.concatenate([row[:4], [mapped, self.table.flags.writeable, os.getpid()]])


def _row(table: Any, index: int, writes: bool, name: str) -> tuple[np.ndarray[Any, Any], int]:
    """Row ``index`` of ``table`` as ``int64`` (1 added to it first, with ``writes``), and
    how many mappings of what ``name`` names this process holds (``/proc/self/maps``)."""
    if writes:
        table[index] += 1
    with open("/proc/self/maps") as maps:
        mapped = sum(name in line for line in maps)
    return np.asarray(table[index], dtype=np.int64), mapped


class MapsFile:
    """Rows of a file of ``uint16`` (a token file, as nanoGPT writes one) that the dataset
    maps: ``np.memmap(path, mode=mode)`` seen through ``view`` (``"whole"``, ``"strided"``: every
    other row backwards, ``"blocks"``: 64 views of 64 rows each, or ``"npy"``:
    ``np.load(path, mmap_mode=mode)`` of an ``.npy``). Item ``i`` is its row, then how many
    mappings of ``path`` the process holds, its pid, and the pid of the process that loaded
    the dataset; with ``writes``, each call adds 1 to its row first."""

    def __init__(
        self,
        path: str,
        mode: Literal["r", "r+", "c"] = "r",
        view: str = "whole",
        writes: bool = False,
    ) -> None:
        if view == "npy":
            self.table: Any = np.load(path, mmap_mode=mode)
        else:
            table = np.memmap(path, dtype=np.uint16, mode=mode).reshape(-1, 512)
            self.table = table[::-2] if view == "strided" else table
            if view == "blocks":
                self.table = _Blocks([table[start : start + 64] for start in range(0, 4096, 64)])
        self.path, self.writes = path, writes
        self.loaded_in = os.getpid()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.loaded_in = os.getpid()

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, index: int) -> np.ndarray[Any, Any]:
        row, mapped = _row(self.table, index, self.writes, self.path)
        return np.concatenate([row[:4], [mapped, os.getpid(), self.loaded_in]])


class MapsArrow:
    """Rows of an Arrow (Feather) file read with ``memory_map=True``: item ``i`` is its
    ``x`` at row ``i``, then whether the process maps ``path`` and its pid (read by
    ``__getitems__`` alone, a batch at a time)."""

    def __init__(self, path: str) -> None:
        import pyarrow.feather

        self.table = pyarrow.feather.read_table(path, memory_map=True)
        self.path = path

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def __getitem__(self, index: int) -> np.ndarray[Any, Any]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: list[int]) -> list[np.ndarray[Any, Any]]:
        with open("/proc/self/maps") as maps:
            mapped = self.path in maps.read()
        column = self.table.column("x").take(indices).to_pylist()
        return [np.array([value, mapped, os.getpid()]) for value in column]


class _Blocks:
    """Rows held as blocks of 64 (views of one array, say): row ``i`` of block ``i // 64``."""

    def __init__(self, blocks: list[np.ndarray[Any, Any]]) -> None:
        self.blocks = blocks

    def __len__(self) -> int:
        return 64 * len(self.blocks)

    def __getitem__(self, index: int) -> np.ndarray[Any, Any]:
        row: np.ndarray[Any, Any] = self.blocks[index // 64][index % 64]
        return row


# A module made at run time, as Cython makes one (``_cython_3_2_8``) for the type of the
# functions it compiles: in sys.modules, yet no import finds it in another process.
_MADE = types.ModuleType("_asyncloader_made_at_run_time")
sys.modules[_MADE.__name__] = _MADE


class _CompiledFunction:
    """A function as Cython compiles one: its type is of the made module, and it pickles by
    its own name in an importable module (``pyarrow.lib._reconstruct_table``)."""

    def __init__(self, name: str) -> None:
        self.__module__ = __name__
        self.__qualname__ = name

    def __reduce__(self) -> str:
        return self.__qualname__

    def __call__(self, value: int) -> int:
        return value


_CompiledFunction.__module__ = _MADE.__name__
compiled = _CompiledFunction("compiled")


class HoldsCompiled(Images):
    """Holds a function of a compiled extension (a pyarrow table holds such in its pickle)."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.function = compiled


class HoldsBytes:
    """``count`` items of ``size`` bytes each, held in memory as ``bytes`` (encoded images,
    say): pickled in band, so each process that loads the work makes them anew."""

    def __init__(self, count: int, size: int) -> None:
        self.items = [bytes([i % 251]) * size for i in range(count)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> np.ndarray[Any, Any]:
        return np.array(list(self.items[index][:8]), dtype=np.uint8)


class WhereLoaded:
    """Item ``i`` is ``[pid that loaded the dataset, pid that made the item]``. With
    ``path``, loading opens that file, as a dataset that opens its files in ``__setstate__``;
    with ``thread``, loading starts a thread."""

    def __init__(self, n: int, path: str | None = None, thread: bool = False) -> None:
        self.n, self.path, self.thread = n, path, thread
        self.loaded_in = os.getpid()

    def __len__(self) -> int:
        return self.n

    def __getstate__(self) -> dict[str, Any]:
        return {"n": self.n, "path": self.path, "thread": self.thread}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.loaded_in = os.getpid()
        if self.path is not None:
            self.file = open(self.path, "rb")  # noqa: SIM115  # held, as such datasets do
        if self.thread:  # a client library's background thread, say
            threading.Thread(target=threading.Event().wait, daemon=True).start()

    def __getitem__(self, index: int) -> np.ndarray[Any, Any]:
        return np.array([self.loaded_in, os.getpid()])


class HoldsObjects:
    """Item ``i`` is an array of Python objects (``[i, "i"]``, object dtype), or with
    ``structured``, a record array with an object field: references, which mean nothing in
    another process's memory."""

    def __init__(self, n: int, structured: bool = False) -> None:
        self.n, self.structured = n, structured

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> np.ndarray[Any, Any]:
        if self.structured:
            return np.array([(index, str(index))], dtype=[("n", "i8"), ("name", "O")])
        return np.array([index, str(index)], dtype=object)


class RunsAJob:
    """Item ``i`` is what a separate Python job prints, started by the dataset: the job reads
    ``i``'s batches with a loader of its own, in worker processes (a preprocessing tool that
    uses asyncloader, say)."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> str:
        job = (
            "from asyncloader import DataLoader\n"
            f"with DataLoader(list(range({index}, {index} + 4)), batch_size=2, cpu_processes=1)"
            " as loader:\n"
            "    print([[int(x) for x in batch] for batch in loader])\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", job], capture_output=True, text=True, timeout=60, check=False
        )
        return done.stdout.strip() or done.stderr.strip().splitlines()[-1]


class ReadsStdin:
    """Item ``i`` is what ``sys.stdin`` holds when the item is made (a script that asks its
    user, a ``breakpoint()``); with ``thread``, loading starts a thread (each worker is then
    a fresh interpreter)."""

    def __init__(self, n: int, thread: bool = False) -> None:
        self.n, self.thread = n, thread

    def __len__(self) -> int:
        return self.n

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.thread:
            threading.Thread(target=threading.Event().wait, daemon=True).start()

    def __getitem__(self, index: int) -> str:
        return sys.stdin.read()


class ChildSignals:
    """Item ``i`` is how a Python process that the dataset starts finds SIGINT, SIGTERM,
    SIGUSR1 and SIGUSR2 (a tool run per item), as ``signal.getsignal`` names them."""

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> str:
        probe = (
            "import signal\n"
            "for number in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):\n"
            "    handler = signal.getsignal(number)\n"
            "    print(handler.__name__ if callable(handler) else signal.Handlers(handler).name)"
        )
        done = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
        )
        return " ".join(done.stdout.split())


class SpinsInAWorker:
    """Every item spins for ever in a worker process (a call that never returns), once it has
    written its pid to ``marker``; on the loader's own thread, it is ``0``."""

    def __init__(self, marker: str) -> None:
        self.marker, self.here = marker, os.getpid()

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        if os.getpid() == self.here:
            return 0
        with open(self.marker, "w") as file:
            file.write(str(os.getpid()))
        while True:
            pass


class Chatty:
    """Every item logs, on the logger ``proc_data.chatty``: its number at INFO and a detail at
    DEBUG; item 3 an exception with its traceback, item 5 with an ``extra`` that cannot be
    pickled (a lock), item 6 a message whose arguments do not fit it. Loading it may start a
    thread (each worker is then a fresh interpreter), or configure logging to stdout (as a
    dataset's module may)."""

    def __init__(self, thread: bool = False, configure: bool = False) -> None:
        self.thread, self.configure = thread, configure

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.thread:
            threading.Thread(target=threading.Event().wait, daemon=True).start()
        if self.configure:
            logging.basicConfig(stream=sys.stdout, format="here: %(message)s", level="INFO")

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> int:
        logger = logging.getLogger("proc_data.chatty")
        logger.info("item %d", index, extra={"lock": threading.Lock()} if index == 5 else None)
        logger.debug("a detail of item %d", index)
        if index == 3:
            try:
                raise ValueError("item 3 is odd")
            except ValueError:
                logger.exception("item %d failed", index)
        if index == 6:
            logger.info("%d items", "six")
        return index


class Garrulous:
    """Item ``i`` logs ``lines`` records at INFO on ``proc_data.garrulous``."""

    def __init__(self, lines: int) -> None:
        self.lines = lines

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> int:
        logger = logging.getLogger("proc_data.garrulous")
        for line in range(self.lines):
            logger.info("item %d, line %d", index, line)
        return index


class Prints:
    """Each item prints its number to stdout where it is made; loading it (in the workers'
    server, before it forks them) prints ``loaded``."""

    def __init__(self) -> None:
        self.n = 8  # a state to set: pickle calls no __setstate__ with none

    def __len__(self) -> int:
        return self.n

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        print("loaded")

    def __getitem__(self, index: int) -> int:
        print(f"item {index}")
        return index


WORKER: int | None = None
"""The worker number :func:`set_up_worker` was given in this process, if it ran here."""


def set_up_worker(worker_id: int) -> None:
    """A ``worker_init_fn``: notes the worker's number."""
    global WORKER
    WORKER = worker_id


class CannotOpen(Exception):
    """What :func:`cannot_set_up` raises."""


def cannot_set_up(worker_id: int) -> None:
    """A ``worker_init_fn`` that fails, as one whose database is not there."""
    raise CannotOpen(f"worker {worker_id} cannot open its database")


class WhichWorker:
    """Item ``i`` is ``(i, WORKER, pid)`` as it is made."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> tuple[int, int | None, int]:
        return index, WORKER, os.getpid()


class Noisy(UserWarning):
    """What :class:`Warns` warns."""


class Warns:
    """Every item warns, ``noisy item i`` (a :class:`Noisy`), where it is made."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        warnings.warn(f"noisy item {index}", Noisy, stacklevel=1)
        return index


def logged(index: int, item: Any) -> Any:
    """A transform that logs each item's index at INFO."""
    logging.getLogger("proc_data.transform").info("transformed item %d", index)
    return item


class Opener:
    """Each item is what :meth:`open`, its worker's ``worker_init_fn``, opened."""

    def __init__(self) -> None:
        self.opened: str | None = None

    def __len__(self) -> int:
        return 4

    def open(self, worker_id: int) -> None:
        self.opened = f"opened by worker {worker_id}"

    def __getitem__(self, index: int) -> str | None:
        return self.opened
