"""One budget of requests in flight for the whole epoch, across batch boundaries.

A lane that finds its batch's items all started takes the next item in epoch order, within
the window of ``num_workers + prefetch_depth`` batches ahead of the consumer: a batch whose
slowest item is still out never leaves the other lanes idle.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from asyncloader import DataLoader

from .children import run_script
from .datasets import AsyncData, Probe

PREFETCH = 2
# (num_workers, item_concurrency) with more lanes than batches in the window, so that lanes
# are left over once the first item of every batch in the window holds one.
SETTINGS = [(1, 4), (1, 8), (2, 4), (4, 2)]


class _Held:
    """The first item of every batch waits for :meth:`release`; the others return at once."""

    def __init__(self, n: int, batch_size: int) -> None:
        self.n, self.batch_size = n, batch_size
        self.probe = Probe()

    def __len__(self) -> int:
        return self.n

    def held(self, index: int) -> bool:
        return index % self.batch_size == 0


class HeldSync(_Held):
    def __init__(self, n: int, batch_size: int) -> None:
        super().__init__(n, batch_size)
        self._released = threading.Event()

    def release(self) -> None:
        self._released.set()

    def __getitem__(self, index: int) -> int:
        self.probe.enter(index)
        try:
            if self.held(index):
                assert self._released.wait(10)
            return index
        finally:
            self.probe.leave()


class HeldAsync(_Held):
    def __init__(self, n: int, batch_size: int) -> None:
        super().__init__(n, batch_size)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._released: asyncio.Event | None = None
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            if self._loop is not None and self._released is not None:
                self._loop.call_soon_threadsafe(self._released.set)

    async def __getitem__(self, index: int) -> int:
        with self._lock:
            if self._released is None:
                self._loop, self._released = asyncio.get_running_loop(), asyncio.Event()
            released = self._released
        self.probe.enter(index)
        try:
            if self.held(index):
                await asyncio.wait_for(released.wait(), 10)
            return index
        finally:
            self.probe.leave()


def _held(kind: str, n: int, batch_size: int) -> HeldSync | HeldAsync:
    return HeldSync(n, batch_size) if kind == "sync" else HeldAsync(n, batch_size)


@pytest.mark.parametrize(("num_workers", "item_concurrency"), SETTINGS)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_lanes_go_on_to_the_next_batches_while_an_item_is_out(
    kind: str, num_workers: int, item_concurrency: int
) -> None:
    batch_size, n = 4, 40
    window = max(num_workers, 1) + PREFETCH
    data = _held(kind, n, batch_size)
    probe = data.probe
    within = set(range(window * batch_size))
    with DataLoader(
        data,
        batch_size=batch_size,
        num_workers=num_workers,
        item_concurrency=item_concurrency,
        prefetch_depth=PREFETCH,
    ) as loader:
        iterator = iter(loader)
        # Every item of the window starts while the first item of each batch is still out,
        # and nothing past the window does.
        probe.wait_for(lambda: set(probe.started) == within)
        assert probe.in_flight == window  # the held items
        data.release()
        batches = [batch.tolist() for batch in iterator]
    assert batches == [list(range(i, i + batch_size)) for i in range(0, n, batch_size)]


@pytest.mark.asyncio
@pytest.mark.parametrize(("num_workers", "item_concurrency"), [(1, 3), (3, 2), (4, 4)])
async def test_items_start_in_epoch_order_with_the_whole_budget(
    num_workers: int, item_concurrency: int
) -> None:
    # Lanes on one event loop take items strictly in epoch order, each batch with the whole
    # budget: the epoch has max(num_workers, 1) * item_concurrency in flight, no more, and
    # reaches it in its first batch.
    batch_size, n = 6, 120
    budget = max(num_workers, 1) * item_concurrency
    started: list[int] = []
    first_batch_peak = 0
    in_flight = 0

    class Ticking:
        def __len__(self) -> int:
            return n

        async def __getitem__(self, index: int) -> int:
            nonlocal in_flight, first_batch_peak
            started.append(index)
            in_flight += 1
            assert in_flight <= budget
            if index < batch_size:
                first_batch_peak = max(first_batch_peak, in_flight)
            for _ in range(3):  # let the other lanes start their items
                await asyncio.sleep(0)
            in_flight -= 1
            return index

    loader = DataLoader(
        Ticking(),
        batch_size=batch_size,
        num_workers=num_workers,
        item_concurrency=item_concurrency,
    )
    async with loader:
        out = [int(i) async for batch in loader for i in batch]
    assert out == list(range(n))
    assert started == list(range(n))
    assert first_batch_peak == min(budget, batch_size)


_PAST_THE_DESCRIPTORS = """
import resource
from asyncloader import DataLoader, HttpDataset, Template
from asyncloader._samples import serve_samples
from tests.epochs import outcomes

with serve_samples(0.05, 16) as url:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    data = HttpDataset(Template(url + "/samples/{index}"), length=2048)
    with DataLoader(
        data, batch_size=64, num_workers=8, item_concurrency=64, collate_fn=list
    ) as loader:
        print(outcomes(loader, len, Exception) == [64] * 32, loader.stats().retries)
"""


@pytest.mark.timeout(120)
def test_more_requests_in_flight_than_descriptors_wait_for_a_connection() -> None:
    # 512 requests in flight under a limit of 256 descriptors: each socket past the limit
    # failed to open ("Too many open files") and was retried, until some items ran out of
    # attempts and failed their batches.
    result = run_script(_PAST_THE_DESCRIPTORS, timeout=100)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True", "0"]  # every batch, and not one retry


async def test_lanes_past_what_the_epoch_can_use_are_not_made() -> None:
    # 100,000 requests in flight over 40 items: a task for each lane, 99,960 of them only to
    # wait for the epoch's end (1,000,000 over 100 items took 19 s and 1.7 GB, and the close
    # timed out).
    loader = DataLoader(AsyncData(40), batch_size=4, num_workers=1000, item_concurrency=100)
    most = 0
    batches = []
    async for batch in loader:
        most = max(most, len(asyncio.all_tasks()))
        batches.append(batch.tolist())
    await loader.aclose()
    assert batches == [list(range(n, n + 4)) for n in range(0, 40, 4)]
    assert most <= 64
