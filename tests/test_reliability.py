"""Faults with nothing lost, cancellation storms, and a short soak."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import os
import random
import threading
from typing import Any

import pytest

from asyncloader import DataLoader, HttpDataset, ObjectStoreDataset, Retry, Template

from .datasets import AsyncData, SyncData
from .servers import FaultServer, random_body, run_moto

ITEMS = 5000
RETRY = Retry(max_retries=6, initial_backoff=0.001, max_backoff=0.01)


def checksum(item: bytes) -> str:
    return hashlib.sha256(item).hexdigest()


EXPECTED = [checksum(random_body(i)) for i in range(ITEMS)]


def _fault_dataset(server: FaultServer) -> HttpDataset:
    return HttpDataset(
        Template(server.url + "/random/{index}"), length=ITEMS, retry=RETRY, timeout=0.5
    )


def _check_nothing_lost(
    server: FaultServer, batches: list[Any], faults_before: int, retries: int
) -> None:
    got = [checksum(item) for batch in batches for item in batch]
    assert got == EXPECTED  # every item, byte-identical, in order
    injected = sum(server.faults.values()) - faults_before
    assert injected > ITEMS * 0.3 * 0.8  # about 30 % of first attempts failed, and more
    assert set(server.faults) == {"500", "503", "reset", "short", "stall"}
    # Each injected fault cost one retry (a response slowed past the time-out by a loaded
    # machine costs one more: at least, not exactly).
    assert retries >= injected


@pytest.mark.timeout(300)
def test_an_epoch_through_30_percent_faults_loses_nothing(server: FaultServer) -> None:
    faults_before = sum(server.faults.values())
    with DataLoader(
        _fault_dataset(server), batch_size=50, collate_fn=list, num_workers=4, item_concurrency=16
    ) as loader:
        batches = list(loader)
    _check_nothing_lost(server, batches, faults_before, loader.stats().retries)


@pytest.mark.timeout(300)
async def test_an_async_epoch_through_30_percent_faults_loses_nothing(server: FaultServer) -> None:
    faults_before = sum(server.faults.values())
    async with DataLoader(
        _fault_dataset(server), batch_size=50, collate_fn=list, num_workers=4, item_concurrency=16
    ) as loader:
        batches = [batch async for batch in loader]
    _check_nothing_lost(server, batches, faults_before, loader.stats().retries)


def test_exhausted_retries_fail_batches_and_the_next_epoch_is_whole(server: FaultServer) -> None:
    server.streak.clear()
    data = HttpDataset(
        Template(server.url + "/random/{index}"), length=400, retry=Retry(0), timeout=0.25
    )
    with DataLoader(
        data, batch_size=20, collate_fn=list, num_workers=4, item_concurrency=5
    ) as loader:
        outcomes: list[Any] = []
        iterator = iter(loader)
        for _ in range(len(loader)):
            try:
                outcomes.append(next(iterator))
            except OSError as error:  # TimeoutError and ConnectionError are OSErrors
                outcomes.append(error)
        failed = [o for o in outcomes if isinstance(o, Exception)]
        assert failed  # without retries, faults fail their batch...
        assert len(outcomes) == 20  # ...and only their batch
        data.retry = RETRY
        whole = [checksum(item) for batch in loader for item in batch]
    assert whole == EXPECTED[:400]


@pytest.mark.timeout(300)
def test_an_s3_server_restarted_mid_epoch_loses_nothing() -> None:
    objects = {f"o/{i:04d}": random_body(i) for i in range(300)}
    with run_moto("restart", objects) as moto:
        data = ObjectStoreDataset(
            "s3://restart",
            [f"o/{i:04d}" for i in range(300)],
            endpoint=moto.endpoint,
            allow_http=True,
            region="us-east-1",
            access_key_id="testing",
            secret_access_key="testing",
            # About 14 s of retries: the restart is slow on a loaded machine (one whole run
            # on two busy cores used up 10 retries, about 4 s, before moto was back).
            retry=Retry(max_retries=30, initial_backoff=0.05, max_backoff=0.5),
        )
        got: list[str] = []
        with DataLoader(
            data, batch_size=10, collate_fn=list, num_workers=2, item_concurrency=4
        ) as loader:
            for number, batch in enumerate(loader):
                got += [checksum(bytes(item)) for item in batch]
                if number == 5:  # mid-epoch, with requests in flight: down, and up again
                    moto.restart()
    assert got == [checksum(random_body(i)) for i in range(300)]


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _loader_threads() -> int:
    return sum(t.name.startswith("asyncloader") for t in threading.enumerate())


@pytest.mark.timeout(300)
async def test_a_storm_of_abandoned_iterators_leaves_nothing_behind() -> None:
    rng = random.Random(7)
    gc.collect()
    fds, tasks = _fds(), len(asyncio.all_tasks())
    assert _loader_threads() == 0
    sync_loader = DataLoader(
        SyncData(200, delay=0.001), batch_size=5, num_workers=3, item_concurrency=2
    )
    async_loader = DataLoader(
        AsyncData(200, delay=0.002), batch_size=5, num_workers=3, item_concurrency=4
    )
    # The most threads the two loaders may own: loop thread, CPU pool, I/O pool (sync only),
    # and pools retired while a call of an abandoned epoch still runs (they end with it).
    bound = 2 * (1 + 2) + 2 * 6
    ways: dict[str, int] = {}

    class ConsumerError(Exception):
        pass

    def abandon_sync(way: str, stop: int) -> None:
        iterator = iter(sync_loader)
        try:
            for position, _ in enumerate(iterator):
                if position == stop:
                    if way == "break":
                        break
                    if way == "close":
                        iterator.close()  # type: ignore[attr-defined]
                        break
                    if way == "raise":
                        raise ConsumerError
                    if way == "gc":
                        del iterator
                        gc.collect()
                        return
        except ConsumerError:
            pass

    async def abandon_async(way: str, stop: int) -> None:
        async def consume() -> None:
            position = 0
            async for _ in async_loader:
                if position == stop:
                    if way == "raise":
                        raise ConsumerError
                    await asyncio.sleep(3600)  # cancelled from outside
                position += 1

        task = asyncio.ensure_future(consume())
        if way == "cancel":
            for _ in range(stop + 5):  # at a random point of the epoch
                await asyncio.sleep(0.002)
            task.cancel()
        with contextlib.suppress(ConsumerError, asyncio.CancelledError):
            await task

    for _ in range(200):
        stop = rng.randrange(0, 40)
        if rng.random() < 0.5:
            way = rng.choice(["break", "close", "raise", "gc"])
            await asyncio.to_thread(abandon_sync, way, stop)
            ways[f"sync-{way}"] = ways.get(f"sync-{way}", 0) + 1
        else:
            way = rng.choice(["raise", "cancel"])
            await abandon_async(way, stop)
            ways[f"async-{way}"] = ways.get(f"async-{way}", 0) + 1
        assert _loader_threads() <= bound
    gc.collect()
    for _ in range(200):  # let the cancelled drivers finish their clean-up
        if len(asyncio.all_tasks()) <= tasks:
            break
        await asyncio.sleep(0.005)
    assert len(asyncio.all_tasks()) == tasks
    assert sum(ways.values()) == 200
    assert len(ways) == 6
    # Both loaders still run whole epochs.
    assert sum(len(b) for b in await asyncio.to_thread(lambda: list(sync_loader))) == 200
    assert sum([len(b) async for b in async_loader]) == 200
    sync_loader.close()
    await async_loader.aclose()
    gc.collect()
    assert _loader_threads() == 0  # no thread left over
    assert _fds() == fds  # no socket, pipe or file left open


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.timeout(300)
def test_a_short_soak_keeps_threads_fds_and_memory_flat() -> None:
    loader = DataLoader(
        AsyncData(2000),
        batch_size=50,
        num_workers=4,
        item_concurrency=8,
        transform=lambda i, x: x * 2,
    )
    counts, rss = [], []
    with loader:
        for _ in range(15):
            assert sum(int(batch.sum()) for batch in loader) == 2 * sum(range(2000))
            gc.collect()
            counts.append((_loader_threads(), _fds()))
            rss.append(_rss_bytes())
    assert len(set(counts)) == 1
    growth = rss[-1] - rss[4]
    assert growth < 16 * 2**20, f"RSS grew {growth / 2**20:.1f} MiB after the first 5 epochs"
