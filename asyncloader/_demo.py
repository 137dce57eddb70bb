"""``python -m asyncloader demo``: stream an epoch from a local HTTP server it starts itself.

The server (a bare HTTP/1.1 protocol on 127.0.0.1, in a process of its own) serves synthetic
samples with a few milliseconds of latency, like a nearby object store; the loader keeps many
requests in flight on one event loop, decodes each sample on the CPU pool and collates batches
in order. The benchmark suite serves its HTTP workload from the same server.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from ._loader import DataLoader
from ._samples import peak_in_flight, serve_samples
from .datasets import HttpDataset, Template


def decode(index: int, item: bytes) -> np.ndarray[Any, np.dtype[np.float32]]:
    """The demo's transform: bytes to a float32 vector."""
    return np.frombuffer(item, dtype=np.float32)


def run_demo(items: int, batch_size: int, in_flight: int, latency_s: float) -> dict[str, float]:
    """Stream one epoch of ``items`` samples; print and return what was measured."""
    from tqdm import tqdm

    # The requests in flight as num_workers x 4: any split reads as fast (one budget for the
    # epoch, docs/settings.md), and num_workers batches in work keep the window wide enough.
    item_concurrency = max(1, min(4, in_flight))
    num_workers = max(1, in_flight // item_concurrency)
    with serve_samples(latency_s) as url:
        dataset = HttpDataset(Template(url + "/samples/{index}"), length=items)
        with DataLoader(
            dataset,
            batch_size=batch_size,
            transform=decode,
            num_workers=num_workers,
            item_concurrency=item_concurrency,
        ) as loader:
            start = time.perf_counter()
            seen = 0
            for batch in tqdm(loader, unit="batch", desc="epoch 0"):
                # Each row holds its own index: a wrong order or a lost sample shows here.
                expected = np.arange(seen, seen + len(batch), dtype=np.float32)
                if not np.array_equal(batch[:, 0], expected):
                    raise AssertionError(f"batch out of order at sample {seen}")
                seen += len(batch)
            elapsed = time.perf_counter() - start
        peak = peak_in_flight(url)
    limit = num_workers * item_concurrency / latency_s
    figures = {
        "items": float(seen),
        "items_per_s": seen / elapsed,
        "batches_per_s": len(loader) / elapsed,
        "peak_in_flight": float(peak),
        "limit_items_per_s": limit,
    }
    print(
        f"\n{seen} items in {elapsed:.2f} s: {figures['items_per_s']:,.0f} items/s, "
        f"{figures['batches_per_s']:,.1f} batches/s, "
        f"{peak} requests in flight at peak "
        f"(limit {num_workers * item_concurrency} / {latency_s * 1000:.0f} ms "
        f"= {limit:,.0f} items/s; {figures['items_per_s'] / limit:.0%} of it)"
    )
    return figures


def main(argv: list[str] | None = None) -> int:
    """Parse the demo's options and run it."""
    parser = argparse.ArgumentParser(prog="asyncloader demo", description=__doc__)
    parser.add_argument("--items", type=int, default=20_000, help="samples in the epoch")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--in-flight", type=int, default=64, help="requests in flight")
    parser.add_argument("--latency-ms", type=float, default=5.0, help="server latency")
    args = parser.parse_args(argv)
    run_demo(args.items, args.batch_size, args.in_flight, args.latency_ms / 1000)
    return 0
