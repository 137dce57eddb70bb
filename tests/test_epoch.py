"""Order, completeness and bounds of an epoch, on every path and in both consumption modes."""

from __future__ import annotations

import asyncio
import threading
import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncloader import DataLoader, RandomSampler, _sampler
from asyncloader._sampler import Permutation, SequentialSampler, cut_batches, read_sampler
from asyncloader._skip import ErrorPolicy

from .datasets import AsyncData, SyncData

MATRIX = [(w, k) for w in (0, 1, 4) for k in (1, 4)]


class GatedSync(SyncData):
    """Each item waits until ``limit`` items were once in flight, so the limit is reached."""

    def __init__(self, n: int, limit: int) -> None:
        super().__init__(n)
        self.limit = limit
        self.gate = threading.Event()

    def __getitem__(self, index: int) -> int:
        self.probe.enter(index)
        try:
            if self.probe.peak >= self.limit:
                self.gate.set()
            self.gate.wait(10)
            return index
        finally:
            self.probe.leave()


class GatedAsync(AsyncData):
    """The async twin of :class:`GatedSync`."""

    def __init__(self, n: int, limit: int) -> None:
        super().__init__(n)
        self.limit = limit
        self.gate: asyncio.Event | None = None

    async def __getitem__(self, index: int) -> int:
        if self.gate is None:
            self.gate = asyncio.Event()
        self.probe.enter(index)
        try:
            if self.probe.peak >= self.limit:
                self.gate.set()
            await asyncio.wait_for(self.gate.wait(), 10)
            return index
        finally:
            self.probe.leave()


def _make(kind: str, n: int, delay: float) -> SyncData | AsyncData:
    return SyncData(n, delay) if kind == "sync" else AsyncData(n, delay)


def _expected(n: int, batch_size: int) -> list[list[int]]:
    return [list(range(i, min(i + batch_size, n))) for i in range(0, n, batch_size)]


@pytest.mark.parametrize(("num_workers", "item_concurrency"), MATRIX)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_for_keeps_order_under_random_delays(
    kind: str, num_workers: int, item_concurrency: int
) -> None:
    data = _make(kind, 101, delay=0.002)
    with DataLoader(
        data, batch_size=8, num_workers=num_workers, item_concurrency=item_concurrency
    ) as loader:
        got = [batch.tolist() for batch in loader]
    assert got == _expected(101, 8)


@pytest.mark.parametrize(("num_workers", "item_concurrency"), MATRIX)
@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_async_for_keeps_order_under_random_delays(
    kind: str, num_workers: int, item_concurrency: int
) -> None:
    data = _make(kind, 101, delay=0.002)
    async with DataLoader(
        data, batch_size=8, num_workers=num_workers, item_concurrency=item_concurrency
    ) as loader:
        got = [batch.tolist() async for batch in loader]
    assert got == _expected(101, 8)


@pytest.mark.parametrize(("num_workers", "item_concurrency"), [(0, 1), (2, 1), (2, 3)])
def test_iter_with_indices_pairs_each_batch_with_its_indices(
    num_workers: int, item_concurrency: int
) -> None:
    data = SyncData(30)
    with DataLoader(
        data,
        batch_size=4,
        shuffle=True,
        seed=3,
        num_workers=num_workers,
        item_concurrency=item_concurrency,
    ) as loader:
        pairs = list(loader.iter_with_indices())
    assert [batch.tolist() for _, batch in pairs] == [indices for indices, _ in pairs]
    assert sorted(i for indices, _ in pairs for i in indices) == list(range(30))


async def test_aiter_with_indices() -> None:
    async with DataLoader(AsyncData(10), batch_size=3, num_workers=2) as loader:
        pairs = [pair async for pair in loader.aiter_with_indices()]
    assert [indices for indices, _ in pairs] == _expected(10, 3)


@pytest.mark.parametrize(("num_workers", "item_concurrency"), MATRIX)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_items_in_flight_reach_but_never_exceed_the_limit(
    kind: str, num_workers: int, item_concurrency: int
) -> None:
    limit = max(num_workers, 1) * item_concurrency
    data: GatedSync | GatedAsync = (
        GatedSync(400, limit) if kind == "sync" else GatedAsync(400, limit)
    )
    probe = data.probe
    with DataLoader(
        data, batch_size=8, num_workers=num_workers, item_concurrency=item_concurrency
    ) as loader:
        total = sum(len(batch) for batch in loader)
    assert total == 400
    # The direct path (sync, 0 workers, 1 at a time) makes one call per batch: 1 in flight.
    assert probe.peak == limit


@pytest.mark.parametrize(("num_workers", "prefetch_depth"), [(1, 1), (2, 2), (4, 3)])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_stalled_consumer_bounds_the_batches_started(
    kind: str, num_workers: int, prefetch_depth: int
) -> None:
    batch_size = 4
    window = num_workers + prefetch_depth
    data = _make(kind, 200, delay=0.0)
    probe = data.probe
    calls = 0  # next() calls begun: the batches taken once the current call returns
    violations: list[tuple[int, int]] = []
    original = probe.enter

    def checked_enter(index: int) -> None:
        batch = index // batch_size
        if batch >= calls + window:
            violations.append((batch, calls))
        original(index)

    probe.enter = checked_enter  # type: ignore[method-assign]

    def highest_batch_started() -> int:
        return max(probe.started, default=-1) // batch_size

    with DataLoader(
        data, batch_size=batch_size, num_workers=num_workers, prefetch_depth=prefetch_depth
    ) as loader:
        iterator = iter(loader)
        for taken in range(0, 50, 7):
            while calls < taken:
                calls += 1
                next(iterator)
            # The consumer stalls here until the pipeline is full: exactly the window ahead.
            full = min(taken + window - 1, 49)
            probe.wait_for(lambda f=full: highest_batch_started() >= f)
            assert highest_batch_started() == full
        rest: list[Any] = list(iterator)
    assert not violations, violations
    assert len(rest) == 50 - 49


def test_shuffle_is_a_permutation_that_changes_each_epoch_and_is_reproducible() -> None:
    def epochs(seed: int) -> list[list[int]]:
        with DataLoader(SyncData(50), batch_size=50, shuffle=True, seed=seed) as loader:
            return [next(iter(loader)).tolist() for _ in range(3)]

    first = epochs(7)
    assert all(sorted(epoch) == list(range(50)) for epoch in first)
    assert first[0] != first[1] != first[2]
    assert epochs(7) == first
    assert epochs(8) != first


def test_a_sampler_is_read_at_the_start_of_each_epoch() -> None:
    order = [5, 3, 1]
    with DataLoader(SyncData(10), batch_size=2, sampler=order) as loader:
        first = [batch.tolist() for batch in loader]
        order.append(0)
        second = [batch.tolist() for batch in loader]
    assert first == [[5, 3], [1]]
    assert second == [[5, 3], [1, 0]]


class EndsOnceWarned:
    """A sampler that would go on for ever (one for training by steps): it ends only once
    ``warned`` holds a warning; with ``batches``, a batch sampler of such."""

    def __init__(self, warned: list[warnings.WarningMessage], batches: bool) -> None:
        self.warned, self.batches = warned, batches

    def __iter__(self) -> Any:
        count = 0
        while not self.warned:
            yield [count % 10] if self.batches else count % 10
            count += 1


@pytest.mark.parametrize("what", ["sampler", "batch_sampler"])
def test_a_sampler_that_goes_on_and_on_is_named_in_a_warning(
    what: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The epoch's sampler is read whole before its first batch: one that never ended (torch
    # takes such samplers, read as the batches go) left the loader silent for ever, its
    # memory growing.
    monkeypatch.setattr(_sampler, "SLOW_READ_S", 0.05)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        sampler = EndsOnceWarned(warned, batches=what == "batch_sampler")
        settings: dict[str, Any] = {what: sampler}
        if what == "sampler":
            settings["batch_size"] = 2
        with DataLoader(SyncData(10), **settings) as loader:
            first = next(iter(loader)).tolist()
    assert first == ([0, 1] if what == "sampler" else [0])
    (warning,) = warned
    assert warning.category is UserWarning
    message = str(warning.message)
    assert f"the {what} (EndsOnceWarned) has yielded" in message, message
    assert "never ends" in message, message
    assert warning.filename == __file__


def test_a_transform_gets_the_index_and_runs_off_the_consumer_thread() -> None:
    threads: set[str] = set()

    def transform(index: int, item: int) -> np.ndarray[Any, Any]:
        threads.add(threading.current_thread().name)
        return np.array([index, item * 10])

    with DataLoader(
        AsyncData(20), batch_size=5, shuffle=True, seed=1, transform=transform, num_workers=2
    ) as loader:
        for batch in loader:
            assert (batch[:, 1] == batch[:, 0] * 10).all()
    assert threads
    # The CPU pool's threads, and once the transforms are timed cheaper than a hop, the lanes'.
    assert all(name.startswith(("asyncloader-cpu", "asyncloader-loop")) for name in threads)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_sync_datasets_item_is_transformed_while_its_batch_is_still_fetched(
    num_workers: int,
) -> None:
    # Each item's fetch waits for the transform of the item before it: a loader that
    # transformed a batch only once all its items were in would never finish one.
    transformed = [threading.Event() for _ in range(8)]
    fetched_on: set[str] = set()
    transformed_on: set[str] = set()

    class Chained(SyncData):
        def __getitem__(self, index: int) -> int:
            fetched_on.add(threading.current_thread().name)
            if index % 4 and not transformed[index - 1].wait(5.0):
                raise TimeoutError(f"item {index - 1} was not transformed while {index} waited")
            return super().__getitem__(index)

    def transform(index: int, item: int) -> int:
        transformed_on.add(threading.current_thread().name)
        transformed[index].set()
        return item * 10

    with DataLoader(
        Chained(8),
        batch_size=4,
        transform=transform,
        num_workers=num_workers,
        item_concurrency=4,
    ) as loader:
        assert [batch.tolist() for batch in loader] == [[0, 10, 20, 30], [40, 50, 60, 70]]
    assert fetched_on
    assert all(name.startswith("asyncloader-io") for name in fetched_on)
    assert transformed_on
    # The CPU pool's threads, and once the transforms are timed cheaper than a hop, the lanes'.
    assert all(name.startswith(("asyncloader-cpu", "asyncloader-io")) for name in transformed_on)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_lane_fetches_its_next_item_while_the_last_is_transformed(kind: str) -> None:
    # The first two items' transforms wait until the batch's last two items are being
    # fetched: lanes that waited for their items' transforms would never fetch them.
    fetching = [threading.Event() for _ in range(8)]

    def transform(index: int, item: int) -> int:
        if index % 4 < 2 and not fetching[index + 2].wait(5.0):
            raise TimeoutError(f"item {index + 2} was not fetched while {index} was transformed")
        return item * 10

    class Sync(SyncData):
        def __getitem__(self, index: int) -> int:
            fetching[index].set()
            return super().__getitem__(index)

    class Async(AsyncData):
        async def __getitem__(self, index: int) -> int:
            fetching[index].set()
            return await super().__getitem__(index)

    data = Sync(8) if kind == "sync" else Async(8)
    with DataLoader(
        data, batch_size=4, transform=transform, num_workers=2, item_concurrency=2
    ) as loader:
        assert [batch.tolist() for batch in loader] == [[0, 10, 20, 30], [40, 50, 60, 70]]


@given(
    length=st.integers(0, 300),
    batch_size=st.integers(1, 70),
    drop_last=st.booleans(),
    skip=st.integers(0, 10),
    kind=st.sampled_from(["range", "list", "permutation"]),
)
def test_batches_are_cut_as_asked_like_a_list_of_lists(
    length: int, batch_size: int, drop_last: bool, skip: int, kind: str
) -> None:
    """The lazy cut equals the eager one: every batch, its length, a resume's tail, the count."""
    indices: Sequence[int] = {
        "range": range(length),
        "list": list(range(length - 1, -1, -1)),
        "permutation": Permutation(length, 7, 1),
    }[kind]
    stop = length - length % batch_size if drop_last else length
    eager = [list(indices[i : i + batch_size]) for i in range(0, stop, batch_size)]
    batches = cut_batches(indices, batch_size, drop_last)
    assert list(batches) == eager
    assert len(batches) == len(eager)
    assert all(type(batch) is list for batch in batches)
    tail = batches[skip:]
    assert list(tail) == eager[skip:]
    assert tail.items == sum(map(len, eager[skip:]))
    if eager:
        assert batches[-1] == eager[-1]


def test_a_random_epoch_is_numpys_permutation_of_seed_and_epoch() -> None:
    """The order saved states recompute: numpy's ``default_rng([seed, epoch])``, as ints."""
    drawn = read_sampler(RandomSampler(5), 1000, 3)
    assert list(drawn) == np.random.default_rng([5, 3]).permutation(1000).tolist()
    assert all(type(index) is int for index in drawn[10:20])
    data = SyncData(1000)
    with DataLoader(data, batch_size=100, collate_fn=list, shuffle=True, seed=5) as loader:
        for _ in range(4):  # epochs 0 to 3
            epoch = [index for batch in loader for index in batch]
    assert epoch == list(drawn)


def test_a_sequential_epoch_is_not_built_whole_before_its_first_batch() -> None:
    """The default sampler's indices stay a range; the loader yields them batch by batch."""
    assert read_sampler(SequentialSampler(), 1_000_000, 0) == range(1_000_000)
    data = SyncData(1_000_000)
    with DataLoader(data, batch_size=4, collate_fn=list) as loader:
        iterator = iter(loader)
        assert next(iterator) == [data[i] for i in range(4)]
        assert len(loader) == 250_000
    # Nor counted one batch at a time: 2**38 batches took hours before the first (an epoch's
    # count of items was a sum over its batches; 10**8 items took 3 s).
    with DataLoader(SyncData(2**40), batch_size=4, collate_fn=list) as loader:
        assert next(iter(loader)) == [0, 1, 2, 3]
        assert len(loader) == 2**38


def test_a_batch_fetched_whole_spreads_its_transforms_over_the_cpu_threads() -> None:
    # Items 0 and 4 each begin a half of the first batch: they meet at the barrier only if
    # both halves run at once, on the two CPU threads.
    meet = threading.Barrier(2, timeout=10)
    threads: dict[int, set[str]] = {}

    def transform(index: int, item: int) -> int:
        threads.setdefault(index // 8, set()).add(threading.current_thread().name)
        if index in (0, 4):
            meet.wait()
        return item * 10

    with DataLoader(
        SyncData(40), batch_size=8, transform=transform, num_workers=1, cpu_threads=2
    ) as loader:
        batches = [[int(i) for i in batch] for batch in loader]
    assert batches == [[i * 10 for i in range(s, s + 8)] for s in range(0, 40, 8)]
    assert len(threads[0]) == 2
    # Cheap transforms are not split once the epoch has timed them: a hop would cost more.
    assert all(len(threads[batch]) == 1 for batch in range(1, 5))


@pytest.mark.parametrize("errors", ["raise", "skip"])
def test_a_batch_split_over_threads_fails_by_its_first_failure_or_skips_in_order(
    errors: ErrorPolicy,
) -> None:
    def transform(index: int, item: int) -> int:
        if index in (1, 6):  # one in each half of the first batch
            raise ValueError(f"item {index}")
        return item

    with DataLoader(
        SyncData(16),
        batch_size=8,
        transform=transform,
        num_workers=1,
        cpu_threads=2,
        errors=errors,
    ) as loader:
        got: list[object] = []
        iterator = iter(loader)
        for _ in range(2):
            try:
                got.append([int(i) for i in next(iterator)])
            except ValueError as error:
                got.append(str(error))
    if errors == "raise":
        assert got == ["item 1", list(range(8, 16))]
    else:
        assert got == [[0, 2, 3, 4, 5, 7], list(range(8, 16))]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_batch_on_lanes_fails_by_its_first_failing_item_whatever_the_timing(kind: str) -> None:
    # Item 1's transform fails, item 2's fetch fails first: the batch said item 2's error
    # (item 1's transform was passed over once any item had failed), and which one it said
    # varied with the timing (3 runs in 30 in one loop of 30 epochs).
    failed = threading.Event()

    def fetch(index: int) -> int:
        if index == 1:
            failed.wait(10)  # until item 2 has failed
        if index == 2:
            failed.set()
            raise ValueError("fetch of item 2")
        return index

    class Sync:
        def __len__(self) -> int:
            return 4

        def __getitem__(self, index: int) -> int:
            return fetch(index)

    class Async(Sync):
        async def __getitem__(self, index: int) -> int:  # type: ignore[override]
            if index == 1:
                await asyncio.get_running_loop().run_in_executor(None, failed.wait, 10)
            return fetch(index)

    def transform(index: int, item: int) -> int:
        if index == 1:
            raise KeyError("transform of item 1")
        return item

    dataset = Sync() if kind == "sync" else Async()
    with (
        DataLoader(
            dataset, batch_size=4, item_concurrency=4, transform=transform, collate_fn=list
        ) as loader,
        pytest.raises(KeyError, match="transform of item 1"),
    ):
        next(iter(loader))


def test_ranks_without_a_seed_read_disjoint_shares() -> None:
    # torch's DistributedSampler seeds 0 by default for the same reason: every rank is a
    # process of its own, and each must draw the same permutation.
    shares = [
        [
            i
            for batch in DataLoader(SyncData(40), batch_size=4, shuffle=True, rank=r, world_size=2)
            for i in batch.tolist()
        ]
        for r in range(2)
    ]
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == list(range(40))


def spin(seconds: float) -> None:
    """CPU work for ``seconds`` (a collation that costs more than a thread hop)."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_a_collation_cheaper_than_a_thread_hop_runs_on_the_event_loop(kind: str) -> None:
    # The first batch's collation is timed on a CPU thread; once the loader knows it costs
    # less than the hop there and back, the batches are collated where they are (the loop).
    where: dict[str, list[str]] = {"cheap": [], "costly": []}

    def cheap(items: list[Any]) -> list[Any]:
        where["cheap"].append(threading.current_thread().name)
        return list(items)

    def costly(items: list[Any]) -> list[Any]:
        where["costly"].append(threading.current_thread().name)
        spin(0.001)
        return list(items)

    for collate in (cheap, costly):
        data = _make(kind, 48, 0.0)
        with DataLoader(data, batch_size=8, collate_fn=collate, num_workers=1) as loader:
            assert [list(batch) for batch in loader] == [
                list(range(s, s + 8)) for s in range(0, 48, 8)
            ]
    assert where["cheap"][0].startswith("asyncloader-cpu")
    assert where["cheap"][1:] == ["asyncloader-loop"] * 5
    assert all(name.startswith("asyncloader-cpu") for name in where["costly"])


def run_times_ten(kind: str, items: int, transform: Any) -> None:
    """An epoch of ``items`` in batches of 8 through ``transform`` (which multiplies each by
    10), one lane (a sync dataset's lanes from 2), its batches checked."""
    with DataLoader(
        _make(kind, items, 0.0),
        batch_size=8,
        transform=transform,
        num_workers=1,
        item_concurrency=1 + (kind == "sync"),
    ) as loader:
        assert [batch.tolist() for batch in loader] == [
            [i * 10 for i in range(s, s + 8)] for s in range(0, items, 8)
        ]


@pytest.mark.parametrize(
    ("kind", "lane"), [("async", "asyncloader-loop"), ("sync", "asyncloader-io")]
)
def test_an_item_transform_cheaper_than_a_thread_hop_runs_in_its_lane(kind: str, lane: str) -> None:
    # An item's transform goes to a CPU thread until the loader's transforms are timed as
    # cheaper than the hop there; then the lane that fetched the item transforms it.
    where: dict[str, list[str]] = {"cheap": [], "costly": []}

    def cheap(index: int, item: int) -> int:
        where["cheap"].append(threading.current_thread().name)
        return item * 10

    def costly(index: int, item: int) -> int:
        where["costly"].append(threading.current_thread().name)
        spin(0.001)
        return item * 10

    for transform in (cheap, costly):
        run_times_ten(kind, 48, transform)
    assert where["cheap"][0].startswith("asyncloader-cpu")
    assert all(name.startswith(lane) for name in where["cheap"][8:])
    assert all(name.startswith("asyncloader-cpu") for name in where["costly"])


@pytest.mark.parametrize(
    ("kind", "lane"), [("async", "asyncloader-loop"), ("sync", "asyncloader-io")]
)
def test_one_slow_transform_does_not_keep_cheap_ones_off_their_lanes(kind: str, lane: str) -> None:
    # Cheap transforms run in their lanes; one far over the hop (a preempted one, a garbage
    # collection in the middle of it) is the one figure it is: the cheap ones after it stay.
    where: list[str] = []

    def one_slow(index: int, item: int) -> int:
        where.append(threading.current_thread().name)
        if index == 48:
            spin(0.005)
        return item * 10

    run_times_ten(kind, 96, one_slow)
    assert all(name.startswith(lane) for name in where[40:])
