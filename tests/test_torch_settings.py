"""torch's own ``DataLoader`` settings, passed as a torch user passes them: taken where they
mean something here, refused at construction, naming the setting and what to use, where
they do not (they were all "unexpected keyword argument")."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from asyncloader import DataLoader, default_collate

from .datasets import SyncData


def batches(loader: DataLoader) -> list[list[int]]:
    return [np.asarray(batch).tolist() for batch in loader]


def test_torchs_usual_settings_are_taken() -> None:
    # num_workers=8, pin_memory=True, persistent_workers=True, prefetch_factor=4: the
    # settings of most torch training scripts.
    plain = DataLoader(SyncData(40), batch_size=4, shuffle=True, seed=1, num_workers=2)
    torchs = DataLoader(
        SyncData(40),
        batch_size=4,
        shuffle=True,
        seed=1,
        num_workers=2,
        persistent_workers=True,
        prefetch_factor=4,
        worker_init_fn=None,
        multiprocessing_context=None,
        pin_memory_device="",
        in_order=False,  # allows batches out of order: they come in order all the same
    )
    with plain, torchs:
        assert batches(torchs) == batches(plain)
        # torch holds num_workers * prefetch_factor batches; the same window here.
        assert torchs.prefetch_depth + torchs.num_workers == 2 * 4


@pytest.mark.parametrize(
    ("workers", "factor", "depth"), [(1, 2, 1), (4, 2, 4), (8, 4, 24), (2, 1, 1), (2, 0, 1)]
)
def test_prefetch_factor_is_torchs_batches_ahead_per_worker(
    workers: int, factor: int, depth: int
) -> None:
    loader = DataLoader(SyncData(8), num_workers=workers, prefetch_factor=factor)
    assert loader.prefetch_depth == depth  # at least one batch beyond num_workers


REFUSED: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"worker_init_fn": print}, ValueError, "worker_init_fn: it runs in each worker process"),
    ({"worker_init_fn": 3, "cpu_processes": 1}, TypeError, "worker_init_fn must be callable"),
    (
        {"worker_init_fn": lambda: None, "cpu_processes": 1},
        TypeError,
        "worker_init_fn must take \\(worker_id\\)",
    ),
    ({"multiprocessing_context": "spawn"}, ValueError, "multiprocessing_context: asyncloader"),
    ({"pin_memory_device": "cuda"}, ValueError, "pin_memory_device: "),
    ({"prefetch_factor": 2}, ValueError, "prefetch_factor: num_workers=0"),
    ({"prefetch_factor": -1, "num_workers": 2}, ValueError, "prefetch_factor must be at least"),
    ({"prefetch_factor": 2.5, "num_workers": 2}, TypeError, "prefetch_factor must be an int"),
    (
        {"prefetch_factor": 2, "num_workers": 2, "prefetch_depth": 5},
        ValueError,
        "prefetch_factor=2 and prefetch_depth=5 are exclusive",
    ),
    ({"persistent_workers": "yes"}, TypeError, "persistent_workers must be a bool"),
    ({"in_order": 1}, TypeError, "in_order must be a bool"),
]


@pytest.mark.parametrize(("settings", "error", "message"), REFUSED)
def test_torchs_settings_that_mean_nothing_here_are_refused_saying_what_to_use(
    settings: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        DataLoader(SyncData(4), **settings)


def test_torchs_attributes_read_back() -> None:
    # Code written for torch's loader reads them (loader.collate_fn, loader.timeout, ...):
    # each was an AttributeError.
    loader = DataLoader(
        SyncData(8), batch_size=4, num_workers=2, prefetch_factor=3, persistent_workers=True
    )
    assert loader.collate_fn is default_collate
    assert (loader.pin_memory, loader.timeout, loader.generator) == (False, None, None)
    assert (loader.prefetch_factor, loader.persistent_workers, loader.in_order) == (3, True, True)
    assert (loader.worker_init_fn, loader.multiprocessing_context) == (None, None)
    assert loader.pin_memory_device == ""
    assert (loader.cpu_processes, loader.transform) == (0, None)
    assert loader.cpu_threads >= 1
    own = DataLoader(SyncData(8), collate_fn=list, timeout=5)
    assert (own.collate_fn, own.timeout) == (list, 5.0)
    with pytest.raises(AttributeError, match="collate_fn is fixed"):
        own.collate_fn = default_collate
