"""Every row of the failure table: a batch's error at its turn, then the next batch."""

from __future__ import annotations

import re
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from asyncloader import DataLoader

from .datasets import AsyncData, Boom, SyncData

# (kind, num_workers, item_concurrency): the direct path, lanes without workers, workers with
# whole-batch calls, workers with lanes; sync and async datasets.
PATHS = [
    ("sync", 0, 1),
    ("sync", 0, 3),
    ("sync", 2, 1),
    ("sync", 2, 3),
    ("async", 0, 1),
    ("async", 2, 3),
]


def _dataset(kind: str, n: int) -> SyncData | AsyncData:
    return SyncData(n) if kind == "sync" else AsyncData(n)


def _collect_sync(loader: DataLoader) -> list[Any]:
    """Every batch or the exception raised in its place; iteration goes on after errors."""
    out: list[Any] = []
    iterator: Iterator[Any] = iter(loader)
    while True:
        try:
            out.append(next(iterator).tolist())
        except StopIteration:
            return out
        except Exception as error:
            out.append(error)


async def _collect_async(loader: DataLoader) -> list[Any]:
    out: list[Any] = []
    iterator = aiter(loader)
    while True:
        try:
            out.append((await anext(iterator)).tolist())
        except StopAsyncIteration:
            return out
        except Exception as error:
            out.append(error)


def _check_failed_batch(out: list[Any], failed: int, error_type: type[BaseException]) -> None:
    assert len(out) == 5
    for position, value in enumerate(out):
        if position == failed:
            assert type(value) is error_type, value
        else:
            assert value == list(range(position * 4, position * 4 + 4))


@pytest.mark.parametrize(("kind", "num_workers", "item_concurrency"), PATHS)
def test_dataset_error_fails_its_batch_only(
    kind: str, num_workers: int, item_concurrency: int
) -> None:
    data = _dataset(kind, 20)
    data.fail_at = {9}
    with DataLoader(
        data, batch_size=4, num_workers=num_workers, item_concurrency=item_concurrency
    ) as loader:
        out = _collect_sync(loader)
        _check_failed_batch(out, 2, Boom)
        # The original traceback is kept: it reaches into the dataset's own code.
        frames = traceback.extract_tb(out[2].__traceback__)
        assert any(frame.name == "__getitem__" for frame in frames)
        # The loader is usable for the next epoch, which is whole once the fault is gone.
        data.fail_at = set()
        assert len(_collect_sync(loader)) == 5


@pytest.mark.parametrize(("kind", "num_workers", "item_concurrency"), PATHS)
async def test_dataset_error_fails_its_batch_only_async(
    kind: str, num_workers: int, item_concurrency: int
) -> None:
    data = _dataset(kind, 20)
    data.fail_at = {0, 19}
    async with DataLoader(
        data, batch_size=4, num_workers=num_workers, item_concurrency=item_concurrency
    ) as loader:
        out = await _collect_async(loader)
    assert isinstance(out[0], Boom)
    assert isinstance(out[4], Boom)
    assert out[1:4] == [list(range(i, i + 4)) for i in (4, 8, 12)]


def _failing_transform(index: int, item: int) -> int:
    if index == 5:
        raise KeyError("bad transform")
    return item


def _failing_collate(items: list[int]) -> Any:
    if 13 in items:
        raise ZeroDivisionError("bad collate")
    from asyncloader import default_collate

    return default_collate(items)


@pytest.mark.parametrize(("kind", "num_workers", "item_concurrency"), PATHS)
@pytest.mark.parametrize(
    ("setting", "failed", "error_type"),
    [
        ({"transform": _failing_transform}, 1, KeyError),
        ({"collate_fn": _failing_collate}, 3, ZeroDivisionError),
    ],
)
def test_transform_and_collate_errors_fail_their_batch(
    kind: str,
    num_workers: int,
    item_concurrency: int,
    setting: dict[str, Any],
    failed: int,
    error_type: type[BaseException],
) -> None:
    with DataLoader(
        _dataset(kind, 20),
        batch_size=4,
        num_workers=num_workers,
        item_concurrency=item_concurrency,
        **setting,
    ) as loader:
        _check_failed_batch(_collect_sync(loader), failed, error_type)


class _RaisingSampler:
    def __iter__(self) -> Iterator[int]:
        yield 0
        raise Boom("sampler")

    def __len__(self) -> int:
        return 2


class _RaisingLen(SyncData):
    def __len__(self) -> int:
        raise Boom("len")


def test_a_raising_sampler_raises_from_iter() -> None:
    loader = DataLoader(SyncData(10), sampler=_RaisingSampler(), num_workers=1)
    with pytest.raises(Boom, match="sampler"):
        iter(loader)
    loader.close()


def test_a_raising_len_raises_from_iter_and_len() -> None:
    loader = DataLoader(_RaisingLen(10))
    with pytest.raises(Boom, match="len"):
        iter(loader)
    with pytest.raises(Boom, match="len"):
        len(loader)


def test_a_non_integer_index_from_the_sampler_raises_from_iter() -> None:
    loader = DataLoader(SyncData(10), sampler=[0, 1.5])
    with pytest.raises(TypeError, match=r"1\.5.*position 1"):
        iter(loader)


def test_a_mask_given_as_a_sampler_or_batch_is_refused_not_read_as_indices() -> None:
    # [True, False, True] read items 1, 0, 1 (bool is an int); a NumPy mask was refused.
    for loader in (
        DataLoader(SyncData(10), sampler=[True, False, True]),
        DataLoader(SyncData(10), batch_sampler=[[0, 1], [True, False]]),
    ):
        with pytest.raises(TypeError, match=r"True \(bool\) at position 0"):
            iter(loader)


@pytest.mark.parametrize(("num_workers", "item_concurrency"), [(0, 1), (2, 1), (1, 4)])
def test_an_out_of_range_index_fails_its_batch(num_workers: int, item_concurrency: int) -> None:
    with DataLoader(
        SyncData(4),
        batch_size=2,
        sampler=[0, 1, 2, 99],
        num_workers=num_workers,
        item_concurrency=item_concurrency,
    ) as loader:
        out = _collect_sync(loader)
    assert out[0] == [0, 1]
    assert isinstance(out[1], IndexError)


class _SyncReturningCoroutine:
    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> Any:
        async def item() -> int:
            return index

        return item()


@pytest.mark.parametrize(("num_workers", "item_concurrency"), [(0, 1), (1, 1), (1, 2)])
def test_sync_getitem_returning_a_coroutine_fails_clearly(
    num_workers: int, item_concurrency: int
) -> None:
    # filterwarnings=error: a coroutine left unawaited would fail this test at collection.
    with DataLoader(
        _SyncReturningCoroutine(),
        batch_size=2,
        num_workers=num_workers,
        item_concurrency=item_concurrency,
    ) as loader:
        out = _collect_sync(loader)
    assert len(out) == 2
    for error in out:
        assert isinstance(error, TypeError)
        assert "async def" in str(error)


class _WrongCount(SyncData):
    def __getitems__(self, indices: list[int]) -> list[int]:
        return indices[:-1] if 4 in indices else indices


class _AsyncWrongCount(AsyncData):
    async def __getitems__(self, indices: list[int]) -> list[int]:
        return [*indices, 0] if 4 in indices else indices


@pytest.mark.parametrize("dataset", [_WrongCount(8), _AsyncWrongCount(8)])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_getitems_returning_the_wrong_count_fails_the_batch(dataset: Any, num_workers: int) -> None:
    with DataLoader(dataset, batch_size=4, num_workers=num_workers) as loader:
        out = _collect_sync(loader)
    assert out[0] == [0, 1, 2, 3]
    assert isinstance(out[1], ValueError)
    assert "__getitems__ returned" in str(out[1])


class _Returns(SyncData):
    """``__getitems__`` returns its items as ``kind`` says."""

    def __init__(self, n: int, kind: str) -> None:
        super().__init__(n)
        self.kind = kind

    def __getitems__(self, indices: list[int]) -> Any:
        rows = np.arange(self.n * 3).reshape(self.n, 3)
        made: dict[str, Callable[[], Any]] = {
            "rows of an array": lambda: rows[indices],  # a dataset held in one array
            "a generator": lambda: (rows[i] for i in indices),
            "None": lambda: None,
            "a dict": lambda: {i: rows[i] for i in indices},
            "a str": lambda: "abcd"[: len(indices)],
        }
        return made[self.kind]()


@pytest.mark.parametrize("kind", ["rows of an array", "a generator"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_getitems_may_return_any_iterable_of_the_items(kind: str, num_workers: int) -> None:
    # An array failed every batch with "The truth value of an array ... is ambiguous" (torch
    # collates it), a generator with "'generator' object is not subscriptable".
    with DataLoader(_Returns(8, kind), batch_size=4, num_workers=num_workers) as loader:
        got = [batch.tolist() for batch in loader]
    assert got == np.arange(24).reshape(2, 4, 3).tolist()


@pytest.mark.parametrize("kind", ["None", "a dict", "a str"])
def test_getitems_returning_no_sequence_of_items_fails_the_batch_saying_so(kind: str) -> None:
    # None failed as "'NoneType' object is not iterable", a dict as KeyError 0, and a str was
    # taken as one item a character.
    with DataLoader(_Returns(8, kind), batch_size=4) as loader:
        out = _collect_sync(loader)
    assert len(out) == 2
    for error in out:
        assert type(error) is TypeError, error
        assert "_Returns.__getitems__ returned" in str(error)
        assert "one item per index" in str(error)


class _Mixed:
    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> int:
        return index

    async def __getitems__(self, indices: list[int]) -> list[int]:
        return indices


class _NoLen:
    def __getitem__(self, index: int) -> int:
        return index


def test_datasets_that_mix_sync_and_async_or_lack_len_are_refused() -> None:
    with pytest.raises(TypeError, match="mixes sync and async"):
        DataLoader(_Mixed())
    with pytest.raises(TypeError, match="__len__"):
        DataLoader(_NoLen())


def test_len_follows_pytorch_for_every_drop_last_and_batch_size() -> None:
    for n in (0, 1, 7, 8, 9, 64):
        for batch_size in (1, 3, 8, 100):
            for drop_last in (False, True):
                loader = DataLoader(SyncData(n), batch_size=batch_size, drop_last=drop_last)
                expected = n // batch_size if drop_last else -(-n // batch_size)
                assert len(loader) == expected == len(list(loader))


def test_len_without_a_sampler_len_raises_type_error() -> None:
    loader = DataLoader(SyncData(5), sampler=iter([0, 1]))
    with pytest.raises(TypeError, match="no len"):
        len(loader)


@pytest.mark.parametrize(("num_workers", "item_concurrency"), [(0, 1), (2, 1), (1, 3)])
def test_a_transform_returning_none_fails_its_batch_clearly(
    num_workers: int, item_concurrency: int
) -> None:
    def sometimes_none(index: int, item: int) -> int | None:
        return None if index == 5 else item

    with DataLoader(
        SyncData(12),
        batch_size=4,
        transform=sometimes_none,
        num_workers=num_workers,
        item_concurrency=item_concurrency,
    ) as loader:
        out = _collect_sync(loader)
    assert out[0] == [0, 1, 2, 3]
    assert isinstance(out[1], TypeError)
    assert "NoneType" in str(out[1])
    assert out[2] == [8, 9, 10, 11]


@pytest.mark.parametrize("odd", [None, "text", iter([1, 2]), object()])
def test_a_collate_fn_may_return_any_value_and_the_epoch_stays_whole(odd: object) -> None:
    with DataLoader(
        SyncData(9), batch_size=3, collate_fn=lambda items: odd, num_workers=2
    ) as loader:
        batches = list(loader)
    assert len(batches) == 3
    assert all(batch is odd for batch in batches)


@pytest.mark.parametrize("kind", ["async", "sync"])
def test_a_cheap_transform_that_fails_in_its_lane_fails_its_batch_or_is_skipped(
    kind: str,
) -> None:
    # By item 40 the transforms are timed cheap, so the lanes run them (not the CPU pool):
    # its failure still fails only its own batch, and errors="skip" drops only it.
    where: set[str] = set()

    def transform(index: int, item: int) -> int:
        where.add(re.sub(r"-[0-9]+$", "", threading.current_thread().name))
        if index == 40:
            raise KeyError("bad 40")
        return item

    def loader(errors: str) -> DataLoader:
        return DataLoader(
            _dataset(kind, 64),
            batch_size=8,
            transform=transform,
            num_workers=1,
            item_concurrency=2,
            collate_fn=list,
            errors=errors,  # type: ignore[arg-type]
        )

    with loader("skip") as skipping:
        assert [i for batch in skipping for i in batch] == [i for i in range(64) if i != 40]
        assert skipping.stats().skipped == 1
    outcomes: list[Any] = []
    with loader("raise") as raising:
        batches = iter(raising)
        for _ in range(8):
            try:
                outcomes.append(next(batches)[0])
            except KeyError as error:
                outcomes.append(repr(error))
    assert outcomes == [0, 8, 16, 24, 32, "KeyError('bad 40')", 48, 56]
    assert {"asyncloader-loop" if kind == "async" else "asyncloader-io"} <= where
