"""Local files: FileDataset against a plain read loop and against aiofiles, interleaved.

The measurement behind FileDataset's design (one thread hop per file, no aiofiles) and behind
the settings guide's rule for small files. 4 MiB and 16 KiB files, page cache warm:
FileDataset (8 I/O threads) against a plain single-threaded read loop, the same loop keeping
batches of 16 alive, aiofiles with 8 in flight, and one ``run_in_executor`` hop per file with
8 in flight; and FileDataset read against ``mmap=True`` when the consumer touches every page
of every item. The loaders' comparison on files, with torch and SPDL, is in ``suite.py`` (e).

Run: ``.venv/bin/python benches/bench_datasets.py [--repeats R]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from asyncloader import DataLoader, FileDataset

from _common import interleave, median, save, table, timed

PAGE = os.sysconf("SC_PAGE_SIZE")


def files_section(repeats: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for label, count, size in (("4 MiB", 128, 4 * 2**20), ("16 KiB", 4096, 16 * 2**10)):
        with tempfile.TemporaryDirectory() as folder:
            for i in range(count):
                with open(os.path.join(folder, f"{i:05d}.bin"), "wb") as file:
                    file.write(os.urandom(size))
            results[label] = _files_run(folder, label, count, repeats)
    return results


def _files_run(folder: str, label: str, count: int, repeats: int) -> dict[str, Any]:
    names = [f"{i:05d}.bin" for i in range(count)]
    # One loader for every epoch, as in training: its threads are started once.
    loader, mapped = (
        DataLoader(
            FileDataset(names, root=folder, mmap=mmap),
            batch_size=16,
            collate_fn=list,
            num_workers=2,
            item_concurrency=4,
        )
        for mmap in (False, True)
    )

    def ours() -> int:
        return sum(len(item) for batch in loader for item in batch)

    def touched(batches: DataLoader) -> int:
        """Each item's every page read once, as a training step that uses the bytes does."""
        total = 0
        for batch in batches:
            for item in batch:
                total += len(item)
                np.frombuffer(item, dtype=np.uint8)[::PAGE].sum()
        return total

    def plain() -> int:
        total = 0
        for name in names:
            with open(os.path.join(folder, name), "rb") as file:
                total += len(file.read())
        return total

    def plain_held() -> int:
        """The plain loop, keeping each batch of 16 alive as a loader's consumer does."""
        total = 0
        for start in range(0, len(names), 16):
            batch = []
            for name in names[start : start + 16]:
                with open(os.path.join(folder, name), "rb") as file:
                    batch.append(file.read())
            total += sum(len(item) for item in batch)
        return total

    def eight_in_flight(read: Callable[[str], Any]) -> int:
        """Each file read by ``read`` with 8 at once, on a loop with 8 executor threads."""

        async def all_files() -> int:
            asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(8))
            semaphore = asyncio.Semaphore(8)

            async def bounded(name: str) -> int:
                async with semaphore:
                    size: int = await read(os.path.join(folder, name))
                    return size

            return sum(await asyncio.gather(*(bounded(name) for name in names)))

        return asyncio.run(all_files())

    async def aiofiles_read(path: str) -> int:
        import aiofiles

        async with aiofiles.open(path, "rb") as file:  # a thread hop for open, read, close
            return len(await file.read())

    def whole_file(path: str) -> int:
        with open(path, "rb", buffering=0) as file:
            return len(file.read())

    async def one_hop_read(path: str) -> int:
        return await asyncio.get_running_loop().run_in_executor(None, whole_file, path)

    def with_aiofiles() -> int:
        return eight_in_flight(aiofiles_read)

    def with_one_hop() -> int:
        return eight_in_flight(one_hop_read)

    with loader, mapped:
        ours()  # warm: threads started, page cache filled
        figures = interleave(
            {
                "asyncloader FileDataset (8 in flight)": lambda: timed(ours) / 2**20,
                "asyncloader, each page touched": lambda: timed(lambda: touched(loader)) / 2**20,
                "asyncloader mmap=True, each page touched": lambda: (
                    timed(lambda: touched(mapped)) / 2**20
                ),
                "plain read loop (1 thread)": lambda: timed(plain) / 2**20,
                "plain read loop, batches of 16 held": lambda: timed(plain_held) / 2**20,
                "aiofiles (8 in flight)": lambda: timed(with_aiofiles) / 2**20,
                "one thread hop per file (8 in flight)": lambda: timed(with_one_hop) / 2**20,
            },
            repeats,
        )
    medians = {name: median(values) for name, values in figures.items()}
    print(f"\n### Files, {count} x {label}, page cache warm (MiB/s)\n")
    print(table([(name, value, "MiB/s") for name, value in medians.items()]))
    ours_median = medians["asyncloader FileDataset (8 in flight)"]
    ratios = {
        "vs_plain_loop": ours_median / medians["plain read loop (1 thread)"],
        "vs_plain_held": ours_median / medians["plain read loop, batches of 16 held"],
        "vs_aiofiles": ours_median / medians["aiofiles (8 in flight)"],
        "one_hop_vs_aiofiles": medians["one thread hop per file (8 in flight)"]
        / medians["aiofiles (8 in flight)"],
        "touched_mmap_vs_read": medians["asyncloader mmap=True, each page touched"]
        / medians["asyncloader, each page touched"],
    }
    print("\n" + ", ".join(f"{k}: {v:.2f}" for k, v in ratios.items()))
    return {"mib_per_s": figures, "medians": medians, **ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"\nresults: {save('datasets-files', files_section(args.repeats))}")


if __name__ == "__main__":
    main()
