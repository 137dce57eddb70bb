"""Exact mid-epoch resume, sharding across ranks, and elastic resume."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from asyncloader import DataLoader, DistributedSampler
from asyncloader.testing import assert_equal_output_after_checkpoint

from .datasets import SyncData


class StatefulSampler:
    """A custom sampler with its own state: each epoch it rotates the order by one more."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.shift = 0

    def __iter__(self) -> Iterator[int]:
        order = [(i + self.shift) % self.n for i in range(self.n)]
        self.shift += 1
        return iter(order)

    def __len__(self) -> int:
        return self.n

    def state_dict(self) -> dict[str, int]:
        return {"shift": self.shift}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.shift = state["shift"]


SAMPLERS: dict[str, Any] = {
    "sequential": {},
    "shuffle": {"shuffle": True, "seed": 5},
    "list": {"sampler": [9, 2, 7, 1, 0, 4, 3, 8, 6, 5, 10]},
    "stateful": {"sampler": "stateful"},
    "distributed-rank-1-of-2": {"shuffle": True, "seed": 2, "rank": 1, "world_size": 2},
}


def _loader(sampler: str, drop_last: bool, num_workers: int, item_concurrency: int) -> DataLoader:
    settings = dict(SAMPLERS[sampler])
    if settings.get("sampler") == "stateful":
        settings["sampler"] = StatefulSampler(11)
    return DataLoader(
        SyncData(11),
        batch_size=3,
        drop_last=drop_last,
        num_workers=num_workers,
        item_concurrency=item_concurrency,
        **settings,
    )


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(("num_workers", "item_concurrency"), [(0, 1), (2, 3)])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_resume_is_exact_from_every_point(
    sampler: str, drop_last: bool, num_workers: int, item_concurrency: int, mode: str
) -> None:
    points = assert_equal_output_after_checkpoint(
        lambda: _loader(sampler, drop_last, num_workers, item_concurrency), epochs=2, mode=mode
    )
    # The start, every batch of two epochs and each epoch's end were restore points.
    assert points == 2 * len(_loader(sampler, drop_last, num_workers, item_concurrency)) + 3


def test_the_checker_catches_a_loader_that_does_not_resume() -> None:
    class Forgetful(DataLoader):
        def load_state_dict(self, state: Any) -> None:
            pass

    with pytest.raises(AssertionError, match="differs or is missing"):
        assert_equal_output_after_checkpoint(lambda: Forgetful(SyncData(6), batch_size=2))


def test_the_checker_compares_failed_batches_and_goes_on_past_them() -> None:
    # It raised the first failed batch's error, so no epoch with a failure could be checked.
    class Failing(SyncData):
        def __getitem__(self, index: int) -> Any:
            if index == 3:
                raise ValueError("item 3 is bad")
            return super().__getitem__(index)

    points = assert_equal_output_after_checkpoint(lambda: DataLoader(Failing(8), batch_size=2))
    assert points == 2 * 4 + 3

    class Forgetful(DataLoader):
        def load_state_dict(self, state: Any) -> None:
            pass

    with pytest.raises(AssertionError, match="ValueError: item 3 is bad"):
        assert_equal_output_after_checkpoint(lambda: Forgetful(Failing(8), batch_size=2))


@pytest.mark.parametrize(("num_workers", "item_concurrency"), [(0, 1), (2, 3)])
@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_a_state_after_an_epochs_last_batch_starts_the_next_epoch(
    sampler: str, num_workers: int, item_concurrency: int
) -> None:
    """A consumer that takes ``len(loader)`` batches and never calls ``next()`` again (as
    Lightning's Trainer does) saves the state between epochs: the next epoch, 0 received."""
    with _loader(sampler, False, num_workers, item_concurrency) as reference:
        iterator = iter(reference)
        for _ in range(len(reference)):
            next(iterator)
        state = json.loads(json.dumps(reference.state_dict()))
        next_epoch = [batch.tolist() for batch in reference]
    assert (state["epoch"], state["batches_received"]) == (1, 0)
    with _loader(sampler, False, num_workers, item_concurrency) as restored:
        restored.load_state_dict(state)
        assert restored.epoch == 1
        assert [batch.tolist() for batch in restored] == next_epoch


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_iterator_made_and_dropped_is_not_counted_as_an_epoch(num_workers: int) -> None:
    """Lightning's Trainer makes one to check that the loader is iterable: the epoch it
    started runs again, so that the epochs are numbered as the consumer received them."""
    with _loader("shuffle", False, num_workers, 1) as reference:
        epochs = [[batch.tolist() for batch in reference] for _ in range(2)]
    with _loader("shuffle", False, num_workers, 1) as loader:
        iterator = iter(loader)
        del iterator
        assert loader.epoch == 0
        assert loader.state_dict()["epoch"] == 0
        assert [[batch.tolist() for batch in loader] for _ in range(2)] == epochs
        assert loader.epoch == 2
        iterator = iter(loader)
        next(iterator)  # a batch received: the epoch counts
        assert loader.epoch == 3


def test_an_empty_epoch_made_and_dropped_is_over() -> None:
    """It has nothing to give: the epoch and the state both name the next one."""
    with DataLoader(SyncData(0), batch_size=2) as loader:
        iterator = iter(loader)
        del iterator
        assert (loader.epoch, loader.state_dict()["epoch"]) == (1, 1)


def test_the_state_counts_what_was_received_not_prefetched() -> None:
    data = SyncData(40)
    with DataLoader(data, batch_size=4, num_workers=4, prefetch_depth=2) as loader:
        iterator = iter(loader)
        next(iterator)
        data.probe.wait_for(lambda: len(data.probe.started) >= 4 * 6)  # 6 batches fetched
        state = loader.state_dict()
    assert state["batches_received"] == 1
    assert state["epoch"] == 0
    json.dumps(state)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_next_after_close_leaves_the_state_where_the_epoch_was_closed(num_workers: int) -> None:
    """A closed epoch is not a finished one: with num_workers=0, a ``next()`` after
    ``close()`` marked it finished, and a state saved then skipped its last batches."""
    with DataLoader(SyncData(24), batch_size=4, num_workers=num_workers) as loader:
        iterator = iter(loader)
        received = [next(iterator).tolist(), next(iterator).tolist()]
        iterator.close()  # type: ignore[attr-defined]
        assert next(iterator, None) is None
        state = loader.state_dict()
    assert (state["epoch"], state["batches_received"]) == (0, 2)
    with DataLoader(SyncData(24), batch_size=4, num_workers=num_workers) as restored:
        restored.load_state_dict(state)
        rest = [batch.tolist() for batch in restored]
    assert received + rest == [list(range(i, i + 4)) for i in range(0, 24, 4)]


async def test_a_wait_cancelled_by_a_time_out_ends_the_epoch_and_the_state_resumes_there() -> None:
    """``wait_for`` around ``anext()`` cancels the wait, which ends the epoch as it ends an
    async generator (README): nothing after it comes silently, and the state resumes at the
    batch that was waited for."""
    gate = asyncio.Event()

    class Gated:
        def __len__(self) -> int:
            return 12

        async def __getitem__(self, index: int) -> int:
            if index >= 4:
                await gate.wait()
            return index

    loader = DataLoader(Gated(), batch_size=4, num_workers=1)
    iterator = aiter(loader)
    assert (await anext(iterator)).tolist() == [0, 1, 2, 3]
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(anext(iterator), 0.01)
    with pytest.raises(StopAsyncIteration):
        await anext(iterator)
    state = loader.state_dict()
    await loader.aclose()
    gate.set()
    assert (state["epoch"], state["batches_received"]) == (0, 1)
    restored = DataLoader(Gated(), batch_size=4, num_workers=1)
    restored.load_state_dict(state)
    assert [batch.tolist() async for batch in restored] == [[4, 5, 6, 7], [8, 9, 10, 11]]
    await restored.aclose()


def test_resume_does_not_fetch_the_batches_already_received() -> None:
    with DataLoader(SyncData(40), batch_size=4, num_workers=2) as first:
        iterator = iter(first)
        for _ in range(7):
            next(iterator)
        state = first.state_dict()
    data = SyncData(40)
    with DataLoader(data, batch_size=4, num_workers=2) as second:
        second.load_state_dict(state)
        rest = [batch.tolist() for batch in second]
    assert rest == [list(range(i, i + 4)) for i in range(28, 40, 4)]
    assert min(data.probe.started) == 28


def test_a_failed_batch_counts_as_received() -> None:
    data = SyncData(12)
    data.fail_at = {4}
    with DataLoader(data, batch_size=4) as loader:
        iterator = iter(loader)
        next(iterator)
        with pytest.raises(Exception, match="4"):
            next(iterator)
        assert loader.state_dict()["batches_received"] == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": 99}, "format"),
        ({"dataset_length": 5}, "dataset_length"),
        ({"batch_size": 2}, "batch_size"),
        ({"drop_last": True}, "drop_last"),
        ({"epoch": -1}, "epoch"),
        ({"sampler": {"kind": "random", "seed": 77}}, "orders the epoch"),
        ({"sampler": {"kind": "custom", "state": {}}}, "kind"),
    ],
)
def test_incompatible_states_are_refused_saying_what_differs(
    change: dict[str, Any], message: str
) -> None:
    with DataLoader(SyncData(12), batch_size=3, shuffle=True, seed=1) as loader:
        state = {**loader.state_dict(), **change}
        with pytest.raises(ValueError, match=message):
            loader.load_state_dict(state)
    with pytest.raises(ValueError, match="got none"):
        DataLoader(SyncData(1)).load_state_dict([])


def test_an_os_drawn_seed_is_taken_from_the_state() -> None:
    with DataLoader(SyncData(20), batch_size=20, shuffle=True) as first:
        order = next(iter(first)).tolist()
        first.set_epoch(0)
        state = first.state_dict()
    with DataLoader(SyncData(20), batch_size=20, shuffle=True) as second:
        second.load_state_dict(state)
        assert next(iter(second)).tolist() == order


def test_set_epoch_keeps_a_loaded_state_for_that_epoch() -> None:
    with DataLoader(SyncData(12), batch_size=3, shuffle=True, seed=4) as first:
        first.set_epoch(3)
        iterator = iter(first)
        taken = [next(iterator).tolist() for _ in range(2)]
        state = first.state_dict()
        rest_expected = [batch.tolist() for batch in iterator]
    assert state["epoch"] == 3
    with DataLoader(SyncData(12), batch_size=3, shuffle=True, seed=4) as second:
        second.load_state_dict({**state, "batches_received": 2})
        second.set_epoch(3)  # what a PyTorch-style loop does before each epoch
        assert [batch.tolist() for batch in second] == rest_expected
    assert len(taken) == 2


def _epoch_of(mode: str, loader: DataLoader, between: Any = None) -> list[list[int]]:
    """One epoch's batches, ``between(loader)`` called after ``iter()``, before ``next()``."""
    if mode == "async":

        async def run() -> list[list[int]]:
            iterator = aiter(loader)
            if between is not None:
                between(loader)
            return [batch.tolist() async for batch in iterator]

        return asyncio.run(run())
    iterator = iter(loader)
    if between is not None:
        between(loader)
    return [batch.tolist() for batch in iterator]


@pytest.mark.parametrize("mode", ["inline", "threads", "async"])
def test_the_samplers_set_epoch_before_the_first_batch_chooses_the_epoch(mode: str) -> None:
    # Lightning's Trainer makes a resumed run's first iterator, then calls set_epoch on the
    # loader's sampler: torch's loader reads its sampler at the first batch and runs that
    # epoch. Here the iterator had planned the loader's own epoch and ran it, so a run
    # resumed from a checkpoint at an epoch's end trained on its first epoch again.
    workers = 0 if mode == "inline" else 2

    def make() -> DataLoader:
        return DataLoader(SyncData(40), batch_size=8, shuffle=True, seed=4, num_workers=workers)

    with make() as reference:
        epochs = [_epoch_of(mode, reference) for _ in range(4)]
    with make() as loader:
        assert _epoch_of(mode, loader, lambda lo: lo.sampler.set_epoch(2)) == epochs[2]
        sampler: Any = loader.sampler  # the loader's own: a RandomSampler
        assert (loader.epoch, sampler.epoch) == (3, 2)
        # Once a batch was taken, a set_epoch is for the next epoch: this one goes on.
        iterator = iter(loader)
        taken = [next(iterator).tolist()]
        sampler.set_epoch(1)
        taken += [batch.tolist() for batch in iterator]
        assert taken == epochs[3]
        assert _epoch_of(mode, loader) == epochs[1]
        assert _epoch_of(mode, loader) == epochs[2]


@pytest.mark.parametrize("mode", ["inline", "threads", "async"])
def test_a_loaded_state_of_another_epoch_than_the_one_set_after_iter_is_left_unused(
    mode: str,
) -> None:
    # Lightning with limit_train_batches=5 of 13: the state saved at the cut epoch's end is
    # epoch 0 with 5 received, and its next epoch is a new one, which the Trainer sets.
    workers = 0 if mode == "inline" else 2

    def make() -> DataLoader:
        return DataLoader(SyncData(40), batch_size=8, shuffle=True, seed=4, num_workers=workers)

    with make() as reference:
        epochs = [_epoch_of(mode, reference) for _ in range(2)]
        state = {**reference.state_dict(), "epoch": 0, "batches_received": 2}
    with make() as loader:
        loader.load_state_dict(state)
        assert _epoch_of(mode, loader, lambda lo: lo.sampler.set_epoch(1)) == epochs[1]
    with make() as loader:
        loader.load_state_dict(state)  # the epoch it was saved in: it resumes there
        assert _epoch_of(mode, loader, lambda lo: lo.sampler.set_epoch(0)) == epochs[0][2:]


def test_rank_and_world_size_default_to_torchruns_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = DataLoader(SyncData(10), batch_size=5, shuffle=True, seed=3)
    assert (loader.rank, loader.world_size) == (1, 2)
    assert isinstance(loader.sampler, DistributedSampler)
    other = DataLoader(SyncData(10), batch_size=5, shuffle=True, seed=3, rank=0)
    seen = [i for batch in loader for i in batch.tolist()] + [
        i for batch in other for i in batch.tolist()
    ]
    assert sorted(seen) == list(range(10))
    with pytest.raises(ValueError, match="rank"):
        DataLoader(SyncData(10), rank=2, world_size=2)
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="RANK"):
        DataLoader(SyncData(10))


def test_a_world_size_given_without_a_rank_that_nothing_says_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # world_size=2 with no rank given, no process group and no RANK (mpirun or srun without
    # torchrun): every process took rank 0, so each read the first share and the second went
    # unread. torch's DistributedSampler(num_replicas=2) refuses to guess the rank.
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match=r"^rank: world_size=2 was given without a rank"):
        DataLoader(SyncData(10), batch_size=2, world_size=2)
    alone = DataLoader(SyncData(10), batch_size=2, world_size=1)
    assert (alone.rank, alone.world_size) == (0, 1)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    found = DataLoader(SyncData(10), batch_size=2, world_size=2)
    assert (found.rank, found.world_size) == (1, 2)


def test_ranks_left_to_the_environment_are_read_again_before_each_epoch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A loader built before its process group starts (Lightning's Trainer starts it inside
    # fit, and the processes it starts have no RANK) kept the ranks of its construction, (0,
    # 1), for good: every rank read every item (tests/test_lightning.py runs the Trainer).
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    loaders = [DataLoader(SyncData(10), batch_size=2, shuffle=True) for _ in range(3)]
    kept = DataLoader(SyncData(10), batch_size=2, shuffle=True, seed=5)
    assert [len(loader) for loader in loaders] == [5, 5, 5]
    under_way = iter(loaders[2])
    first = next(under_way).tolist()
    monkeypatch.setenv("WORLD_SIZE", "2")
    seen = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        loader = loaders[rank]
        assert (loader.rank, loader.world_size, len(loader)) == (rank, 2, 3)
        assert loader.seed == 0  # a seed drawn by each process would split two orders
        assert isinstance(loader.sampler, DistributedSampler)
        seen.append([i for batch in loader for i in batch.tolist()])
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == list(range(10))
    assert kept.seed == 5
    # An epoch under way goes on with the ranks it started with; the next one reads anew.
    assert loaders[2].state_dict()["world_size"] == 1
    rest = [i for batch in under_way for i in batch.tolist()]
    assert sorted(first + rest) == list(range(10))
    assert (loaders[2].world_size, len(list(loaders[2]))) == (2, 3)


@pytest.mark.parametrize(("saved_ranks", "new_ranks"), [(2, 1), (2, 3), (3, 2), (1, 2)])
def test_elastic_resume_covers_each_sample_exactly_once(saved_ranks: int, new_ranks: int) -> None:
    n, batch_size, taken = 60, 2, 3

    def loader(rank: int, world: int) -> DataLoader:
        return DataLoader(
            SyncData(n), batch_size=batch_size, shuffle=True, seed=8, rank=rank, world_size=world
        )

    received: list[int] = []
    states = []
    for rank in range(saved_ranks):
        with loader(rank, saved_ranks) as first:
            iterator = iter(first)
            for _ in range(taken):
                received += next(iterator).tolist()
            states.append(first.state_dict())
    for rank in range(new_ranks):
        with loader(rank, new_ranks) as second:
            second.load_state_dict(states[0])  # any rank's state: ranks move in lockstep
            received += [i for batch in second for i in batch.tolist()]
            assert second.epoch == 1
            # Later epochs are the plain new sharding.
            assert len(list(second)) == len(second)
    # 60 - 2 * 3 * saved_ranks leftover samples divide evenly among the new ranks here.
    assert sorted(received) == list(range(n))


class _FailsOnce:
    """A sampler whose first reading raises (a listing that timed out, say)."""

    def __init__(self, n: int) -> None:
        self.n, self.failed = n, False

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        if not self.failed:
            self.failed = True
            raise TimeoutError("the index listing timed out")
        return iter(range(self.n - 1, -1, -1))


def test_an_epoch_that_cannot_start_keeps_the_loaded_state_and_the_epoch() -> None:
    # The refused iter() had taken the loaded state and the epoch's number with it: the
    # next iter() gave a whole epoch, not the batches the state had left.
    with DataLoader(SyncData(20), batch_size=4, sampler=range(19, -1, -1)) as saver:
        iterator = iter(saver)
        next(iterator), next(iterator)
        state = saver.state_dict()
        rest = [batch.tolist() for batch in iterator]
    with DataLoader(SyncData(20), batch_size=4, sampler=_FailsOnce(20)) as loader:
        loader.load_state_dict(state)
        with pytest.raises(TimeoutError, match="listing timed out"):
            iter(loader)
        assert loader.state_dict() == state
        assert [batch.tolist() for batch in loader] == rest
        assert loader.state_dict()["epoch"] == 1
