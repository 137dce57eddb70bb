"""Statistics that match the work done, a report that names the bottleneck, the skip policy."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import threading
import time
import tracemalloc
import uuid
from typing import Any

import pytest

from asyncloader import (
    DataLoader,
    HttpDataset,
    LoaderStats,
    Retry,
    SkipBudgetExceeded,
    StageStats,
)
from asyncloader.testing import assert_equal_output_after_checkpoint

from .datasets import AsyncData, SyncData
from .servers import FaultServer, body


class Blobs(SyncData):
    """Item ``i`` is ``i + 1`` bytes."""

    def __getitem__(self, index: int) -> Any:
        super().__getitem__(index)
        return b"x" * (index + 1)


@pytest.mark.parametrize(("num_workers", "item_concurrency"), [(0, 1), (2, 1), (2, 3)])
def test_counts_match_the_work_exactly(num_workers: int, item_concurrency: int) -> None:
    with DataLoader(
        Blobs(25),
        batch_size=10,
        collate_fn=list,
        transform=lambda i, x: x,
        num_workers=num_workers,
        item_concurrency=item_concurrency,
    ) as loader:
        assert len(list(loader)) == 3
        stats = loader.stats()
    assert (stats.items, stats.batches, stats.errors, stats.skipped) == (25, 3, 0, 0)
    assert stats.bytes == sum(range(1, 26))
    assert stats.transform.count == 25
    assert stats.collate.count == 3
    calls = 3 if item_concurrency == 1 else 25  # one call per batch, or one per item
    assert stats.fetch.count == calls
    assert stats.consumer_wait.count == 3 + (0 if num_workers == 0 else 1)  # + the end
    assert (stats.in_flight, stats.items_in_flight) == (0, 0)
    assert stats.peak_in_flight <= max(num_workers, 1) * item_concurrency
    assert stats.active_s > 0


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_retries_and_bytes_of_http_items_are_counted(server: FaultServer, mode: str) -> None:
    key = uuid.uuid4().hex  # fresh fault counters for each run
    urls = [
        server.url + "/ok/10",
        server.url + f"/flaky/503/1/{key}-a",
        server.url + "/ok/20",
        server.url + f"/flaky/500/2/{key}-b",
    ]
    data = HttpDataset(urls, retry=Retry(3, 0.001, 0.01))
    loader = DataLoader(data, batch_size=2, collate_fn=list, num_workers=2, item_concurrency=2)
    if mode == "sync":
        batches = await asyncio.to_thread(lambda: list(loader))
    else:
        batches = [batch async for batch in loader]
    await loader.aclose()
    assert batches == [[body(10), b"recovered"], [body(20), b"recovered"]]
    stats = loader.stats()
    assert stats.retries == 3
    assert stats.items == 4
    assert stats.bytes == 10 + 9 + 20 + 9


class Counted:
    """Item ``i`` is ``i + 1`` bytes after a short random wait; counts the items returned."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.returned: list[int] = []
        self.lock = threading.Lock()
        self.rng = random.Random(0)

    def __len__(self) -> int:
        return self.n

    def _item(self, index: int) -> bytes:
        with self.lock:
            self.returned.append(index)
        return b"x" * (index + 1)


class SyncCounted(Counted):
    def __getitem__(self, index: int) -> bytes:
        time.sleep(self.rng.random() * 0.002)
        return self._item(index)


class AsyncCounted(Counted):
    async def __getitem__(self, index: int) -> bytes:
        await asyncio.sleep(self.rng.random() * 0.002)
        return self._item(index)


@pytest.mark.parametrize("kind", [AsyncCounted, SyncCounted])
@pytest.mark.parametrize("transform", [None, lambda i, x: x])
def test_items_of_batches_left_behind_are_counted_once_fetched(
    kind: type[Counted], transform: Any
) -> None:
    # A batch's fetches are counted together once none is left in work: a batch the consumer
    # never takes is counted too, with what it fetched before it was cancelled.
    data = kind(64)
    with DataLoader(
        data,
        batch_size=4,
        collate_fn=list,
        transform=transform,
        num_workers=4,
        item_concurrency=3,
    ) as loader:
        for _ in loader:
            break
    stats = loader.stats()
    assert stats.items == len(data.returned) >= 4
    assert stats.bytes == sum(index + 1 for index in data.returned)
    assert stats.fetch.count >= stats.items


def test_failed_batches_are_counted_as_errors() -> None:
    data = SyncData(20)
    data.fail_at = {5, 15}
    with DataLoader(data, batch_size=5, num_workers=1) as loader:
        iterator = iter(loader)
        outcomes = []
        for _ in range(4):
            try:
                outcomes.append(next(iterator).tolist())
            except Exception as error:
                outcomes.append(error)
        assert loader.stats().errors == 2
        assert loader.stats().batches == 4


def _fetch_bound(items: int, batch_size: int, num_workers: int, lanes: int) -> LoaderStats:
    """The statistics of an epoch of ``items`` that each take 20 ms to fetch."""
    with DataLoader(
        AsyncData(items, delay=0.02),
        batch_size=batch_size,
        num_workers=num_workers,
        item_concurrency=lanes,
    ) as loader:
        for _ in loader:
            pass
        return loader.stats()


def test_the_report_names_a_fetch_bound_loader() -> None:
    stats = _fetch_bound(60, 6, 1, 2)
    assert stats.bottleneck()[0] == "fetch"
    assert "fetch-bound" in stats.report()
    assert "raise item_concurrency" in stats.report()


def test_a_fetch_bound_loader_that_never_used_all_its_requests_is_not_told_to_add_more() -> None:
    # 3 items cannot keep 64 requests in flight: "raise item_concurrency" was the advice.
    stats = _fetch_bound(3, 3, 16, 4)
    assert stats.bottleneck()[0] == "fetch"
    assert "3 of 64 requests in flight at peak" in stats.report()
    assert "would not help" in stats.report()
    assert "raise item_concurrency or num_workers" not in stats.report()


class SlowStream:
    """A stream whose every item takes its reader 2 ms (the iterator's own work)."""

    def __iter__(self) -> Any:
        for item in range(100):
            time.sleep(0.002)
            yield item


def test_a_stream_counts_one_pull_in_flight_and_only_its_own_time() -> None:
    # Its reader pulls one batch at a time; the lanes that waited for it were counted as
    # pulls in flight (4 "of 1") and their waits as fetch time (several times the epoch's).
    with DataLoader(SlowStream(), batch_size=5, num_workers=4) as loader:
        assert sum(len(batch) for batch in loader) == 100
        stats = loader.stats()
    assert stats.requests_limit == 1
    assert stats.peak_in_flight == 1
    assert stats.fetch.count == 21  # 20 batches, and the pull that found the end
    assert stats.fetch.total_s <= stats.active_s
    assert "one reader pulls the stream" in stats.report()


def _reader_bound(stats: LoaderStats) -> LoaderStats:
    """``stats`` as a run whose consumer waited for a reader that was busy all the while."""
    return dataclasses.replace(
        stats,
        active_s=1.0,
        fetch=StageStats(20, 0.9, 0.045, 0.04, 0.09),
        consumer_wait=StageStats(20, 0.95, 0.05, 0.05, 0.06),
    )


def test_a_shard_stream_is_advised_on_its_interleave_not_to_store_shards(tmp_path: Any) -> None:
    # A TarShards loader bound by its reader was told to "store the data in shards".
    from asyncloader import FileDataset, TarShards

    from .test_shards import shard_bytes

    names = [f"{shard}.tar" for shard in range(4)]
    for shard, name in enumerate(names):
        (tmp_path / name).write_bytes(shard_bytes(shard))
    shards = TarShards(FileDataset(names, root=tmp_path), interleave=3)
    with DataLoader(shards, batch_size=2, collate_fn=list) as loader:
        assert sum(len(batch) for batch in loader) == 28
        stats = loader.stats()
    assert stats.interleave == 3
    assert stats.shards == 4
    reader_bound = _reader_bound(stats)
    stage, advice = reader_bound.bottleneck()
    assert stage == "fetch"
    assert "raise interleave" in advice
    assert "interleave=3" in advice
    assert "store the data in shards" not in advice
    plain = dataclasses.replace(reader_bound, interleave=0)
    assert "store the data in shards" in plain.bottleneck()[1]


def test_a_shard_stream_that_reads_all_its_shards_at_once_is_not_told_to_raise_interleave(
    tmp_path: Any,
) -> None:
    # One shard read at interleave=3 was told to raise interleave (and `asyncloader bench`
    # suggested --interleave 6): every shard was open already, and more could not be.
    from asyncloader import FileDataset, TarShards

    from .test_shards import shard_bytes

    (tmp_path / "0.tar").write_bytes(shard_bytes(0))
    shards = TarShards(FileDataset(["0.tar"], root=tmp_path), interleave=3)
    with DataLoader(shards, batch_size=2, collate_fn=list) as loader:
        assert sum(len(batch) for batch in loader) == 7
        stats = loader.stats()
    reader_bound = _reader_bound(stats)
    stage, advice = reader_bound.bottleneck()
    assert stage == "fetch"
    assert "raise interleave" not in advice
    assert "all 1 shards are read at once (interleave=3)" in advice


def test_the_report_names_a_transform_bound_loader() -> None:
    def heavy(index: int, item: int) -> int:
        time.sleep(0.003)  # stands for decoding: it holds a CPU thread
        return item

    with DataLoader(
        SyncData(120), batch_size=6, num_workers=2, transform=heavy, cpu_threads=1
    ) as loader:
        for _ in loader:
            pass
        stats = loader.stats()
    assert stats.bottleneck()[0] == "transform"
    assert "raise cpu_threads" in stats.report()


def _spin(index: int, item: int) -> int:
    """Pure Python: it holds the GIL throughout."""
    total = 0
    for step in range(20_000):
        total += step ^ index
    return item


def _sleep(index: int, item: int) -> int:
    time.sleep(0.002)  # waits: uses no CPU, holds no GIL
    return item


def test_the_report_names_a_gil_bound_transform_and_suggests_processes() -> None:
    with DataLoader(
        SyncData(400), batch_size=8, num_workers=2, transform=_spin, cpu_threads=2
    ) as loader:
        for _ in loader:
            pass
        stats = loader.stats()
    # It computes (when it does not wait for the GIL), and two threads give it one core.
    assert stats.transform_cpu_s > 0.3 * stats.transform.total_s
    assert stats.transform_cpu_s < 1.15 * stats.active_s
    assert stats.gil_bound()
    assert stats.bottleneck()[0] == "GIL"
    assert "GIL-bound: the transform holds the GIL" in stats.report()
    assert "cpu_processes=2" in stats.report()


def test_a_waiting_transform_is_not_called_gil_bound() -> None:
    with DataLoader(
        SyncData(400), batch_size=8, num_workers=2, transform=_sleep, cpu_threads=2
    ) as loader:
        for _ in loader:
            pass
        stats = loader.stats()
    assert stats.transform_cpu_s < 0.2 * stats.transform.total_s  # it waits
    assert not stats.gil_bound()
    assert stats.bottleneck()[0] == "transform"


@pytest.mark.parametrize("transform", [_spin, _sleep, None])
def test_with_num_workers_0_the_report_says_the_batches_are_made_inline(
    transform: Any,
) -> None:
    # num_workers=0 makes each batch in the consumer's thread, with no CPU thread at all:
    # the report said "GIL-bound: ... 2 CPU threads give it 0.9 cores", or "raise
    # item_concurrency or num_workers" for a dataset of plain numbers.
    with DataLoader(SyncData(200), batch_size=8, transform=transform) as loader:
        for _ in loader:
            pass
        stats = loader.stats()
    assert stats.inline
    stage, advice = stats.bottleneck()
    assert stage == "inline"
    assert "num_workers=0 makes each batch in your thread" in advice
    assert "CPU threads" not in advice


@pytest.mark.parametrize("num_workers", [0, 2])
def test_items_that_failed_to_fetch_are_not_counted_as_fetched(num_workers: int) -> None:
    # With num_workers=0 an item that failed under errors="skip" was counted in items
    # (12 of 12 here, against 8 of 12 on the other path), and a batch whose first item
    # failed counted none of its bytes.
    data = Blobs(12)
    data.fail_at = {0, 3, 4, 9}
    settings: dict[str, Any] = {"num_workers": num_workers, "errors": "skip", "collate_fn": list}
    with DataLoader(data, batch_size=4, **settings) as loader:
        assert sum(len(batch) for batch in loader) == 8
        stats = loader.stats()
    assert (stats.items, stats.skipped) == (8, 4)
    assert stats.bytes == sum(i + 1 for i in range(12) if i not in data.fail_at)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_report_of_an_epoch_whose_every_item_was_skipped_says_so(num_workers: int) -> None:
    def failing(index: int, item: int) -> int:
        raise ValueError("cannot decode")

    with DataLoader(
        SyncData(40), batch_size=8, transform=failing, errors="skip", num_workers=num_workers
    ) as loader:
        assert list(loader) == []
        stats = loader.stats()
    assert stats.batches == 0  # none handed over, the same on every path
    stage, advice = stats.bottleneck()
    assert stage == "skip"
    assert 'errors="skip" dropped 40 items' in advice


def test_with_processes_the_report_never_suggests_them() -> None:
    from . import proc_data

    with DataLoader(
        proc_data.Images(64), batch_size=8, transform=proc_data.spin, cpu_processes=2
    ) as loader:
        for _ in loader:
            pass
        stats = loader.stats()
    assert stats.cpu_processes == 2
    assert stats.transform.count == 64
    assert stats.transform_cpu_s > 0
    assert not stats.gil_bound()
    assert "cpu_processes=" not in stats.report()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_report_names_a_consumer_bound_loader(num_workers: int) -> None:
    with DataLoader(SyncData(60), batch_size=6, num_workers=num_workers) as loader:
        for _ in loader:
            time.sleep(0.02)  # stands for a training step, slower than the loader
        stats = loader.stats()
    assert stats.bottleneck()[0] == "consumer"
    assert "the loader waits on you" in stats.report()
    loader.reset_stats()
    assert loader.stats().batches == 0


PATHS = [("sync", 0, 1), ("sync", 2, 1), ("sync", 2, 3), ("async", 2, 3), ("async", 0, 1)]


@pytest.mark.parametrize(("kind", "num_workers", "item_concurrency"), PATHS)
def test_skip_drops_failing_items_logs_each_once_and_counts_them(
    kind: str, num_workers: int, item_concurrency: int, caplog: pytest.LogCaptureFixture
) -> None:
    data = SyncData(20) if kind == "sync" else AsyncData(20)
    data.fail_at = {3, 7}

    def transform(index: int, item: int) -> int:
        if index == 12:
            raise ValueError("cannot decode")
        return item

    caplog.set_level(logging.WARNING, logger="asyncloader")
    with DataLoader(
        data,
        batch_size=5,
        errors="skip",
        transform=transform,
        num_workers=num_workers,
        item_concurrency=item_concurrency,
    ) as loader:
        pairs = [(indices, batch.tolist()) for indices, batch in loader.iter_with_indices()]
        stats = loader.stats()
    assert [indices for indices, _ in pairs] == [
        [0, 1, 2, 4],
        [5, 6, 8, 9],
        [10, 11, 13, 14],
        [15, 16, 17, 18, 19],
    ]
    assert all(indices == batch for indices, batch in pairs)
    assert stats.skipped == 3
    messages = [r.getMessage() for r in caplog.records if r.name == "asyncloader"]
    for index in (3, 7, 12):
        assert sum(m.startswith(f"skipped item {index}:") for m in messages) == 1
    assert any("cannot decode" in m for m in messages)


def _refusing_empty(items: list[Any]) -> list[Any]:
    """A collate_fn as torch's and ImageCollator are: an empty batch is an error."""
    if not items:
        raise IndexError("list index out of range")
    return list(items)


class _Stream:
    """An iterable source of 0-11 whose items 4-7 fail."""

    def __iter__(self) -> Any:
        return iter(range(12))


@pytest.mark.parametrize("setup", ["inline", "threads", "async", "stream", "unbatched"])
def test_a_batch_whose_every_item_is_skipped_is_not_delivered(setup: str) -> None:
    # errors="skip" handed such a batch on as an empty one: [] from the default collation,
    # and an error from a collate_fn that refuses an empty list (torch's IndexError,
    # ImageCollator's "an empty batch"); with batch_size=None, [] in each skipped item's place.
    def transform(index: int, item: int) -> int:
        if 4 <= index < 8:
            raise ValueError("cannot decode")
        return item

    size: int | None = None if setup == "unbatched" else 4
    settings: dict[str, Any] = {"batch_size": size, "errors": "skip", "transform": transform}
    if setup != "unbatched":
        settings["collate_fn"] = _refusing_empty
    data: Any = (
        AsyncData(12) if setup == "async" else _Stream() if setup == "stream" else (SyncData(12))
    )
    if setup != "inline":
        settings["num_workers"] = 2

    def make() -> DataLoader:
        return DataLoader(data, **settings)

    with make() as loader:
        if setup == "async":

            async def epoch() -> list[Any]:
                return [batch async for batch in loader]

            got = asyncio.run(epoch())
        else:
            got = list(loader)
        assert loader.stats().skipped == 4
    if setup == "unbatched":
        assert got == [0, 1, 2, 3, 8, 9, 10, 11]
    else:
        assert got == [[0, 1, 2, 3], [8, 9, 10, 11]]
    if setup != "stream":  # a stream without state of its own resumes by reading again
        assert_equal_output_after_checkpoint(make)


@pytest.mark.parametrize(("max_errors", "allowed"), [(1, 1), (0.1, 2), (0, 0)])
def test_exceeding_the_budget_raises_listing_the_first_failures(
    max_errors: int | float, allowed: int
) -> None:
    data = SyncData(20)
    data.fail_at = {1, 2, 3, 11}
    with DataLoader(data, batch_size=10, errors="skip", max_errors=max_errors) as loader:
        iterator = iter(loader)
        with pytest.raises(SkipBudgetExceeded) as raised:
            next(iterator)
    assert f"over max_errors={allowed}" in str(raised.value)
    assert [index for index, _ in raised.value.failures] == [1, 2, 3][: allowed + 1]
    assert "item 1: Boom" in str(raised.value)


def test_the_budget_holds_with_batches_in_parallel() -> None:
    data = SyncData(40)
    data.fail_at = {1, 2, 11, 21, 31}
    with DataLoader(
        data, batch_size=10, errors="skip", max_errors=3, num_workers=3, item_concurrency=2
    ) as loader:
        outcomes: list[Any] = []
        iterator = iter(loader)
        for _ in range(4):
            try:
                outcomes.append(next(iterator))
            except SkipBudgetExceeded as error:
                outcomes.append(error)
    over = [o for o in outcomes if isinstance(o, SkipBudgetExceeded)]
    assert over  # the 4th and 5th failures are over the budget of 3
    assert {index for error in over for index, _ in error.failures} <= data.fail_at
    assert loader.stats().skipped == 5


def test_an_epoch_of_skipped_items_holds_no_memory_for_each(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Each skipped item's reason was kept until the epoch ended, though only the first ten
    # are ever shown: 20,000 reasons of 1 KB held 20 MB.
    def transform(index: int, item: int) -> int:
        raise ValueError("cannot decode " + "x" * 1000)

    caplog.set_level(logging.ERROR, logger="asyncloader")  # no record kept by the capture
    with DataLoader(SyncData(20_000), batch_size=100, errors="skip", transform=transform) as loader:
        tracemalloc.start()
        try:
            assert sum(len(batch) for batch in loader) == 0
            held, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert loader.stats().skipped == 20_000
    # What the loader holds anyway (its statistics' samples, its pools) is about 1 MB alone
    # (989 KB by hand; once 1,003 KB in a whole run): the reasons held 20 MB.
    assert held < 2_000_000


def test_skip_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="errors"):
        DataLoader(SyncData(3), errors="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_errors"):
        DataLoader(SyncData(3), max_errors=3)
    with pytest.raises(ValueError, match="max_errors"):
        DataLoader(SyncData(3), errors="skip", max_errors=1.5)
    with pytest.raises(ValueError, match="max_errors"):
        DataLoader(SyncData(3), errors="skip", max_errors=-1)
    with pytest.raises(TypeError, match="max_errors"):
        DataLoader(SyncData(3), errors="skip", max_errors="1")  # type: ignore[arg-type]


def test_a_clean_epoch_logs_nothing_at_info(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="asyncloader")
    with DataLoader(AsyncData(50), batch_size=5, num_workers=2, item_concurrency=2) as loader:
        assert len(list(loader)) == 10
    assert not [r for r in caplog.records if r.name == "asyncloader" and r.levelno >= logging.INFO]


class _HeldBatches(SyncData):
    """Batch ``k``'s items wait until :meth:`release` ``(k)``: nothing finishes unasked."""

    def __init__(self, n: int, batch_size: int) -> None:
        super().__init__(n)
        self.batch_size = batch_size
        self.released = [threading.Event() for _ in range(-(-n // batch_size))]

    def release(self, batch: int) -> None:
        self.released[batch].set()

    def __getitem__(self, index: int) -> int:
        assert self.released[index // self.batch_size].wait(10)
        return super().__getitem__(index)


def test_permit_wait_counts_only_waits_behind_the_consumer() -> None:
    # The window is full of batches still fetching: the loader waits on its own fetches, not
    # on the consumer, so none of it is permit_wait (the loader waiting for you).
    data = _HeldBatches(40, 4)
    with DataLoader(data, batch_size=4, num_workers=1, prefetch_depth=2) as loader:
        iterator = iter(loader)
        for batch in range(10):
            data.release(batch)  # only the batch taken next can finish
            next(iterator)
        assert loader.stats().permit_wait.count == 0
    # The consumer is slower: finished batches wait for it, and the driver waits behind them.
    with DataLoader(SyncData(80), batch_size=4, num_workers=1, prefetch_depth=2) as loader:
        for _ in loader:
            time.sleep(0.01)  # the training step
        waited = loader.stats().permit_wait
    assert waited.count >= 1
    assert waited.total_s > 0
