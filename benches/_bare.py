"""The reference fetch loop of the HTTP workloads: bare asyncio + aiohttp, no loader."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def bare(url: str, items: int, in_flight: int, done: Callable[[], None] | None = None) -> int:
    """GET ``{url}/samples/{i}`` for every ``i`` below ``items``, ``in_flight`` at once;
    ``done()`` after each."""
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        indices = iter(range(items))

        async def lane() -> None:
            for index in indices:
                async with session.get(f"{url}/samples/{index}") as response:
                    await response.read()
                if done is not None:
                    done()

        await asyncio.gather(*(lane() for _ in range(in_flight)))
    return items
