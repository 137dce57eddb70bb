"""Latency-bound: HttpDataset items that take 20 ms each, 64 requests in flight.

Items come from an aiohttp server on loopback (its own process). The limit is
in-flight / latency = 64 / 0.020 s = 3,200 items/s; the figure is the fraction of it reached,
for ``for`` and ``async for``, as medians of interleaved runs.

Run: ``make bench`` or ``.venv/bin/python benches/bench_latency.py [--items N] [--repeats R]``.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from asyncloader import DataLoader, HttpDataset, Template
from asyncloader._demo import serve_samples

from _common import interleave, median, save, table, timed

LATENCY_S = 0.020
IN_FLIGHT = 64


def settings() -> dict[str, Any]:
    # 4 batches of 64 at once, 16 items of each in flight: 64 requests.
    return {"batch_size": 64, "num_workers": 4, "item_concurrency": 16}


def run_for(url: str, items: int) -> int:
    dataset = HttpDataset(Template(url + "/samples/{index}"), length=items)
    with DataLoader(dataset, collate_fn=list, **settings()) as loader:
        return sum(len(batch) for batch in loader)


def run_async_for(url: str, items: int) -> int:
    async def epoch() -> int:
        dataset = HttpDataset(Template(url + "/samples/{index}"), length=items)
        async with DataLoader(dataset, collate_fn=list, **settings()) as loader:
            return sum([len(batch) async for batch in loader])

    return asyncio.run(epoch())


def run_bare(url: str, items: int) -> int:
    """The reference: a bare asyncio + aiohttp loop with 64 requests in flight, no loader."""
    import aiohttp

    async def fetch_all() -> int:
        connector = aiohttp.TCPConnector(limit=IN_FLIGHT)
        async with aiohttp.ClientSession(connector=connector) as session:
            indices = iter(range(items))

            async def lane() -> None:
                for index in indices:
                    async with session.get(f"{url}/samples/{index}") as response:
                        await response.read()

            await asyncio.gather(*(lane() for _ in range(IN_FLIGHT)))
        return items

    return asyncio.run(fetch_all())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--items", type=int, default=6_400)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    limit = IN_FLIGHT / LATENCY_S
    with serve_samples(LATENCY_S) as url:
        run_for(url, 640)  # warm the server and the connection pool code paths
        figures = interleave(
            {
                "asyncloader for": lambda: timed(lambda: run_for(url, args.items)),
                "asyncloader async for": lambda: timed(lambda: run_async_for(url, args.items)),
                "bare asyncio + aiohttp loop": lambda: timed(lambda: run_bare(url, args.items)),
            },
            args.repeats,
        )
    medians = {name: median(values) for name, values in figures.items()}
    fractions = {name: value / limit for name, value in medians.items()}
    bare = medians["bare asyncio + aiohttp loop"]
    print(
        table(
            [
                (name, value, f"{fractions[name]:.2f} of the limit, {value / bare:.2f} of bare")
                for name, value in medians.items()
            ]
        )
    )
    print(f"\nlimit: {IN_FLIGHT} in flight / {LATENCY_S * 1000:.0f} ms = {limit:,.0f} items/s")
    path = save(
        "latency",
        {
            "items": args.items,
            "latency_s": LATENCY_S,
            "in_flight": IN_FLIGHT,
            "limit_items_per_s": limit,
            "items_per_s": figures,
            "medians": medians,
            "fraction_of_limit": fractions,
            "fraction_of_bare_loop": {name: value / bare for name, value in medians.items()},
        },
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()
