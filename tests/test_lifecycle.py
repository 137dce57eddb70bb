"""Early exits, closing, threads, time-outs: the loader never leaks, hangs or loses a batch."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import re
import threading
import types
import weakref
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from asyncloader import DataLoader

from .children import run_script
from .conftest import loader_threads
from .datasets import AsyncData, SyncData, eventually


class _Blocking(SyncData):
    """Items of index >= ``block_from`` wait for ``release``; counts calls that are running."""

    def __init__(self, n: int, block_from: int) -> None:
        super().__init__(n)
        self.block_from = block_from
        self.release = threading.Event()

    def __getitem__(self, index: int) -> int:
        self.probe.enter(index)
        try:
            if index >= self.block_from:
                self.release.wait(2.0)
            return index
        finally:
            self.probe.leave()


@pytest.mark.parametrize("how", ["break", "close", "del"])
def test_an_abandoned_sync_epoch_stops_touching_the_dataset(how: str) -> None:
    data = _Blocking(100, block_from=8)
    with DataLoader(data, batch_size=4, num_workers=3, item_concurrency=2) as loader:
        iterator = iter(loader)
        assert next(iterator).tolist() == [0, 1, 2, 3]
        data.probe.wait_for(lambda: data.probe.in_flight > 0)
        threading.Timer(0.3, data.release.set).start()
        if how == "close":
            iterator.close()  # type: ignore[attr-defined]
        elif how == "del":
            del iterator
            gc.collect()
        else:
            for _ in iterator:
                break
            del iterator
        # Once the drop returns, nothing runs the dataset's code any more.
        assert data.probe.in_flight == 0
        started = len(data.probe.started)
        # Items 0-7 came at once; then each of the 3 batches in work had its 2 items in
        # flight, blocked, when it was dropped, and took no other item once released.
        assert started <= 8 + 3 * 2
        # The loader is usable for the next epoch.
        data.block_from = 1000
        assert len(list(loader)) == 25


class _FirstBatchFast(AsyncData):
    """Items 0-3 arrive at once; every other item would take 30 s, so it must be cancelled."""

    async def __getitem__(self, index: int) -> int:
        self.probe.enter(index)
        try:
            if index >= 4:
                await asyncio.sleep(30)
            return index
        except asyncio.CancelledError:
            with self.probe.lock:
                self.probe.cancelled += 1
            raise
        finally:
            self.probe.leave()


@pytest.mark.parametrize("how", ["break", "aclose", "del", "cancel"])
async def test_an_abandoned_async_epoch_cancels_requests_in_flight(how: str) -> None:
    data = _FirstBatchFast(1000)
    loader = DataLoader(data, batch_size=4, num_workers=4, item_concurrency=4)
    in_flight = lambda: data.probe.in_flight >= 16  # noqa: E731  batches 1-4, 4 items each

    if how == "break":
        async for batch in loader:
            assert batch.tolist() == [0, 1, 2, 3]
            await eventually(in_flight)
            break
    elif how in ("aclose", "del"):
        iterator = aiter(loader)
        assert (await anext(iterator)).tolist() == [0, 1, 2, 3]
        await eventually(in_flight)
        if how == "aclose":
            await iterator.aclose()  # type: ignore[attr-defined]
        del iterator
    else:

        async def consume() -> None:
            async for _ in loader:
                pass

        consumer = asyncio.ensure_future(consume())
        await eventually(in_flight)
        consumer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await consumer
    gc.collect()
    await eventually(lambda: data.probe.in_flight == 0)
    # Every request still in flight was cancelled, none completed: only items 0-3 finished.
    assert data.probe.cancelled == len(data.probe.started) - 4
    # The loader goes on with the next epoch.
    data.n = 4
    assert [b.tolist() async for b in loader] == [[0, 1, 2, 3]]
    await loader.aclose()
    assert data.closed


async def test_a_second_cancellation_while_an_epoch_ends_still_cancels_its_requests() -> None:
    # An abandoned iterator cancels its epoch, and again when it is collected: a cancellation
    # that came while the batches were ending skipped the lanes' and left their requests.
    data = _FirstBatchFast(1000)
    loader = DataLoader(data, batch_size=4, num_workers=4, item_concurrency=4)
    iterator = aiter(loader)
    assert (await anext(iterator)).tolist() == [0, 1, 2, 3]
    await eventually(lambda: data.probe.in_flight >= 16)
    driver = iterator._task  # type: ignore[attr-defined]
    driver.cancel()

    def batches_left() -> bool:
        names = (getattr(task.get_coro(), "__name__", "") for task in asyncio.all_tasks())
        return "process_batch" in names

    for _ in range(10_000):  # the driver ends them: step the loop a round at a time till then
        if not batches_left():
            break
        await asyncio.sleep(0)
    assert not batches_left()
    assert not driver.done()
    driver.cancel()
    await asyncio.wait([driver])
    await eventually(lambda: data.probe.in_flight == 0)
    assert data.probe.cancelled == len(data.probe.started) - 4
    await loader.aclose()


def test_close_releases_threads_and_thread_count_stays_constant(no_leaked_threads: None) -> None:
    baseline = len(threading.enumerate())
    loader = DataLoader(
        AsyncData(40), batch_size=4, num_workers=2, item_concurrency=2, transform=lambda i, x: x
    )
    counts = set()
    for _ in range(50):
        assert sum(len(batch) for batch in loader) == 40
        counts.add(len(threading.enumerate()))
    assert len(counts) == 1
    loader.close()
    assert len(threading.enumerate()) == baseline
    loader.close()  # idempotent


def test_with_releases_threads_of_a_sync_loader(no_leaked_threads: None) -> None:
    with DataLoader(SyncData(40), batch_size=4, num_workers=2) as loader:
        assert len(list(loader)) == 10
        assert loader_threads()


def test_close_awaits_an_async_datasets_aclose() -> None:
    data = AsyncData(8)
    with DataLoader(data, batch_size=4, num_workers=1) as loader:
        assert len(list(loader)) == 2
    assert data.closed


def test_a_loader_dropped_while_its_iterator_lives_is_fine() -> None:
    loader = DataLoader(SyncData(40), batch_size=4, num_workers=2)
    iterator = iter(loader)
    first = next(iterator)
    ref = weakref.ref(loader)
    del loader
    gc.collect()
    assert ref() is None
    rest = list(iterator)
    assert first.tolist() == [0, 1, 2, 3]
    assert len(rest) == 9


@pytest.mark.parametrize("dataset", [SyncData, AsyncData])
@pytest.mark.parametrize("workers", [0, 2])
async def test_async_for_over_a_loader_not_kept_gives_the_whole_epoch(
    dataset: type, workers: int
) -> None:
    # `async for batch in DataLoader(...)` failed its first batch with "asyncloader-io (or
    # -cpu) pool is shut down": nothing kept the loader's threads once the loader was gone.
    got = []
    async for batch in DataLoader(dataset(40), batch_size=4, num_workers=workers):
        gc.collect()
        got.append(batch.tolist())
    assert got == [list(range(i, i + 4)) for i in range(0, 40, 4)]


def test_a_forgotten_loader_stops_its_threads(no_leaked_threads: None) -> None:
    loader = DataLoader(AsyncData(8), batch_size=4, num_workers=2)
    assert len(list(loader)) == 2
    del loader
    gc.collect()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_timeout_raises_and_the_epoch_goes_on(kind: str) -> None:
    release = threading.Event()

    class Slow(SyncData):
        def __getitem__(self, index: int) -> int:
            if index == 4:
                release.wait(5.0)
            return index

    class SlowAsync(AsyncData):
        async def __getitem__(self, index: int) -> int:
            if index == 4:
                await eventually(release.is_set)
            return index

    data: Any = Slow(8) if kind == "sync" else SlowAsync(8)
    with DataLoader(data, batch_size=4, num_workers=1, timeout=0.05) as loader:
        iterator = iter(loader)
        assert next(iterator).tolist() == [0, 1, 2, 3]
        with pytest.raises(TimeoutError, match=r"timeout=0\.05"):
            next(iterator)
        release.set()
        assert next(iterator).tolist() == [4, 5, 6, 7]


async def test_async_timeout_raises() -> None:
    data = AsyncData(8, delay=0.0)
    gate = asyncio.Event()

    class Gated(AsyncData):
        async def __getitem__(self, index: int) -> int:
            await gate.wait()
            return index

    async with DataLoader(Gated(4), batch_size=4, timeout=0.05) as loader:
        iterator = aiter(loader)
        with pytest.raises(TimeoutError):
            await anext(iterator)
        gate.set()
        assert (await anext(iterator)).tolist() == [0, 1, 2, 3]
    assert len(data) == 8


def test_closing_the_loader_under_a_live_iterator_fails_it_instead_of_hanging() -> None:
    loader = DataLoader(AsyncData(400, delay=0.01), batch_size=4, num_workers=1)
    iterator = iter(loader)
    next(iterator)
    loader.close()
    with pytest.raises(RuntimeError, match="closed"):
        for _ in iterator:
            pass


async def _stalling(ended: list[str]) -> AsyncGenerator[int, None]:
    """Two items, then a wait that never ends; ``ended`` notes its ``finally``."""
    try:
        yield 1
        yield 2
        await asyncio.Event().wait()
        yield 3
    finally:
        ended.append("finally")


def _stalls(ended: list[str]) -> types.AsyncGeneratorType[int, None]:
    return _stalling(ended)  # type: ignore[return-value]


def test_closing_with_an_epoch_open_ends_the_epoch_before_it_closes_the_dataset(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The dataset's aclose() ran while the open epoch still waited in the generator: "aclose():
    # asynchronous generator is already running", logged with its traceback, and the
    # generator was closed only after, by the loop's own shutdown.
    ended: list[str] = []
    stream = _stalls(ended)
    loader = DataLoader(stream, batch_size=2, num_workers=2)
    iterator = iter(loader)
    assert next(iterator).tolist() == [1, 2]
    with caplog.at_level(logging.ERROR, logger="asyncloader"):
        loader.close()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert ended == ["finally"]
    assert stream.ag_frame is None  # closed


async def test_aclose_with_an_epoch_open_ends_the_epoch_before_it_closes_the_dataset(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The same under `async for`: the dataset's aclose() raced the epoch's pull on this loop.
    ended: list[str] = []
    stream = _stalls(ended)
    loader = DataLoader(stream, batch_size=2, num_workers=2)
    iterator = aiter(loader)
    assert (await anext(iterator)).tolist() == [1, 2]
    with caplog.at_level(logging.ERROR, logger="asyncloader"):
        await loader.aclose()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert ended == ["finally"]
    assert stream.ag_frame is None


_FEW_THREADS = """
import logging, sys, threading
from asyncloader import DataLoader
from tests.children import limit_address_space
from tests.datasets import SyncData
from tests.epochs import outcomes

logging.basicConfig(level=logging.WARNING)
# Each thread reserves 128 MiB of address space: under a limit of 640 MiB more than this
# process maps now, three can start, where the loader's settings want 35; under 200 MiB
# more, the event loop's thread alone.
threading.stack_size(128 * 2**20)
limit_address_space(int(sys.argv[1]) * 2**20)
settings = {"batch_size": 16, "num_workers": 4, "item_concurrency": 8, "timeout": 10}
with DataLoader(SyncData(512), **settings) as loader:
    batches = outcomes(loader, lambda batch: batch.tolist(), Exception)
assert batches == [list(range(n, n + 16)) for n in range(0, 512, 16)], batches[:3]
print(threading.active_count() < 10)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("more_mib", "said"),
    [
        (640, [r"asyncloader-io pool runs \d threads, not 32", "asyncloader-cpu pool could start"]),
        (200, ["asyncloader-io pool could start", "asyncloader-cpu pool could start"]),
    ],
)
def test_threads_the_system_will_not_start_fail_no_batch(more_mib: int, said: list[str]) -> None:
    # Batches failed with "can't start new thread" where the threads already running (or
    # the one that submits the job, for a pool that got none) could do their work; with the
    # loop's thread alone, the lanes counted as running never ran and every batch after
    # the first two timed out.
    result = run_script(_FEW_THREADS, str(more_mib), timeout=100)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True"]
    for message in said:  # each said once
        assert len(re.findall(message, result.stderr)) == 1, result.stderr


_NO_LOOP_THREAD = """
import os, resource, threading
from asyncloader import DataLoader
from tests.children import limit_address_space
from tests.datasets import SyncData

threading.stack_size(256 * 2**20)  # more than the limit below leaves


def make():
    return DataLoader(SyncData(40), batch_size=8, shuffle=True, seed=0, num_workers=2)


loader = make()
limit = limit_address_space(16 * 2**20)
try:
    iter(loader)
except RuntimeError as error:
    print("refused:", error)
descriptors = len(os.listdir("/proc/self/fd"))
for _ in range(20):  # each refusal had left its event loop open: its descriptors too
    try:
        iter(loader)
    except RuntimeError:
        pass
print(len(os.listdir("/proc/self/fd")) - descriptors)
resource.setrlimit(resource.RLIMIT_AS, limit)
got = [batch.tolist() for batch in loader]
loader.close()
with make() as fresh:
    print([batch.tolist() for batch in fresh] == got)
"""


@pytest.mark.timeout(120)
def test_an_epoch_whose_loop_thread_cannot_start_leaves_the_loader_as_it_was() -> None:
    # The refused iter() had counted its epoch (the next one gave epoch 1's order), and left
    # its new event loop open.
    result = run_script(_NO_LOOP_THREAD, timeout=100)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["refused: can't start new thread", "0", "True"]


_NO_DESCRIPTOR = """
import os, resource, sys
if sys.argv[2] == "asyncio":
    sys.modules["uvloop"] = None  # as if not installed
from asyncloader import DataLoader
from tests.datasets import SyncData

loader = DataLoader(SyncData(8), batch_size=4, num_workers=1)
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
free = int(sys.argv[1])
listing = os.listdir("/proc/self/fd")  # and the descriptor that listing it took
resource.setrlimit(resource.RLIMIT_NOFILE, (len(listing) - 1 + free, hard))
try:
    next(iter(loader))
except OSError as error:
    print("refused:", error.strerror)
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
print([batch.tolist() for batch in loader])
loader.close()
"""


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@pytest.mark.parametrize("free", [0, 1, 2])
def test_an_epoch_started_with_no_descriptor_left_fails_and_the_next_runs(
    free: int, loop: str
) -> None:
    # With none or one left, uvloop aborted the process (SIGABRT) as it built the loader's
    # loop: libuv's half-built loop fails an assertion as it is freed. With a few more it
    # raised, after "deallocating an open event loop"; asyncio's half-built loop printed an
    # AttributeError as it was freed.
    result = run_script(_NO_DESCRIPTOR, str(free), loop, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == [
        "refused: Too many open files",
        "[[0, 1, 2, 3], [4, 5, 6, 7]]",
    ]
    assert result.stderr == ""


def test_without_uvloop_the_loaders_thread_runs_asyncios_own_loop() -> None:
    # uvloop is optional (the `fast` extra) and the tests install it, so every other test's
    # plain `for` ran on uvloop: here the default install's loop carries the same epochs.
    out = run_script(
        """
        import sys
        sys.modules["uvloop"] = None  # as if not installed: importing it raises ImportError
        import asyncio, json
        from asyncloader import DataLoader, HttpDataset
        from asyncloader.testing import serve_samples
        from tests.datasets import AsyncData, Boom, SyncData

        loops = set()

        class Seen(AsyncData):
            async def __getitem__(self, index):
                loops.add(type(asyncio.get_running_loop()).__module__)
                return await super().__getitem__(index)

        said = {}
        sync = SyncData(40, delay=0.002)
        sync.fail_at = {13}
        with DataLoader(sync, batch_size=4, num_workers=2) as loader:
            it = iter(loader)
            batches = []
            while True:
                try:
                    batches.append(next(it).tolist()[0])
                except Boom:
                    batches.append("Boom")
                except StopIteration:
                    break
            said["sync"] = batches
        data = Seen(400, delay=0.01)
        with DataLoader(data, batch_size=4, num_workers=8) as loader:
            for number, batch in enumerate(loader):
                if number == 3:
                    state = loader.state_dict()
                    break
            said["cancelled"] = data.probe.cancelled > 0
            loader.load_state_dict(state)
            said["resumed"] = next(iter(loader)).tolist()
        said["loops"] = sorted(loops)
        with serve_samples(0.005, 8) as url:
            http = HttpDataset([f"{url}/{i}" for i in range(64)], max_bytes=1 << 20)
            with DataLoader(http, batch_size=8, num_workers=4, collate_fn=list) as loader:
                said["http"] = sum(len(batch) for batch in loader)

        def stream():
            yield from range(10)

        with DataLoader(stream(), batch_size=3) as loader:
            said["stream"] = [b.tolist() for b in loader]
        print(json.dumps(said))
        """,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    said = json.loads(out.stdout.splitlines()[-1])
    assert said["loops"] == ["asyncio.unix_events"]
    assert said["sync"] == [0, 4, 8, "Boom", 16, 20, 24, 28, 32, 36]
    assert said["cancelled"]
    assert said["resumed"] == [16, 17, 18, 19]
    assert said["http"] == 64
    assert said["stream"] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


@pytest.mark.parametrize("processes", [False, True])
def test_closing_one_iterator_leaves_the_jobs_of_another_alone(
    tmp_path: Any, processes: bool
) -> None:
    # Closing an iterator waited (up to 5 s) until no job of the loader ran, then retired the
    # pools still busy: those of another iterator of the same loader, open at the same time
    # (one dropped mid-epoch and collected later, say). Its threads were replaced, and its
    # worker processes killed, failing its batches: "stopped by the loader, its epoch
    # abandoned". The closing iterator waits for its own jobs only.
    from . import proc_data

    data = proc_data.Gated(4, str(tmp_path), gated=(3,))
    settings: dict[str, Any] = {"cpu_processes": 1} if processes else {"cpu_threads": 1}
    with DataLoader(data, batch_size=1, num_workers=1, **settings) as loader:
        started = loader._runtime_here().procs
        assert started is None or started.wait_ready(30.0)  # every batch then goes to it
        (tmp_path / "3").touch()
        first = iter(loader)
        assert [int(next(first)[0, 0, 0, 0]) for _ in range(4)] == [
            int(data[i][0, 0, 0]) for i in range(4)
        ]  # its epoch read whole, but still open
        (tmp_path / "3").unlink()
        second = iter(loader)
        taken = [next(second) for _ in range(3)]
        runtime = loader._runtime_here()
        pools = (runtime._parts.cpu, runtime._parts.io)
        procs = runtime.procs if processes else None
        for _ in range(3000):  # until item 3's call runs (its gate waits 30 s)
            if procs is not None and procs.workers and procs.workers[0].held:
                break
            if procs is None and any(pool is not None and pool.busy for pool in pools):
                break
            threading.Event().wait(0.01)
        first.close()  # type: ignore[attr-defined]
        assert (runtime._parts.cpu, runtime._parts.io) == pools  # the second's, not replaced
        (tmp_path / "3").touch()
        last = next(second)
        assert int(last[0, 0, 0, 0]) == int(data[3][0, 0, 0])
        assert len(taken) == 3
        with pytest.raises(StopIteration):
            next(second)


def test_an_epoch_left_pending_on_a_closed_loop_is_let_go_quietly() -> None:
    # A sync wrapper that runs `loop.run_until_complete(anext(iterator))` and closes its loop
    # leaves the epoch's tasks pending there. Each driver stayed referenced for good (with
    # its dataset and batches), and as the collector closed its coroutines a lane swallowed
    # the GeneratorExit ("coroutine ignored GeneratorExit") and called the closed loop
    # ("Event loop is closed"), and the driver reset its context variables from another
    # context. asyncio's own "Task was destroyed but it is pending!" is the caller's due.
    result = run_script(
        """
        import asyncio, gc
        from asyncloader import DataLoader, _iterators
        from tests.datasets import AsyncData

        loader = DataLoader(AsyncData(4000, delay=0.002), batch_size=4, num_workers=2)
        for _ in range(3):
            loop = asyncio.new_event_loop()
            iterator = aiter(loader)
            loop.run_until_complete(anext(iterator))
            loop.close()
            del iterator
            gc.collect()
        print("drivers kept", len(_iterators._DRIVERS))
        loader.dataset.n = 8
        print([batch.tolist() for batch in loader])
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "drivers kept 0",
        "[[0, 1, 2, 3], [4, 5, 6, 7]]",
    ], result.stdout + result.stderr
    for noise in ("ignored GeneratorExit", "Event loop is closed", "different Context"):
        assert noise not in result.stderr, result.stderr
