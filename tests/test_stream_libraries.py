"""Streams as the libraries people train from make them (issue 20, point 1), real: Hugging
Face's streaming datasets (``datasets.IterableDataset``) and WebDataset's pipelines.

Hugging Face's: each item once in the stream's order, an exact resume through their own
state, a new shuffle each epoch (``set_epoch``), with and without torch beside them. Built in
memory (``Dataset.from_dict(...).to_iterable_dataset(num_shards=...)``): the same classes and
state as a dataset streamed from the Hub, read with no network. WebDataset's: resumed by
reading again, exact when its shuffles are seeded from the epoch (docs/streaming.md).
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pytest
import webdataset

from asyncloader import DataLoader, stream_info
from asyncloader.testing import assert_equal_output_after_checkpoint
from tests.children import run_script

ITEMS = 60


def _stream(shuffle: bool = False) -> datasets.IterableDataset:
    rows = {"i": list(range(ITEMS)), "x": [np.arange(3) + i for i in range(ITEMS)]}
    stream = datasets.Dataset.from_dict(rows).to_iterable_dataset(num_shards=3)
    if shuffle:
        stream = stream.shuffle(seed=7, buffer_size=8)
    return stream.map(lambda row: {"twice": row["i"] * 2})


def _numbers(items: list[dict[str, Any]]) -> list[tuple[int, int, int]]:
    return [(row["i"], row["twice"], int(np.asarray(row["x"]).sum())) for row in items]


def _loader(stream: Any, **options: Any) -> DataLoader:
    return DataLoader(stream, batch_size=7, collate_fn=_numbers, **options)


def test_without_torch_a_hugging_face_stream_is_a_stream() -> None:
    # Without torch (or with USE_TORCH=0), Hugging Face's IterableDataset is no torch
    # IterableDataset, and it has a __getitem__ (a column: ds["text"]) and no __len__: it was
    # taken for a map-style dataset and refused ("no __len__; map-style datasets need one").
    script = """
        import os, sys
        os.environ["USE_TORCH"] = "0"
        import datasets
        from asyncloader import DataLoader, stream_info
        stream = datasets.Dataset.from_dict({"i": list(range(20))}).to_iterable_dataset(
            num_shards=2
        )
        assert hasattr(stream, "__getitem__") and not hasattr(stream, "__len__")
        loader = DataLoader(stream, batch_size=6, num_workers=3, collate_fn=lambda rows: [
            row["i"] for row in rows
        ])
        print([batch for batch in loader], "torch" in sys.modules)
    """
    done = run_script(script)
    assert done.returncode == 0, done.stderr
    expected = [list(range(i, min(i + 6, 20))) for i in range(0, 20, 6)]
    assert done.stdout.strip() == f"{expected} False"


@pytest.mark.parametrize("workers", [1, 4])
def test_each_row_once_in_the_streams_order(workers: int) -> None:
    with _loader(_stream(), num_workers=workers, cpu_threads=2) as loader:
        got = [row for batch in loader for row in batch]
    assert got == [(i, 2 * i, 3 * i + 3) for i in _rows_in_order(_stream())]
    assert sorted(row[0] for row in got) == list(range(ITEMS))


def _rows_in_order(stream: datasets.IterableDataset) -> list[int]:
    return [row["i"] for row in stream]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_resume_through_its_own_state_is_exact_from_every_batch(mode: str) -> None:
    def make() -> DataLoader:
        return _loader(_stream(), num_workers=3)

    # From the start, after each of the 9 batches of each epoch and at each epoch's end.
    assert assert_equal_output_after_checkpoint(make, epochs=2, mode=mode) == 1 + 2 * (9 + 1)


def test_a_shuffled_stream_is_reshuffled_each_epoch_the_same_whatever_the_workers() -> None:
    epochs = []
    for workers, threads in ((1, 1), (4, 2), (8, 3)):
        with _loader(_stream(shuffle=True), num_workers=workers, cpu_threads=threads) as loader:
            epochs.append([[row[0] for batch in loader for row in batch] for _ in range(2)])
    assert epochs[0] == epochs[1] == epochs[2]
    first, second = epochs[0]
    assert first != second  # set_epoch(1) drew another order
    assert sorted(first) == sorted(second) == list(range(ITEMS))


class Reread:
    """A stream's items and its epoch, but not its state: the loader resumes it by reading
    again (docs/streaming.md, for a stream whose own state is not exact)."""

    def __init__(self, stream: datasets.IterableDataset) -> None:
        self.stream = stream

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.stream)

    def set_epoch(self, epoch: int) -> None:
        self.stream.set_epoch(epoch)


def test_a_shuffled_stream_resumes_exactly_by_reading_again() -> None:
    # Hugging Face's state of a shuffle buffer leaves out what the buffer holds ("Loading a
    # state dict of a shuffle buffer of a dataset without the buffer content"): rows of it
    # never come in the resumed epoch, and others come twice. Read again, the epoch's order
    # is drawn anew from the same seed and epoch, and the resume is exact.
    with _loader(_stream(shuffle=True)) as loader:
        iterator: Any = iter(loader)
        received = [row[0] for _ in range(3) for row in next(iterator)]
        state = json.loads(json.dumps(loader.state_dict()))
        iterator.close()
    with _loader(_stream(shuffle=True)) as resumed:
        resumed.load_state_dict(state)
        rest = [row[0] for batch in resumed for row in batch]
    assert set(range(ITEMS)) - set(received + rest)  # rows left in Hugging Face's buffer

    def make() -> DataLoader:
        return _loader(Reread(_stream(shuffle=True)), num_workers=3)

    with pytest.warns(UserWarning, match=r"reads its first \d+ batches again"):
        assert_equal_output_after_checkpoint(make, epochs=2)


def _write_shards(folder: Path, shards: int, samples: int) -> list[str]:
    paths = []
    for shard in range(shards):
        path = folder / f"shard-{shard}.tar"
        with tarfile.open(path, "w") as tar:
            for sample in range(samples):
                key = f"{shard * samples + sample:04d}"
                info = tarfile.TarInfo(f"{key}.txt")
                info.size = len(key)
                tar.addfile(info, io.BytesIO(key.encode()))
        paths.append(str(path))
    return paths


class SeededPipeline:
    """A WebDataset pipeline built for each epoch, its shuffles seeded from the loader's seed
    and the epoch (docs/streaming.md): read again, it gives the same samples in the same
    order."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = stream_info()
        assert info is not None
        seed = hash((info.seed, info.epoch))
        pipeline = webdataset.WebDataset(self.urls, shardshuffle=4, seed=seed, empty_check=False)
        return iter(pipeline.shuffle(5, seed=seed))


def _keys(samples: list[dict[str, Any]]) -> list[str]:
    return [sample["__key__"] for sample in samples]


# webdataset 1.0.2 leaves each shard's file for the collector to close, read whole or not.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_webdataset_pipeline_seeded_from_the_epoch_resumes_exactly(tmp_path: Path) -> None:
    urls = _write_shards(tmp_path, 4, 10)

    def make() -> DataLoader:
        return DataLoader(SeededPipeline(urls), batch_size=4, num_workers=2, collate_fn=_keys)

    with make() as loader:
        first, second = list(loader), list(loader)
    assert first != second  # a new order each epoch
    every = [f"{i:04d}" for i in range(40)]
    assert sorted(k for batch in first for k in batch) == every
    assert sorted(k for batch in second for k in batch) == every
    with pytest.warns(UserWarning, match="exact only if it gives the same items"):
        assert_equal_output_after_checkpoint(make, epochs=2)
