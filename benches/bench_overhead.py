"""Per-batch overhead: 200,000 in-memory items of 16 float32, batch 64, against torch.

asyncloader's direct path against torch ``num_workers=0``, and ``num_workers=2`` against torch
``num_workers=2``, interleaved in one run; figures are medians and ratios of medians.

Run: ``make bench`` or ``.venv/bin/python benches/bench_overhead.py [--items N] [--repeats R]``.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import torch

from asyncloader import DataLoader

from _common import interleave, median, save, table, timed


class InMemory:
    """``n`` rows of 16 float32 held in one array; an item is one row."""

    def __init__(self, n: int) -> None:
        self.rows = np.random.default_rng(0).random((n, 16), dtype=np.float32)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Any:
        return self.rows[index]


def run_ours(dataset: InMemory, num_workers: int) -> int:
    with DataLoader(dataset, batch_size=64, num_workers=num_workers) as loader:
        return sum(len(batch) for batch in loader)


def run_torch(dataset: InMemory, num_workers: int) -> int:
    loader: torch.utils.data.DataLoader[Any] = torch.utils.data.DataLoader(
        dataset,  # type: ignore[arg-type,unused-ignore]
        batch_size=64,
        num_workers=num_workers,
        persistent_workers=False,
    )
    return sum(len(batch) for batch in loader)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dataset = InMemory(args.items)
    figures = interleave(
        {
            "asyncloader direct (num_workers=0)": lambda: timed(lambda: run_ours(dataset, 0)),
            "torch num_workers=0": lambda: timed(lambda: run_torch(dataset, 0)),
            "asyncloader num_workers=2": lambda: timed(lambda: run_ours(dataset, 2)),
            "torch num_workers=2": lambda: timed(lambda: run_torch(dataset, 2)),
        },
        args.repeats,
    )
    medians = {name: median(values) for name, values in figures.items()}
    ratio_direct = medians["asyncloader direct (num_workers=0)"] / medians["torch num_workers=0"]
    ratio_workers = medians["asyncloader num_workers=2"] / medians["torch num_workers=2"]
    print(
        table(
            [
                (name, value, f"{len(figures[name])} runs, interleaved")
                for name, value in medians.items()
            ]
        )
    )
    print(f"\ndirect path / torch num_workers=0: {ratio_direct:.2f}x")
    print(f"num_workers=2 / torch num_workers=2: {ratio_workers:.2f}x")
    path = save(
        "overhead",
        {
            "items": args.items,
            "batch_size": 64,
            "items_per_s": figures,
            "medians": medians,
            "ratio_direct_vs_torch0": ratio_direct,
            "ratio_workers2_vs_torch2": ratio_workers,
        },
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()
