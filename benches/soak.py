"""Soak: 100 epochs over a 10,000-item async dataset with a transform.

Prints threads, open file descriptors and RSS after every 10th epoch, and the RSS growth after
the first 5 epochs (warm-up: pools, buffers and caches settle); fails if a thread or a file
descriptor is gained or if RSS grows by more than ``--max-growth-mib``.

Run: ``make soak`` or ``.venv/bin/python benches/soak.py [--epochs N] [--items N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import threading
import time
from typing import Any

import numpy as np

from asyncloader import DataLoader

from _common import save


class Items:
    """An async dataset: item ``i`` is a small array, after a yield to the loop."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    async def __getitem__(self, index: int) -> np.ndarray[Any, Any]:
        await asyncio.sleep(0)
        return np.full(16, index, dtype=np.float32)


def scale(index: int, item: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return item * 2


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--max-growth-mib", type=float, default=8.0)
    args = parser.parse_args()
    loader = DataLoader(
        Items(args.items),
        batch_size=64,
        shuffle=True,
        seed=1,
        transform=scale,
        num_workers=4,
        item_concurrency=8,
    )
    expected = 2 * sum(range(args.items))
    rows = []
    started = time.perf_counter()
    with loader:
        for epoch in range(args.epochs):
            total = sum(float(batch[:, 0].sum()) for batch in loader)
            assert total == expected, (epoch, total)
            gc.collect()
            rows.append(
                (epoch, threading.active_count(), len(os.listdir("/proc/self/fd")), rss_mib())
            )
            if epoch % 10 == 9 or epoch == 4:
                _, threads_now, fds_now, rss_now = rows[-1]
                print(
                    f"epoch {epoch + 1:3d}: {threads_now} threads, {fds_now} fds, {rss_now:.1f} MiB"
                )
    elapsed = time.perf_counter() - started
    threads = {row[1] for row in rows}
    fds = {row[2] for row in rows}
    growth = rows[-1][3] - rows[4][3]
    print(
        f"\n{args.epochs} epochs x {args.items} items in {elapsed:.0f} s "
        f"({args.epochs * args.items / elapsed:,.0f} items/s): threads {sorted(threads)}, "
        f"fds {sorted(fds)}, RSS after epoch 5 {rows[4][3]:.1f} MiB, after epoch "
        f"{args.epochs} {rows[-1][3]:.1f} MiB: growth {growth:+.1f} MiB"
    )
    save(
        "soak", {"epochs": args.epochs, "items": args.items, "rows": rows, "rss_growth_mib": growth}
    )
    assert len(threads) == 1, f"the thread count changed: {sorted(threads)}"
    assert len(fds) == 1, f"the fd count changed: {sorted(fds)}"
    assert growth <= args.max_growth_mib, f"RSS grew {growth:.1f} MiB"


if __name__ == "__main__":
    main()
