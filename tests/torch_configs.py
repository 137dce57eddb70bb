"""Loaders over torch's samplers, for the state tests (imported only where torch is)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.data import BatchSampler
from torch.utils.data import RandomSampler as TorchRandomSampler

from asyncloader import DataLoader

from .datasets import SyncData

TORCH_CONFIGS: dict[str, Callable[[], DataLoader]] = {
    "torch generator": lambda: DataLoader(
        SyncData(23),
        batch_size=4,
        sampler=TorchRandomSampler(range(23), generator=torch.Generator().manual_seed(1)),
    ),
    "batch sampler": lambda: DataLoader(
        SyncData(23),
        batch_sampler=BatchSampler(
            TorchRandomSampler(range(23), generator=torch.Generator().manual_seed(2)), 5, False
        ),
    ),
}
