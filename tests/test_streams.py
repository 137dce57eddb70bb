"""Streams (issue 20, point 1): a dataset read by iterating it, as torch's ``IterableDataset``.

Every item exactly once and in the stream's order whatever ``num_workers``; batches of
``batch_size``; the epoch's memory bounded by the window; an iterator's error raised at its
batch, ending the epoch; ``break`` closes the iterator; resume, exact, through the stream's
own state or by reading again.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from asyncloader import DataLoader, StreamInfo, stream_info
from asyncloader.testing import assert_equal_output_after_checkpoint

WORKERS = [0, 1, 4]


class Numbers:
    """A sync stream of ``0..n-1``, optionally with ``__len__``."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.iterations = 0

    def __iter__(self) -> Iterator[int]:
        self.iterations += 1
        yield from range(self.n)


class Sized(Numbers):
    def __len__(self) -> int:
        return self.n


class AsyncNumbers:
    def __init__(self, n: int) -> None:
        self.n = n

    async def __aiter__(self) -> AsyncIterator[int]:
        for i in range(self.n):
            if i % 3 == 0:
                await asyncio.sleep(0)  # a real suspension, as a network read would
            yield i


def _lists(loader: DataLoader) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


def _expected(n: int, size: int, drop_last: bool = False) -> list[list[int]]:
    out = [list(range(i, min(i + size, n))) for i in range(0, n, size)]
    return [b for b in out if len(b) == size] if drop_last else out


@pytest.mark.parametrize("workers", WORKERS)
def test_a_sync_stream_gives_every_item_once_in_order(workers: int) -> None:
    with DataLoader(Numbers(103), batch_size=8, num_workers=workers) as loader:
        assert _lists(loader) == _expected(103, 8)
        assert _lists(loader) == _expected(103, 8)  # each epoch a new pass
    with DataLoader(Numbers(103), batch_size=8, num_workers=workers, drop_last=True) as loader:
        assert _lists(loader) == _expected(103, 8, drop_last=True)


@pytest.mark.parametrize("workers", WORKERS)
async def test_an_async_stream_gives_every_item_once_in_order_with_async_for(
    workers: int,
) -> None:
    async with DataLoader(AsyncNumbers(50), batch_size=7, num_workers=workers) as loader:
        got = [batch.tolist() async for batch in loader]
    assert got == _expected(50, 7)


@pytest.mark.parametrize("workers", WORKERS)
def test_a_generator_and_an_async_generator_are_streams(workers: int) -> None:
    async def agen() -> AsyncIterator[int]:
        for i in range(10):
            yield i

    assert _lists(DataLoader((i for i in range(10)), batch_size=4, num_workers=workers)) == (
        _expected(10, 4)
    )
    with DataLoader(agen(), batch_size=4, num_workers=workers) as loader:
        assert _lists(loader) == _expected(10, 4)


@pytest.mark.parametrize("workers", WORKERS)
def test_the_transform_runs_on_the_pool_with_the_items_position(workers: int) -> None:
    threads: set[str] = set()

    def transform(index: int, item: int) -> int:
        threads.add(threading.current_thread().name)
        return index * 1000 + item

    with DataLoader(Numbers(20), batch_size=6, num_workers=workers, transform=transform) as loader:
        pairs = [(indices, batch.tolist()) for indices, batch in loader.iter_with_indices()]
    assert [indices for indices, _ in pairs] == _expected(20, 6)
    assert [batch for _, batch in pairs] == [[i * 1001 for i in b] for b in _expected(20, 6)]
    assert threading.current_thread().name not in threads


def test_len_is_the_streams_batches_when_it_has_a_len_and_a_type_error_otherwise() -> None:
    loader = DataLoader(Sized(10), batch_size=4)
    assert len(loader) == 3
    assert len(DataLoader(Sized(10), batch_size=4, drop_last=True)) == 2
    iterator: Any = iter(loader)
    assert len(iterator) == 3
    next(iterator)
    assert len(iterator) == 2
    iterator.close()
    unsized = DataLoader(Numbers(10), batch_size=4)
    with pytest.raises(TypeError, match="no __len__"):
        len(unsized)
    unsized_epoch: Any = iter(unsized)
    with pytest.raises(TypeError, match="no __len__"):
        len(unsized_epoch)
    unsized_epoch.close()


class Unsized(Numbers):
    """A stream whose ``__len__`` raises ``TypeError``, as torch's ``ChainDataset`` of
    streams without a length does: it has no length."""

    def __len__(self) -> int:
        raise TypeError("object of type 'Part' has no len()")


@pytest.mark.parametrize("workers", WORKERS)
def test_a_stream_whose_len_raises_type_error_has_no_len_and_runs(workers: int) -> None:
    # Every epoch failed at iter() with the TypeError: the loader asked its length first.
    with DataLoader(Unsized(10), batch_size=4, num_workers=workers) as loader:
        assert [batch.tolist() for batch in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
        with pytest.raises(TypeError, match=r"Unsized is a stream with no len\(\): object of"):
            len(loader)
    with pytest.raises(ValueError, match="no __len__: give a count"):
        DataLoader(Unsized(10), errors="skip", max_errors=0.5)


class Lying(Numbers):
    """A stream whose ``__len__`` is not its count of items."""

    def __init__(self, n: int, said: int) -> None:
        super().__init__(n)
        self.said = said

    def __len__(self) -> int:
        return self.said


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize(("n", "said"), [(25, 10), (5, 0), (10, 25)])
def test_a_stream_whose_len_is_wrong_gives_all_its_items_and_never_a_negative_len(
    n: int, said: int, workers: int, caplog: pytest.LogCaptureFixture
) -> None:
    # len(iterator) went negative once a stream gave more batches than its __len__ said, so
    # len() raised ValueError mid-epoch (a progress bar's refresh, say); with fewer, it still
    # said 4 batches were left after the epoch's end.
    with DataLoader(Lying(n, said), batch_size=4, num_workers=workers) as loader:
        for _ in range(2):  # the warning once in each epoch
            iterator: Any = iter(loader)
            left = []
            batches = []
            for batch in iterator:
                batches.append(batch.tolist())
                left.append(len(iterator))
            assert batches == _expected(n, 4)
            assert min(left) >= 0
            assert len(iterator) == 0
    more = [r.getMessage() for r in caplog.records if "__len__" in r.getMessage()]
    if n > said:  # as torch warns: len(loader) undercounts the epoch
        assert more == [f"Lying.__len__() is {said}, but the stream gave more items"] * 2
    else:
        assert more == []


async def test_an_async_for_over_a_stream_whose_len_is_short_never_has_a_negative_len() -> None:
    async with DataLoader(Lying(25, 10), batch_size=4, num_workers=2) as loader:
        iterator: Any = loader.__aiter__()
        left = []
        async for _ in iterator:
            left.append(len(iterator))
        assert left == [2, 1, 0, 0, 0, 0, 0]
        assert len(iterator) == 0


def test_settings_that_order_indices_are_refused_for_a_stream() -> None:
    with pytest.raises(ValueError, match="shuffle") as refused:
        DataLoader(Numbers(3), shuffle=True)
    assert "shuffle=True, shuffle_buffer=N" in str(refused.value)  # where a stream shuffles
    with pytest.raises(ValueError, match="sampler"):
        DataLoader(Numbers(3), sampler=[0, 1, 2])
    with pytest.raises(ValueError, match="batch_sampler"):
        DataLoader(Numbers(3), batch_size=None, batch_sampler=[[0, 1]])
    with pytest.raises(ValueError, match="max_errors"):
        DataLoader(Numbers(3), errors="skip", max_errors=0.1)
    DataLoader(Sized(3), errors="skip", max_errors=0.1)  # a fraction of its len()


class Failing:
    def __init__(self, at: int, kind: type[Exception] = KeyError) -> None:
        self.at, self.kind = at, kind

    def __iter__(self) -> Iterator[int]:
        for i in range(100):
            if i == self.at:
                raise self.kind(f"item {i} is broken")
            yield i


@pytest.mark.parametrize("workers", WORKERS)
def test_an_iterators_error_comes_after_the_items_before_it_and_ends_the_epoch(
    workers: int,
) -> None:
    with DataLoader(Failing(10), batch_size=4, num_workers=workers) as loader:
        iterator: Any = iter(loader)
        # Items 8 and 9 were read before the error: a short batch, not dropped.
        assert [next(iterator).tolist() for _ in range(3)] == _expected(10, 4)
        with pytest.raises(KeyError, match="item 10 is broken"):
            next(iterator)
        assert list(iterator) == []
        # The next epoch starts a new pass, and fails at the same place.
        assert len(list(zip(range(2), loader, strict=False))) == 2


async def test_an_async_iterators_error_comes_after_the_items_before_it() -> None:
    async def broken() -> AsyncIterator[int]:
        for i in range(5):
            yield i
        raise ConnectionError("the stream's server went away")

    async with DataLoader(broken(), batch_size=2, num_workers=2) as loader:
        iterator = aiter(loader)
        got = [(await anext(iterator)).tolist() for _ in range(3)]
        with pytest.raises(ConnectionError, match="went away"):
            await anext(iterator)
    assert got == [[0, 1], [2, 3], [4]]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_system_exit_from_the_stream_comes_after_the_items_before_it(kind: str) -> None:
    # A library that calls sys.exit on bad input. The items read before it were dropped.
    def numbers() -> Iterator[int]:
        yield from range(5)
        sys.exit(3)

    async def async_numbers() -> AsyncIterator[int]:
        for i in numbers():
            yield i

    stream = numbers() if kind == "sync" else async_numbers()
    with DataLoader(stream, batch_size=2, num_workers=2) as loader:
        iterator: Any = iter(loader)
        assert [next(iterator).tolist() for _ in range(3)] == [[0, 1], [2, 3], [4]]
        with pytest.raises(SystemExit):
            next(iterator)
        assert list(iterator) == []


def test_an_error_at_a_batchs_start_fails_that_batch_and_drop_last_drops_a_short_one() -> None:
    with DataLoader(Failing(8), batch_size=4) as loader:
        iterator: Any = iter(loader)
        assert [next(iterator).tolist() for _ in range(2)] == _expected(8, 4)
        with pytest.raises(KeyError, match="item 8"):
            next(iterator)
        assert list(iterator) == []
    with DataLoader(Failing(10), batch_size=4, drop_last=True) as loader:
        iterator = iter(loader)
        assert [next(iterator).tolist() for _ in range(2)] == _expected(8, 4)
        with pytest.raises(KeyError, match="item 10"):
            next(iterator)
    loader = DataLoader(Failing(0), batch_size=4)
    with loader, pytest.raises(KeyError, match="item 0"):
        next(iter(loader))


class Probe:
    """An endless stream that records how far it was read, and checks the window."""

    def __init__(self, batch_size: int, window: int) -> None:
        self.batch_size, self.window = batch_size, window
        self.calls = 0  # next() calls the consumer began
        self.read = -1
        self.violations: list[tuple[int, int]] = []
        self.changed = threading.Condition()

    def __iter__(self) -> Iterator[int]:
        i = 0
        while True:
            if i // self.batch_size >= self.calls + self.window:
                self.violations.append((i, self.calls))
            with self.changed:
                self.read = i
                self.changed.notify_all()
            yield i
            i += 1

    def wait_for(self, read: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: self.read >= read, timeout=10)


@pytest.mark.parametrize(("num_workers", "prefetch_depth"), [(0, 1), (1, 2), (4, 3)])
def test_a_stalled_consumer_bounds_what_is_read_of_an_endless_stream(
    num_workers: int, prefetch_depth: int
) -> None:
    size = 5
    window = max(num_workers, 1) + prefetch_depth
    probe = Probe(size, window)
    with DataLoader(
        probe, batch_size=size, num_workers=num_workers, prefetch_depth=prefetch_depth
    ) as loader:
        iterator: Any = iter(loader)
        for taken in range(0, 30, 7):
            while probe.calls < taken:
                probe.calls += 1
                next(iterator)
            # The consumer stalls: the reader fills exactly the window, and stops there.
            last = (taken + window) * size - 1
            probe.wait_for(last)
            assert probe.read == last
        iterator.close()
    assert not probe.violations, probe.violations


def test_break_closes_the_iterator_and_the_epoch_after_it_starts_afresh() -> None:
    closed = threading.Event()

    class Closing:
        def __iter__(self) -> Iterator[int]:
            try:
                yield from range(1000)
            finally:
                closed.set()

    with DataLoader(Closing(), batch_size=10, num_workers=2) as loader:
        for batch in loader:
            assert batch.tolist() == list(range(10))
            break
        assert closed.wait(10)
        assert next(iter(loader)).tolist() == list(range(10))


def test_a_stream_that_splits_itself_reads_the_rank_epoch_and_seed() -> None:
    seen: list[StreamInfo | None] = []

    class Ranked:
        def __iter__(self) -> Iterator[int]:
            info = stream_info()
            seen.append(info)
            assert info is not None
            return iter(range(info.rank, 20, info.world_size))

    with DataLoader(Ranked(), batch_size=5, num_workers=2, rank=1, world_size=2, seed=9) as loader:
        assert _lists(loader) == [[1, 3, 5, 7, 9], [11, 13, 15, 17, 19]]
        loader.set_epoch(4)
        list(loader)
    assert seen == [StreamInfo(1, 2, 0, 9, 2), StreamInfo(1, 2, 4, 9, 2)]
    assert stream_info() is None


def test_a_stream_with_set_epoch_is_told_each_epoch_before_it_is_read() -> None:
    class Epochs:
        def __init__(self) -> None:
            self.told: list[int] = []

        def set_epoch(self, epoch: int) -> None:
            self.told.append(epoch)

        def __iter__(self) -> Iterator[int]:
            return iter(range(self.told[-1] * 10, self.told[-1] * 10 + 3))

    stream = Epochs()
    with DataLoader(stream, batch_size=3) as loader:
        assert _lists(loader) == [[0, 1, 2]]
        loader.set_epoch(5)
        assert _lists(loader) == [[50, 51, 52]]
    assert stream.told == [0, 5]


def test_a_slow_stream_is_named_as_the_bottleneck_with_stream_advice() -> None:
    class Slow:
        def __iter__(self) -> Iterator[int]:
            for i in range(40):
                threading.Event().wait(0.002)  # a slow source: 2 ms an item
                yield i

    with DataLoader(Slow(), batch_size=4, num_workers=2) as loader:
        for _ in loader:
            pass
        stage, advice = loader.stats().bottleneck()
    assert stage == "fetch"
    assert "one reader pulls the stream" in advice


class Counter:
    """A stream with its own position: ``state_dict`` says where the next item is."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.next = 0
        self.produced = 0

    def __iter__(self) -> Iterator[int]:
        while self.next < self.n:
            item = self.next
            self.next += 1
            self.produced += 1
            yield item
        self.next = 0  # the next epoch starts from the beginning

    def state_dict(self) -> dict[str, int]:
        return {"next": self.next}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.next = state["next"]


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_with_the_streams_own_state_reads_only_what_was_not_received(
    workers: int,
) -> None:
    with DataLoader(Counter(40), batch_size=4, num_workers=workers) as loader:
        iterator: Any = iter(loader)
        head = [next(iterator).tolist() for _ in range(3)]
        state = loader.state_dict()  # batches prefetched past these must not count
        iterator.close()
    assert state["source"] == {"next": 12}
    assert state["batches_received"] == 3
    stream = Counter(40)
    with DataLoader(stream, batch_size=4, num_workers=workers) as restored:
        restored.load_state_dict(state)
        rest = [(i, b.tolist()) for i, b in restored.iter_with_indices()]
    assert head + [b for _, b in rest] == _expected(40, 4)
    assert [i for i, _ in rest] == _expected(40, 4)[3:]  # positions go on from the state
    assert stream.produced == 28


def test_a_state_between_epochs_after_a_stream_state_drops_it_or_is_refused() -> None:
    # A state with none of the stream's (one between epochs) left the stream's state loaded
    # before in it: the epoch resumed there, silently. The stream is now handed {}, its state
    # between epochs; one that refuses it has the load refused, the loader as it was.
    with DataLoader(Counter(40), batch_size=4) as loader:
        iterator: Any = iter(loader)
        next(iterator)
        inside = loader.state_dict()
        iterator.close()
    between = DataLoader(Counter(40), batch_size=4).state_dict()
    with DataLoader(Counter(40), batch_size=4) as restored:
        restored.load_state_dict(inside)
        with pytest.raises(ValueError, match=r"Counter.load_state_dict refused \{\}"):
            restored.load_state_dict(between)
        assert _lists(restored) == _expected(40, 4)[1:]

    class Restarts(Counter):
        def load_state_dict(self, state: dict[str, int]) -> None:
            self.next = state.get("next", 0)

    with DataLoader(Restarts(40), batch_size=4) as restored:
        restored.load_state_dict(inside)
        restored.load_state_dict(between)
        assert _lists(restored) == _expected(40, 4)


def test_resume_without_the_streams_own_state_reads_again_and_warns() -> None:
    with DataLoader(Numbers(30), batch_size=4, num_workers=2) as loader:
        iterator: Any = iter(loader)
        for _ in range(2):
            next(iterator)
        state = loader.state_dict()
        iterator.close()
    with DataLoader(Numbers(30), batch_size=4, num_workers=2) as restored:
        with pytest.warns(UserWarning, match="reads its first 2 batches again"):
            restored.load_state_dict(state)
        assert _lists(restored) == _expected(30, 4)[2:]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("stateful", [True, False])
def test_every_checkpoint_of_a_stream_resumes_exactly(mode: str, stateful: bool) -> None:
    def make() -> DataLoader:
        stream = Counter(22) if stateful else Sized(22)
        return DataLoader(
            stream, batch_size=4, num_workers=2, transform=lambda i, x: (i, x), seed=3
        )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore" if not stateful else "error")
        assert assert_equal_output_after_checkpoint(make, epochs=2, mode=mode) > 10


@pytest.mark.parametrize("stream", [Counter, Numbers])
def test_a_stream_longer_than_its_len_resumes_from_every_state_it_saved(
    stream: type[Any],
) -> None:
    # 10 items whose len() says 5, 2 a batch: the states after batches 4 and 5 were past
    # len()'s 3 batches and refused when loaded, whether the stream resumes from its own
    # state (Counter) or by reading its first batches again (Numbers).
    class Claimed(stream):  # type: ignore[misc]
        def __len__(self) -> int:
            return 5

    def make() -> DataLoader:
        return DataLoader(Claimed(10), batch_size=2, seed=1, collate_fn=list)

    assert len(make()) == 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Numbers: "reads its first N batches again"
        assert assert_equal_output_after_checkpoint(make, epochs=2) == 2 * (5 + 1) + 1


def test_a_stream_state_is_checked_whole_and_a_map_state_refused() -> None:
    from tests.datasets import SyncData

    loader = DataLoader(Counter(10), batch_size=4, seed=1)
    good = loader.state_dict()
    map_state = DataLoader(SyncData(10), batch_size=4, seed=1).state_dict()
    with pytest.raises(ValueError, match="kind"):
        loader.load_state_dict(map_state)
    with pytest.raises(ValueError, match="a stream loader's"):
        DataLoader(SyncData(10), batch_size=4, seed=1).load_state_dict(good)
    for key, value, match in [
        ("batch_size", 5, "batch_size"),
        ("seed", 2, "seed"),
        ("batches_received", -1, "batches_received"),
        ("world_size", 2, "re-split"),
    ]:
        with pytest.raises(ValueError, match=match):
            DataLoader(Sized(10), batch_size=4, seed=1).load_state_dict({**good, key: value})
    with pytest.raises(ValueError, match="has none"):
        DataLoader(Numbers(10), batch_size=4, seed=1).load_state_dict(
            {**good, "source": {"next": 4}}
        )
    assert loader.state_dict() == good  # every refusal left it as it was
    # Past len(): a stream may give more than it says, so its own states can be there.
    past = DataLoader(Sized(10), batch_size=4, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "reads its first 4 batches again"
        past.load_state_dict({**good, "batches_received": 4})
    assert [batch.tolist() for batch in past] == []  # the 10 items were 3 batches
    assert [batch.tolist() for batch in past] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_a_failing_transform_is_skipped_from_its_batch_under_errors_skip() -> None:
    def transform(index: int, item: int) -> int:
        if item % 5 == 0:
            raise ValueError(f"item {item} is bad")
        return item

    with DataLoader(
        Numbers(12), batch_size=4, num_workers=2, transform=transform, errors="skip"
    ) as loader:
        assert _lists(loader) == [[1, 2, 3], [4, 6, 7], [8, 9, 11]]
        assert loader.stats().skipped == 3


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_generator_that_an_earlier_epoch_used_up_is_said_to_be(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A generator's result as the dataset: every epoch after the first passed with no batch
    # and no word, as torch's do.
    def numbers() -> Iterator[int]:
        yield from range(5)

    async def async_numbers() -> AsyncIterator[int]:
        for number in range(5):
            yield number

    caplog.set_level(logging.WARNING, logger="asyncloader")
    with DataLoader(numbers() if kind == "sync" else async_numbers(), batch_size=2) as loader:
        assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3], [4]]
        caplog.clear()
        assert [batch for batch in loader] == []
    messages = [r.getMessage() for r in caplog.records if r.name == "asyncloader"]
    assert len(messages) == 1
    assert messages[0].startswith("the dataset is an iterator")
    assert "epoch 1 has no item" in messages[0]
