"""torch users' samplers and datasets: generators, ``set_epoch``, ``BatchSampler``,
``generator=``, ``IterableDataset``."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, IterableDataset, get_worker_info
from torch.utils.data import DistributedSampler as TorchDistributedSampler
from torch.utils.data import RandomSampler as TorchRandomSampler

from asyncloader import DataLoader
from asyncloader.testing import assert_equal_output_after_checkpoint

from .datasets import SyncData
from .test_hostile_states import CONFIGS, batches


@pytest.mark.parametrize("config", ["torch generator", "batch sampler", "custom sampler"])
def test_resume_is_exact_in_later_epochs_with_torch_samplers(config: str) -> None:
    assert_equal_output_after_checkpoint(CONFIGS[config], epochs=3)


def test_a_torch_sampler_without_a_generator_warns_on_load() -> None:
    def make() -> DataLoader:
        return DataLoader(SyncData(10), batch_size=2, sampler=TorchRandomSampler(range(10)))

    with make() as first:
        state = first.state_dict()
    with make() as second, pytest.warns(UserWarning, match="global random state"):
        second.load_state_dict(state)


def test_torch_distributed_sampler_gets_the_epoch_its_user_set() -> None:
    indices: Any = range(20)
    sampler: Any = TorchDistributedSampler(indices, num_replicas=2, rank=1, shuffle=True, seed=9)
    loader = DataLoader(SyncData(20), batch_size=5, sampler=sampler)
    reference: Any = TorchDistributedSampler(indices, num_replicas=2, rank=1, shuffle=True, seed=9)
    for epoch in range(3, 6):  # torch's documented loop, started at a later epoch
        sampler.set_epoch(epoch)
        reference.set_epoch(epoch)
        got = [i for batch in batches(loader) for i in batch]
        assert got == list(reference)
        assert loader.epoch == epoch + 1
    second = list(batches(loader))  # no set_epoch: the loader's own epoch, 6
    reference.set_epoch(6)
    assert [i for batch in second for i in batch] == list(reference)


def test_batch_sampler_makes_the_batches() -> None:
    plain = [[3, 1], [0], [2, 4, 5]]
    loader = DataLoader(SyncData(6), batch_sampler=plain)
    assert len(loader) == 3
    assert loader.batch_size is None
    assert batches(loader) == plain
    torch_made = BatchSampler(range(7), 3, drop_last=True)
    assert batches(DataLoader(SyncData(7), batch_sampler=torch_made)) == [[0, 1, 2], [3, 4, 5]]
    exclusives: list[dict[str, Any]] = [
        {"batch_size": 2},
        {"shuffle": True},
        {"sampler": [0]},
        {"drop_last": True},
    ]
    for exclusive in exclusives:
        with pytest.raises(ValueError, match="batch_sampler is exclusive"):
            DataLoader(SyncData(6), batch_sampler=plain, **exclusive)
    with pytest.raises(TypeError, match="batch_sampler yielded"):
        list(DataLoader(SyncData(6), batch_sampler=[[0], 1]))


def test_generator_seeds_the_shuffle_reproducibly() -> None:
    def run(seed: int) -> list[list[int]]:
        generator = torch.Generator().manual_seed(seed)
        return batches(DataLoader(SyncData(30), batch_size=10, shuffle=True, generator=generator))

    assert run(5) == run(5)
    assert run(5) != run(6)
    with pytest.raises(ValueError, match="exclusive"):
        DataLoader(SyncData(3), shuffle=True, seed=1, generator=torch.Generator())
    with pytest.raises(TypeError, match="generator"):
        DataLoader(SyncData(3), shuffle=True, generator=np.random.default_rng(0))


class Split(IterableDataset[int]):  # type: ignore[misc,unused-ignore]
    """The torch idiom: each worker reads its share (``get_worker_info``)."""

    def __iter__(self) -> Iterator[int]:
        info = get_worker_info()
        if info is None:
            return iter(range(12))
        return iter(range(info.id, 12, info.num_workers))


class Unaware(IterableDataset[int]):  # type: ignore[misc,unused-ignore]
    def __iter__(self) -> Iterator[int]:
        return iter(range(12))


@pytest.mark.parametrize("workers", [0, 1, 4])
def test_a_torch_iterable_dataset_is_read_once_whatever_num_workers(workers: int) -> None:
    for dataset in (Unaware(), Split()):
        with DataLoader(dataset, batch_size=4, num_workers=workers) as loader:
            assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    # The trap this avoids: torch's own loader reads an unaware dataset once per worker.
    torch_items = sorted(
        int(x)
        for batch in torch.utils.data.DataLoader(Unaware(), batch_size=4, num_workers=2)
        for x in batch
    )
    assert torch_items == sorted(list(range(12)) * 2)


TORCH_TRANSFORM = """
import torch
from asyncloader import DataLoader

class Data:
    def __len__(self): return 10_000
    def __getitem__(self, i): return i

def conv(index, item):  # C++ that releases the GIL, as a torch transform does
    return torch.nn.functional.conv2d(torch.ones(1, 1, 64, 64), torch.ones(1, 1, 5, 5)).sum()

loader = DataLoader(Data(), batch_size=8, num_workers=4, cpu_threads=2, transform=conv)
it = iter(loader)
for _ in range(3):
    next(it)
print("done")
"""


def test_exit_with_an_iterator_whose_transform_runs_torch_does_not_abort() -> None:
    # A script that takes batches with next() and ends: the interpreter finalized while the
    # CPU threads were inside torch's C++ code; ending them there aborted the process
    # ("terminate called without an active exception", SIGABRT) in 7 of 8 runs. Four at once.
    children = [
        subprocess.Popen(
            [sys.executable, "-c", TORCH_TRANSFORM],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    ended = [child.communicate(timeout=120) for child in children]
    assert [child.returncode for child in children] == [0] * 4, [err[-500:] for _, err in ended]
    assert all(out.strip() == "done" for out, _ in ended)


def test_a_chain_of_torch_streams_without_a_length_runs() -> None:
    # torch's ChainDataset has a __len__ that raises TypeError when its parts have none:
    # every epoch failed at iter() with it.
    class Part(torch.utils.data.IterableDataset[int]):  # type: ignore[misc,unused-ignore]
        def __iter__(self) -> Iterator[int]:
            return iter(range(5))

    chain = torch.utils.data.ChainDataset([Part(), Part()])
    with DataLoader(chain, batch_size=4) as loader:
        assert [batch.tolist() for batch in loader] == [[0, 1, 2, 3], [4, 0, 1, 2], [3, 4]]
