"""A loader pickles and deep-copies as torch's does: its settings, dataset, sampler, seed and
epoch count, never its threads, processes or the epoch in progress (``multiprocessing``'s
spawn, Lightning's ``ddp_spawn`` and configuration systems copy loaders)."""

from __future__ import annotations

import copy
import io
import multiprocessing
import pickle
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncloader import DataLoader, FileDataset, HttpDataset, TarShards

from .servers import FaultServer


class Numbers:
    """Item ``i`` is ``i`` (a sync dataset that pickles)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


class AsyncNumbers(Numbers):
    async def __getitem__(self, index: int) -> int:  # type: ignore[override]
        return index


COPIES: dict[str, Callable[[DataLoader], DataLoader]] = {
    "pickle": lambda loader: pickle.loads(pickle.dumps(loader)),
    "deepcopy": copy.deepcopy,
}


def batches(loader: DataLoader) -> list[list[int]]:
    return [np.asarray(batch).tolist() for batch in loader]


class Counting:
    """A stream (no ``__getitem__``) that pickles."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Any:
        return iter(range(self.n))


def double(index: int, item: Any) -> Any:
    return item * 2


@pytest.mark.parametrize("how", sorted(COPIES))
@pytest.mark.parametrize(
    "make",
    [
        lambda: DataLoader(Numbers(23), batch_size=4, shuffle=True),  # a seed from the OS
        lambda: DataLoader(AsyncNumbers(23), batch_size=4, shuffle=True, seed=5, num_workers=2),
        lambda: DataLoader(Numbers(23), batch_size=3, transform=double, cpu_threads=2),
        lambda: DataLoader(Counting(10), batch_size=4),
        lambda: DataLoader(Numbers(20), batch_size=4, shuffle=True, cpu_processes=1),
    ],
)
def test_a_copy_gives_the_next_epochs_the_original_would_give(
    how: str, make: Callable[[], DataLoader]
) -> None:
    # It failed: "cannot pickle '_thread.lock' object", fresh or after an epoch.
    with make() as original:
        first = batches(original)
        iterator: Any = iter(original)
        next(iterator)  # an epoch in progress is not the copy's
        with COPIES[how](original) as copied:
            assert copied.seed == original.seed
            assert batches(copied) == batches(original)  # the epoch after the one in progress
            assert batches(copied) == batches(original)
        iterator.close()
    assert len(first) > 1


def test_a_copy_of_a_shard_loader_gives_its_next_epoch(tmp_path: Path) -> None:
    for shard in range(4):
        with tarfile.open(tmp_path / f"{shard}.tar", "w") as archive:
            for i in range(10):
                info = tarfile.TarInfo(f"{shard}{i:03d}.cls")
                info.size = 1
                archive.addfile(info, io.BytesIO(b"x"))
    files = FileDataset([f"{shard}.tar" for shard in range(4)], root=tmp_path)
    shards = TarShards(files, shuffle=True, shuffle_buffer=8)

    def keys(loader: DataLoader) -> list[list[str]]:
        return [[sample["__key__"] for sample in batch] for batch in loader]

    with DataLoader(shards, batch_size=5, collate_fn=list, seed=3) as original:
        first = keys(original)
        iterator: Any = iter(original)
        next(iterator)
        with copy.deepcopy(original) as copied:
            assert keys(copied) == keys(original) != first
        iterator.close()


@pytest.mark.parametrize("how", sorted(COPIES))
def test_a_copy_of_an_http_loader_opens_sessions_of_its_own(how: str, server: FaultServer) -> None:
    # It failed: "cannot pickle 'module' object" (the dataset held aiohttp itself), fresh
    # or after an epoch, and so for tar shards over HTTP too.
    sizes = list(range(1, 30))
    data = HttpDataset([f"{server.url}/ok/{n}" for n in sizes])
    shards = TarShards(HttpDataset([f"{server.url}/ok/10"]))
    with DataLoader(data, batch_size=4, num_workers=2, collate_fn=list) as original:
        before = [len(item) for batch in original for item in batch]
        with COPIES[how](original) as copied:
            assert [len(item) for batch in copied for item in batch] == sizes
        assert [len(item) for batch in original for item in batch] == before == sizes
    assert pickle.loads(pickle.dumps(shards)).shards.locations[0] == f"{server.url}/ok/10"


def test_a_copy_carries_a_loaded_state() -> None:
    with DataLoader(Numbers(23), batch_size=4, shuffle=True, seed=2) as saver:
        iterator = iter(saver)
        next(iterator), next(iterator)
        state = saver.state_dict()
        rest = [np.asarray(batch).tolist() for batch in iterator]
    with DataLoader(Numbers(23), batch_size=4, shuffle=True, seed=2) as loader:
        loader.load_state_dict(state)
        for copied in (pickle.loads(pickle.dumps(loader)), copy.deepcopy(loader)):
            with copied:
                assert batches(copied) == rest
        assert batches(loader) == rest


def test_a_copy_runs_on_threads_of_its_own() -> None:
    with DataLoader(Numbers(40), batch_size=4, num_workers=2) as original:
        iterator: Any = iter(original)
        next(iterator)
        copied = pickle.loads(pickle.dumps(original))
        copied.close()  # the original's epoch goes on
        assert len([next(iterator) for _ in range(9)]) == 9
        iterator.close()


def test_a_loader_of_what_cannot_be_pickled_says_what() -> None:
    loader = DataLoader(Numbers(8), batch_size=4, transform=lambda index, item: item)
    with loader, pytest.raises((pickle.PicklingError, AttributeError, TypeError), match="lambda"):
        pickle.dumps(loader)


def test_a_rank_left_to_the_environment_is_read_where_the_copy_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As a process started by spawn reads its own RANK: the copy made there is its rank's.
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    given = DataLoader(Numbers(8), batch_size=2, rank=0, world_size=2)
    found = DataLoader(Numbers(8), batch_size=2)
    monkeypatch.setenv("RANK", "1")
    assert copy.deepcopy(given).rank == 0
    assert copy.deepcopy(found).rank == 1
    assert batches(copy.deepcopy(found)) == [[1, 3], [5, 7]]


def test_a_copy_made_before_its_process_group_shuffles_as_every_rank_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A seed drawn from the OS becomes 0 once the loader finds more than one rank, so that
    # every rank draws one order. A copy took the original's drawn seed as given, and kept
    # it: ranks holding copies each shuffled in an order of their own (overlapping shares).
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    copies = [copy.deepcopy(DataLoader(Numbers(8), batch_size=2, shuffle=True)) for _ in "ab"]
    monkeypatch.setenv("WORLD_SIZE", "2")
    shares = []
    for rank, loader in enumerate(copies):
        monkeypatch.setenv("RANK", str(rank))
        assert loader.seed == 0
        shares.append([item for batch in batches(loader) for item in batch])
    assert sorted(shares[0] + shares[1]) == list(range(8))


def _epoch_in_child(loader: DataLoader, queue: Any) -> None:
    queue.put(batches(loader))


def test_a_loader_handed_to_a_spawned_process_runs_there() -> None:
    loader = DataLoader(Numbers(10), batch_size=4, shuffle=True, num_workers=2)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_epoch_in_child, args=(loader, queue))
    child.start()
    try:
        got = queue.get(timeout=120)
    finally:
        child.join(60)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    assert got == batches(loader)  # its first epoch, as here
